"""Fault injection at every await point of ``resume()``, on the SQL stores.

The scheme of ``test_fault_injection.py`` (count the await points of an undisturbed
resume; for each, before and after the operation, inject a cancellation delivered there,
a deadline that runs out there, or an error; retry until finished), on
:class:`SQLiteCheckpointStore` and :class:`PostgresCheckpointStore` (when its test
server starts). There every store call really waits for a worker thread, which anyio
does not abandon: a cancellation that comes meanwhile takes effect once the thread has
finished its transaction. So more kinds of fault are checked here, which the in-memory
store cannot show: a cancellation (an anyio cancel scope, and on asyncio a plain
``Task.cancel()``, which does abandon the thread unless the resume protects the wait)
that arrives while the thread is in a store call, at its start or before its commit;
the thread then writes all the same. And a transaction that commits, after which its
call fails (the reply to the COMMIT lost with the connection). The contract must hold
on retry all the same.

After every case: the approved refund ran with one idempotency key only and was paid in
the end; a non-idempotent refund ran no more often than people approved it, and a
second run came only after an ``outcome_unknown`` request that a person answered (a
rejection is honoured: the refund does not run again); no checkpoint is left pending or
claimed; the transcript is the undisturbed run's; the errors surfaced are the documented
ones (the injected error itself, a ``ModelError`` or ``ResultNotRecordedError`` caused by
it, the cancellation, and with a real lease a ``CheckpointClaimedError`` until a claim
left behind runs out).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import attrs
import pytest
from _store_semantics import execute
from test_fault_injection import KINDS, SCHEMA, Bank, Faults, Injected, Model, _targets

import runlet
from runlet import (
    REJECTION_MESSAGE,
    Agent,
    CallRecord,
    Checkpoint,
    HumanResponse,
    Resolution,
    Runtime,
    StoredCheckpoint,
    ToolContext,
    ToolSpec,
)
from runlet.stores.sqlite import SQLiteCheckpointStore

pytestmark = pytest.mark.anyio

T = TypeVar("T")

# An undisturbed resume: get, claim, record (decision), refund, record (result), model,
# notify, model, resolve.
POINTS = ["get", "claim", "record", "refund", "record", "model", "notify", "model", "resolve"]
# The same resume's store calls, each one transaction in a worker thread.
WRITES = ["get", "claim", "record", "record", "resolve"]
LEASE = 60.0
# The faults (kind, when, point) that cut the refund off inside its handler: it started,
# and its result was not recorded (the handler was stopped, or the record failed). A retry
# runs an idempotent refund again with the same key, and asks a person about another.
CUT_OFF = {
    ("cancel", "before", 3),
    ("cancel", "after", 3),
    ("deadline", "before", 3),
    ("cancel", "before", 4),
    ("error", "before", 4),
}
# Those that stop the resume once the decision is stored, before the handler starts: the
# call looks started all the same (an approved decision without a result), so another
# person is asked about a non-idempotent one (outcome_unknown, though it never ran).
DECIDED_ONLY = {(kind, "after", 2) for kind in ("cancel", "deadline", "error")}


class Gate:
    """Counts the store's calls (one transaction each, in a worker thread) while a
    resume runs. In the chosen one, the worker thread, at *stage* (``"start"``: before
    the transaction; ``"commit"``: after its statements, before the commit), has the test
    cancel the resume and waits until it has (a ``threading.Event`` set after the
    cancellation); or, with *fail*, the transaction commits and then the call raises
    *fail* (the reply to the COMMIT was lost with the connection)."""

    def __init__(
        self, target: int | None = None, fail: BaseException | None = None, stage: str = "commit"
    ) -> None:
        self.target = target
        self.stage = stage  # "start": the thread has begun, before the transaction
        self.fail = fail
        self.counting = False
        self.ops: list[str] = []
        self.faults: Faults | None = None
        self.entered = anyio.Event()  # the thread is inside the chosen write
        self.go = threading.Event()  # the test has cancelled: commit
        self.releases = 0  # release() calls begun
        self.released = anyio.Event()  # a release() call returned
        self.released_early = False  # one began while the chosen write was under way
        self.chosen: int | None = None  # the thread of the chosen write
        self.finished = threading.Event()  # that thread's call has returned
        self._lock = threading.Lock()

    def reached(self, stage: str) -> bool:
        """In the worker thread, as it starts (*stage* ``"start"``) or just before the
        transaction ends (``"commit"``): whether it is the chosen one."""
        with self._lock:
            if not self.counting or stage != self.stage:
                return False
            assert self.faults is not None
            self.ops.append(self.faults.points[-1])  # the store call under way
            hit = len(self.ops) - 1 == self.target
        if hit:
            self.target = None
            self.chosen = threading.get_ident()
            if self.fail is None:
                anyio.from_thread.run_sync(self.entered.set)
                assert self.go.wait(30), "the test never let the thread go on"
        return hit

    def committed(self) -> None:
        """In the worker thread, after the chosen transaction ended."""
        if self.fail is not None:
            raise self.fail


class SQLFaults(Faults):
    """:class:`Faults`, and optionally every release fails (a lost database, say)."""

    def __init__(self, release_fails: bool = False) -> None:
        super().__init__()
        self.release_fails = release_fails
        self.failed_releases = 0

    async def point(self, name: str, when: str) -> None:
        if name == "release" and when == "before" and self.release_fails:
            self.points.append(name)
            self.failed_releases += 1
            raise Injected("injected: release failed")
        await super().point(name, when)


class FaultPoints:
    """Fault points around each durable store call, and the gate inside each
    transaction; mixed into a SQL store."""

    faults: Faults
    gate: Gate

    async def get(self, checkpoint_id: str) -> StoredCheckpoint:
        return await self.faults.around("get", super().get, checkpoint_id)  # type: ignore[misc,no-any-return]

    async def claim(self, checkpoint_id: str) -> runlet.Claim:
        return await self.faults.around("claim", super().claim, checkpoint_id)  # type: ignore[misc,no-any-return]

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        await self.faults.around("record", super().record, checkpoint_id, token, records)  # type: ignore[misc]

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        await self.faults.around(
            "resolve",
            super().resolve,  # type: ignore[misc]
            checkpoint_id,
            token,
            resolution,
            next_checkpoint,
        )

    async def release(self, checkpoint_id: str, token: str) -> None:
        self.gate.releases += 1
        await self.faults.around("release", super().release, checkpoint_id, token)  # type: ignore[misc]
        self.gate.released.set()

    @contextmanager
    def _connection(self, *, write: bool, atomic: bool) -> Iterator[Any]:
        with super()._connection(write=write, atomic=atomic) as conn:  # type: ignore[misc]
            yield conn
            chosen = self.gate.reached("commit")
        if chosen:
            self.gate.committed()

    async def _run(self, work: Callable[[], T]) -> T:
        return await super()._run(partial(self._started, work))  # type: ignore[misc,no-any-return]

    def _started(self, work: Callable[[], T]) -> T:
        self.gate.reached("start")
        try:
            return work()
        finally:
            if self.gate.chosen == threading.get_ident():
                self.gate.chosen = None
                self.gate.finished.set()


class FaultySQLite(FaultPoints, SQLiteCheckpointStore):
    pass


class PayingBank(Bank):
    """:class:`Bank`, counting the refunds that returned, by idempotency key."""

    def __init__(self, faults: Faults) -> None:
        super().__init__(faults)
        self.paid: Counter[str] = Counter()
        self.notified = 0  # notify handlers that returned

    async def notify(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        done = await super().notify(arguments, context)
        self.notified += 1
        return done

    async def refund(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        done = await super().refund(arguments, context)
        self.paid[context.idempotency_key] += 1
        return done


@attrs.define
class Where:
    """Where the stores of a test live: a SQLite file per case, or a PostgreSQL server
    (a fresh schema per test)."""

    kind: str
    tmp: Path
    conninfo: str = ""
    schema: str = ""
    cases: Iterator[int] = attrs.field(factory=itertools.count)


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "postgres":
        return Where("postgres", tmp_path, request.getfixturevalue("postgres_server"))
    return Where("sqlite", tmp_path)


@asynccontextmanager
async def open_store(where: Where, faults: Faults, gate: Gate, lease: float) -> AsyncIterator[Any]:
    store: Any
    if where.kind == "sqlite":
        store = FaultySQLite(where.tmp / f"case{next(where.cases)}.db", lease=lease)
    else:
        from _postgres import fresh_schema

        from runlet.stores.postgres import PostgresCheckpointStore

        class FaultyPostgres(FaultPoints, PostgresCheckpointStore):
            pass

        if not where.schema:  # one per test: each case's run has ids of its own
            where.schema = await anyio.to_thread.run_sync(fresh_schema, where.conninfo)
        store = FaultyPostgres(where.schema, lease=lease, max_size=4)
    store.faults, store.gate = faults, gate
    gate.faults = faults
    async with store:
        yield store


async def age_leases(where: Where, store: Any, seconds: float) -> None:
    """Move every live claim's lease *seconds* nearer its end (no waiting)."""
    by = f"{seconds!r}" if where.kind == "sqlite" else f"{seconds!r} * interval '1 second'"
    await execute(
        store,
        f"UPDATE runlet_checkpoints SET lease_until = lease_until - {by} WHERE status = 'claimed'",
    )


