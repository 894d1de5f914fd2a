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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

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
    loads,
    merge_headers,
    parse_arguments,
    parse_json,
    reading,
    tool_result,
)
from ._retry import RetryPolicy, retry_policy

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_BASE_URL", "OPTIONS", "PROVIDER", "OpenAIChatModel"]

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

PROVIDER = "openai"
"""The :attr:`~runlet.ReasoningPart.provider` of the reasoning :class:`OpenAIChatModel`
keeps (from ``reasoning_content`` or ``reasoning``). With ``send_reasoning``, it sends
such reasoning back with the assistant turns that made tool calls, as
``reasoning_content``."""

# The hosts whose APIs require reasoning_content back with the turns that called tools
# (DeepSeek's thinking mode); elsewhere it is left out, as some servers (Groq) refuse
# fields they do not know in a message.
_REASONING_BACK_HOSTS = ("deepseek.com",)

_API = "OpenAI Chat Completions"
_ERROR_PREFIX = "Error: "

# The fields in which OpenAI-compatible servers hand out reasoning text: DeepSeek's
# original name first, then the one vLLM (0.9 and later) and OpenRouter use.
_REASONING_FIELDS = ("reasoning_content", "reasoning")

# The HTTP status an error object's ``code`` or ``type`` stands for, for an error that
# arrives with a 200 (in a stream, or from a compatible server) and so has no status of
# its own: the status OpenAI answers with for the same error.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "tokens": 429,
    "requests": 429,
    "server_error": 500,
    "api_error": 500,
    "service_unavailable": 503,
}


