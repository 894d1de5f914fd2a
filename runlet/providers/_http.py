"""What the HTTP adapters share: client ownership, retries, server-sent events, errors.

An adapter subclasses :class:`HTTPModel` and supplies three things: how a
:class:`~runlet.ModelRequest` becomes a request body, how an answer becomes a
:class:`~runlet.ModelResponse`, and a :class:`StreamAssembler` that turns server-sent
events into stream items. Everything about the wire that is not specific to one API
lives here, once.
"""

from __future__ import annotations

import contextlib
import email.utils
import importlib
import json
import math
import random
import re
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import aclosing, asynccontextmanager, contextmanager
from datetime import datetime, timezone
from functools import partial
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs

try:
    import httpx
except ImportError as exc:  # see test_import_without_httpx_says_what_to_install
    raise ImportError(
        'Runlet\'s HTTP model adapters need httpx. Install it with: pip install "runlet[http]"'
    ) from exc

from .._errors import (
    ConfigurationError,
    ModelAPIError,
    ModelConnectionError,
    ModelError,
    ModelResponseError,
)
from .._messages import Message, ToolResult
from .._model import ModelRequest, ModelResponse, ModelStreamItem
from .._util import PerLoop
from ._retry import RetryPolicy

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "HTTPModel",
    "RetryPolicy",
    "ServerSentEvent",
    "SSEDecoder",
    "StreamAssembler",
    "api_error",
    "loads",
    "parse_arguments",
    "parse_json",
    "parse_retry_after",
    "reading",
    "sentence",
    "should_retry",
    "tool_result",
]

DEFAULT_TIMEOUT = 600.0
"""Seconds a client the adapter creates waits for the server to read, write or hand out
a pooled connection. Model answers can take minutes, so httpx's own 5-second default
would be too short."""

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds a client the adapter creates waits to open a connection. A server that does
not accept one within seconds is down or unreachable; waiting as long as for an answer
would only delay the retry."""

# 408 and 409 are transient by nature (the server timed out, or lost a race); 429 asks
# us to slow down; any 5xx (including Anthropic's 529 "overloaded") is the server's fault.
_RETRY_4XX = frozenset({408, 409, 429})

# How long to wait for the rest of a streamed body after its end-of-answer event.
_TAIL_SECONDS = 1.0

# How much of an unparseable error body goes into an exception message.
_SNIPPET = 500

# A surrogate code point on its own, which UTF-8 cannot encode.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# The TLS settings every client the adapters make shares (httpx's defaults: its CA bundle,
# or SSL_CERT_FILE / SSL_CERT_DIR), read once per process, in a worker thread: reading
# the CA bundle takes 50-100 ms, which each new client would otherwise spend inside the
# event loop, holding up every other task.
_TLS: list[Any] = []
_TLS_LOCK = threading.Lock()


# Event loops an adapter keeps a client for at once; the oldest goes first.
_LOOPS_KEPT = 16


def _tls_context() -> Any:
    with _TLS_LOCK:  # two first requests at once read it once
        if not _TLS:
            # httpx imports its transport (httpcore) when the first client is made:
            # about 100 ms, done here rather than in the event loop.
            with contextlib.suppress(ImportError):
                importlib.import_module("httpcore")
            create = getattr(httpx, "create_ssl_context", None)
            _TLS.append(True if create is None else create())
        return _TLS[0]


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for, in seconds, or ``None`` when it asks for none.

    Understands ``Retry-After`` as seconds or as an HTTP date, and the
    ``retry-after-ms`` header some OpenAI-compatible servers send; the more precise
    milliseconds header wins when both are present.
    """
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        seconds = _finite(milliseconds)
        if seconds is not None:
            return max(0.0, seconds / 1000.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is None:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # "-0000" means UTC with no zone given
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - datetime.now(timezone.utc)).total_seconds()
    return max(0.0, seconds)