def lost_connection(where: Where) -> tuple[BaseException, tuple[type[BaseException], ...]]:
    """The error of a connection lost with the reply to a COMMIT, and its class: on
    PostgreSQL psycopg's (which the store recognises: it writes a record once more), on
    SQLite the injected one (a disk that fails the call)."""
    if where.kind == "postgres":
        import psycopg

        lost = psycopg.OperationalError("server closed the connection unexpectedly")
        return lost, (psycopg.OperationalError,)
    return Injected("injected: the call failed after its commit"), ()


def make_agent(faults: Faults, bank: Bank, idempotent: bool) -> Agent:
    tools = (
        ToolSpec("lookup", "Look up.", SCHEMA, bank.lookup),
        ToolSpec(
            "refund", "Refund.", SCHEMA, bank.refund, requires_approval=True, idempotent=idempotent
        ),
        ToolSpec("notify", "Notify.", SCHEMA, bank.notify),
    )
    return Agent("support", "Refund, then notify.", Model(faults), tools)


@attrs.define
class Case:
    """A fault to inject into the first attempt, and how to retry."""

    target: int | None = None  # the await point (index into POINTS)
    when: str = ""
    kind: str = ""
    write: int | None = None  # the transaction to cancel inside (index into WRITES)
    by_task: bool = False  # that cancellation by asyncio's Task.cancel()
    fail: bool = False  # instead, the transaction commits, then the call fails
    stage: str = "commit"  # where in the thread: "start" (before the transaction), "commit"
    lease: float = 0.0
    release_fails: bool = False
    reask: Literal["approve", "reject"] = "approve"  # the answer to an outcome_unknown request

    def label(self) -> str:
        if self.write is not None and self.fail:
            return f"a failure after the commit of {WRITES[self.write]} (#{self.write})"
        if self.write is not None:
            how = "Task.cancel()" if self.by_task else "a cancel scope"
            where = "at the start of" if self.stage == "start" else "before the commit of"
            return f"{how} {where} {WRITES[self.write]} (#{self.write}), lease {self.lease:g}"
        point = "-" if self.target is None else f"{POINTS[self.target]} (#{self.target})"
        return f"{self.kind} {self.when} {point}, lease {self.lease:g}"