class OpenAIChatModel(HTTPModel):
    """A :class:`~runlet.Model` (and :class:`~runlet.StreamingModel`) backed by the
    Chat Completions API (``POST {base_url}/chat/completions``).

    It works with OpenAI and with OpenAI-compatible servers such as Ollama, vLLM,
    llama.cpp's ``llama-server`` or LM Studio: point ``base_url`` at the server.

    Reasoning text that compatible servers return (``reasoning_content`` from DeepSeek
    and older vLLM, ``reasoning`` from newer vLLM and OpenRouter) becomes the message's
    :attr:`~runlet.Message.reasoning` (with :attr:`~runlet.ReasoningPart.provider`
    ``"openai"``) and streams as :class:`~runlet.ReasoningDelta`. It goes back, as
    ``reasoning_content`` with the assistant turns that made tool calls (never with a
    plain answer), only where the server needs it: see *send_reasoning*. Reasoning from
    other providers is never sent.

    Gemini's OpenAI-compatible endpoint puts a thought signature on tool calls
    (``extra_content.google.thought_signature``) and refuses a later request whose
    tool-calling turn lacks it. Each becomes a reasoning part without text, with the
    signature and :attr:`~runlet.ReasoningPart.calls_before` set to its call's index, and
    goes back on that call with every request, whatever *send_reasoning* says.

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
        timeout: Seconds to wait on the server (to read, write, or get a pooled
            connection), for a client the adapter creates; ``None`` waits forever.
        connect_timeout: Seconds to wait for a new connection, for a client the adapter
            creates; ``None`` waits forever.
        retry: When to retry a failed request; see :class:`~runlet.providers.RetryPolicy`.
        max_retries: Instead of *retry*: its ``max_retries``.
        retry_base_delay: Instead of *retry*: its ``base_delay``.
        retry_max_delay: Instead of *retry*: its ``max_delay``.
        retry_deadline: Instead of *retry*: its ``deadline``.
        headers: Extra HTTP headers for every request (e.g. ``OpenAI-Organization``).
        extra_body: Extra JSON fields for every request body; they win over options,
            except a ``tools`` list, which goes beside the agent's tools (for the
            vendor's own tools) rather than in their place.
        stream_usage: Ask for token usage at the end of a stream
            (``stream_options.include_usage``). Turn it off for a server that rejects it.
        send_reasoning: Whether to send a turn's reasoning back, as ``reasoning_content``
            beside the tool calls it led to. DeepSeek's thinking mode refuses a request
            whose tool-calling turns lack it; Groq refuses one that has it. ``None`` (the
            default) sends it to DeepSeek's API (a *base_url* on ``deepseek.com``) only;
            give ``True`` for another server that needs it.

    Raises:
        ConfigurationError: An argument is unusable (an empty model name, a negative
            retry setting, both *retry* and a retry keyword).
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
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_retries: int | None = None,
        retry_base_delay: float | None = None,
        retry_max_delay: float | None = None,
        retry_deadline: float | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        stream_usage: bool = True,
        send_reasoning: bool | None = None,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        auth = {"authorization": f"Bearer {key}"} if key else {}
        root = api_root(base_url, DEFAULT_BASE_URL, "/chat/completions")
        super().__init__(
            model=model,
            url=f"{root}/chat/completions",
            headers=merge_headers(auth, headers),
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
        self.stream_usage = stream_usage
        if send_reasoning is None:
            host = urlsplit(root).hostname or ""
            send_reasoning = any(
                host == known or host.endswith("." + known) for known in _REASONING_BACK_HOSTS
            )
        elif type(send_reasoning) is not bool:
            raise ConfigurationError(
                f"send_reasoning must be True, False or None, not {send_reasoning!r}."
            )
        self.send_reasoning = send_reasoning

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        messages = _messages(request, self.send_reasoning)
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if request.tools:
            body["tools"] = [_tool(tool) for tool in request.tools]
            body.update((k, v) for k, v in request.options.items() if k in OPTIONS)
        else:  # the API refuses tool options without tools; they would mean nothing
            body.update(
                (k, v)
                for k, v in request.options.items()
                if k in OPTIONS and k not in _TOOL_OPTIONS
            )
        if stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def _parse(self, data: Any) -> ModelResponse:
        with reading(_API):
            error = _embedded_error(data)
            if error is not None:
                raise error
            choice = data["choices"][0]
            message = choice["message"]
            raw_calls = message.get("tool_calls") or ()
            if raw_calls and choice.get("finish_reason") == "length":
                last = raw_calls[-1]
                function = last.get("function") if isinstance(last, dict) else None
                raise _cut_off(function.get("name") if isinstance(function, dict) else None)
            calls = tuple(_tool_call(call, index) for index, call in enumerate(raw_calls))
            signatures = [_signature(call) for call in raw_calls]
            text, thought = _content(message)
            return ModelResponse(
                Message.assistant(
                    text, calls, reasoning=_parts(_reasoning(message) or thought, signatures)
                ),
                _usage(data.get("usage")),
            )

    def _error_in(self, data: Any) -> ModelAPIError | None:
        return _embedded_error(data)

    def _assembler(self) -> _Stream:
        return _Stream()


# -- requests -----------------------------------------------------------------------------


_TOOL_OPTIONS = frozenset({"tool_choice", "parallel_tool_calls"})


def _messages(request: ModelRequest, send_reasoning: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    out.extend(_message(message, send_reasoning) for message in request.messages)
    return out


def _message(message: Message, send_reasoning: bool) -> dict[str, Any]:
    if message.role == "assistant":
        # content may be null only beside tool_calls: an empty answer goes as "".
        content = message.content or (None if message.tool_calls else "")
        entry: dict[str, Any] = {"role": "assistant", "content": content}
        if message.tool_calls:
            if send_reasoning:
                # DeepSeek's thinking mode refuses a later request whose tool-calling
                # turns lack their reasoning_content; with a plain answer it is ignored,
                # so it is left out there.
                reasoning = "".join(
                    part.text for part in message.reasoning if part.provider == PROVIDER
                )
                if reasoning:
                    entry["reasoning_content"] = reasoning
            entry["tool_calls"] = calls = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _dumps(call.arguments)},
                }
                for call in message.tool_calls
            ]
            # Gemini's thought signatures go back on the calls they came with, whatever
            # send_reasoning says: Gemini 3 refuses a tool-calling turn without them.
            for part in message.reasoning:
                if (
                    part.provider == PROVIDER
                    and part.signature is not None
                    and part.calls_before < len(calls)
                ):
                    calls[part.calls_before]["extra_content"] = {
                        "google": {"thought_signature": part.signature}
                    }
        return entry
    if message.role == "tool":
        result = tool_result(message)
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


def _embedded_error(data: Any) -> ModelAPIError | None:
    """The error in an answer (or a stream chunk) that is ``{"error": ...}`` with a
    success status: an API error, not a malformed answer. OpenAI reports an error that
    happens mid-stream this way; so do some compatible servers for any error.

    It carries the status the same error would have had as an HTTP answer (its
    ``status_code``, and the hint in its message), so an application can tell a rate
    limit from a bad request. It is never retried: the server did answer, and a stream
    may already have handed out part of its reply.

    Beside ``choices`` the error counts only when a choice ended because of it
    (``finish_reason: "error"``, as OpenRouter reports a provider failing mid-answer);
    otherwise it is a warning some servers add to an answer that is whole. OpenRouter may
    also put the error on the failed choice itself."""
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if error is None:
        error = _choice_error(data.get("choices"))
        if error is None:
            return None
    elif "choices" in data and _choice_error(data["choices"]) is None:
        return None
    details = error if isinstance(error, dict) else {}
    message = details.get("message") if isinstance(error, dict) else error
    message = message if isinstance(message, str) and message else json.dumps(error)
    status = _error_status(details)
    return api_error(_API, f"reported an error (HTTP {status})", status, message)


def _choice_error(choices: Any) -> Any:
    """The error a choice that ended with ``finish_reason: "error"`` carries (a sentence
    saying so when it carries none); ``None`` when no choice ended so."""
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason") == "error":
                return choice.get("error") or 'the answer ended with finish_reason "error"'
    return None


def _error_status(error: Mapping[str, Any]) -> int:
    for key in ("code", "status", "type"):
        value = error.get(key)
        if type(value) is int and 400 <= value <= 599:
            return value
        if isinstance(value, str) and value in _ERROR_STATUS:
            return _ERROR_STATUS[value]
    return 500


def _reasoning(fields: Mapping[str, Any]) -> str:
    """The reasoning text in a message or delta, from the first field that has some
    (a server that fills both repeats one in the other)."""
    for field in _REASONING_FIELDS:
        value = fields.get(field)
        if isinstance(value, str) and value:
            return value
    return ""


def _cut_off(name: Any) -> ModelResponseError:
    """The error for an answer that the token limit cut off while it called tools (the
    last one *name*): its arguments may be partial (even ``""``, which reads as ``{}``),
    so none of the turn's calls may run."""
    which = f" {name!r}" if isinstance(name, str) and name else ""
    return ModelResponseError(
        f'The {_API} answer was cut off by the token limit (finish_reason "length") while '
        f"the model was calling tool{which}: its arguments may be incomplete, so no tool of "
        "this turn ran. Raise max_tokens (or max_completion_tokens) in the run's options "
        "and run again."
    )


