"""What the runtime asks a model, what a model answers, and the adapter protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, Union, runtime_checkable

import attrs

from ._messages import Message, Usage
from ._tools import ToolDefinition

__all__ = [
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelStreamItem",
    "ReasoningDelta",
    "StreamingModel",
    "TextDelta",
    "ToolCallDelta",
]


@attrs.frozen
class ModelRequest:
    """Everything a model adapter needs for one turn.

    Attributes:
        instructions: The agent's instructions (the system prompt).
        messages: The transcript so far, oldest first.
        tools: The definitions of the tools the model may call. Never handlers.
        options: The ``options`` given to ``run()``: adapter settings such as
            ``temperature``; each adapter documents the ones it understands.
    """

    instructions: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]
    options: Mapping[str, Any] = attrs.field(hash=False)


@attrs.frozen
class ModelResponse:
    """A model's answer to one :class:`ModelRequest`.

    Attributes:
        message: An assistant message. Without tool calls it ends the run, and its
            content is the run's output.
        usage: What this request used.
    """

    message: Message
    usage: Usage = Usage()


@attrs.frozen
class TextDelta:
    """A piece of assistant text, as a streaming model produces it.

    It is both what a streaming adapter yields and the stream event a
    :meth:`~runlet.Runtime.stream` consumer receives.
    """

    text: str


@attrs.frozen
class ReasoningDelta:
    """A piece of the model's reasoning (its "thinking"), as a streaming model produces
    it; never part of the answer's text.

    Like :class:`TextDelta`, it is both what a streaming adapter yields and the stream
    event a :meth:`~runlet.Runtime.stream` consumer receives. The complete reasoning
    arrives with the final message, as :attr:`Message.reasoning <runlet.Message.reasoning>`.
    """

    text: str


@attrs.frozen
class ToolCallDelta:
    """A piece of a tool call, as a streaming model produces it.

    Attributes:
        index: Which call of the message this piece belongs to (0 for the first).
        id: The call's id, on the first piece of a call.
        name: The tool's name, on the first piece of a call.
        arguments: A fragment of the arguments' JSON text; the fragments of one call,
            joined, are its whole arguments.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


ModelStreamItem = Union[TextDelta, ReasoningDelta, ToolCallDelta, ModelResponse]
"""What a streaming adapter yields: deltas as they come, then one final
:class:`ModelResponse` holding the complete message and its usage."""


@runtime_checkable
class Model(Protocol):
    """A model adapter: anything with an async ``complete`` method.

    ``complete`` may raise; the runtime reports a non-Runlet exception as a
    :class:`~runlet.ModelError` whose ``__cause__`` is the original.
    """

    async def complete(self, request: ModelRequest, /) -> ModelResponse:
        """Answer *request* with one assistant message."""
        ...


@runtime_checkable
class StreamingModel(Model, Protocol):
    """A model adapter that can also stream.

    ``stream(request)`` returns an async context manager; entering it starts the request
    and gives an async iterator of :data:`ModelStreamItem` whose last item is the final
    :class:`ModelResponse`. Leaving the context manager closes the connection, also
    when the consumer stops early. :meth:`~runlet.Runtime.stream` uses this method when
    the model has it and falls back to ``complete`` otherwise.
    """

    def stream(
        self, request: ModelRequest, /
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelStreamItem]]:
        """Start streaming the answer to *request*."""
        ...