@attrs.define
class Outcome:
    result: runlet.RunResult
    points: list[str]
    ops: list[str]
    bank: PayingBank
    reasks: list[runlet.HumanRequest]
    raised: BaseException | None
    cancelled: bool
    claimed_errors: int
    failed_releases: int
    released_early: bool


async def attempt(
    rt: Runtime,
    agent: Agent,
    checkpoint_id: str,
    response: HumanResponse,
    faults: Faults,
    gate: Gate,
    by_task: bool,
    errors: tuple[type[BaseException], ...] = (),
) -> tuple[runlet.RunResult | None, BaseException | None, bool]:
    """One disturbed resume: its result (None if it raised), the documented error it
    raised, and whether it was cancelled."""
    results: list[runlet.RunResult] = []

    async def resume() -> None:
        results.append(await rt.resume(agent, checkpoint_id=checkpoint_id, response=response))

    caught: tuple[type[BaseException], ...] = (Injected, runlet.ModelError, *errors)
    raised: BaseException | None = None
    cancelled = False
    async with anyio.create_task_group() as group:
        with anyio.CancelScope() as scope:
            faults.scope = scope
            task: Any = None
            if by_task:
                task = asyncio.ensure_future(resume())

            async def cancel_inside_the_write() -> None:
                await gate.entered.wait()
                if task is None:
                    scope.cancel()
                else:
                    # asyncio's own cancellation goes through anyio's shields: a wait
                    # for a thread unprotected by the resume ends at once, and the
                    # resume gives its claim back while the thread still writes. Let
                    # the task run until it waits, and see.
                    task.cancel()
                    await anyio.wait_all_tasks_blocked()
                    gate.released_early = gate.releases > 0
                    if gate.released_early and gate.stage == "start":
                        # Nothing holds a lock the release needs: it goes first, then
                        # the thread's write (which finds the claim gone).
                        await gate.released.wait()
                gate.go.set()

            group.start_soon(cancel_inside_the_write)
            try:
                if task is not None:
                    try:
                        await task
                    except asyncio.CancelledError:  # the task's, not this one's
                        cancelled = True
                else:
                    await resume()
            except caught as exc:
                raised = exc
            except runlet.ResultNotRecordedError as exc:  # the store failed a result record
                raised = exc
        cancelled = cancelled or scope.cancelled_caught
        if not gate.entered.is_set():
            group.cancel_scope.cancel()  # no write was chosen: nothing to wait for
    gate.go.set()
    if gate.entered.is_set():  # a thread the resume left behind finishes its write first
        await anyio.to_thread.run_sync(gate.finished.wait)
    if isinstance(raised, runlet.ModelError):
        assert isinstance(raised.__cause__, Injected), raised
    if isinstance(raised, runlet.ResultNotRecordedError):
        assert isinstance(raised.__cause__, (Injected, *errors)), raised
    return (results[0] if results else None), raised, cancelled


