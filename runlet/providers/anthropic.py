"""A model adapter for the Anthropic Messages API.

::

    from runlet.providers.anthropic import AnthropicModel

    model = AnthropicModel("claude-sonnet-4-5")     # key from ANTHROPIC_API_KEY

Needs httpx: ``pip install "runlet[http]"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from .._errors import ConfigurationError, ModelAPIError, ModelResponseError
from .._messages import Message, ReasoningPart, ToolCall, Usage
from .._model import (
    ModelRequest,
    ModelResponse,
    ModelStreamItem,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from .._tools import ToolDefinition
from ._http import (  # raises a helpful ImportError when httpx is missing
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    HTTPModel,
    ServerSentEvent,
    api_error,
    api_root,
    call_text,
    merge_headers,
    parse_arguments,
    parse_json,
    reading,
    tool_result,
)
from ._retry import RetryPolicy, retry_policy

if TYPE_CHECKING:
    import httpx

__all__ = ["API_VERSION", "DEFAULT_BASE_URL", "OPTIONS", "PROVIDER", "AnthropicModel"]

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
        "thinking",
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

PROVIDER = "anthropic"
"""The :attr:`~runlet.ReasoningPart.provider` of the reasoning :class:`AnthropicModel`
keeps, and the only one it sends back."""

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

    Extended thinking (turned on with the ``thinking`` option) is kept: ``thinking``
    and ``redacted_thinking`` blocks become the message's
    :attr:`~runlet.Message.reasoning` (with :attr:`~runlet.ReasoningPart.provider`
    ``"anthropic"``), stream as :class:`~runlet.ReasoningDelta`, and go back to the API
    unchanged, signature included, in the order they came: ahead of the message's text
    and tool calls, or, with interleaved thinking, between the tool calls they came
    between (:attr:`~runlet.ReasoningPart.calls_before`), as the API requires when
    thinking is combined with tool use. Reasoning from other
    providers is left out of requests.

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
        timeout: Seconds to wait on the server (to read, write, or get a pooled
            connection), for a client the adapter creates; ``None`` waits forever.
        connect_timeout: Seconds to wait for a new connection, for a client the adapter
            creates; ``None`` waits forever.
        retry: When to retry a failed request; see :class:`~runlet.providers.RetryPolicy`.
        max_retries: Instead of *retry*: its ``max_retries``.
        retry_base_delay: Instead of *retry*: its ``base_delay``.
        retry_max_delay: Instead of *retry*: its ``max_delay``.
        retry_deadline: Instead of *retry*: its ``deadline``.
        anthropic_version: The ``anthropic-version`` header.
        headers: Extra HTTP headers for every request (e.g. ``anthropic-beta``).
        extra_body: Extra JSON fields for every request body; they win over options,
            except a ``tools`` list, which goes beside the agent's tools (for the
            vendor's own tools) rather than in their place.
        prompt_caching: Mark the system prompt and the tool definitions as cacheable
            (a ``cache_control`` breakpoint on the system prompt and on the last tool),
            so later requests read them from the prompt cache.
        cache_transcript: Also mark the transcript so far (a breakpoint on the last
            message's last block), so the next turn of the run reads it from the cache.
        cache_ttl: How long cached content lives, as the API spells it (``"5m"``, the
            API's default, or ``"1h"``); ``None`` leaves it to the API.

    Raises:
        ConfigurationError: An argument is unusable (an empty model name, a negative
            retry setting, a *max_tokens* below 1, both *retry* and a retry keyword).
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
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_retries: int | None = None,
        retry_base_delay: float | None = None,
        retry_max_delay: float | None = None,
        retry_deadline: float | None = None,
        anthropic_version: str = API_VERSION,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        prompt_caching: bool = False,
        cache_transcript: bool = False,
        cache_ttl: str | None = None,
    ) -> None:
        if type(max_tokens) is not int or max_tokens < 1:
            raise ConfigurationError(f"max_tokens must be a positive int, not {max_tokens!r}.")
        ttl: object = cache_ttl
        if ttl is not None and not (isinstance(ttl, str) and ttl):
            raise ConfigurationError(
                f'cache_ttl must be a duration such as "5m" or "1h", or None, not {cache_ttl!r}.'
            )
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        auth = {"x-api-key": key} if key else {}
        root = api_root(base_url, DEFAULT_BASE_URL, "/v1/messages")
        super().__init__(
            model=model,
            url=f"{root}/v1/messages",
            headers=merge_headers({"anthropic-version": anthropic_version}, auth, headers),
            http_client=http_client,
            timeout=timeout,
            connect_timeout=connect_timeout,
            retry=retry_policy(
                retry,
                max_retries=max_retries,
                base_delay=retry_base_delay,
                max_delay=retry_max_delay,
                deadline=retry_deadline,
            ),
            extra_body=extra_body,
        )
        self.max_tokens = max_tokens
        self.prompt_caching: bool = bool(prompt_caching)
        self.cache_transcript: bool = bool(cache_transcript)
        self._cache_control: dict[str, str] = {"type": "ephemeral"}
        if cache_ttl is not None:
            self._cache_control["ttl"] = cache_ttl
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
            body["system"] = (
                [{"type": "text", "text": system, "cache_control": dict(self._cache_control)}]
                if self.prompt_caching
                else system
            )
        if request.tools:
            tools = body["tools"] = [_tool(tool) for tool in request.tools]
            if self.prompt_caching:
                # A breakpoint caches everything before it: all tools, then the system.
                tools[-1]["cache_control"] = dict(self._cache_control)
        if self.cache_transcript:
            self._mark_transcript(messages)
        for key, value in request.options.items():
            if key == "stop":
                body["stop_sequences"] = [value] if isinstance(value, str) else value
            elif key in OPTIONS and (key != "tool_choice" or request.tools):
                body[key] = value  # (the API refuses tool_choice without tools)
        if stream:
            body["stream"] = True
        return body

    def _mark_transcript(self, turns: list[dict[str, Any]]) -> None:
        if not turns:
            return
        # Thinking blocks cannot carry a breakpoint; the last other block can.
        for block in reversed(turns[-1]["content"]):
            if block["type"] not in _THINKING_BLOCKS:
                block["cache_control"] = dict(self._cache_control)
                return

    def _parse(self, data: Any) -> ModelResponse:
        with reading(_API):
            error = self._error_in(data)
            if error is not None:
                raise error
            texts: list[str] = []
            calls: list[ToolCall] = []
            reasoning: list[ReasoningPart] = []
            between = False  # another block came since the last text
            for block in data["content"]:
                kind = block["type"]
                if kind == "text":
                    text = block["text"]
                    if text:
                        if between and _apart(texts, text):
                            texts.append(_PARAGRAPH)
                        texts.append(text)
                        between = False
                    continue
                between = bool(texts)
                if kind == "tool_use":
                    name = call_text(block.get("name"), "name", _API)
                    call_id = call_text(block.get("id"), "id", _API)
                    calls.append(ToolCall(call_id, name, _input(block.get("input"), name)))
                elif kind == "thinking":
                    signature = block.get("signature")
                    reasoning.append(_thinking(block["thinking"], signature, len(calls)))
                elif kind == "redacted_thinking":
                    reasoning.append(_redacted(block["data"], len(calls)))
            reason = data.get("stop_reason")
            if calls and isinstance(reason, str) and reason in _CUT_OFF:
                raise _cut_off(reason, calls[-1].name)
            message = Message.assistant("".join(texts), calls, reasoning=reasoning)
            return ModelResponse(message, _usage(data.get("usage"), Usage(requests=1)))

    def _error_in(self, data: Any) -> ModelAPIError | None:
        if isinstance(data, dict) and data.get("type") == "error":
            return _reported_error(data)
        return None

    def _assembler(self) -> _Stream:
        return _Stream()


# Between two text blocks that another block separated (a server tool's search and its
# results, say), so the answer does not run "...policy.Based on the results": text blocks
# next to each other (a sentence split by its citations) are joined as they are.
_PARAGRAPH = "\n\n"


def _apart(texts: list[str], text: str) -> bool:
    """Whether *text*, after another block, needs a paragraph break from *texts*."""
    before = next((earlier for earlier in reversed(texts) if earlier), "")
    return bool(before) and not before[-1].isspace() and not text[0].isspace()


# The stop reasons of an answer cut short by a limit, not ended by the model.
_CUT_OFF = frozenset({"max_tokens", "model_context_window_exceeded"})


def _cut_off(reason: str, name: str) -> ModelResponseError:
    """The error for an answer that a limit cut off while it called tools: the last
    call's input may be partial (the API still sends an object, maybe ``{}``), so none of
    the turn's calls may run."""
    limit = "context window" if reason == "model_context_window_exceeded" else "token limit"
    return ModelResponseError(
        f"The {_API} answer was cut off by the {limit} (stop_reason {reason!r}) while the "
        f"model was calling tool {name!r}: its input may be incomplete, so no tool of this "
        "turn ran. Raise max_tokens in the run's options (or shorten the conversation) and "
        "run again."
    )