def _signature(fields: Any) -> str | None:
    """Gemini's thought signature on a tool call (``extra_content.google``), if any."""
    extra = fields.get("extra_content") if isinstance(fields, dict) else None
    google = extra.get("google") if isinstance(extra, dict) else None
    signature = google.get("thought_signature") if isinstance(google, dict) else None
    return signature if isinstance(signature, str) and signature else None


def _parts(reasoning: str, signatures: Sequence[str | None]) -> list[ReasoningPart]:
    """The message's reasoning: its text, then a part without text for each call's
    thought signature, placed before that call."""
    parts = [ReasoningPart(reasoning, provider=PROVIDER)] if reasoning else []
    parts.extend(
        ReasoningPart(signature=signature, provider=PROVIDER, calls_before=index)
        for index, signature in enumerate(signatures)
        if signature is not None
    )
    return parts


def _content(message: Mapping[str, Any]) -> tuple[str, str]:
    """The answer's text, and the reasoning its content chunks held (if it came as a
    list of chunks)."""
    # A refusal is the model's whole answer, so it is the text the run reports.
    text = message.get("content") or message.get("refusal") or ""
    if isinstance(text, list):
        return _chunks(text, "answer")
    if not isinstance(text, str):
        raise ModelResponseError(
            f"The {_API} answer's message content is a {type(text).__name__}, not text. "
            f"Check that the server really implements the {_API} API."
        )
    return text, ""


