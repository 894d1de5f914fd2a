"""What a run returns."""

from __future__ import annotations

from typing import Literal

import attrs

from ._human import Decision, HumanRequest
from ._messages import Message, Usage

__all__ = ["RunResult", "RunStatus"]

RunStatus = Literal["completed", "interrupted"]


@attrs.frozen(kw_only=True)
class RunResult:
    """The outcome of :meth:`~runlet.Runtime.run`, :meth:`~runlet.Runtime.resume` or a
    finished :meth:`~runlet.Runtime.stream`.

    Attributes:
        status: ``"completed"`` (the model answered without tool calls) or
            ``"interrupted"`` (the run waits for a person).
        output: The final answer's text when completed, else ``None``.
        interruption: The open request when interrupted, else ``None``.
        checkpoint_id: The checkpoint to resume when interrupted, else ``None``.
        transcript: Every message of the run so far, input included, oldest first.
        usage: Usage of the whole run, across interruptions and resumes.
        run_id: The run's id, the same across its interruptions and resumes.
        pending_requests: When interrupted, every request the current turn waits for, in
            call order; the first is :attr:`interruption`. Answer any of them in one
            :meth:`~runlet.Runtime.resume` call with ``responses=[...]``.
        decisions: Every answer people gave this run so far, oldest first (the audit
            trail; see :class:`~runlet.Decision`).
    """

    status: RunStatus
    output: str | None = None
    interruption: HumanRequest | None = None
    checkpoint_id: str | None = None
    transcript: tuple[Message, ...]
    usage: Usage
    run_id: str
    pending_requests: tuple[HumanRequest, ...] = ()
    decisions: tuple[Decision, ...] = ()