async def scenario(where: Where, idempotent: bool, case: Case) -> Outcome:
    """Run, interrupt, resume with *case*'s fault, retry until finished; check the
    store's state at the end."""
    label = case.label()
    faults = SQLFaults(case.release_fails)
    fail, errors = lost_connection(where) if case.fail else (None, ())
    gate = Gate(case.write, fail, case.stage)
    bank = PayingBank(faults)
    agent = make_agent(faults, bank, idempotent)
    async with open_store(where, faults, gate, case.lease) as store:
        rt = Runtime(checkpoint_store=store)
        first = await rt.run(agent, "Refund order 7.")
        assert first.interruption is not None
        assert first.checkpoint_id is not None
        checkpoint_id = first.checkpoint_id
        response = HumanResponse(first.interruption.id, "approve")
        faults.points.clear()
        faults.target, faults.when, faults.kind = case.target, case.when, case.kind
        gate.counting = True
        result, raised, cancelled = await attempt(
            rt, agent, checkpoint_id, response, faults, gate, case.by_task, errors
        )
        gate.counting = False
        points, ops = list(faults.points), list(gate.ops)
        assert faults.target is None, f"{label}: the fault was injected"
        assert gate.target is None, f"{label}: the cancellation came inside the write"
        reasks: list[runlet.HumanRequest] = []
        claimed_errors = 0
        runs_at_reask: list[int] = []
        for _ in range(4):  # retries, undisturbed (but a release may still fail)
            if result is not None and result.status == "completed":
                break
            if result is not None:
                # A non-idempotent refund cut off inside its handler (or whose decision a
                # cancelled write stored) comes back to a person.
                assert result.interruption is not None, label
                assert result.interruption.outcome_unknown, label
                assert not idempotent, label
                assert result.checkpoint_id is not None, label
                reasks.append(result.interruption)
                runs_at_reask.append(len(bank.runs))
                checkpoint_id = result.checkpoint_id
                response = HumanResponse(result.interruption.id, case.reask)
            try:
                result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
            except runlet.CheckpointClaimedError:
                # A claim left behind (its release failed, or the fault came between the
                # store's claim and the resume): it holds until its lease runs out.
                assert case.lease, label
                claimed_errors += 1
                await age_leases(where, store, case.lease + 1)
                result = None
        assert result is not None, label
        assert "completed" == result.status, label

        # Nothing left open: every checkpoint of the run resolved, none pending or claimed.
        run = f"'{first.run_id}'"  # made by Runlet: no quote in it
        rows = await execute(store, f"SELECT status FROM runlet_checkpoints WHERE run_id = {run}")
        assert ["resolved"] * (1 + len(reasks)) == [row[0] for row in rows], label
        assert [] == list(await store.list_pending()), label
        # The repeat of the last response returns the stored result, running nothing.
        runs = len(bank.runs)
        again = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
        assert (again.status, again.output, again.run_id) == (
            result.status,
            result.output,
            result.run_id,
        ), label
        assert runs == len(bank.runs), label

    # One call, one idempotency key, whatever the attempts.
    assert len(set(bank.runs)) <= 1, label
    assert set(bank.paid) <= set(bank.runs), label
    if idempotent:
        assert not reasks, label
    else:
        # Never more runs than people approved; a rejected re-ask is honoured.
        approvals = 1 + sum(1 for _ in reasks) * (case.reask == "approve")
        assert len(bank.runs) <= approvals, label
        if case.reask == "reject":
            assert all(runs == len(bank.runs) for runs in runs_at_reask), label
    return Outcome(
        result,
        points,
        ops,
        bank,
        reasks,
        raised,
        cancelled,
        claimed_errors,
        faults.failed_releases,
        gate.released_early,
    )


