"""Cancellation that arrives in shapes the plain checks miss: a group of cancellations
from a tool's own task group (trio's nurseries raise one), a model adapter whose clean-up
fails while it is cancelled, a cancellation that lands while a resume writes to its
store. Each must stay a cancellation: never an error result, never an exception group
where a plain exception is promised, never a handler started for a caller who left."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import runlet
from runlet import (
    Agent,
    CallRecord,
    HumanResponse,
    InMemoryCheckpointStore,
    LeaseLostError,
    ModelRequest,
    ResultNotRecordedError,
    RunResult,
    Runtime,
    ToolCallStarted,
    ToolContext,
    ToolSpec,
)
from runlet.testing import ScriptedModel, call

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

pytestmark = pytest.mark.anyio


async def own_tasks(arguments: Mapping[str, Any], context: ToolContext) -> str:
    """A handler that runs tasks of its own and, cancelled, raises what a trio nursery
    raises then: a group holding the cancellation."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class() as exc:
        raise BaseExceptionGroup("the tool's own tasks", [exc]) from None
    return "never"


def approval_agent(*tools: ToolSpec, script: Sequence[Any]) -> Agent:
    return Agent("payer", "Pay when approved.", ScriptedModel(list(script)), tools)


def approve(result: RunResult) -> HumanResponse:
    assert result.interruption is not None
    return HumanResponse(result.interruption.id, "approve")


# --- Groups of cancellations -------------------------------------------------------


async def test_leaving_a_stream_while_a_tool_runs_its_own_tasks_is_clean() -> None:
    tool = ToolSpec("fetch", "Fetch.", {"type": "object"}, own_tasks)
    agent = approval_agent(tool, script=[call("fetch", id="c1"), "Done."])
    seen: list[str] = []
    async with Runtime().stream(agent, "Go.") as stream:
        async for event in stream:
            if isinstance(event, ToolCallStarted):
                await anyio.lowlevel.checkpoint()  # the handler is waiting now
                seen.append("started")
                break  # leaving stops the run: no group of cancellations comes out
    assert ["started"] == seen


async def test_a_lost_lease_is_raised_as_itself_when_the_handler_raises_a_group() -> None:
    class Losing(InMemoryCheckpointStore):
        async def renew(self, checkpoint_id: str, token: str) -> None:
            raise LeaseLostError("taken over", checkpoint_id=checkpoint_id)

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, own_tasks, requires_approval=True)
    agent = approval_agent(tool, script=[call("pay", id="c1"), "Done."])
    rt = Runtime(checkpoint_store=Losing(lease=0.03))
    first = await rt.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    with anyio.fail_after(10), pytest.raises(LeaseLostError):
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))


async def test_a_failed_record_is_raised_as_itself_beside_a_handler_that_raises_a_group() -> None:
    """Two approved calls run side by side; the store cannot record the quick one's
    result, which stops the other: its group of cancellations must not hide the error."""

    class NoResults(InMemoryCheckpointStore):
        async def record(
            self, checkpoint_id: str, token: str, records: Sequence[CallRecord]
        ) -> None:
            if any(record.result is not None for record in records):
                raise OSError("disk full")
            await super().record(checkpoint_id, token, records)

    async def quick(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "paid"

    slow = ToolSpec("slow", "Pay slowly.", {"type": "object"}, own_tasks, requires_approval=True)
    fast = ToolSpec("fast", "Pay fast.", {"type": "object"}, quick, requires_approval=True)
    model = ScriptedModel([[call("slow", id="c1"), call("fast", id="c2")], "Done."])
    agent = Agent("payer", "Pay when approved.", model, (slow, fast))
    rt = Runtime(checkpoint_store=NoResults())
    first = await rt.run(agent, "Pay twice.")
    assert first.checkpoint_id is not None
    responses = [HumanResponse(r.id, "approve") for r in first.pending_requests]
    with anyio.fail_after(10), pytest.raises(ResultNotRecordedError) as caught:
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, responses=responses)
    assert "c2" == caught.value.tool_call_id


