"""Threads and several event loops at once: one ``Runtime`` and one store shared by
threads that each run their own event loop (a Flask or Django app calling ``anyio.run``
or ``asyncio.run`` per request in a thread pool, a worker with a loop per thread), on
asyncio and trio at the same time, and sync tool handlers that call back into their loop.

Each thread's wait is bounded by a join (or barrier) timeout: a failure there is a hang
of the code under test, not a slow machine.
"""

from __future__ import annotations

import collections
import queue
import sys
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
import pytest
from _files import needs_proc, open_files_under
from _threads import JOIN, in_threads

from runlet import (
    Agent,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    ConfigurationError,
    DurableCheckpointStore,
    HumanResponse,
    InMemoryCheckpointStore,
    ModelRequest,
    ResultNotRecordedError,
    RunResult,
    Runtime,
    ToolContext,
    ToolSpec,
)
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call

THREADS = 8
ROUNDS = 12  # round trips per thread
SHARED_EVERY = 4  # every so many rounds, all threads resume one checkpoint at once


def _backend(number: int) -> str:
    """Half the threads run asyncio, the other half trio."""
    return "trio" if number % 2 else "asyncio"


class Ledger:
    """A payment service: counts each call's runs by its idempotency key, from any
    thread."""

    def __init__(self) -> None:
        self.runs: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def pay(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        # A plain def: Runlet runs it in a worker thread of the calling loop.
        with self._lock:
            self.runs[context.idempotency_key] += 1
        return f"Paid {arguments['invoice']}."

    async def apay(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        return self.pay(arguments, context)

    def of_run(self, run_id: str) -> int:
        with self._lock:
            return sum(n for key, n in self.runs.items() if key.startswith(f"{run_id}/"))


def _script(request: ModelRequest) -> Any:
    """Pay once, then answer: one model serves every thread (no script position)."""
    if request.messages[-1].role == "tool":
        return "Paid."
    return call("pay", invoice="A-1")


def _agents(ledger: Ledger) -> tuple[Agent, Agent]:
    """The same agent twice, with a sync and an async handler (as two deployments)."""
    model = ScriptedModel(_script)
    return tuple(  # type: ignore[return-value]
        Agent(
            "billing",
            "Pay invoices.",
            model,
            (ToolSpec("pay", "Pay.", {"type": "object"}, handler, requires_approval=True),),
        )
        for handler in (ledger.pay, ledger.apay)
    )


def _approve(result: RunResult) -> HumanResponse:
    assert result.interruption is not None
    return HumanResponse(result.interruption.id, "approve")


def _cp(result: RunResult) -> str:
    assert result.checkpoint_id is not None
    return result.checkpoint_id


@attrs.define
class Shared:
    """What the threads of one stress run share, besides the runtime and the store."""

    ledger: Ledger
    handoff: queue.Queue[RunResult] = attrs.field(factory=queue.Queue)
    barrier: threading.Barrier = attrs.field(factory=lambda: threading.Barrier(THREADS))
    current: list[RunResult] = attrs.field(factory=list)
    approved: list[str] = attrs.field(factory=list)  # run ids of approved resumes
    retired: list[str] = attrs.field(factory=list)  # run ids cancelled or expired
    at_once: dict[str, list[RunResult | str]] = attrs.field(
        factory=lambda: collections.defaultdict(list)
    )


def _stress_thread(number: int, runtime: Runtime, shared: Shared) -> None:
    """One thread's loop: run, hand the interruption to the queue, answer one taken from
    it (usually another thread's), list, and now and then join the others in resuming
    one checkpoint at once."""
    store = runtime.checkpoint_store
    assert isinstance(store, DurableCheckpointStore)
    agent = _agents(shared.ledger)[number % 2]

    async def main() -> None:
        for round_ in range(ROUNDS):
            started = await runtime.run(agent, "Pay A-1.", metadata={"thread": number})
            assert started.status == "interrupted"
            shared.handoff.put(started)
            taken = shared.handoff.get(timeout=JOIN)
            if round_ % 6 == 5:
                await runtime.cancel(_cp(taken))
                shared.retired.append(taken.run_id)
            elif round_ % 6 == 2:
                expired = await runtime.expire(agent, checkpoint_id=_cp(taken))
                assert expired.status == "completed"
                shared.retired.append(taken.run_id)
            else:
                done = await runtime.resume(
                    agent, checkpoint_id=_cp(taken), response=_approve(taken)
                )
                assert done.status == "completed"
                assert done.output == "Paid."
                shared.approved.append(taken.run_id)
            mine = await store.list_pending(metadata={"thread": number})
            assert all(p.checkpoint.metadata == {"thread": number} for p in mine)
            if round_ % SHARED_EVERY == 0:
                await resume_at_once()

    async def resume_at_once() -> None:
        if number == 0:
            shared.current[:] = [await runtime.run(agent, "Pay A-1.")]
        await anyio.to_thread.run_sync(shared.barrier.wait, JOIN)
        (one,) = shared.current
        try:
            answer: RunResult | str = await runtime.resume(
                agent, checkpoint_id=_cp(one), response=_approve(one)
            )
        except CheckpointClaimedError:
            answer = "claimed"
        shared.at_once[one.run_id].append(answer)
        await anyio.to_thread.run_sync(shared.barrier.wait, JOIN)

    try:
        anyio.run(main, backend=_backend(number))
    except BaseException:
        shared.barrier.abort()  # the others stop waiting for this thread
        raise


def _check_stress(shared: Shared, errors: list[BaseException]) -> None:
    assert not errors, errors
    runs = dict(shared.ledger.runs)
    assert all(n == 1 for n in runs.values()), {k: n for k, n in runs.items() if n != 1}
    for run_id in shared.approved:
        assert shared.ledger.of_run(run_id) == 1
    for run_id in shared.retired:
        assert shared.ledger.of_run(run_id) == 0
    assert len(shared.approved) + len(shared.retired) == THREADS * ROUNDS
    assert len(shared.at_once) == ROUNDS // SHARED_EVERY
    for run_id, answers in shared.at_once.items():
        assert len(answers) == THREADS
        assert shared.ledger.of_run(run_id) == 1
        results = [a for a in answers if a != "claimed"]
        assert results, "nobody resumed the checkpoint"
        assert all(r == results[0] for r in results)  # the winner's, or the stored one
    assert sum(runs.values()) == len(shared.approved) + len(shared.at_once)


@needs_proc
def test_threads_on_both_backends_share_one_sqlite_store_and_run_each_approval_once(
    tmp_path: Path,
) -> None:
    # Built with no loop running (as at import time), opened in one loop, used by 8
    # others (4 asyncio, 4 trio) at once, closed in yet another.
    store = SQLiteCheckpointStore(tmp_path / "c.db", lease=30.0, connections=2)
    runtime = Runtime(checkpoint_store=store)
    anyio.run(store.__aenter__)
    shared = Shared(Ledger())
    errors = in_threads(*(lambda n=n: _stress_thread(n, runtime, shared) for n in range(THREADS)))
    _check_stress(shared, errors)
    assert anyio.run(store.list_pending) == []
    anyio.run(store.__aexit__, None, None, None, backend="trio")
    assert open_files_under(tmp_path) == 0  # no connection left open by any thread


def test_threads_on_both_backends_share_one_in_memory_store_and_run_each_approval_once() -> None:
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
    shared = Shared(Ledger())
    errors = in_threads(*(lambda n=n: _stress_thread(n, runtime, shared) for n in range(THREADS)))
    _check_stress(shared, errors)
    assert anyio.run(runtime.checkpoint_store.list_pending) == []  # type: ignore[union-attr]


def test_a_loop_per_request_in_a_thread_pool_shares_one_sqlite_store(tmp_path: Path) -> None:
    # A Django or Flask view calling anyio.run() (asyncio.run()) per request: every
    # run and every resume gets a fresh loop, far more loops than the store keeps a
    # limiter for, and the answer comes in another thread than the run.
    ledger = Ledger()
    sync_agent, _ = _agents(ledger)
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    runtime = Runtime(checkpoint_store=store)
    anyio.run(store.__aenter__)
    handoff: queue.Queue[RunResult] = queue.Queue()
    done: list[RunResult] = []

    def requests(number: int) -> None:
        backend = _backend(number)
        for _ in range(10):
            handoff.put(anyio.run(runtime.run, sync_agent, "Pay A-1.", backend=backend))
            taken = handoff.get(timeout=JOIN)
            done.append(
                anyio.run(
                    lambda taken=taken: runtime.resume(
                        sync_agent, checkpoint_id=_cp(taken), response=_approve(taken)
                    ),
                    backend=backend,
                )
            )

    try:
        errors = in_threads(*(lambda n=n: requests(n) for n in range(THREADS)))
        assert not errors, errors
        assert len(done) == THREADS * 10
        assert all(r.output == "Paid." for r in done)
        assert sorted(ledger.runs.values()) == [1] * (THREADS * 10)
        assert anyio.run(store.list_pending) == []
    finally:
        anyio.run(store.__aexit__, None, None, None)


def test_the_in_memory_store_lists_while_other_threads_save_and_finish() -> None:
    # Each operation of the in-memory store is atomic within a loop (it never yields);
    # threads that each run a loop switch in the middle of one, so list_pending(),
    # decisions() and len() walked the checkpoints while another thread added or forgot
    # some: "RuntimeError: dictionary changed size during iteration".
    store = InMemoryCheckpointStore(keep_finished=100)
    agent, _ = _agents(Ledger())
    first = anyio.run(Runtime(checkpoint_store=store).run, agent, "Pay A-1.")
    checkpoint = anyio.run(store.load, _cp(first))
    saved = threading.Event()

    def saver() -> None:
        async def main() -> None:
            for number in range(1000):
                await store.save(attrs.evolve(checkpoint, id=f"cp-{number}"))
                if number % 2:
                    await store.cancel(f"cp-{number}")
            saved.set()

        anyio.run(main, backend="asyncio")

    def lister() -> None:
        async def main() -> None:
            while not saved.is_set():
                await store.list_pending(limit=10_000)
                await store.decisions(first.run_id)
                assert len(store) >= 1

        anyio.run(main, backend="trio")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, as a busy server does
    try:
        errors = in_threads(saver, lister)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert len(store) == 1 + 500


@pytest.mark.anyio
async def test_a_sql_store_entered_twice_at_once_is_opened_once(
    anyio_backend: str, tmp_path: Path
) -> None:
    # One store object at module level, entered per request: the second enter must be
    # refused while the first still opens (not only once it has opened), or both open
    # it and the first to leave closes it under the other.
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    outcomes: list[str] = []
    leave = anyio.Event()

    async def enter() -> None:
        try:
            async with store:
                outcomes.append("entered")
                await leave.wait()
                await store.list_pending()  # still open
        except ConfigurationError as exc:
            outcomes.append("refused" if "already open" in str(exc) else str(exc))
            leave.set()

    with anyio.move_on_after(5):  # both entered: neither is told to leave
        async with anyio.create_task_group() as group:
            group.start_soon(enter)
            group.start_soon(enter)
    assert sorted(outcomes) == ["entered", "refused"]
    async with store:  # closed properly: it opens again
        assert await store.list_pending() == []


def test_threads_entering_one_sqlite_store_at_once_open_it_once(tmp_path: Path) -> None:
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    opening = threading.Event()
    go_on = threading.Event()
    open_store = store._open

    def slow_open() -> None:  # the first thread's open takes a while (a busy disk)
        if not opening.is_set():
            opening.set()
            go_on.wait(JOIN)
        open_store()

    store._open = slow_open  # type: ignore[method-assign]
    outcomes: list[str] = []

    def first() -> None:
        async def main() -> None:
            async with store:
                outcomes.append("entered")

        anyio.run(main, backend="asyncio")

    def second() -> None:
        async def main() -> None:
            opening.wait(JOIN)
            try:
                async with store:
                    outcomes.append("entered")
            except ConfigurationError:
                outcomes.append("refused")
            finally:
                go_on.set()

        anyio.run(main, backend="trio")

    assert in_threads(first, second) == []
    assert sorted(outcomes) == ["entered", "refused"]


@asynccontextmanager
async def _store(kind: str, path: Path, **options: Any) -> AsyncIterator[DurableCheckpointStore]:
    if kind == "memory":
        yield InMemoryCheckpointStore(lease=options.get("lease"))
        return
    async with SQLiteCheckpointStore(path / "c.db", **options) as store:
        yield store


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_sync_handler_waiting_on_its_loop_is_cut_off_by_a_deadline(
    anyio_backend: str, kind: str, tmp_path: Path
) -> None:
    never = anyio.Event()
    keys: list[str] = []
    cut_off: list[BaseException] = []

    def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        keys.append(context.idempotency_key)
        try:
            anyio.from_thread.run(never.wait)  # back into the loop, which never answers
        except BaseException as exc:
            cut_off.append(exc)
            raise
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = Agent("billing", "Pay.", ScriptedModel(_script), (tool,))
    async with _store(kind, tmp_path, lease=30.0) as store:
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(agent, "Pay A-1.")
        began = anyio.current_time()
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.2):
                await runtime.resume(agent, checkpoint_id=_cp(first), response=_approve(first))
        assert anyio.current_time() - began < 5  # the deadline, not the handler, ended it
        stored = await store.get(_cp(first))
        assert stored.status == "pending"  # the claim was given back
        (record,) = stored.records
        assert record.decision.action == "approve"
        assert record.result is None
        again = await runtime.resume(agent, checkpoint_id=_cp(first), response=_approve(first))
        assert again.interruption is not None
        assert again.interruption.outcome_unknown
        assert len(keys) == 1
    never.set()


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_sync_handler_blocked_past_a_deadline_records_nothing_late(
    anyio_backend: str, kind: str, tmp_path: Path
) -> None:
    let_go = threading.Event()
    finished = threading.Event()
    keys: list[str] = []

    def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        keys.append(context.idempotency_key)
        let_go.wait(JOIN)  # a slow payment API
        finished.set()
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = Agent("billing", "Pay.", ScriptedModel(_script), (tool,))
    async with _store(kind, tmp_path, lease=30.0) as store:
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(agent, "Pay A-1.")
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.2):
                await runtime.resume(agent, checkpoint_id=_cp(first), response=_approve(first))
        let_go.set()
        await anyio.to_thread.run_sync(finished.wait, JOIN)  # the abandoned handler ends
        stored = await store.get(_cp(first))
        assert stored.status == "pending"
        (record,) = stored.records
        assert record.result is None  # its late result goes nowhere: outcome unknown
        again = await runtime.resume(agent, checkpoint_id=_cp(first), response=_approve(first))
        assert again.interruption is not None
        assert again.interruption.outcome_unknown
        done = await runtime.resume(agent, checkpoint_id=_cp(again), response=_approve(again))
        assert done.output == "Paid."
        assert len(keys) == 2
        assert keys[0] == keys[1]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_sync_handler_reads_the_store_through_its_loop(
    anyio_backend: str, kind: str, tmp_path: Path
) -> None:
    # One connection: the handler's store call must not wait for a connection its own
    # resume holds.
    seen: list[list[str]] = []
    options = {"connections": 1} if kind == "sqlite" else {}
    async with _store(kind, tmp_path, **options) as store:

        def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
            decisions = anyio.from_thread.run(store.decisions, context.run_id)
            seen.append([d.action for d in decisions])
            return "paid"

        tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
        agent = Agent("billing", "Pay.", ScriptedModel(_script), (tool,))
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(agent, "Pay A-1.")
        with anyio.fail_after(JOIN):
            done = await runtime.resume(agent, checkpoint_id=_cp(first), response=_approve(first))
        assert done.output == "Paid."
        assert seen == [["approve"]]  # the decision is stored before the handler runs
        (record,) = (await store.get(_cp(first))).records
        assert record.result is not None
        assert record.result.content == "paid"


