"""The events :meth:`~runlet.Runtime.stream` hands out, in the order things happen."""

from __future__ import annotations

from typing import Union

import attrs

from ._human import HumanRequest
from ._messages import Message, ToolCall, ToolResult
from ._model import ReasoningDelta, TextDelta, ToolCallDelta
from ._result import RunResult

__all__ = [
    "Interrupted",
    "MessageCompleted",
    "RunFinished",
    "StreamEvent",
    "ToolCallFinished",
    "ToolCallStarted",
]


@attrs.frozen
class MessageCompleted:
    """The model finished an assistant message (after its deltas, if it streamed)."""

    message: Message


@attrs.frozen
class ToolCallStarted:
    """A tool call is about to run (or to be answered at once with an error result)."""

    tool_call: ToolCall


@attrs.frozen
class ToolCallFinished:
    """A tool call has its result. Sent as soon as that call is done, so a fast call is
    reported before a slower sibling finishes."""

    tool_call: ToolCall
    result: ToolResult


@attrs.frozen
class Interrupted:
    """The run stopped for a person. Sent only after the checkpoint is saved; the stream
    ends right after, with :class:`RunFinished`. Resume with
    :meth:`~runlet.Runtime.resume` using ``checkpoint_id`` and ``request.id``.

    Attributes:
        request: The first open request (the result's ``interruption``).
        checkpoint_id: The checkpoint to resume.
        requests: Every open request of the checkpoint, in call order (the result's
            ``pending_requests``), when one turn stopped for several calls.
    """

    request: HumanRequest
    checkpoint_id: str
    # A default= (not a decorator) so every type checker sees that it has one.
    requests: tuple[HumanRequest, ...] = attrs.field(
        default=attrs.Factory(lambda self: (self.request,), takes_self=True)
    )


@attrs.frozen
class RunFinished:
    """The last event of every stream that did not fail: the run's result."""

    result: RunResult


StreamEvent = Union[
    TextDelta,
    ReasoningDelta,
    ToolCallDelta,
    MessageCompleted,
    ToolCallStarted,
    ToolCallFinished,
    Interrupted,
    RunFinished,
]
"""Any event :meth:`~runlet.Runtime.stream` can hand out."""