async def caught_cancellation() -> BaseException:
    """A real instance of the backend's cancellation exception."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class() as exc:
            return exc
    raise AssertionError("not cancelled")


async def test_what_counts_as_a_cancellation() -> None:
    from runlet._tracing import _error_type
    from runlet._util import is_cancellation

    cancelled = await caught_cancellation()
    group = BaseExceptionGroup("tasks", [cancelled, BaseExceptionGroup("inner", [cancelled])])
    mixed = BaseExceptionGroup("tasks", [cancelled, KeyboardInterrupt()])
    assert [True, True, False, False] == [
        is_cancellation(exc) for exc in (cancelled, group, mixed, ValueError("x"))
    ]
    # A span records a group of cancellations as a cancellation, not as an error.
    assert ["cancelled", "cancelled", "BaseExceptionGroup"] == [
        _error_type(exc) for exc in (cancelled, group, mixed)
    ]


# --- A model adapter that fails while it is cancelled -----------------------------


class FailsWhenCancelled:
    """A model whose clean-up fails while a cancellation passes through (an HTTP client
    whose close raises, say)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.started = anyio.Event()

    async def complete(self, request: ModelRequest) -> runlet.ModelResponse:
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            raise self.error  # the clean-up failing is the point


@pytest.mark.parametrize(
    "error",
    [OSError("connection reset while closing"), runlet.ModelAPIError("closed", status_code=500)],
    ids=["adapter-error", "runlet-error"],
)
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "stream"])
async def test_a_model_failing_while_cancelled_stays_cancelled(
    error: Exception, streamed: bool
) -> None:
    model = FailsWhenCancelled(error)
    agent = Agent("a", "", model)
    rt = Runtime()
    streams: list[runlet.RunStream] = []
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def go() -> None:
                if streamed:
                    async with rt.stream(agent, "Hi.") as stream:
                        streams.append(stream)
                        async for _ in stream:
                            pass
                else:
                    await rt.run(agent, "Hi.")

            group.start_soon(go)
            await model.started.wait()
            scope.cancel()
    assert scope.cancelled_caught  # not a ModelError out of a cancelled scope
    if streamed:  # the stream's run ended cancelled too, not failed with a ModelError
        with pytest.raises(runlet.RunletError, match=r"stopped the run|run was cancelled"):
            streams[0].result  # noqa: B018 - the property raises


# --- A caller cancelled before it calls ---------------------------------------------


async def test_a_run_for_a_cancelled_caller_runs_nothing() -> None:
    ran: list[str] = []

    async def send(arguments: Mapping[str, Any], context: ToolContext) -> str:
        ran.append("sent")  # before its first await: a model that never waits gets here
        return "sent"

    tool = ToolSpec("send", "Send.", {"type": "object"}, send)
    gated = ToolSpec("pay", "Pay.", {"type": "object"}, send, requires_approval=True)
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    agent = approval_agent(tool, gated, script=[[call("send"), call("pay")], "Done."])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await rt.run(agent, "Go.")
    assert scope.cancelled_caught
    assert ([], []) == (ran, list(await store.list_pending()))


async def test_cancel_for_a_cancelled_caller_retires_nothing() -> None:
    tool = ToolSpec("pay", "Pay.", {"type": "object"}, own_tasks, requires_approval=True)
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    first = await rt.run(approval_agent(tool, script=[call("pay")]), "Pay.")
    assert first.checkpoint_id is not None
    with anyio.CancelScope() as scope:
        scope.cancel()
        await rt.cancel(first.checkpoint_id)
    assert scope.cancelled_caught
    assert "pending" == (await store.get(first.checkpoint_id)).status


class _Stop(BaseException):
    """Neither an error nor a cancellation: stands in for KeyboardInterrupt and
    SystemExit, which asyncio would raise out of the event loop itself."""