async def undisturbed(where: Where, idempotent: bool) -> Outcome:
    outcome = await scenario(where, idempotent, Case())
    assert POINTS == outcome.points
    assert WRITES == outcome.ops
    assert 1 == outcome.bank.finished
    assert 1 == sum(outcome.bank.paid.values())
    return outcome


def check_paid(outcome: Outcome, expected: Outcome, case: Case, idempotent: bool) -> None:
    """The refund paid once in the end, and the undisturbed run's transcript."""
    label = case.label()
    bank = outcome.bank
    if outcome.reasks and case.reask == "reject":
        # The person said no: the model was told so, in the refund's place, and the run
        # went on as before (the refund's handler did not run again: see scenario()).
        got, want = outcome.result.transcript, expected.result.transcript
        assert len(want) == len(got), label
        for mine, theirs in zip(got, want, strict=True):
            result = mine.tool_result
            if result is not None and result.tool_call_id == "b":
                assert result.is_error, label
                assert REJECTION_MESSAGE == result.content, label
            else:
                assert theirs == mine, label
        return
    assert 1 == len(bank.refunds), label  # paid, under one key
    assert expected.result.transcript == outcome.result.transcript, label


IDEMPOTENT = pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "once"])


LEASES = pytest.mark.parametrize("lease", [0.0, LEASE], ids=["lease0", "lease60"])


