"""The scripted model behind :mod:`runlet.testing`."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any, Union

from .._errors import ConfigurationError, ModelError, ModelResponseError
from .._messages import Message, ToolCall, Usage
from .._model import (
    ModelRequest,
    ModelResponse,
    ModelStreamItem,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)

__all__ = ["ScriptExhaustedError", "ScriptItem", "ScriptedModel", "call"]

_Answer = Union[str, ToolCall, Sequence[ToolCall], Message, ModelResponse]
ScriptItem = Union[_Answer, Callable[[ModelRequest], Union[_Answer, Awaitable[_Answer]]]]
"""One scripted answer, or a function of the request that returns one."""

_call_ids = itertools.count(1)
# Answers that are never awaitable: no need to ask.
_READY = frozenset({str, ToolCall, Message, ModelResponse, list, tuple})


def call(
    name: str,
    arguments: Mapping[str, Any] | None = None,
    /,
    *,
    id: str | None = None,
    **kwargs: Any,
) -> ToolCall:
    """A :class:`~runlet.ToolCall` for a script: ``call("add", a=1, b=2)`` or
    ``call("add", {"a": 1, "b": 2}, id="call_7")``. Ids default to ``call_1``,
    ``call_2``, … (unique within the process). Tuples in the arguments become lists,
    as in the arguments a real model's JSON gives, so a result that went through JSON
    (a durable store, :func:`~runlet.unstructure`) compares equal."""
    args = {**(arguments or {}), **kwargs}
    with contextlib.suppress(RecursionError):  # deeper than any model's JSON: as it is
        args = {key: _as_json_read(value) for key, value in args.items()}
    return ToolCall(id or f"call_{next(_call_ids)}", name, args)


def _as_json_read(value: Any) -> Any:
    """*value* with every tuple inside made a list; anything else as it is (a test may
    give a value JSON has no form for, to see it refused)."""
    if type(value) is tuple or type(value) is list:
        return [_as_json_read(item) for item in value]
    if type(value) is dict:
        return {key: _as_json_read(item) for key, item in value.items()}
    return value


class ScriptExhaustedError(ModelError):
    """Raised when a :class:`ScriptedModel` is asked for more answers than its script
    holds."""


class ScriptedModel:
    """A model that answers from a script and records every request it sees.

    Args:
        script: The answers, one per request, in order; or one function of the request
            consulted for every request.
        usage: The usage reported with each answer (default: one request, no tokens).
        chunk_size: When streamed, text and tool arguments are cut into pieces of this
            many characters (default: one piece each).

    Attributes:
        requests: Every :class:`~runlet.ModelRequest` received, in order.

    Raises:
        ConfigurationError: The script is neither a list nor a function, one of its items
            is not a usable answer, *usage* is not a :class:`~runlet.Usage`, or
            *chunk_size* is not a positive int.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] | Callable[[ModelRequest], Any],
        *,
        usage: Usage = Usage(requests=1),
        chunk_size: int | None = None,
    ) -> None:
        if chunk_size is not None and (type(chunk_size) is not int or chunk_size < 1):
            raise ConfigurationError(
                f"chunk_size must be a positive number of characters or None, not {chunk_size!r}."
            )
        if not isinstance(usage, Usage):
            raise ConfigurationError(f"usage must be a Usage, not {type(usage).__name__}.")
        self._function: Callable[[ModelRequest], Any] | None = None
        self._script: list[ScriptItem] = []
        if callable(script):
            self._function = script
        elif isinstance(script, (str, bytes)) or not isinstance(script, Iterable):
            raise ConfigurationError(
                f"A ScriptedModel script must be a list of answers or a function of the "
                f"request, not a {type(script).__name__}: write ScriptedModel([...])."
            )
        else:
            self._script = list(script)
        for number, item in enumerate(self._script, 1):
            if not callable(item) and _answer_problem(item) is not None:
                raise ConfigurationError(f"Script item {number}: {_answer_problem(item)}.")
        self._usage = usage
        self.chunk_size = chunk_size
        self.requests: list[ModelRequest] = []
        self._used = 0

    @property
    def remaining(self) -> int:
        """Answers left in the script (0 for a function script)."""
        return len(self._script) - self._used if self._function is None else 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Record *request* and return the next scripted answer.

        Raises:
            ScriptExhaustedError: The script has no answer left.
            ModelResponseError: A function in the script returned an unusable answer.
        """
        self.requests.append(request)
        if self._function is not None:
            item: Any = self._function(request)
        else:
            if self._used >= len(self._script):
                raise ScriptExhaustedError(
                    f"ScriptedModel has no answer left for request {len(self.requests)} "
                    f"(its script has {len(self._script)}); add more answers to the script."
                )
            item = self._script[self._used]
            self._used += 1
            if callable(item):
                item = item(request)
        if type(item) not in _READY and inspect.isawaitable(item):
            item = await item
        return self._response(item)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelStreamItem]]:
        """Stream the next scripted answer: use as ``async with model.stream(request) as
        items: async for item in items: ...``. The items are reasoning deltas (the text of
        each reasoning part), text deltas, tool-call deltas (all cut into ``chunk_size``
        pieces), then the complete :class:`~runlet.ModelResponse`.

        Raises:
            ScriptExhaustedError: On entering, when the script has no answer left.
            ModelResponseError: On entering, when a function in the script returned an
                unusable answer.
        """
        return self._stream(request)

    @asynccontextmanager
    async def _stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelStreamItem]]:
        response = await self.complete(request)
        # Closed here, not by the garbage collector, so a stream left early (a break,
        # an error, a cancellation) leaves no suspended generator behind.
        async with aclosing(self._chunks(response)) as chunks:
            yield chunks

    async def _chunks(self, response: ModelResponse) -> AsyncGenerator[ModelStreamItem, None]:
        message = response.message
        for part in message.reasoning:  # first, as a model thinks before it answers
            for piece in self._cut(part.text):
                yield ReasoningDelta(piece)
        for piece in self._cut(message.content):
            yield TextDelta(piece)
        for index, tool_call in enumerate(message.tool_calls):
            text = json.dumps(dict(tool_call.arguments))
            for number, piece in enumerate(self._cut(text)):
                first = number == 0
                yield ToolCallDelta(
                    index,
                    tool_call.id if first else None,
                    tool_call.name if first else None,
                    piece,
                )
        yield response

    def _cut(self, text: str) -> list[str]:
        if not text:
            return []
        size = self.chunk_size or len(text)
        return [text[i : i + size] for i in range(0, len(text), size)]

    def _response(self, item: Any) -> ModelResponse:
        kind = type(item)  # the usual answers first, without the isinstance chain
        if kind is str:
            return ModelResponse(Message("assistant", item), self._usage)
        if kind is ToolCall:
            return ModelResponse(Message("assistant", "", (item,)), self._usage)
        if isinstance(item, ModelResponse):
            return item
        if isinstance(item, Message):
            return ModelResponse(item, self._usage)
        if isinstance(item, str):
            return ModelResponse(Message("assistant", item), self._usage)
        if isinstance(item, ToolCall):
            return ModelResponse(Message("assistant", "", (item,)), self._usage)
        if isinstance(item, (list, tuple)) and all(isinstance(c, ToolCall) for c in item):
            return ModelResponse(Message("assistant", "", tuple(item)), self._usage)
        raise ModelResponseError(
            f"A function in the script returned {type(item).__name__}; {_ANSWERS}; fix it."
        )


def _answer_problem(item: object) -> str | None:
    """What is wrong with *item* as a scripted answer; ``None`` when it is usable."""
    if isinstance(item, (ModelResponse, Message, str, ToolCall)):
        return None
    if isinstance(item, (list, tuple)) and all(isinstance(c, ToolCall) for c in item):
        return None
    return f"got {type(item).__name__}; {_ANSWERS}"


_ANSWERS = "an answer must be a str, ToolCall, list of ToolCall, Message or ModelResponse"