async def test_a_renewal_that_raises_a_base_exception_raises_it_as_itself() -> None:
    class Stopping(InMemoryCheckpointStore):
        async def renew(self, checkpoint_id: str, token: str) -> None:
            raise _Stop

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, own_tasks, requires_approval=True)
    agent = approval_agent(tool, script=[call("pay", id="c1"), "Done."])
    rt = Runtime(checkpoint_store=Stopping(lease=0.03))
    first = await rt.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    with anyio.fail_after(10), pytest.raises(_Stop):  # not inside an exception group
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))


# --- An error that comes while the caller is cancelled -----------------------------


class ResultsNotRecorded(InMemoryCheckpointStore):
    """A store (not the in-memory class itself, so the resume protects its writes) whose
    disk is full when a result is recorded."""

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        if any(record.result is not None for record in records):
            await anyio.lowlevel.checkpoint()
            raise OSError("disk full")
        await super().record(checkpoint_id, token, records)


async def test_a_result_not_recorded_for_a_cancelled_caller_is_logged_on_both_backends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The handler finishes inside a shield after its caller was cancelled; the store then
    # cannot record the result. The cancellation goes on, on asyncio as on trio (asyncio's
    # own Task.cancel() comes once and must not be lost to an error the caller catches);
    # the failure is logged for the operator, and the call stays recorded as started.
    scopes: list[anyio.CancelScope] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        scopes[0].cancel()
        with anyio.CancelScope(shield=True):
            await anyio.lowlevel.checkpoint()
        return "Refunded."

    tool = ToolSpec("refund", "Refund.", {"type": "object"}, refund, requires_approval=True)
    agent = approval_agent(tool, script=[call("refund", id="c1"), "Done."])
    store = ResultsNotRecorded()
    runtime = Runtime(checkpoint_store=store)
    first = await runtime.run(agent, "Refund.")
    assert first.checkpoint_id is not None

    with caplog.at_level("WARNING", logger="runlet"), anyio.CancelScope() as scope:
        scopes.append(scope)
        await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))

    assert scope.cancelled_caught
    [line] = [r for r in caplog.records if "while its caller was being cancelled" in r.message]
    assert line.exc_info is not None
    assert "disk full" == str(line.exc_info[1])
    assert "Refunded." not in line.getMessage()  # a log line never holds a tool's result
    stored = await store.get(first.checkpoint_id)
    assert ("pending", 1) == (stored.status, len(stored.records))  # resumable, call started
    assert stored.records[0].result is None


async def test_to_the_end_lets_the_cancellation_go_on_whatever_the_call_did() -> None:
    from runlet._util import to_the_end

    ran: list[str] = []

    async def fails() -> None:
        await anyio.lowlevel.checkpoint()
        ran.append("failed")
        raise OSError("disk full")

    async def finishes() -> None:
        await anyio.lowlevel.checkpoint()
        ran.append("done")

    for call_ in (fails, finishes):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await to_the_end(call_)  # runs to its end all the same; then it is cancelled
            ran.append("not cancelled")
        assert scope.cancelled_caught
    assert ["failed", "done"] == ran

    async def fails_uncancelled() -> None:
        await to_the_end(fails)

    with pytest.raises(OSError, match="disk full"):  # not cancelled: raised as itself
        await fails_uncancelled()


async def test_to_the_end_under_an_interrupt_leaves_the_interrupt_to_go_on(
    anyio_backend: str,
) -> None:
    # Cleaning up after Ctrl-C (giving a claim back, closing a store) in a cancelled
    # scope: on trio the cancellation waits, so the scope cannot take the interrupt with
    # it. (On asyncio the task group's own exit delivers it, as before.)
    from runlet._util import to_the_end

    ran: list[str] = []

    async def finishes() -> None:
        await anyio.lowlevel.checkpoint()
        ran.append("done")

    with pytest.raises(KeyboardInterrupt) if anyio_backend == "trio" else nullcontext():
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                await to_the_end(finishes)
                ran.append("cleaned up")
                raise
    assert (["done", "cleaned up"] if anyio_backend == "trio" else ["done"]) == ran