# -- requests -----------------------------------------------------------------------------

_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


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


# What a tool result with no text says instead: the API may refuse an empty (or blank)
# result with a 400 (it does for an error result), though a tool may have nothing to say.
_NO_OUTPUT: Final = "(no output)"
_NO_ERROR_MESSAGE: Final = "(the tool failed without a message)"


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        result = tool_result(message)
        content = result.content
        if not content or content.isspace():
            content = _NO_ERROR_MESSAGE if result.is_error else _NO_OUTPUT
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": result.tool_call_id,
            "content": content,
        }
        if result.is_error:
            block["is_error"] = True
        return [block]
    # Thinking goes back exactly as it came and where it came: the API checks the
    # signatures, and wants the thinking that led to a tool call ahead of that call. So
    # thinking that came after some of the calls (interleaved thinking) follows them.
    thinking: list[list[dict[str, Any]]] = [[] for _ in range(len(message.tool_calls) + 1)]
    for part in message.reasoning:
        sent = _reasoning_block(part)
        if sent is not None:
            thinking[min(part.calls_before, len(message.tool_calls))].append(sent)
    blocks = thinking[0]
    if message.content and not message.content.isspace():
        # The API refuses text blocks with nothing but whitespace, which a model's own
        # turn may hold beside its tool calls (say "\n\n").
        blocks.append({"type": "text", "text": message.content})
    for call, after in zip(message.tool_calls, thinking[1:], strict=True):
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        )
        blocks.extend(after)
    return blocks


