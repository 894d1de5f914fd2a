"""A model adapter for the OpenAI Chat Completions API and the servers that copy it.

::

    from runlet.providers.openai import OpenAIChatModel

    model = OpenAIChatModel("gpt-4o-mini")          # key from OPENAI_API_KEY
    local = OpenAIChatModel("llama3.1", base_url="http://localhost:11434/v1")  # Ollama

Needs httpx: ``pip install "runlet[http]"``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._errors import ModelAPIError, ModelError, ModelResponseError
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

__all__ = ["DEFAULT_BASE_URL", "OPTIONS", "OpenAIChatModel"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
"""Where :class:`OpenAIChatModel` sends requests unless given ``base_url``."""

OPTIONS = frozenset(
    {
        "frequency_penalty",
        "logit_bias",
        "max_completion_tokens",
        "max_tokens",
        "parallel_tool_calls",
        "presence_penalty",
        "reasoning_effort",
        "response_format",
        "seed",
        "service_tier",
        "stop",
        "temperature",
        "tool_choice",
        "top_p",
        "user",
    }
)
"""The keys of ``ModelRequest.options`` that :class:`OpenAIChatModel` copies into the
request body, unchanged. Other keys are left out, so one ``options`` mapping can serve
several adapters; send anything else with ``extra_body``."""

_API = "OpenAI Chat Completions"
_ERROR_PREFIX = "Error: "


class OpenAIChatModel(HTTPModel):
    """A :class:`~runlet.Model` (and :class:`~runlet.StreamingModel`) backed by the
    Chat Completions API (``POST {base_url}/chat/completions``).

    It works with OpenAI and with OpenAI-compatible servers such as Ollama, vLLM,
    llama.cpp's ``llama-server`` or LM Studio: point ``base_url`` at the server.

    Use it as ``async with OpenAIChatModel(...) as model:``, or call :meth:`aclose`
    when done, to close the HTTP client it creates. A client passed as ``http_client``
    is never closed by the adapter.

    Args:
        model: The model name, e.g. ``"gpt-4o-mini"``.
        api_key: The API key; defaults to the ``OPENAI_API_KEY`` environment variable.
            With neither, no ``Authorization`` header is sent (local servers need none).
        base_url: The API root, up to and including ``/v1``.
        http_client: An :class:`httpx.AsyncClient` to use (and not close) instead of one
            the adapter creates.
        timeout: Seconds to wait on the server, for a client the adapter creates.
        max_retries: Retries after a 408, 409, 429 or 5xx answer or a connection
            failure; 0 turns retrying off.
        retry_base_delay: Seconds; the backoff cap starts here and doubles per retry.
        retry_max_delay: Seconds; the backoff cap never exceeds this.
        retry_deadline: Seconds from the first attempt after which no retry is begun.
        headers: Extra HTTP headers for every request (e.g. ``OpenAI-Organization``).
        extra_body: Extra JSON fields for every request body; they win over options.
        stream_usage: Ask for token usage at the end of a stream
            (``stream_options.include_usage``). Turn it off for a server that rejects it.

    Raises:
        ConfigurationError: An argument is unusable (an empty model name, a negative
            retry setting).
    """

    api = _API

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
        retry_deadline: float = 60.0,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        stream_usage: bool = True,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        auth = {"authorization": f"Bearer {key}"} if key else {}
        root = (base_url or DEFAULT_BASE_URL).rstrip("/")
        super().__init__(
            model=model,
            url=f"{root}/chat/completions",
            headers={**auth, **(headers or {})},
            http_client=http_client,
            timeout=timeout,
            retry=RetryPolicy(max_retries, retry_base_delay, retry_max_delay, retry_deadline),
            extra_body=extra_body,
        )
        self.stream_usage = stream_usage

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": _messages(request)}
        if request.tools:
            body["tools"] = [_tool(tool) for tool in request.tools]
        body.update((k, v) for k, v in request.options.items() if k in OPTIONS)
        if stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def _parse(self, data: Any) -> ModelResponse:
        with reading(_API):
            _raise_embedded_error(data)
            message = data["choices"][0]["message"]
            calls = tuple(
                _tool_call(call, index)
                for index, call in enumerate(message.get("tool_calls") or ())
            )
            return ModelResponse(
                Message.assistant(_text(message), calls), _usage(data.get("usage"))
            )

    def _assembler(self) -> _Stream:
        return _Stream()


# -- requests -----------------------------------------------------------------------------


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    out.extend(_message(message) for message in request.messages)
    return out


def _message(message: Message) -> dict[str, Any]:
    if message.role == "assistant":
        entry: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _dumps(call.arguments)},
                }
                for call in message.tool_calls
            ]
        return entry
    if message.role == "tool":
        result = message.tool_result
        if result is None:
            raise ModelError(
                "A tool message without a tool_result cannot be sent: the API needs the id "
                "of the call it answers. Build tool messages with Message.tool(ToolResult(...))."
            )
        # Chat Completions has no error flag on tool messages, so the text says it.
        content = _ERROR_PREFIX + result.content if result.is_error else result.content
        return {"role": "tool", "tool_call_id": result.tool_call_id, "content": content}
    return {"role": message.role, "content": message.content}


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.input_schema),
        },
    }


def _dumps(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments), ensure_ascii=False)


# -- answers ------------------------------------------------------------------------------


def _raise_embedded_error(data: Any) -> None:
    """Some compatible servers answer (or end a stream) with ``{"error": ...}`` and a
    success status; that is an API error, not a malformed answer."""
    if not isinstance(data, dict) or "error" not in data or "choices" in data:
        return
    error = data["error"]
    message = error.get("message") if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    raise ModelAPIError(
        f"The {_API} API reported an error: {message}", status_code=status, body=str(message)
    )


def _text(message: Mapping[str, Any]) -> str:
    # A refusal is the model's whole answer, so it is the text the run reports.
    text = message.get("content") or message.get("refusal") or ""
    if not isinstance(text, str):
        raise ModelResponseError(
            f"The {_API} answer's message content is a {type(text).__name__}, not text."
        )
    return text


def _call_id(value: Any, index: int) -> str:
    # A few compatible servers leave ids out; the transcript still needs one per call.
    if isinstance(value, str) and value:
        return value
    return f"call_{index}_{os.urandom(6).hex()}"


def _tool_call(call: Mapping[str, Any], index: int) -> ToolCall:
    function = call["function"]
    name = function["name"]
    arguments = parse_arguments(function.get("arguments") or "", name, _API)
    return ToolCall(_call_id(call.get("id"), index), name, arguments)


def _usage(usage: Any) -> Usage:
    # Some compatible servers report no usage; the request still counts.
    if not isinstance(usage, dict):
        return Usage(requests=1)
    return Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0, 1)


@attrs.define
class _PartialCall:
    ordinal: int
    id: str | None = None
    name: str | None = None
    arguments: list[str] = attrs.Factory(list)


class _Stream:
    """Assembles a streamed Chat Completions answer from its ``data:`` chunks."""

    def __init__(self) -> None:
        self.done = False
        self._finished = False
        self._text: list[str] = []
        # The API's own call indexes, mapped to the order the calls first appeared in.
        self._calls: dict[int, _PartialCall] = {}
        self._last = 0
        self._usage = Usage(requests=1)

    def feed(self, event: ServerSentEvent) -> list[ModelStreamItem]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = parse_json(event.data, _API)
        with reading(_API):
            _raise_embedded_error(chunk)
            if chunk.get("usage"):
                self._usage = _usage(chunk["usage"])
            items: list[ModelStreamItem] = []
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) == 0:  # only one choice is ever asked for
                    self._choice(choice, items)
            return items

    def _choice(self, choice: Mapping[str, Any], items: list[ModelStreamItem]) -> None:
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("refusal")
        if text:
            self._text.append(text)
            items.append(TextDelta(text))
        for piece in delta.get("tool_calls") or ():
            index = piece.get("index")
            if index is None:  # a few servers omit it: a new id starts a new call
                index = len(self._calls) if piece.get("id") or not self._calls else self._last
            partial = self._calls.get(index)
            if partial is None:
                partial = self._calls[index] = _PartialCall(len(self._calls))
            self._last = index
            function = piece.get("function") or {}
            call_id, name = piece.get("id"), function.get("name")
            arguments = function.get("arguments") or ""
            if call_id:
                partial.id = call_id
            if name:
                partial.name = name
            partial.arguments.append(arguments)
            items.append(ToolCallDelta(partial.ordinal, call_id or None, name or None, arguments))
        if choice.get("finish_reason"):
            self._finished = True

    def finish(self) -> ModelResponse:
        if not (self.done or self._finished):
            raise ModelResponseError(
                f"The {_API} stream ended before the answer was complete (no finish_reason "
                "and no [DONE]). The partial answer was dropped; run again."
            )
        calls = []
        for index, partial in enumerate(self._calls.values()):
            if not partial.name:
                raise ModelResponseError(
                    f"The {_API} stream sent tool call {index} without a function name."
                )
            arguments = parse_arguments("".join(partial.arguments), partial.name, _API)
            calls.append(ToolCall(_call_id(partial.id, index), partial.name, arguments))
        message = Message.assistant("".join(self._text), calls)
        return ModelResponse(message, self._usage)
