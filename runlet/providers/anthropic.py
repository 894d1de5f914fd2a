"""A model adapter for the Anthropic Messages API.

::

    from runlet.providers.anthropic import AnthropicModel

    model = AnthropicModel("claude-sonnet-4-5")     # key from ANTHROPIC_API_KEY

Needs httpx: ``pip install "runlet[http]"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._errors import ConfigurationError, ModelAPIError, ModelError, ModelResponseError
from .._messages import Message, ToolCall, Usage
from .._model import ModelRequest, ModelResponse, ModelStreamItem, TextDelta, ToolCallDelta
from .._tools import ToolDefinition
from ._http import (  # raises a helpful ImportError when httpx is missing
    DEFAULT_TIMEOUT,
    HTTPModel,
    RetryPolicy,
    ServerSentEvent,
    parse_arguments,
    parse_json,
    reading,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["API_VERSION", "DEFAULT_BASE_URL", "OPTIONS", "AnthropicModel"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
"""Where :class:`AnthropicModel` sends requests unless given ``base_url``."""

API_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent unless the adapter is given another."""

OPTIONS = frozenset(
    {
        "max_tokens",
        "service_tier",
        "stop",
        "stop_sequences",
        "temperature",
        "tool_choice",
        "top_k",
        "top_p",
    }
)
"""The keys of ``ModelRequest.options`` that :class:`AnthropicModel` puts in the request
body. They are copied unchanged, except ``stop`` (the Chat Completions name), which
becomes ``stop_sequences`` (a single string becomes a one-item list). Other keys are left
out, so one ``options`` mapping can serve several adapters; send anything else with
``extra_body``."""

_API = "Anthropic Messages"

# The HTTP status each documented error type stands for, for errors that arrive inside a
# stream (after a 200) and so carry no status of their own.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class AnthropicModel(HTTPModel):
    """A :class:`~runlet.Model` (and :class:`~runlet.StreamingModel`) backed by the
    Anthropic Messages API (``POST {base_url}/v1/messages``).

    Use it as ``async with AnthropicModel(...) as model:``, or call :meth:`aclose` when
    done, to close the HTTP client it creates. A client passed as ``http_client`` is
    never closed by the adapter.

    Args:
        model: The model name, e.g. ``"claude-sonnet-4-5"``.
        api_key: The API key, sent as ``x-api-key``; defaults to the
            ``ANTHROPIC_API_KEY`` environment variable. With neither, a request raises
            :class:`~runlet.ConfigurationError`. An empty string sends no key (for a
            proxy that adds its own).
        base_url: The API root, without ``/v1``.
        http_client: An :class:`httpx.AsyncClient` to use (and not close) instead of one
            the adapter creates.
        max_tokens: The most tokens an answer may have (the API requires a limit); the
            ``max_tokens`` option overrides it per run.
        timeout: Seconds to wait on the server, for a client the adapter creates.
        max_retries: Retries after a 408, 409, 429 or 5xx answer (529 "overloaded"
            included) or a connection failure; 0 turns retrying off.
        retry_base_delay: Seconds; the backoff cap starts here and doubles per retry.
        retry_max_delay: Seconds; the backoff cap never exceeds this.
        retry_deadline: Seconds from the first attempt after which no retry is begun.
        anthropic_version: The ``anthropic-version`` header.
        headers: Extra HTTP headers for every request (e.g. ``anthropic-beta``).
        extra_body: Extra JSON fields for every request body; they win over options.

    Raises:
        ConfigurationError: An argument is unusable (an empty model name, a negative
            retry setting, a *max_tokens* below 1).
    """

    api = _API

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_tokens: int = 4096,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
        retry_deadline: float = 60.0,
        anthropic_version: str = API_VERSION,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if type(max_tokens) is not int or max_tokens < 1:
            raise ConfigurationError(f"max_tokens must be a positive int, not {max_tokens!r}.")
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        auth = {"x-api-key": key} if key else {}
        root = (base_url or DEFAULT_BASE_URL).rstrip("/")
        super().__init__(
            model=model,
            url=f"{root}/v1/messages",
            headers={"anthropic-version": anthropic_version, **auth, **(headers or {})},
            http_client=http_client,
            timeout=timeout,
            retry=RetryPolicy(max_retries, retry_base_delay, retry_max_delay, retry_deadline),
            extra_body=extra_body,
        )
        self.max_tokens = max_tokens
        self._has_key = key is not None

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        if not self._has_key:
            # Checked here rather than in __init__ so that building an agent (say, at
            # import time) works without the key; only talking to the API needs it.
            raise ConfigurationError(
                "AnthropicModel has no API key: set the ANTHROPIC_API_KEY environment "
                "variable or pass AnthropicModel(..., api_key=...)."
            )
        system, messages = _messages(request)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": messages,
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [_tool(tool) for tool in request.tools]
        for key, value in request.options.items():
            if key == "stop":
                body["stop_sequences"] = [value] if isinstance(value, str) else value
            elif key in OPTIONS:
                body[key] = value
        if stream:
            body["stream"] = True
        return body

    def _parse(self, data: Any) -> ModelResponse:
        with reading(_API):
            if data.get("type") == "error":
                raise _api_error(data)
            texts: list[str] = []
            calls: list[ToolCall] = []
            for block in data["content"]:
                kind = block["type"]
                if kind == "text":
                    texts.append(block["text"])
                elif kind == "tool_use":
                    name = block["name"]
                    calls.append(ToolCall(block["id"], name, _input(block.get("input"), name)))
            message = Message.assistant("".join(texts), calls)
            return ModelResponse(message, _usage(data.get("usage"), Usage(requests=1)))

    def _assembler(self) -> _Stream:
        return _Stream()