async def test_a_resume_cancelled_while_it_stores_its_outcome_is_cancelled() -> None:
    # A store that waits in resolve() (every durable one): the write goes to its end, and
    # the caller then sees its cancellation, on trio as on asyncio, not a result.
    class SlowResolve(InMemoryCheckpointStore):
        async def resolve(self, *args: Any) -> None:
            resolving.set()
            await release.wait()
            await super().resolve(*args)

    resolving, release = anyio.Event(), anyio.Event()
    store = SlowResolve()
    runtime = Runtime(checkpoint_store=store)
    tool = ToolSpec("pay", "Pay.", {"type": "object"}, lambda a, c: "Paid.", requires_approval=True)
    agent = approval_agent(tool, script=[call("pay", id="c1"), "Done."])
    first = await runtime.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    got: list[object] = []
    scope = anyio.CancelScope()

    async def resume() -> None:
        with scope:
            kwargs = {"checkpoint_id": first.checkpoint_id, "response": approve(first)}
            got.append(await runtime.resume(agent, **kwargs))
        got.append(scope.cancelled_caught)

    async with anyio.create_task_group() as group:
        group.start_soon(resume)
        await resolving.wait()
        scope.cancel()
        release.set()  # the write finishes all the same (it is shielded)
    assert [True] == got
    assert "resolved" == (await store.get(first.checkpoint_id)).status
    again = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert ("completed", "Done.") == (again.status, again.output)


# --- A deadline that passes during the last turn of a resume that holds a lease ----------


async def test_a_cancellation_during_the_last_turn_finds_the_run_resolved() -> None:
    # The resume finishes its last turn without waiting again; the cancellation that came
    # meanwhile lands where the lease's renewals stop. It must find the outcome stored,
    # not throw the finished run away (a retry would run the last turn again).
    paid: list[str] = []

    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        paid.append(context.idempotency_key)
        return "Paid."

    scope = anyio.CancelScope()
    turns: list[ModelRequest] = []

    def last_turn(request: ModelRequest) -> str:
        turns.append(request)
        scope.cancel()  # a deadline passes while the model answers; nothing waits after
        return "Done."

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = approval_agent(tool, script=[call("pay", id="c1"), last_turn])
    store = InMemoryCheckpointStore(lease=60.0)
    runtime = Runtime(checkpoint_store=store)
    first = await runtime.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    with scope:
        await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert scope.cancelled_caught  # the cancellation went on
    stored = await store.get(first.checkpoint_id)
    assert ("resolved", 1) == (stored.status, len(turns))
    again = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=approve(first))
    assert stored.resolution is not None
    assert (again, 1, 1) == (stored.resolution.result, len(turns), len(paid))


async def test_a_renewal_refused_because_the_resolve_retired_the_token_is_no_lost_lease() -> None:
    # The resolve retires the claim's token; a renewal that comes while the resolve is
    # still under way is then refused. The resume must return its stored result, not
    # raise LeaseLostError for a claim it gave up itself.
    class ResolvesSlowly(InMemoryCheckpointStore):
        def __init__(self) -> None:
            super().__init__(lease=0.03)  # renewed every 10 ms
            self.renewed_after_resolve = anyio.Event()
            self.resolved = False

        async def renew(self, checkpoint_id: str, token: str) -> None:
            try:
                await super().renew(checkpoint_id, token)
            finally:
                if self.resolved:
                    self.renewed_after_resolve.set()

        async def resolve(self, *args: Any, **kwargs: Any) -> None:
            await super().resolve(*args, **kwargs)
            self.resolved = True
            await self.renewed_after_resolve.wait()  # the write's reply is slow to come

    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "Paid."

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = approval_agent(tool, script=[call("pay", id="c1"), "Done."])
    store = ResolvesSlowly()
    runtime = Runtime(checkpoint_store=store)
    first = await runtime.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    with anyio.fail_after(10):
        result = await runtime.resume(
            agent, checkpoint_id=first.checkpoint_id, response=approve(first)
        )
    stored = await store.get(first.checkpoint_id)
    assert ("completed", "resolved") == (result.status, stored.status)
    assert stored.resolution is not None
    assert result == stored.resolution.result