def _reasoning_block(part: ReasoningPart) -> dict[str, Any] | None:
    """The block that sends *part* back, or ``None`` for reasoning the API would refuse:
    another provider's, or thinking without the signature that vouches for it."""
    if part.provider != PROVIDER:
        return None
    if part.redacted_data is not None:
        return {"type": "redacted_thinking", "data": part.redacted_data}
    if part.signature is not None:
        return {"type": "thinking", "thinking": part.text, "signature": part.signature}
    return None


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": dict(tool.input_schema),
    }


# -- answers ------------------------------------------------------------------------------


def _thinking(text: str, signature: Any, calls_before: int) -> ReasoningPart:
    if not isinstance(text, str):
        raise TypeError(f"thinking is a {type(text).__name__}, not a string")
    # Without a signature the API would refuse the block, so it is never sent back.
    signed = isinstance(signature, str) and signature
    return ReasoningPart(
        text,
        signature=signature if signed else None,
        provider=PROVIDER,
        calls_before=calls_before,
    )


def _redacted(data: str, calls_before: int) -> ReasoningPart:
    if not isinstance(data, str):
        raise TypeError(f"redacted_thinking data is a {type(data).__name__}, not a string")
    return ReasoningPart(redacted_data=data, provider=PROVIDER, calls_before=calls_before)


def _reported_error(data: Mapping[str, Any]) -> ModelAPIError:
    """The error an ``error`` body or stream event reports, with the status its type
    stands for, so it is the same error (and as retryable) as that status would be."""
    error = data.get("error")
    error = error if isinstance(error, dict) else {}
    kind = error.get("type")
    kind = kind if isinstance(kind, str) and kind else "error"
    message = error.get("message")
    message = message if isinstance(message, str) and message else kind
    status = _ERROR_STATUS.get(kind, 500)
    return api_error(_API, f"reported {kind} (HTTP {status})", status, message)