# -- requests -----------------------------------------------------------------------------


def _messages(request: ModelRequest) -> tuple[str, list[dict[str, Any]]]:
    """The system prompt and the alternating user/assistant turns.

    The Messages API has no system or tool role: system text goes to the top-level
    ``system`` field, and tool results are user content. Consecutive messages of one role
    are merged into one turn, which is how the API wants the results of parallel calls.
    """
    system = [request.instructions] if request.instructions else []
    turns: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role == "system":
            system.append(message.content)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:  # the API refuses empty text blocks and empty turns
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(system), turns


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        result = message.tool_result
        if result is None:
            raise ModelError(
                "A tool message without a tool_result cannot be sent: the API needs the id "
                "of the call it answers. Build tool messages with Message.tool(ToolResult(...))."
            )
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": result.tool_call_id,
            "content": result.content,
        }
        if result.is_error:
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        for call in message.tool_calls
    )
    return blocks


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": dict(tool.input_schema),
    }


# -- answers ------------------------------------------------------------------------------


def _api_error(data: Mapping[str, Any]) -> ModelAPIError:
    error = data.get("error") or {}
    kind = error.get("type", "error")
    message = error.get("message") or kind
    return ModelAPIError(
        f"The {_API} API reported {kind}: {message}",
        status_code=_ERROR_STATUS.get(kind, 500),
        body=message,
    )


def _input(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelResponseError(
            f"The {_API} model called tool {name!r} with input that is a "
            f"{type(value).__name__}, not a JSON object."
        )
    return value


def _usage(usage: Any, previous: Usage) -> Usage:
    """*previous* updated with what *usage* reports.

    Input tokens include those read from or written to the prompt cache: they were all
    sent to the model. In a stream, later counts are running totals, so they replace
    earlier ones rather than add to them.
    """
    if not isinstance(usage, dict):
        return previous
    input_tokens = previous.input_tokens
    if any(key in usage for key in ("input_tokens", "cache_read_input_tokens")):
        input_tokens = sum(
            usage.get(key) or 0
            for key in (
                "input_tokens",
                "cache_creation_input_tokens",
                "cache_read_input_tokens",
            )
        )
    output_tokens = usage.get("output_tokens")
    if output_tokens is None:
        output_tokens = previous.output_tokens
    return Usage(input_tokens, output_tokens, 1)


@attrs.define
class _PartialCall:
    ordinal: int
    id: str
    name: str
    start: Any
    arguments: list[str] = attrs.Factory(list)


class _Stream:
    """Assembles a streamed Messages answer from its typed events."""

    def __init__(self) -> None:
        self.done = False
        self._text: list[str] = []
        # Content-block index -> tool call; text blocks share the index space.
        self._calls: dict[int, _PartialCall] = {}
        self._usage = Usage(requests=1)

    def feed(self, event: ServerSentEvent) -> list[ModelStreamItem]:
        data = parse_json(event.data, _API)
        with reading(_API):
            kind = data.get("type", event.event)
            if kind == "message_start":
                self._usage = _usage(data["message"].get("usage"), self._usage)
            elif kind == "content_block_start":
                return self._start(data["index"], data["content_block"])
            elif kind == "content_block_delta":
                return self._delta(data["index"], data["delta"])
            elif kind == "message_delta":
                self._usage = _usage(data.get("usage"), self._usage)
            elif kind == "message_stop":
                self.done = True
            elif kind == "error":
                raise _api_error(data)
            # ping, content_block_stop and event types added later carry nothing we need
            return []

    def _start(self, index: int, block: Mapping[str, Any]) -> list[ModelStreamItem]:
        if block["type"] == "tool_use":
            call = _PartialCall(len(self._calls), block["id"], block["name"], block.get("input"))
            self._calls[index] = call
            return [ToolCallDelta(call.ordinal, call.id, call.name)]
        if block["type"] == "text" and block.get("text"):
            self._text.append(block["text"])
            return [TextDelta(block["text"])]
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[ModelStreamItem]:
        if delta["type"] == "text_delta":
            self._text.append(delta["text"])
            return [TextDelta(delta["text"])]
        if delta["type"] == "input_json_delta":
            call = self._calls[index]
            call.arguments.append(delta["partial_json"])
            return [ToolCallDelta(call.ordinal, arguments=delta["partial_json"])]
        return []  # thinking, signatures, citations: not part of a Runlet message

    def finish(self) -> ModelResponse:
        if not self.done:
            raise ModelResponseError(
                f"The {_API} stream ended before message_stop. The partial answer was "
                "dropped; run again."
            )
        calls = []
        for call in self._calls.values():
            text = "".join(call.arguments)
            # Without input deltas the start block's input is the whole input.
            arguments = (
                parse_arguments(text, call.name, _API) if text else _input(call.start, call.name)
            )
            calls.append(ToolCall(call.id, call.name, arguments))
        return ModelResponse(Message.assistant("".join(self._text), calls), self._usage)