def _finite(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@attrs.frozen
class ServerSentEvent:
    """One dispatched server-sent event.

    Attributes:
        event: The ``event:`` field, or ``"message"`` when the server sent none.
        data: The ``data:`` lines, joined with newlines.
    """

    event: str
    data: str


class SSEDecoder:
    """Turns the lines of a ``text/event-stream`` body into events, one line at a time.

    It follows the HTML server-sent events rules that matter for model APIs: ``data``
    lines accumulate until a blank line dispatches them, a leading space after the colon
    is dropped, comment lines (starting with ``:``) and ``id``/``retry`` fields are
    ignored, and an event with no data is not dispatched.

    One field outside the standard is kept: ``error:``, which ``llama-server`` builds from
    before September 2025 used to report a failure mid-stream. Its value becomes the data
    of an event named ``error``, so the failure is raised instead of silently ignored.
    """

    __slots__ = ("_data", "_event")

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> ServerSentEvent | None:
        """Take one line (without its line break); return an event when one is complete."""
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = ServerSentEvent(self._event or "message", "\n".join(self._data))
            self._event = ""
            self._data = []
            return event
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "error":
            self._event = "error"
            self._data.append(value)
        return None


class StreamAssembler(Protocol):
    """Builds one streamed answer from its server-sent events (one per stream)."""

    done: bool
    """Whether the API signalled the end of the answer; reading stops there."""

    def feed(self, event: ServerSentEvent) -> list[ModelStreamItem]:
        """Take one event; return the deltas it carries (possibly none).

        Raises:
            ModelResponseError: The event is not what the API documents.
            ModelAPIError: The event reports an error.
        """
        ...

    def finish(self) -> ModelResponse:
        """The complete answer, once the events have run out.

        Raises:
            ModelResponseError: The stream ended before the answer was complete, or a
                tool call's arguments are not a JSON object.
        """
        ...


@contextmanager
def reading(api: str) -> Iterator[None]:
    """Turn a surprise while reading an API's answer into a clear
    :class:`~runlet.ModelResponseError`.

    The adapters index into answers as the API documents them; a server that answers
    with a different shape (a missing key, a list where an object belongs) must not
    surface as a bare ``KeyError`` from deep inside an adapter.
    """
    try:
        yield
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ModelResponseError(
            f"The {api} answer does not have the documented shape "
            f"({type(exc).__name__}: {exc}). Check that the server really implements "
            f"the {api} API."
        ) from exc


def _not_a_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def loads(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity``, which Python
    reads but JSON does not have: a model's ``{"amount": NaN}`` would otherwise pass a
    schema's bounds (NaN compares false with everything) and an approval policy's
    ``amount > 100``. Raises ``ValueError``, or ``RecursionError`` for data nested
    deeper than Python can read."""
    return json.loads(text, parse_constant=_not_a_constant)


def parse_json(text: str, api: str) -> Any:
    """Parse JSON text an API sent, or raise :class:`~runlet.ModelResponseError`."""
    try:
        return loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelResponseError(
            f"The {api} answer is not valid JSON ({_why(exc)}): {text[:_SNIPPET]!r}. Check "
            f"that the server really implements the {api} API."
        ) from exc


def _why(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested deeper than Python can read"
    return str(exc)


def call_text(value: Any, what: str, api: str) -> str:
    """*value*, a tool call's name or id, if it is a non-empty string.

    Raises:
        ModelResponseError: It is missing, empty or not a string; a transcript (and a
            checkpoint) must never hold such a call.
    """
    if isinstance(value, str) and value:
        return value
    raise ModelResponseError(
        f"The {api} answer has a tool call whose {what} is {value!r}, not a non-empty "
        f"string. Check that the server really implements the {api} API."
    )


def parse_arguments(text: str, tool_name: str, api: str) -> dict[str, Any]:
    """Parse a tool call's JSON arguments into a dict.

    Empty text means no arguments: some servers send ``""`` for a tool without
    parameters.

    Raises:
        ModelResponseError: The text is not JSON, or not a JSON object.
    """
    if not text.strip():
        return {}
    try:
        arguments = loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelResponseError(
            f"The {api} model called tool {tool_name!r} with arguments that are not valid "
            f"JSON ({_why(exc)}): {text[:_SNIPPET]!r}. Run again; if it keeps happening, "
            "describe the tool's arguments more plainly."
        ) from exc
    if not isinstance(arguments, dict):
        raise ModelResponseError(
            f"The {api} model called tool {tool_name!r} with arguments that are a JSON "
            f"{type(arguments).__name__}, not an object: {text[:_SNIPPET]!r}. Give the tool "
            "an input schema of type object."
        )
    return arguments


def _error_message(response: httpx.Response) -> str:
    """The API's own words for what went wrong.

    OpenAI and Anthropic put it in ``error.message``; OpenAI-compatible servers vary
    (``{"error": "..."}`` from Ollama, ``{"message": ...}`` or ``{"detail": ...}`` from
    others, and Gemini's OpenAI-compatible endpoint wraps OpenAI's shape in a list).
    Anything else is quoted as sent.
    """
    text = response.text
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for candidate in (error, data.get("message"), data.get("detail")):
            if isinstance(candidate, str) and candidate:
                return candidate
    return text.strip()[:_SNIPPET] or response.reason_phrase or "no details"


def sentence(text: str) -> str:
    """*text* as a sentence: stripped, ending in a full stop unless it already ends in
    one (or in a question or exclamation mark)."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _hint(status: int) -> str:
    if status in (401, 403):
        return " Check the API key and that it may use this model."
    if status == 404:
        return " Check base_url and the model name."
    if should_retry(status):
        return " This is usually temporary: try again later."
    return ""


def api_error(
    api: str,
    what: str,
    status: int,
    message: str,
    *,
    attempts: int = 1,
    api_request_id: str | None = None,
) -> ModelAPIError:
    """The :class:`~runlet.ModelAPIError` for an error the API reported.

    Args:
        api: The API's name.
        what: How it reported it, e.g. ``"answered 429 Too Many Requests"``.
        status: The HTTP status, or the one the error's type stands for.
        message: The API's own words.
        attempts: How many attempts failed.
        api_request_id: The id the API gave the request, if it sent one.
    """
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    text = f"The {api} API {what}{tries}: {sentence(message)}{_hint(status)}"
    if api_request_id:
        text += f" (request id {api_request_id})"
    return ModelAPIError(text, status_code=status, body=message, api_request_id=api_request_id)


def _response_error(response: httpx.Response, api: str, attempts: int) -> ModelAPIError:
    status = response.status_code
    return api_error(
        api,
        f"answered {status} {response.reason_phrase}".rstrip(),
        status,
        _error_message(response),
        attempts=attempts,
        api_request_id=_request_id(response),
    )


def _request_id(response: httpx.Response) -> str | None:
    """The id the API gave the request (Anthropic's ``request-id``, OpenAI's
    ``x-request-id``), if it sent one."""
    headers = response.headers
    found: str | None = headers.get("request-id") or headers.get("x-request-id")
    return found


def _named(error: ModelAPIError, response: httpx.Response) -> ModelAPIError:
    """*error*, reported in the body of a successful answer (or in its stream), with the
    id the API gave the request in its headers."""
    api_request_id = _request_id(response)
    if error.api_request_id is not None or not api_request_id:
        return error
    return ModelAPIError(
        f"{error} (request id {api_request_id})",
        status_code=error.status_code,
        body=error.body,
        api_request_id=api_request_id,
    )


def tool_result(message: Message) -> ToolResult:
    """The result a tool message carries.

    Raises:
        ModelError: The message has none, so the API could not tell which call it answers.
    """
    if message.tool_result is None:
        raise ModelError(
            "A tool message without a tool_result cannot be sent: the API needs the id "
            "of the call it answers. Build tool messages with Message.tool(ToolResult(...))."
        )
    return message.tool_result


def should_retry(status: int) -> bool:
    """Whether an answer with this HTTP status may succeed if sent again."""
    return status >= 500 or status in _RETRY_4XX


# The only line breaks of an event stream (a JSON string may hold U+2028, U+0085 and the
# like as they are; str.splitlines() and httpx's aiter_lines() would break lines there).
_SSE_LINE_BREAK = re.compile(r"\r\n|\r|\n")


async def sse_lines(texts: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    """The lines of an event stream's decoded text, each without its line break: a line
    ends at CRLF, LF or CR only, as the server-sent events format says, wherever the
    chunks of *texts* split it. Iterating to the end iterates *texts* to its end."""
    begun: list[str] = []  # the start of a line that has not ended yet, chunk by chunk
    after_cr = False  # the last chunk ended in CR: a LF starting the next one ends no line
    async for text in texts:
        if after_cr and text.startswith("\n"):
            text = text[1:]
        after_cr = text.endswith("\r")
        # Only the new text is searched for line breaks, so a long line costs its length
        # once, not once per chunk it came in.
        lines = _SSE_LINE_BREAK.split(text)
        rest = lines.pop()
        if lines:
            if begun:
                begun.append(lines[0])
                lines[0] = "".join(begun)
                begun = []
            for line in lines:
                yield line
        if rest:
            begun.append(rest)
    if begun:
        yield "".join(begun)


async def _read_tail(lines: AsyncGenerator[str, None]) -> None:
    """Read what follows the end-of-answer event, so the connection can be reused.

    The APIs end the body right after it; the time limit only guards against a server
    that keeps the response open, which then costs a new connection, nothing more.
    """
    with anyio.move_on_after(_TAIL_SECONDS):
        try:
            async for _ in lines:
                pass
        except httpx.TransportError:
            pass  # the answer is complete; a broken tail changes nothing


async def _run_down(lines: AsyncGenerator[str, None]) -> None:
    """Run the line iterator over httpx's text iterator to its end once its response is
    closed.

    Closing only our outermost generator would leave the generators httpx and httpcore
    nest inside it suspended; trio then warns about each when it is garbage collected.
    Once the response is closed, reading on raises at the bottom of that chain and so
    finishes every generator in it. The socket is closed, so this never waits; the
    shield keeps a pending cancellation from interrupting the clean-up, and the
    cancellation itself still propagates from the caller's ``finally``.
    """
    with anyio.CancelScope(shield=True):
        try:
            async for _ in lines:
                pass
        except (httpx.HTTPError, httpx.StreamError):
            pass  # the expected end: reading a closed stream


_M = TypeVar("_M", bound="HTTPModel")


# RFC 9110: a header name is a token; a value is visible ASCII with inner spaces or tabs.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?|")


def api_root(base_url: str | None, default: str, path: str) -> str:
    """*base_url* (or *default*) without its trailing slash, for *path* to be appended.

    Raises:
        ConfigurationError: It is not text, not an http(s) URL httpx can use (a bad port
            or host), or it has a query string or a fragment, which the appended path
            would end up inside.
    """
    root: object = base_url or default  # a user's: checked as anything
    if not isinstance(root, str):
        raise ConfigurationError(f"base_url must be a URL (a str), not {root!r}.")
    if "?" in root or "#" in root:
        raise ConfigurationError(
            f"base_url {shown_url(root)!r} has a query string or a fragment, but Runlet appends "
            f"{path} to base_url, so it would end up inside it. Give the URL without it, and "
            "any query parameters with http_client=httpx.AsyncClient(params={...}). (For "
            "Azure OpenAI, the base URL https://<resource>.openai.azure.com/openai/v1 "
            "needs no api-version.)"
        )
    try:
        scheme = httpx.URL(root).scheme
    except (httpx.InvalidURL, ValueError) as exc:  # a bad port or host, say
        raise ConfigurationError(
            f"base_url {shown_url(root)!r} is not a URL httpx can use: {exc}. Give the API's "
            "base URL, such as https://api.example.com/v1."
        ) from None
    if scheme not in ("http", "https"):
        raise ConfigurationError(
            f"base_url {shown_url(root)!r} must start with https:// (or http:// for a server "
            "on your own network)."
        )
    return root.rstrip("/")


def shown_url(url: str) -> str:
    """*url* as messages and reprs show it: a password in it replaced by ``***``. The
    user information runs to the last ``@`` before the path, as httpx reads it (a user
    name that is an e-mail address, a password holding ``@``, ``?`` or ``#``); the
    password is what follows its first ``:``."""
    scheme, separator, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    if not separator or "@" not in authority:
        return url
    user_information = authority[: authority.rindex("@")]
    user, colon, _ = user_information.partition(":")
    if not colon:
        return url
    return f"{scheme}://{user}:***{rest[len(user_information) :]}"


def merge_headers(*layers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers of *layers*, a later layer's value replacing an earlier one's. Names
    compare without regard to case, as HTTP's do, so a caller's ``Authorization`` replaces
    the adapter's ``authorization`` instead of going out beside it.

    Raises:
        ConfigurationError: A name or value is not a string, or a value holds a character
            HTTP does not allow (such as the newline at the end of a key read from a file).
    """
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        # Typed as strings, but given by users: checked as anything.
        given = cast("Mapping[object, object]", layer or {})
        for name, value in given.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigurationError(
                    f"HTTP headers must map strings to strings; got {name!r}: "
                    f"{type(value).__name__}."
                )
            if not _TOKEN.fullmatch(name):
                raise ConfigurationError(
                    f"{name!r} is not an HTTP header name: use letters, digits and "
                    "!#$%&'*+-.^_`|~ only."
                )
            if value != value.strip(" \t") or not _FIELD_VALUE.fullmatch(value):
                # The value itself may be a secret: only its name goes in the message.
                raise ConfigurationError(
                    f"The value of HTTP header {name!r} holds something HTTP does not allow "
                    "(a control character such as a newline, a non-ASCII character, or "
                    "spaces at either end). Strip it, for instance from an API key read "
                    "from a file."
                )
            merged[name.lower()] = (name, value)
    return dict(merged.values())


class HTTPModel:
    """The machinery of an HTTP model adapter: owning (or borrowing) an
    :class:`httpx.AsyncClient`, posting JSON with retries, and streaming.

    Subclasses set :attr:`api` and implement :meth:`_body`, :meth:`_parse` and
    :meth:`_assembler`.
    """

    api = "model"
    """The API's name, as error messages show it."""

    def __init__(
        self,
        *,
        model: str,
        url: str,
        headers: Mapping[str, str],
        http_client: httpx.AsyncClient | None,
        timeout: float | None,
        connect_timeout: float | None,
        retry: RetryPolicy,
        extra_body: Mapping[str, Any] | None,
    ) -> None:
        if not model:
            raise ConfigurationError(f"model must be a non-empty model name, not {model!r}.")
        given: tuple[tuple[str, object], ...] = (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
        )
        for name, seconds in given:
            if seconds is not None and (
                isinstance(seconds, bool)
                or not isinstance(seconds, (int, float))
                or not seconds > 0
            ):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds or None (no limit), "
                    f"not {seconds!r}."
                )
        self.model = model
        self._url = url
        self._shown_url = shown_url(url)  # for messages and the repr: never a password
        self._headers = merge_headers({"content-type": "application/json"}, headers)
        self._given_client = http_client
        # One client per event loop (by its anyio token): a client's connections belong
        # to the loop that opened them. Two long-lived loops (a sync framework's worker
        # threads with a portal each) then keep a client each.
        self._own_clients: PerLoop[httpx.AsyncClient] = PerLoop(_LOOPS_KEPT)
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._retry = retry
        self._extra_body = dict(extra_body or {})
        self._rng = random.Random()
        # The clock and the sleep of the retry loop; tests replace them to run a
        # backoff schedule without waiting for it.
        self._clock: Callable[[], float] = anyio.current_time
        self._sleep: Callable[[float], Awaitable[None]] = anyio.sleep

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs.
        return f"{type(self).__name__}(model={self.model!r}, url={self._shown_url!r})"

    @property
    def retry(self) -> RetryPolicy:
        """The :class:`~runlet.providers.RetryPolicy` this adapter follows."""
        return self._retry

    # -- client ownership ---------------------------------------------------------------

    async def _client(self) -> httpx.AsyncClient:
        if self._given_client is not None:
            return self._given_client
        client = self._own_clients.this_loop()
        if client is None:
            # Created on first use, inside the event loop that will use it, so a model
            # built at import time holds no sockets; after aclose() the next request
            # starts a fresh client. The client of a loop that came and went long ago
            # is left behind: its connections belong to that loop, which alone could
            # close them; they close when it is collected.
            tls = _TLS[0] if _TLS else await anyio.to_thread.run_sync(_tls_context)
            client = self._own_clients.this_loop_or(
                partial(httpx.AsyncClient, timeout=self._timeout, verify=tls)
            )
        return client

    async def aclose(self) -> None:
        """Close the HTTP client the adapter created, if any. A client passed in as
        ``http_client`` belongs to the caller and is never closed here."""
        client = self._own_clients.pop_this_loop()
        if client is not None:
            await client.aclose()

    async def __aenter__(self: _M) -> _M:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- what subclasses supply ---------------------------------------------------------

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _parse(self, data: Any) -> ModelResponse:
        raise NotImplementedError

    def _assembler(self) -> StreamAssembler:
        raise NotImplementedError

    def _error_in(self, data: Any) -> ModelAPIError | None:
        """The API error a successful (2xx) JSON body reports, if it reports one."""
        return None

    # -- the model protocol -------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send *request* and return the model's answer.

        Raises:
            ModelAPIError: The API refused the request (4xx), or kept failing (429, 5xx)
                until the retries ran out.
            ModelConnectionError: The API could not be reached, even after retrying.
            ModelResponseError: The answer is not what the API documents (bad JSON,
                tool arguments that are not a JSON object).
        """
        response = await self._send(self._encode(request, stream=False), stream=False)
        try:
            return self._parse(parse_json(response.text, self.api))
        except ModelAPIError as exc:
            raise _named(exc, response) from exc.__cause__

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelStreamItem]]:
        """Stream the answer to *request*: use as ``async with model.stream(request) as
        items: async for item in items: ...``.

        The items are :class:`~runlet.TextDelta`, :class:`~runlet.ReasoningDelta` and
        :class:`~runlet.ToolCallDelta` pieces as they arrive, then one complete
        :class:`~runlet.ModelResponse` with the usage. Opening the stream is retried
        like :meth:`complete`; once items have been handed out, a failure is raised
        rather than retried, since a retry would repeat them. Leaving the block closes
        the connection.

        Raises:
            ModelAPIError: As for :meth:`complete`, or an error event in the stream.
            ModelConnectionError: As for :meth:`complete`, or the stream was cut off.
            ModelResponseError: As for :meth:`complete`, the stream ended early, or the
                server answered without streaming (not ``text/event-stream``).
        """
        response = await self._send(self._encode(request, stream=True), stream=True)
        try:
            await self._check_streaming(response)
            async with aclosing(self._items(response, self._assembler())) as items:
                yield items
        finally:
            await response.aclose()

    async def _check_streaming(self, response: httpx.Response) -> None:
        """Refuse an answer to a streaming request that is not a stream: read as one,
        it would only look cut short."""
        content_type = response.headers.get("content-type", "")
        media_type = content_type.partition(";")[0].strip().lower()
        if media_type == "text/event-stream":
            return
        try:
            await response.aread()
        except httpx.HTTPError:
            text = ""
        else:
            text = response.text
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        error = self._error_in(data)
        if error is not None:
            raise _named(error, response)
        raise ModelResponseError(
            f"The {self.api} server at {self._shown_url} answered a streaming request with "
            f"{media_type or 'no content type'}, not text/event-stream: it does not stream "
            "(or a proxy in between buffers the stream). Use Runtime.run(), which does "
            "not stream, with this server, or make the server stream."
        )

    async def _items(
        self, response: httpx.Response, assembler: StreamAssembler
    ) -> AsyncGenerator[ModelStreamItem, None]:
        decoder = SSEDecoder()
        lines = sse_lines(cast(AsyncGenerator[str, None], response.aiter_text()))
        try:
            async for line in lines:
                event = decoder.feed(line)
                if event is None:
                    continue
                for item in assembler.feed(event):
                    yield item
                if assembler.done:
                    await _read_tail(lines)
                    break
        except ModelAPIError as exc:  # an error event: the API named the request
            raise _named(exc, response) from exc.__cause__
        except httpx.TransportError as exc:
            raise ModelConnectionError(
                f"The {self.api} stream from {self._shown_url} was cut off: {type(exc).__name__}: "
                f"{sentence(str(exc) or 'no details')} The partial answer was dropped; "
                "run again."
            ) from exc
        except httpx.HTTPError as exc:
            raise _not_retried(exc, self.api, self._shown_url) from exc
        finally:
            await response.aclose()
            await _run_down(lines)
        yield assembler.finish()

    # -- sending with retries -----------------------------------------------------------

    def _encode(self, request: ModelRequest, *, stream: bool) -> bytes:
        own = self._body(request, stream=stream)
        body = {**own, **self._extra_body}
        extra_tools = self._extra_body.get("tools")
        if "tools" in own and isinstance(extra_tools, list):
            # The vendor's own tools (Anthropic's web search, say) go beside the agent's.
            body["tools"] = [*own["tools"], *extra_tools]
        try:
            text = json.dumps(body, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ModelError(
                f"The {self.api} request cannot be sent as JSON: {sentence(str(exc))} Keep "
                "the values in options and extra_body JSON-compatible."
            ) from exc
        try:
            return text.encode()
        except UnicodeEncodeError:
            # A lone surrogate, which no UTF-8 text can hold: a str made from bytes that
            # were not UTF-8 (a file name from os.listdir(), say), in a tool result or a
            # message. Every later request of the run would carry it, so rather than fail
            # each of them, it goes as U+FFFD, the replacement character.
            return _LONE_SURROGATE.sub("\ufffd", text).encode()

    async def _send(self, content: bytes, *, stream: bool) -> httpx.Response:
        """POST *content*, retrying what may succeed later; return a 2xx response
        (still open when *stream*)."""
        client = await self._client()
        policy = self._retry
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            request = client.build_request(
                "POST", self._url, content=content, headers=self._headers
            )
            try:
                response = await client.send(request, stream=stream)
                if response.is_success:
                    return response
                try:  # the error body holds the API's explanation
                    await response.aread()
                finally:
                    await response.aclose()
            except httpx.LocalProtocolError as exc:
                # The request could not even be written: sending it again would fail the
                # same way. Its message may quote a header, which may hold the key.
                raise ModelError(
                    f"The {self.api} request to {self._shown_url} could not be written "
                    f"({type(exc).__name__}); this is not retried. Check the headers and "
                    "the api_key given to the adapter."
                ) from exc
            except httpx.TransportError as exc:
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                failure: ModelError = ModelConnectionError(
                    f"Could not reach the {self.api} API at {self._shown_url}{tries}: "
                    f"{type(exc).__name__}: {sentence(str(exc) or 'no details')} "
                    "Check base_url and that the server is up, then run again."
                )
                failure.__cause__ = exc
            except httpx.HTTPError as exc:
                # Not a network failure (an undecodable body, too many redirects):
                # sending the same request again would fail the same way.
                raise _not_retried(exc, self.api, self._shown_url) from exc
            else:
                failure = _response_error(response, self.api, attempt)
                if not should_retry(response.status_code):
                    raise failure
                retry_after = parse_retry_after(response.headers)
            retry = attempt - 1
            if retry >= policy.max_retries:
                raise failure
            delay = policy.delay(retry, retry_after, self._rng)
            # The deadline counts from the first attempt: time spent waiting on the
            # server counts as much as time spent backing off.
            if self._clock() + delay - started > policy.deadline:
                raise failure
            await self._sleep(delay)


def _not_retried(exc: httpx.HTTPError, api: str, url: str) -> ModelError:
    what = f"{type(exc).__name__}: {sentence(str(exc) or 'no details')}"
    if isinstance(exc, httpx.DecodingError):
        return ModelResponseError(
            f"The {api} answer from {url} could not be decoded: {what} Check that the "
            f"server really implements the {api} API."
        )
    return ModelError(
        f"The {api} request to {url} failed: {what} This is not retried; check base_url "
        "and the HTTP client's settings."
    )