@LEASES
@IDEMPOTENT
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("when", ["before", "after"])
async def test_every_await_point_of_resume(
    where: Where, when: str, kind: str, idempotent: bool, lease: float
) -> None:
    expected = await undisturbed(where, idempotent)
    for target in _targets(POINTS, kind):
        case = Case(target, when, kind, lease=lease)
        outcome = await scenario(where, idempotent, case)
        label = case.label()
        check_paid(outcome, expected, case, idempotent)
        # Turns after the recorded one are ordinary turns: a retry may run them again.
        assert outcome.bank.notified in (1, 2), label
        if kind == "deadline":  # no store call fails: a handler that returned, once
            assert 1 == outcome.bank.finished, label
            # A deadline that lands at the resolve cannot stop that write: the retry
            # finds the run resolved and runs nothing. One that runs out during the last
            # turn is delivered once the run is resolved, also with a lease (where it
            # used to land as the lease's renewals stopped, before the resolve: the
            # finished run was thrown away and its last turn, notify included, ran again).
            if (when, target) == ("before", 8) or target >= 6:
                assert 1 == outcome.bank.notified, label
            assert outcome.raised is None, label  # cancelled, or finished before it landed
        # Where the refund runs again, and where a person is asked again: exactly there.
        where_ = (kind, when, target)
        assert 1 + (where_ in CUT_OFF) == len(outcome.bank.runs), label
        assert 1 == len(set(outcome.bank.runs)), label  # with the same key
        reasked = not idempotent and where_ in CUT_OFF | DECIDED_ONLY
        assert (1 if reasked else 0) == len(outcome.reasks), label
        # A claim outlives the failed resume only where the resume never got it: the
        # fault came after the store's claim returned, before the resume held it.
        left_behind = lease and (when, POINTS[target]) == ("after", "claim") and kind != "deadline"
        assert (1 if left_behind else 0) == outcome.claimed_errors, label


REASKS = pytest.mark.parametrize(
    ("idempotent", "reask"),
    [(True, "approve"), (False, "approve"), (False, "reject")],
    ids=["idempotent", "once-approve", "once-reject"],
)
STAGES = pytest.mark.parametrize("stage", ["start", "commit"])


@REASKS
@STAGES
async def test_a_cancellation_while_the_thread_writes(
    where: Where, stage: str, idempotent: bool, reask: Literal["approve", "reject"]
) -> None:
    """The worker thread is in each store call of the resume (at its start, or with its
    statements run and the commit to come) when the resume's cancel scope is cancelled;
    the thread then writes."""
    await cancel_while_the_thread_writes(where, stage, False, idempotent, reask)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # Task.cancel() is asyncio's
@REASKS
@STAGES
async def test_asyncio_task_cancel_while_the_thread_writes(
    where: Where, stage: str, idempotent: bool, reask: Literal["approve", "reject"]
) -> None:
    """As above, with a plain ``Task.cancel()`` (``asyncio.timeout()``, ``wait_for()``),
    which goes through anyio's shields."""
    await cancel_while_the_thread_writes(where, stage, True, idempotent, reask)


