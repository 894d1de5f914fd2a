"""From a mutation review of the exactly-once core (_resume.py, _human.py): what the
lease bookkeeping of a durable resume must do that no other test pinned down."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest

from runlet import (
    Agent,
    CallRecord,
    HumanResponse,
    HumanResponseError,
    InMemoryCheckpointStore,
    LeaseLostError,
    ResultNotRecordedError,
    RunResult,
    Runtime,
    ToolContext,
    ToolSpec,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
}


class Refunds:
    """A refund tool whose handler can be made to wait for *gate* and then do *then*."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.gate: anyio.Event | None = None
        self.then: BaseException | None = None

    async def refund(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.attempts.append(context.idempotency_key)
        if self.gate is not None:
            # A wait nothing can cut short (a worker thread, a shielded call): the handler
            # ends on its own, whatever happened to the resume meanwhile.
            with anyio.CancelScope(shield=True):
                await self.gate.wait()
        if self.then is not None:
            raise self.then
        return f"Refunded order {arguments['order_id']}."


async def first_run(
    store: InMemoryCheckpointStore,
) -> tuple[Runtime, Agent, Refunds, RunResult]:
    refunds = Refunds()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Done."])
    tool = ToolSpec(
        "refund", "Refund an order.", ORDER_SCHEMA, refunds.refund, requires_approval=True
    )
    agent = Agent("support", "Refund when approved.", model, [tool])
    rt = Runtime(checkpoint_store=store)
    first = await rt.run(agent, "Refund order 1.")
    assert "interrupted" == first.status
    assert first.checkpoint_id is not None
    return rt, agent, refunds, first


def approve(result: RunResult) -> HumanResponse:
    assert result.interruption is not None
    return HumanResponse.approve(result.interruption.id)


@pytest.fixture
def clock_jump(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Seconds added to ``anyio.current_time()``: a process paused (SIGSTOP, a VM freeze)
    sees its clock jump."""
    jump = [0.0]
    real = anyio.current_time
    monkeypatch.setattr(anyio, "current_time", lambda: real() + jump[0])
    return jump


# --- A pause before the handler: renew once the renewal is overdue -----------------------


class PausedAfterDeciding(InMemoryCheckpointStore):
    """The process pauses for *pause* seconds right after its decisions are stored."""

    def __init__(self, clock_jump: list[float], pause: float) -> None:
        super().__init__(lease=30.0)  # no background renewal within the test
        self.clock_jump = clock_jump
        self.pause = pause
        self.renewals = 0

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        await super().record(checkpoint_id, token, records)
        if any(r.result is None for r in records):
            self.clock_jump[0] = self.pause

    async def renew(self, checkpoint_id: str, token: str) -> None:
        self.renewals += 1
        await super().renew(checkpoint_id, token)


@pytest.mark.parametrize(("pause", "renewals"), [(19.0, 0), (21.0, 1)])
async def test_a_pause_past_two_thirds_of_the_lease_renews_before_the_handler(
    clock_jump: list[float], pause: float, renewals: int
) -> None:
    # Renewals come every third of the 30 s lease: by 20 s one is overdue by a third
    # more, so the process was paused; it renews before the approved handler starts,
    # although the lease itself (30 s) has not run out yet.
    store = PausedAfterDeciding(clock_jump, pause)
    rt, agent, refunds, first = await first_run(store)
    result = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert ("Done.", 1, renewals) == (result.output, len(refunds.attempts), store.renewals)


# --- A renewal whose answer came late: the lease counts from when it was sent -----------


class AnsweredLate(InMemoryCheckpointStore):
    """The first renewal restarts the lease, and then its answer takes longer than the
    lease to arrive (the process was paused meanwhile): another resume has taken the
    checkpoint over by the time this one hears back. The decisions' write waits for that
    renewal, so the approved handler would start right after it."""

    def __init__(self, clock_jump: list[float]) -> None:
        super().__init__(lease=0.6)  # the first background renewal comes after 0.2 s
        self.clock_jump = clock_jump
        self.renewed = anyio.Event()
        self.renewals = 0

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        await super().record(checkpoint_id, token, records)
        if any(r.result is None for r in records):
            await self.renewed.wait()

    async def renew(self, checkpoint_id: str, token: str) -> None:
        self.renewals += 1
        await super().renew(checkpoint_id, token)  # the store restarts the lease here
        if self.renewals == 1:
            self.clock_jump[0] = 1.0  # ... and its answer arrives after the lease ran out
            await self.release(checkpoint_id, token)
            await self.claim(checkpoint_id)  # the other process's claim
            self.renewed.set()


async def test_a_renewal_answered_late_counts_the_lease_from_when_it_was_sent(
    clock_jump: list[float],
) -> None:
    store = AnsweredLate(clock_jump)
    rt, agent, refunds, first = await first_run(store)
    with anyio.fail_after(10), pytest.raises(LeaseLostError):
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert [] == refunds.attempts  # the new owner decides; this one ran nothing
    assert 2 == store.renewals  # the late one, and the check before the handler


# --- What a resume raises when its lease is lost while something else went wrong --------


def losing_lease(
    started: list[Refunds], *, record_fails: bool = False
) -> tuple[InMemoryCheckpointStore, anyio.Event]:
    """An in-memory store (the class itself: nothing it does waits) whose every renewal
    once the handler of *started*'s refunds has begun finds the claim taken over (those
    before succeed: on a busy machine, one may come before the handler starts); the event
    is set once one was tried. With *record_fails*, recording a result raises
    ``OSError("disk full")``."""
    store = InMemoryCheckpointStore(lease=0.03)
    tried = anyio.Event()
    record, renew_for_real = store.record, store.renew

    async def renew(checkpoint_id: str, token: str) -> None:
        if not (started and started[0].attempts):
            return await renew_for_real(checkpoint_id, token)
        tried.set()
        raise LeaseLostError("taken over", checkpoint_id=checkpoint_id)

    async def record_or_fail(checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        if record_fails and any(r.result is not None for r in records):
            raise OSError("disk full")
        await record(checkpoint_id, token, records)

    store.renew = renew  # type: ignore[method-assign]
    store.record = record_or_fail  # type: ignore[method-assign]
    return store, tried


async def test_a_lost_lease_goes_before_a_result_that_could_not_be_recorded() -> None:
    started: list[Refunds] = []
    store, tried = losing_lease(started, record_fails=True)
    rt, agent, refunds, first = await first_run(store)
    started.append(refunds)
    refunds.gate = tried  # the handler ends after the lease was lost
    with anyio.fail_after(10), pytest.raises(LeaseLostError) as info:
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert not isinstance(info.value, ResultNotRecordedError)
    assert first.checkpoint_id == info.value.checkpoint_id
    assert 1 == len(refunds.attempts)


async def test_a_keyboard_interrupt_from_a_handler_goes_before_a_lost_lease() -> None:
    started: list[Refunds] = []
    store, tried = losing_lease(started)
    rt, agent, refunds, first = await first_run(store)
    started.append(refunds)
    refunds.gate = tried
    refunds.then = stop = KeyboardInterrupt()  # pressed while the lease was being lost
    with anyio.fail_after(10), pytest.raises(KeyboardInterrupt) as info:
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert stop is info.value
    assert "pending" == (await store.get(first.checkpoint_id)).status  # given back


# --- A renewal in the background moves the deadline the handler is checked against ------


class RenewedWhileDeciding(InMemoryCheckpointStore):
    """The decisions' write waits for the first background renewal; then the clock moves
    on by *after* seconds before the approved handler is checked."""

    def __init__(self, clock_jump: list[float], after: float) -> None:
        super().__init__(lease=0.6)  # renewed in the background every 0.2 s
        self.clock_jump = clock_jump
        self.after = after
        self.renewed = anyio.Event()
        self.renewals = 0

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        await super().record(checkpoint_id, token, records)
        if any(r.result is None for r in records):
            await self.renewed.wait()
            self.clock_jump[0] = self.after

    async def renew(self, checkpoint_id: str, token: str) -> None:
        self.renewals += 1
        await super().renew(checkpoint_id, token)
        self.renewed.set()


async def test_a_claim_renewed_in_the_background_is_not_renewed_again_before_the_handler(
    clock_jump: list[float],
) -> None:
    # 0.3 s after the renewal (0.5 s after the claim) the renewal is not overdue: the
    # deadline counts from the renewal, not from the claim.
    store = RenewedWhileDeciding(clock_jump, after=0.3)
    rt, agent, refunds, first = await first_run(store)
    with anyio.fail_after(10):
        result = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert ("Done.", 1, 1) == (result.output, len(refunds.attempts), store.renewals)


# --- "expire" is what Runlet records, never what a person answers ------------------------


async def test_an_expiry_cannot_be_given_as_a_response() -> None:
    rt, agent, refunds, first = await first_run(InMemoryCheckpointStore())
    expired = await rt.expire(agent, checkpoint_id=first.checkpoint_id)
    [decision] = expired.decisions
    assert "expire" == decision.action
    assert decision.as_response() is None
    with pytest.raises(HumanResponseError, match="action 'expire' is unknown"):
        HumanResponse(decision.request_id, decision.action)  # type: ignore[arg-type]
    assert [] == refunds.attempts