def _chunks(parts: list[Any], where: str) -> tuple[str, str]:
    """The text and the reasoning of content sent as a list of typed chunks, as Mistral's
    reasoning models send it (``text`` chunks, and ``thinking`` chunks that hold text
    chunks); other kinds of chunk (references, images) carry nothing Runlet keeps."""
    text: list[str] = []
    thought: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            raise ModelResponseError(
                f"The {_API} {where} sent message content as a list holding a "
                f"{type(part).__name__}, not content chunks. Check that the server really "
                f"implements the {_API} API."
            )
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "thinking":
            thinking = part.get("thinking")
            if isinstance(thinking, str):
                thought.append(thinking)
            elif isinstance(thinking, list):
                thought.extend(
                    item["text"]
                    for item in thinking
                    if isinstance(item, dict) and isinstance(item.get("text"), str)
                )
    return "".join(text), "".join(thought)


def _call_id(value: Any, index: int) -> str:
    # A few compatible servers leave ids out; the transcript still needs one per call.
    if isinstance(value, str) and value:
        return value
    return f"call_{index}_{os.urandom(6).hex()}"


def _tool_call(call: Mapping[str, Any], index: int) -> ToolCall:
    _check_call_type(call.get("type"), "answer", index)
    function = call["function"]
    name = call_text(function.get("name"), "name", _API)
    text = _arguments_text(function.get("arguments"), "answer", index)
    arguments = parse_arguments(text, name, _API)
    return ToolCall(_call_id(call.get("id"), index), name, arguments)


def _check_call_type(kind: Any, where: str, ordinal: int) -> None:
    """Refuse a tool call of a type other than ``function`` (a ``custom`` tool declared
    through ``extra_body``): Runlet runs function tools only."""
    if kind is not None and kind != "function":
        raise ModelResponseError(
            f"The {_API} {where} holds tool call {ordinal} of type {kind!r}; Runlet runs "
            "function tools only. Declare the tool as a ToolSpec rather than in extra_body."
        )


def _arguments_text(value: Any, where: str, ordinal: int) -> str:
    """A tool call's arguments as the API sends them, a string of JSON ("" for none)."""
    if not value:
        return ""
    if not isinstance(value, str):
        raise ModelResponseError(
            f"The {_API} {where} sent the arguments of tool call {ordinal} as "
            f"{type(value).__name__}, not as a string of JSON. Check that the server really "
            f"implements the {_API} API."
        )
    return value


def _usage(usage: Any) -> Usage:
    # Some compatible servers report no usage; the request still counts.
    if not isinstance(usage, dict):
        return Usage(requests=1)
    # Cached prompt tokens are part of prompt_tokens. OpenAI reports them in
    # prompt_tokens_details; DeepSeek as prompt_cache_hit_tokens.
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("prompt_cache_hit_tokens")
    return Usage(
        _count(usage.get("prompt_tokens")),
        _count(usage.get("completion_tokens")),
        1,
        cache_read_tokens=_count(cached),
    )


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


@attrs.define
class _PartialCall:
    ordinal: int
    id: str | None = None
    name: str | None = None
    arguments: list[str] = attrs.Factory(list)
    signature: str | None = None

    def whole(self) -> bool:
        """Whether the call has its name and arguments that are a complete JSON object."""
        if not self.name:
            return False
        try:
            return isinstance(loads("".join(self.arguments)), dict)
        except (ValueError, RecursionError):
            return False