@needs_proc
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_sqlite_store_closed_by_one_thread_while_another_resumes(
    backend: str, tmp_path: Path
) -> None:
    # Documented: close the store after the requests; a store closed first leaves the
    # claim to wait out its lease. The resume must say why, not hang or open it again.
    inside = threading.Event()
    go_on = threading.Event()
    keys: list[str] = []

    def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        keys.append(context.idempotency_key)
        inside.set()
        go_on.wait(JOIN)
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = Agent("billing", "Pay.", ScriptedModel(_script), (tool,))
    other = "trio" if backend == "asyncio" else "asyncio"
    store = SQLiteCheckpointStore(tmp_path / "c.db", lease=30.0)
    runtime = Runtime(checkpoint_store=store)
    anyio.run(store.__aenter__, backend=backend)
    first = anyio.run(runtime.run, agent, "Pay A-1.", backend=backend)
    raised: list[BaseException] = []

    def resume() -> None:
        async def main() -> None:
            with pytest.raises(ResultNotRecordedError) as caught:
                await runtime.resume(agent, checkpoint_id=_cp(first), response=_approve(first))
            raised.append(caught.value)

        anyio.run(main, backend=other)

    def close() -> None:
        assert inside.wait(JOIN)
        anyio.run(store.__aexit__, None, None, None, backend=backend)
        go_on.set()

    assert in_threads(resume, close) == []
    (error,) = raised
    assert isinstance(error.__cause__, ConfigurationError)
    assert "not open" in str(error.__cause__)
    assert len(keys) == 1
    assert open_files_under(tmp_path) == 0

    async def status() -> tuple[str, Any]:
        async with SQLiteCheckpointStore(tmp_path / "c.db") as again:
            stored = await again.get(_cp(first))
            return stored.status, [(r.decision.action, r.result) for r in stored.records]

    assert anyio.run(status) == ("claimed", [("approve", None)])


def test_the_in_memory_store_may_be_called_again_while_it_works() -> None:
    # A signal handler runs between any two bytecodes of the main thread, also in the
    # middle of a store operation, and may call the store (len(), a listing). Here the
    # id's hash calls it, at the same place. A plain lock would wait for itself forever.
    store = InMemoryCheckpointStore()

    class CallsBack(str):
        def __hash__(self) -> int:
            seen.append(len(store))
            return str.__hash__(self)

    seen: list[int] = []

    def target() -> None:
        async def main() -> None:
            assert CallsBack("cp-1") not in store
            with pytest.raises(CheckpointNotFoundError):
                await store.get(CallsBack("cp-1"))

        anyio.run(main)

    assert in_threads(target) == []
    assert seen == [0, 0]