async def cancel_while_the_thread_writes(
    where: Where,
    stage: str,
    by_task: bool,
    idempotent: bool,
    reask: Literal["approve", "reject"],
) -> None:
    """The worker thread is in each store call of the resume (at its start, or with its
    statements run and the commit to come) when the resume is cancelled; the thread
    then writes, by a cancel scope or (*by_task*) by asyncio's own ``Task.cancel()``."""
    expected = await undisturbed(where, idempotent)
    for write, lease in itertools.product(range(len(WRITES)), (0.0, LEASE)):
        case = Case(write=write, by_task=by_task, lease=lease, reask=reask, stage=stage)
        outcome = await scenario(where, idempotent, case)
        label = case.label()
        assert outcome.raised is None, label
        # Cancelled; but a resume whose resolve committed may return its result (trio
        # delivers the cancellation at the next checkpoint, and none comes).
        assert outcome.cancelled or WRITES[write] == "resolve", label
        assert 0 == outcome.claimed_errors, label  # the claim was given back
        check_paid(outcome, expected, case, idempotent)
        # No store call failed: a refund that returned never runs again. Only the write
        # of the decisions, committed after the cancellation, leaves the call looking
        # started (it never was): a non-idempotent one is asked again.
        decisions = write == WRITES.index("record")
        if by_task:
            # Only the decisions' write is not protected from Task.cancel() (neither is
            # the get, which comes before the claim): the resume gives its claim back
            # before that write ends. Before the commit, the write holds the lock the
            # release needs, and commits first; at its start, the release goes first
            # and the write then finds no claim to write under (and writes nothing).
            assert decisions == outcome.released_early, label
            decisions = decisions and stage == "commit"
        assert (decisions and not idempotent) == bool(outcome.reasks), label
        rejected = bool(outcome.reasks) and reask == "reject"
        assert 1 == outcome.bank.notified, label  # nothing ran again after the resolve
        assert (0 if rejected else 1) == outcome.bank.finished, label


@IDEMPOTENT
@pytest.mark.parametrize("kind", ["cancel", "error"])
async def test_a_claim_whose_release_fails_runs_out(
    where: Where, kind: str, idempotent: bool
) -> None:
    """A fault at each point, and then giving the claim back fails too: the retry is
    refused (CheckpointClaimedError) until the lease runs out, then finishes."""
    expected = await undisturbed(where, idempotent)
    for target in _targets(POINTS, kind):
        case = Case(target, "before", kind, lease=LEASE, release_fails=True)
        outcome = await scenario(where, idempotent, case)
        label = case.label()
        check_paid(outcome, expected, case, idempotent)
        assert (1 if outcome.failed_releases else 0) == outcome.claimed_errors, label
        claimed = POINTS.index("claim")
        assert (target > claimed) == bool(outcome.failed_releases), label


@IDEMPOTENT
async def test_a_write_that_commits_and_then_fails(where: Where, idempotent: bool) -> None:
    """Each transaction of the resume commits, and then its call fails (the reply to the
    COMMIT lost with the connection): whatever was written counts."""
    expected = await undisturbed(where, idempotent)
    postgres = where.kind == "postgres"
    for write, lease in itertools.product(range(len(WRITES)), (0.0, LEASE)):
        case = Case(write=write, fail=True, lease=lease)
        outcome = await scenario(where, idempotent, case)
        label = case.label()
        op = WRITES[write]
        if postgres and op == "record":  # written once more on a new connection
            assert outcome.raised is None, label
        else:
            assert outcome.raised is not None, label
        if op == "record" and write == WRITES.index("record", 3):  # the refund's result
            assert postgres or isinstance(outcome.raised, runlet.ResultNotRecordedError), label
        check_paid(outcome, expected, case, idempotent)
        # The claim that committed is nobody's. On PostgreSQL, whose store knows a lost
        # connection, it is given back at once; a claim call that failed otherwise (the
        # error injected on SQLite) leaves it held until its lease runs out.
        left_held = op == "claim" and lease and not postgres
        assert (1 if left_held else 0) == outcome.claimed_errors, label
        # The refund's result was recorded: it never runs again; its decision alone was:
        # a non-idempotent one is asked about again.
        decisions = write == WRITES.index("record") and not postgres
        assert (decisions and not idempotent) == bool(outcome.reasks), label
        assert 1 == outcome.bank.finished == len(outcome.bank.runs), label
        assert 1 == outcome.bank.notified, label