class _Stream:
    """Assembles a streamed Chat Completions answer from its ``data:`` chunks."""

    def __init__(self) -> None:
        self.done = False
        self._finished = False
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[_PartialCall] = []  # in the order they first appeared
        self._at: dict[int, _PartialCall] = {}  # the API's own index: the call there now
        self._last: _PartialCall | None = None
        self._usage = Usage(requests=1)
        self._reason: Any = None

    def feed(self, event: ServerSentEvent) -> list[ModelStreamItem]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = parse_json(event.data, _API)
        if event.event == "error" and isinstance(chunk, dict) and "error" not in chunk:
            chunk = {"error": chunk}  # an older llama-server's error: field, the error itself
        with reading(_API):
            error = _embedded_error(chunk)
            if error is not None:
                raise error
            if chunk.get("usage"):
                self._usage = _usage(chunk["usage"])
            items: list[ModelStreamItem] = []
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) == 0:  # only one choice is ever asked for
                    self._choice(choice, items)
            return items

    def _choice(self, choice: Mapping[str, Any], items: list[ModelStreamItem]) -> None:
        delta = choice.get("delta") or {}
        reasoning = _reasoning(delta)
        if reasoning:
            self._reasoning.append(reasoning)
            items.append(ReasoningDelta(reasoning))
        text = delta.get("content") or delta.get("refusal")
        if isinstance(text, list):  # chunks: Mistral's reasoning models
            text, thought = _chunks(text, "stream")
            if thought:
                self._reasoning.append(thought)
                items.append(ReasoningDelta(thought))
        if text:
            if not isinstance(text, str):
                raise ModelResponseError(
                    f"The {_API} stream sent message content as a {type(text).__name__}, "
                    f"not text. Check that the server really implements the {_API} API."
                )
            self._text.append(text)
            items.append(TextDelta(text))
        for piece in delta.get("tool_calls") or ():
            index = piece.get("index")
            call_id = piece.get("id")
            if index is None:
                # A few servers omit it: an id other than the current call's starts a new
                # call (some repeat the id on every piece of one call).
                partial = self._last
                if partial is None or (call_id and call_id != partial.id):
                    partial = self._new_call()
            else:
                # Some (Ollama) give every call index 0, each whole in its own chunk with
                # its own id: a new id at an index starts a new call there too, once the
                # call there is whole (a server that varies the id between the pieces of
                # one call goes on with it).
                partial = self._at.get(index)
                if partial is None or (
                    call_id and partial.id and call_id != partial.id and partial.whole()
                ):
                    partial = self._at[index] = self._new_call()
            self._last = partial
            _check_call_type(piece.get("type"), "stream", partial.ordinal)
            function = piece.get("function") or {}
            name = function.get("name")
            arguments = _arguments_text(function.get("arguments"), "stream", partial.ordinal)
            if call_id:
                partial.id = call_id
            if name:
                partial.name = name
            signature = _signature(piece)
            if signature is not None:
                partial.signature = signature
            partial.arguments.append(arguments)
            items.append(ToolCallDelta(partial.ordinal, call_id or None, name or None, arguments))
        reason = choice.get("finish_reason")
        if reason:
            self._finished = True
            self._reason = reason

    def _new_call(self) -> _PartialCall:
        partial = _PartialCall(len(self._calls))
        self._calls.append(partial)
        return partial

    def finish(self) -> ModelResponse:
        if not (self.done or self._finished):
            raise ModelResponseError(
                f"The {_API} stream ended before the answer was complete (no finish_reason "
                "and no [DONE]). The partial answer was dropped; run again."
            )
        if self._calls and self._reason == "length":
            last = self._calls[-1]
            raise _cut_off(last.name)
        calls = []
        for index, partial in enumerate(self._calls):
            if not partial.name:
                raise ModelResponseError(
                    f"The {_API} stream sent tool call {index} without a function name. Check "
                    f"that the server really implements the {_API} API."
                )
            name = call_text(partial.name, "name", _API)
            arguments = parse_arguments("".join(partial.arguments), name, _API)
            calls.append(ToolCall(_call_id(partial.id, index), name, arguments))
        message = Message.assistant(
            "".join(self._text),
            calls,
            reasoning=_parts(
                "".join(self._reasoning), [partial.signature for partial in self._calls]
            ),
        )
        return ModelResponse(message, self._usage)