def _input(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelResponseError(
            f"The {_API} model called tool {name!r} with input that is a "
            f"{type(value).__name__}, not a JSON object. Give the tool an input schema of "
            "type object."
        )
    return value


def _usage(usage: Any, previous: Usage) -> Usage:
    """*previous* updated with what *usage* reports.

    Input tokens include those read from or written to the prompt cache: they were all
    sent to the model; the cache counts say how many of them were which. In a stream,
    counts are running totals that only grow, so a later count replaces an earlier one
    and a missing (or smaller) one changes nothing.
    """
    if not isinstance(usage, dict):
        return previous

    def count(key: str, before: int) -> int:
        value = usage.get(key)
        if type(value) is not int:
            return before
        return max(before, value)

    read = count("cache_read_input_tokens", previous.cache_read_tokens)
    written = count("cache_creation_input_tokens", previous.cache_write_tokens)
    uncached = previous.input_tokens - previous.cache_read_tokens - previous.cache_write_tokens
    uncached = count("input_tokens", uncached)
    return Usage(
        uncached + read + written,
        count("output_tokens", previous.output_tokens),
        1,
        cache_read_tokens=read,
        cache_write_tokens=written,
    )


@attrs.define
class _PartialCall:
    ordinal: int
    id: str
    name: str
    start: Any
    arguments: list[str] = attrs.Factory(list)


@attrs.define
class _PartialThinking:
    text: list[str] = attrs.Factory(list)
    signature: list[str] = attrs.Factory(list)
    redacted_data: str | None = None

    def part(self, calls_before: int) -> ReasoningPart:
        if self.redacted_data is not None:
            return _redacted(self.redacted_data, calls_before)
        return _thinking("".join(self.text), "".join(self.signature), calls_before)


class _Stream:
    """Assembles a streamed Messages answer from its typed events."""

    def __init__(self) -> None:
        self.done = False
        self._text: list[str] = []
        # Content-block index -> tool call or thinking; all blocks share the index space.
        self._calls: dict[int, _PartialCall] = {}
        self._thinking: dict[int, _PartialThinking] = {}
        self._usage = Usage(requests=1)
        self._stop: str | None = None
        self._between = False  # another block came since the last text

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
                delta = data.get("delta")
                if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                    self._stop = delta["stop_reason"]
            elif kind == "message_stop":
                self.done = True
            elif kind == "error":
                raise _reported_error(data)
            # ping, content_block_stop and event types added later carry nothing we need
            return []

    def _start(self, index: int, block: Mapping[str, Any]) -> list[ModelStreamItem]:
        kind = block["type"]
        if kind == "text":
            return self._add_text(block.get("text"))
        self._between = bool(self._text)
        if kind == "tool_use":
            call = _PartialCall(
                len(self._calls),
                call_text(block.get("id"), "id", _API),
                call_text(block.get("name"), "name", _API),
                block.get("input"),
            )
            self._calls[index] = call
            return [ToolCallDelta(call.ordinal, call.id, call.name)]
        if kind == "redacted_thinking":
            self._thinking[index] = _PartialThinking(redacted_data=block["data"])
        elif kind == "thinking":
            thinking = self._thinking[index] = _PartialThinking()
            return self._think(thinking, block.get("thinking"), block.get("signature"))
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[ModelStreamItem]:
        kind = delta["type"]
        if kind == "text_delta":
            return self._add_text(delta["text"])
        if kind == "input_json_delta":
            call = self._calls.get(index)
            if call is None:  # the input of a block run by the server (server_tool_use)
                return []
            call.arguments.append(delta["partial_json"])
            return [ToolCallDelta(call.ordinal, arguments=delta["partial_json"])]
        if kind == "thinking_delta":
            return self._think(self._thinking[index], delta["thinking"], None)
        if kind == "signature_delta":
            return self._think(self._thinking[index], None, delta["signature"])
        return []  # citations and delta types added later: not part of a Runlet message

    def _add_text(self, text: Any) -> list[ModelStreamItem]:
        if not text:
            return []
        items: list[ModelStreamItem] = []
        if self._between and _apart(self._text, text):
            self._text.append(_PARAGRAPH)
            items.append(TextDelta(_PARAGRAPH))
        self._between = False
        self._text.append(text)
        items.append(TextDelta(text))
        return items

    @staticmethod
    def _think(thinking: _PartialThinking, text: Any, signature: Any) -> list[ModelStreamItem]:
        if isinstance(signature, str):
            thinking.signature.append(signature)
        if isinstance(text, str) and text:
            thinking.text.append(text)
            return [ReasoningDelta(text)]
        return []

    def finish(self) -> ModelResponse:
        if not self.done:
            raise ModelResponseError(
                f"The {_API} stream ended before message_stop. The partial answer was "
                "dropped; run again."
            )
        if self._calls and self._stop in _CUT_OFF:
            raise _cut_off(self._stop, list(self._calls.values())[-1].name)
        calls = []
        for call in self._calls.values():
            text = "".join(call.arguments)
            # Without input deltas the start block's input is the whole input.
            arguments = (
                parse_arguments(text, call.name, _API) if text else _input(call.start, call.name)
            )
            calls.append(ToolCall(call.id, call.name, arguments))
        # Blocks arrive in index order, which is the order the API wants them back in;
        # each thinking block notes how many tool calls came before it.
        reasoning = [
            self._thinking[index].part(sum(1 for start in self._calls if start < index))
            for index in sorted(self._thinking)
        ]
        message = Message.assistant("".join(self._text), calls, reasoning=reasoning)
        return ModelResponse(message, self._usage)
