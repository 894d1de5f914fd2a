"""A property test of concurrent resumes of one checkpoint: the races a web application
creates when two browser tabs, a retried HTTP request and a background expiry job all act
on the same checkpoint at once.

Hypothesis generates a run that stops for one to three approvals or inputs (optionally a
second turn that stops again), then a batch of two to five operations on that checkpoint,
started in one task group: ``resume()`` with the canonical answers or with a conflicting
one, ``stream_resume()`` consumed to the end or abandoned at a chosen event,
``runtime.expire()`` and ``runtime.cancel()``; optionally one fault aimed at one of them
(its cancel scope cancelled from inside the model or an approved handler, before or after
the side effect; the model failing; the handler raising), and any of them may be cancelled
from outside after a drawn number of scheduling points (a client that went away). The
interleaving is controlled, never slept on: a coordinator starts the operations one by
one, waiting (unless the operation is drawn as a "burst") until the operation is done or
parked at its gate (the first model call or approved handler it reaches), so the parked
claim holder really is inside the resume while the others are attempted. Then whatever
failed retryably is retried until the checkpoint settles, and the run is answered to its
end.

Invariants (the world keeps a ledger of side effects, and knows through a context
variable which operation every model call and handler runs in):

* only one operation at a time is inside the model or a handler of the checkpoint (one
  claim); nothing is left claimed after the batch or at the end;
* every outcome is one of the documented ones for that operation (``RunResult`` or
  ``CheckpointClaimedError``, ``HumanResponseConflictError``,
  ``CheckpointCancelledError``, ``HumanRequestExpiredError``, ``CheckpointResolvedError``
  as DESIGN says, a ``ModelError`` or cancellation only when a fault fired); anything else
  (an ``ExceptionGroup``, a ``KeyError``) fails the test;
* every outcome agrees with the final state: all results of the checkpoint are equal and
  come from operations whose answers are the recorded ones; a conflict error only for a
  different answer; a cancelled-error only when a cancel succeeded; an expired-error only
  when an expiry was recorded; a claimed-error only while another operation was working;
* the audit trail (``store.decisions(run_id)``) holds exactly one accepted answer set for
  the checkpoint (one operation's answers, or the expiry) plus the later answers;
* ``list_pending()`` agrees with what the winners said;
* an approved handler runs only in an operation whose answer is the recorded approval,
  with the approved arguments; its side effect happens at most once per approval, exactly
  once once the run completes (modulo the documented ``outcome_unknown`` re-ask for a
  non-idempotent call cut off in its handler; an idempotent one keeps one key); a handler
  that returned never runs again.

Stores: in-memory, SQLite (a fresh file per example) and PostgreSQL (a fresh schema per
example, when the ``postgres_server`` fixture has a server); both backends.
``RUNLET_CONCURRENT_EXAMPLES=1500`` (with ``--timeout=0``) runs a longer hunt. Read a
failure with ``--tb=native``: pytest's own traceback formatting can fail on these deep
stacks (``SystemError: AST constructor recursion depth mismatch`` on CPython 3.11).
"""

from __future__ import annotations

import contextvars
import os
import tempfile
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_stateful import SCHEMA, different

from runlet import (
    Agent,
    CheckpointCancelledError,
    CheckpointClaimedError,
    CheckpointResolvedError,
    HumanRequest,
    HumanRequestExpiredError,
    HumanResponse,
    HumanResponseConflictError,
    InMemoryCheckpointStore,
    Interrupted,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    RunFinished,
    RunResult,
    Runtime,
    ToolCall,
    ToolContext,
    ToolSpec,
    ask_human,
)
from runlet.stores.sqlite import SQLiteCheckpointStore

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("RUNLET_CONCURRENT_EXAMPLES", "100"))
GATED = ("pay", "pay_idem")
ASK = "ask_human"
FREE = "lookup"
DONE = "done"
TOOL_FAULTS = ("tool_cancel_before", "tool_cancel_after", "tool_fail")
MODEL_FAULTS = ("model_cancel", "model_fail")
CANCELS = ("tool_cancel_before", "tool_cancel_after", "model_cancel")
KINDS = ("resume", "resume", "conflict", "stream", "stream_conflict", "expire", "cancel")

CURRENT: contextvars.ContextVar[Op | None] = contextvars.ContextVar("op", default=None)


@attrs.define(eq=False, repr=False)
class Op:
    """One operation of the batch (or of the settling driver), and what became of it."""

    index: int
    kind: str  # resume, conflict, stream, stream_conflict, expire, cancel, driver
    answers: tuple[HumanResponse, ...] | None = None  # None: expire() or cancel()
    park: str | None = None  # "model" or "handler": wait there for the coordinator
    burst: bool = False  # start the next operation without waiting for this one
    abandon_at: int | None = None  # stream: leave after this many events (-1: at once)
    fault: str | None = None
    kill: int | None = None  # cancelled from outside after this many scheduling points
    killed: bool = False
    go: anyio.Event = attrs.Factory(anyio.Event)
    settled: anyio.Event = attrs.Factory(anyio.Event)  # done or parked
    release: anyio.Event = attrs.Factory(anyio.Event)
    done: anyio.Event = attrs.Factory(anyio.Event)
    scope: anyio.CancelScope | None = None
    parked: bool = False
    fired: bool = False
    entered: bool = False  # reached the model or an approved handler: held the claim
    abandoned: bool = False
    cancelled: bool = False
    result: RunResult | None = None
    returned: bool = False  # cancel() returned

    @property
    def may_have_cancelled(self) -> bool:
        return self.kind == "cancel" and (self.returned or self.killed)

    error: BaseException | None = None
    events: list[Any] = attrs.Factory(list)

    @property
    def label(self) -> str:
        return f"op{self.index}:{self.kind}"

    def __repr__(self) -> str:
        return f"<{self.label} park={self.park} fault={self.fault} burst={self.burst}>"


class World:
    """The model and the tools, with a ledger of side effects and gates per operation."""

    def __init__(self, plan: list[list[str]]) -> None:
        self.plan = plan
        self.model_calls: Counter[int] = Counter()
        self.starts: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()
        self.finishes: Counter[str] = Counter()  # handlers that returned or raised
        self.returns: Counter[str] = Counter()  # handlers that returned
        self.keys: defaultdict[str, set[str]] = defaultdict(set)
        self.applied: set[str] = set()  # idempotency keys the idempotent service acted on
        self.ran_in: list[tuple[str, Op, int]] = []  # (ref, op, amount)
        self.inside: Counter[int] = Counter()  # op index -> model calls and handlers now
        self.violations: list[str] = []
        self.broke: set[str] = set()  # refs whose handler raised (a fault) before acting

    def enter(self, op: Op | None, what: str) -> None:
        if op is None:
            self.violations.append(f"{what} ran outside any operation")
            return
        others = [i for i, n in self.inside.items() if n and i != op.index]
        if others:
            self.violations.append(f"{what} ran in op{op.index} while op{others} was inside")
        self.inside[op.index] += 1
        op.entered = True

    async def gate(self, op: Op, where: str) -> None:
        if op.park == where and not op.parked:
            op.parked = True
            op.settled.set()
            await op.release.wait()

    async def fault(self, op: Op, kinds: tuple[str, ...]) -> str | None:
        if op.fired or op.fault not in kinds:
            return None
        op.fired = True
        if op.fault == "model_fail":
            raise RuntimeError("the model is down")
        if op.fault in CANCELS:
            assert op.scope is not None
            op.scope.cancel()
            await anyio.lowlevel.checkpoint()  # delivered right here
        return op.fault

    async def complete(self, request: ModelRequest) -> ModelResponse:
        op = CURRENT.get()
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn > 0:  # run() asks the model outside the batch: no gates there
            self.enter(op, "the model")
            assert op is not None
            try:
                self.model_calls[op.index] += 1
                await self.gate(op, "model")
                await self.fault(op, MODEL_FAULTS)
            finally:
                self.inside[op.index] -= 1
        if turn >= len(self.plan):
            return ModelResponse(Message.assistant(DONE))
        calls = []
        for index, tool in enumerate(self.plan[turn]):
            ref = f"t{turn}i{index}"
            if tool == ASK:
                arguments: dict[str, Any] = {"kind": "input", "prompt": ref}
            else:
                arguments = {"ref": ref, "amount": turn * 10 + index}
            calls.append(ToolCall(f"c{index}", tool, arguments))
        return ModelResponse(Message.assistant("", calls))

    async def free(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        ref = arguments["ref"]
        self.starts[ref] += 1
        self.effects[ref] += 1
        self.finishes[ref] += 1
        return f"looked up {ref}"

    async def handler(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        op = CURRENT.get()
        ref = arguments["ref"]
        self.enter(op, f"handler {ref}")
        assert op is not None
        try:
            self.starts[ref] += 1
            self.keys[ref].add(context.idempotency_key)
            self.ran_in.append((ref, op, int(arguments["amount"])))
            await self.gate(op, "handler")
            if await self.fault(op, ("tool_cancel_before", "tool_fail")) == "tool_fail":
                self.finishes[ref] += 1
                self.broke.add(ref)
                raise RuntimeError(f"tool broke on {ref}")
            if tool_of(ref, self.plan) == "pay_idem":
                if context.idempotency_key not in self.applied:  # the service dedups
                    self.applied.add(context.idempotency_key)
                    self.effects[ref] += 1
            else:
                self.effects[ref] += 1
            await self.fault(op, ("tool_cancel_after",))
            self.finishes[ref] += 1
            self.returns[ref] += 1
            return f"ok {ref} {arguments['amount']}"
        finally:
            self.inside[op.index] -= 1


def tool_of(ref: str, plan: Sequence[Sequence[str]]) -> str:
    turn, index = ref[1:].split("i")
    return plan[int(turn)][int(index)]


def ref_of(request: HumanRequest) -> str:
    arguments = request.tool_call.arguments
    return str(arguments["prompt"] if request.tool_call.name == ASK else arguments["ref"])


def agent_of(world: World) -> Agent:
    tools = (
        ToolSpec(
            name="pay",
            description="Pay.",
            input_schema=SCHEMA,
            handler=world.handler,
            requires_approval=True,
        ),
        ToolSpec(
            name="pay_idem",
            description="Pay through an idempotent service.",
            input_schema=SCHEMA,
            handler=world.handler,
            requires_approval=True,
            idempotent=True,
        ),
        ToolSpec(name=FREE, description="Look up.", input_schema=SCHEMA, handler=world.free),
        ask_human(),
    )
    return Agent(name="conc", instructions="", model=world, tools=tools)


def answer(request: HumanRequest, choice: str) -> HumanResponse:
    if request.kind == "input":
        return HumanResponse.submit(request.id, "no" if choice == "reject" else "yes")
    if choice == "approve_edit":
        arguments = dict(request.tool_call.arguments)
        arguments["amount"] += 1000
        return HumanResponse.approve(request.id, arguments, responded_by="alice")
    if choice == "reject":
        return HumanResponse.reject(request.id, "no", responded_by="alice")
    return HumanResponse(request.id, "approve", responded_by="alice")


async def perform(runtime: Runtime, agent: Agent, cp: str, op: Op) -> None:
    if op.kind == "cancel":
        await runtime.cancel(cp)
        op.returned = True
    elif op.kind == "expire":
        op.result = await runtime.expire(agent, checkpoint_id=cp)
    elif op.kind in ("resume", "conflict", "driver"):
        assert op.answers is not None
        op.result = await runtime.resume(agent, checkpoint_id=cp, responses=op.answers)
    else:
        assert op.answers is not None
        async with runtime.stream_resume(agent, checkpoint_id=cp, responses=op.answers) as s:
            if op.abandon_at == -1:
                op.abandoned = True
                return
            async for item in s:
                op.events.append(item)
                if op.abandon_at is not None and len(op.events) > op.abandon_at:
                    op.abandoned = True
                    return
            op.result = s.result


async def run_op(runtime: Runtime, agent: Agent, cp: str, op: Op) -> None:
    await op.go.wait()
    CURRENT.set(op)  # this task's context: the stream's and the tools' tasks copy it
    try:
        with anyio.CancelScope() as scope:
            op.scope = scope
            try:
                await perform(runtime, agent, cp, op)
            except Exception as exc:  # judged against the documented ones below
                op.error = exc
        op.cancelled = scope.cancelled_caught
    finally:
        op.done.set()
        op.settled.set()


async def kill(op: Op) -> None:
    """Cancel *op* from outside after *op.kill* scheduling points (a client that left)."""
    assert op.kill is not None
    while op.scope is None and not op.done.is_set():
        await anyio.lowlevel.checkpoint()
    for _ in range(op.kill):
        await anyio.lowlevel.checkpoint()
    if op.scope is not None and not op.done.is_set():
        op.killed = True
        op.scope.cancel()


ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "resume": (
        CheckpointClaimedError,
        HumanResponseConflictError,
        CheckpointCancelledError,
        HumanRequestExpiredError,
    ),
    "expire": (CheckpointClaimedError, CheckpointResolvedError, CheckpointCancelledError),
    "cancel": (CheckpointClaimedError, CheckpointResolvedError),
}


class Example:
    """One generated example. Everything is drawn before the store opens: what happens
    after the race may depend on how it went (with threads, not every interleaving
    replays), and the draws must not."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.tag = uuid.uuid4().hex
        plan = [self.turn(first=True)]
        if self.draw(st.booleans(), "second turn"):
            plan.append(self.turn(first=False))
        self.world = World(plan)
        self.agent = agent_of(self.world)
        stops = sum(1 for tool in plan[0] if tool != FREE)
        self.choices = self.draw(
            st.lists(
                st.sampled_from(["approve", "approve_edit", "reject"]),
                min_size=stops,
                max_size=stops,
            ),
            "answers",
        )
        self.victim = self.draw(st.integers(0, stops - 1), "victim")
        self.ops = self.batch()
        self.later = self.draw(
            st.lists(st.sampled_from(["approve", "reject"]), min_size=12, max_size=12),
            "later answers",
        )
        self.order = self.draw(st.permutations(range(len(self.ops))), "release order")
        self.seen: set[str] = set()  # every checkpoint id met
        self.refs: dict[str, str] = {}  # request id -> call ref

    def learn(self, result: RunResult) -> None:
        for q in result.pending_requests:
            self.refs[q.id] = ref_of(q)

    def draw(self, strategy: st.SearchStrategy[Any], label: str) -> Any:
        return self.data.draw(strategy, label=label)

    def turn(self, *, first: bool) -> list[str]:
        stops = self.draw(
            st.lists(st.sampled_from((*GATED, ASK)), min_size=1, max_size=3 if first else 2),
            "stops",
        )
        if self.draw(st.booleans(), "free call"):
            stops.insert(self.draw(st.integers(0, len(stops)), "where"), FREE)
        return stops

    async def pending(self) -> list[tuple[str, tuple[str, ...]]]:
        listed = await self.store.list_pending(limit=1000, metadata={"tag": self.tag})
        return [(p.checkpoint_id, tuple(q.id for q in p.requests)) for p in listed]

    async def status(self, cp: str) -> str:
        return str((await self.store.get(cp)).status)

    async def run(self, store: Any) -> None:
        self.store = store
        self.runtime = Runtime(checkpoint_store=store)
        result = await self.runtime.run(self.agent, "go", metadata={"tag": self.tag})
        assert result.status == "interrupted"
        cp = result.checkpoint_id
        assert cp is not None
        self.seen.add(cp)
        self.run_id = result.run_id
        self.learn(result)
        requests = result.pending_requests
        assert len(requests) == len(self.choices)
        canonical = tuple(answer(q, c) for q, c in zip(requests, self.choices, strict=True))
        conflicting = tuple(
            different(r) if i == self.victim else r for i, r in enumerate(canonical)
        )
        ops = self.ops
        for op in ops:
            if op.kind not in ("expire", "cancel"):
                op.answers = conflicting if op.kind.endswith("conflict") else canonical
        await self.race(cp, ops, self.order)
        await self.check_batch(cp, requests, ops)
        final = await self.settle(cp, ops, canonical, conflicting)
        await self.check_end(cp, requests, ops, final)

    def batch(self) -> list[Op]:
        n = self.draw(st.integers(2, 5), "operations")
        ops = []
        for i in range(n):
            kind = self.draw(st.sampled_from(KINDS), "kind")
            op = Op(i, kind)
            if kind != "cancel":
                op.park = self.draw(st.sampled_from([None, None, "model", "handler"]), "park")
            op.burst = self.draw(st.booleans(), "burst")
            # A client that goes away: cancelled from outside, at a scheduling point.
            op.kill = self.draw(st.sampled_from([None] * 6 + [0, 1, 2, 4, 8]), "kill")
            if kind.startswith("stream"):
                op.abandon_at = self.draw(st.sampled_from([None, None, -1, 0, 1, 2]), "abandon")
            ops.append(op)
        targets = [op for op in ops if op.kind != "cancel"]
        if targets and self.draw(st.booleans(), "fault"):
            op = targets[self.draw(st.integers(0, len(targets) - 1), "target")]
            op.fault = self.draw(st.sampled_from(TOOL_FAULTS + MODEL_FAULTS), "fault kind")
        event(" ".join(op.kind for op in ops))
        return ops

    async def race(self, cp: str, ops: list[Op], order: Sequence[int]) -> None:
        """Start the operations in one task group, one by one, each (unless a burst) done
        or parked at its gate before the next starts; then release the parked ones."""
        with anyio.fail_after(30):  # a safety net only: nothing here waits on time
            async with anyio.create_task_group() as group:
                for op in ops:
                    group.start_soon(run_op, self.runtime, self.agent, cp, op)
                for op in ops:
                    op.go.set()
                    if op.kill is not None:
                        group.start_soon(kill, op)
                    if not op.burst:
                        await op.settled.wait()
                for op in ops:
                    await op.settled.wait()
                for i in order:
                    ops[i].release.set()
                    await ops[i].done.wait()

    # -- checks ---------------------------------------------------------------------
    def check_outcome(self, op: Op) -> None:
        outcome = (
            "cancelled"
            if op.cancelled
            else "abandoned"
            if op.abandoned
            else type(op.error).__name__
            if op.error is not None
            else "ok"
        )
        event(f"{op.kind} -> {outcome}{' (parked)' if op.parked else ''}")
        kind = {"conflict": "resume", "stream": "resume", "stream_conflict": "resume"}.get(
            op.kind, op.kind
        )
        error = op.error
        if op.cancelled:
            assert op.killed or op.fired, f"{op.label}: a cancellation nobody made"
            assert op.killed or op.fault in CANCELS, f"{op.label}: a cancellation nobody made"
            return
        if op.fired and op.fault in CANCELS and not op.killed:
            # Cancelled inside the model or a handler: the cancellation must come out.
            raise AssertionError(f"{op.label}: its cancellation was swallowed ({error!r})")
        if error is None:
            return
        if type(error) in ALLOWED[kind]:
            return
        if isinstance(error, ModelError) and op.fault == "model_fail" and op.fired:
            return
        raise AssertionError(f"{op.label}: undocumented {type(error).__name__}: {error!r}")

    async def cp_decisions(self, cp: str) -> list[Any]:
        return [d for d in await self.store.decisions(self.run_id) if d.checkpoint_id == cp]

    async def check_batch(self, cp: str, requests: Sequence[HumanRequest], ops: list[Op]) -> None:
        assert not self.world.violations, self.world.violations
        for op in ops:
            self.check_outcome(op)
        status = await self.status(cp)
        assert status in ("pending", "resolved", "cancelled"), f"left {status} after the batch"
        event(f"after the batch: {status}")
        decided = await self.cp_decisions(cp)
        results = [op.result for op in ops if op.result is not None]
        for a in results:
            assert a == results[0], "two different results for one checkpoint"
        if status == "pending":
            assert not results, "a result, but the checkpoint is still pending"
        if status == "cancelled":
            assert not results, "a result, but the checkpoint was cancelled"
            assert any(op.may_have_cancelled for op in ops), "cancelled by nobody"
        if status == "resolved":
            assert not any(op.returned for op in ops), "cancel() returned, yet it resolved"
        for op in ops:
            error = op.error
            if op.result is not None:
                assert status == "resolved"
                if op.answers is not None:  # its answers are the recorded ones
                    assert sorted(d.request_id for d in decided) == sorted(
                        r.request_id for r in op.answers
                    )
                    by_id = {d.request_id: d for d in decided}
                    for r in op.answers:
                        assert by_id[r.request_id].answers_like(r), (op.label, r)
                if op.kind.startswith("stream"):
                    assert isinstance(op.events[-1], RunFinished)
                    assert op.events[-1].result == op.result
                    if op.result.status == "interrupted":
                        assert isinstance(op.events[-2], Interrupted)
                        assert op.events[-2].checkpoint_id == op.result.checkpoint_id
            if op.returned:
                assert status == "cancelled"
            if isinstance(error, CheckpointCancelledError):
                assert status == "cancelled"
                assert any(o.may_have_cancelled for o in ops), f"{op.label}: cancelled by nobody"
            if isinstance(error, CheckpointResolvedError):
                assert status == "resolved", f"{op.label}: {error!r}, status {status}"
            if isinstance(error, HumanResponseConflictError):
                assert op.answers is not None
                assert decided, f"{op.label}: conflict with nothing"
                by_id = {d.request_id: d for d in decided}
                assert not all(
                    r.request_id in by_id and by_id[r.request_id].answers_like(r)
                    for r in op.answers
                ), f"{op.label}: a conflict error for the recorded answer"
                assert error.checkpoint_id == cp
            if isinstance(error, HumanRequestExpiredError):
                assert any(d.action == "expire" for d in decided), f"{op.label}: {error!r}"
            if isinstance(error, CheckpointClaimedError):
                assert error.checkpoint_id == cp
                assert any(
                    o is not op
                    and (o.entered or o.abandoned or o.fired or o.killed or o.result is not None)
                    for o in ops
                ), f"{op.label}: claimed by nobody"
        # The recorded decisions of this checkpoint are one operation's answers (or the
        # expiry), never a mix; at most one per request.
        assert len({d.request_id for d in decided}) == len(decided), decided
        if decided:
            self.check_one_source(decided, ops)
        # list_pending() agrees with the winners.
        listed = await self.pending()
        if status == "pending":
            assert listed == [(cp, tuple(q.id for q in requests))]
        elif status == "cancelled":
            assert listed == []
        elif results:
            nxt = results[0]
            want = (
                [(nxt.checkpoint_id, tuple(q.id for q in nxt.pending_requests))]
                if nxt.status == "interrupted"
                else []
            )
            assert listed == want

    def check_one_source(self, decided: Sequence[Any], ops: Sequence[Op]) -> None:
        if all(d.action == "expire" for d in decided):
            assert any(op.kind == "expire" for op in ops), "an expiry nobody asked for"
            return
        by_id = {d.request_id: d for d in decided}
        sources = [
            op
            for op in ops
            if op.answers is not None
            and all(
                r.request_id in by_id and by_id[r.request_id].answers_like(r) for r in op.answers
            )
        ]
        assert sources, f"recorded decisions no operation gave: {decided}"

    async def settle(
        self,
        cp: str,
        ops: list[Op],
        canonical: tuple[HumanResponse, ...],
        conflicting: tuple[HumanResponse, ...],
    ) -> RunResult | None:
        """Retry until the checkpoint is resolved (or found cancelled), then answer the run
        to its end. Returns the checkpoint's result (``None``: it was cancelled)."""
        candidates: list[tuple[HumanResponse, ...] | None] = [
            op.answers for op in ops if op.result is not None
        ]
        candidates += [op.answers for op in ops if op.fired or op.abandoned or op.killed]
        candidates += [canonical, conflicting, None]
        first: RunResult | None = None
        for answers in candidates:
            driver = Op(len(ops), "driver" if answers is not None else "expire", answers)
            await self.drive(cp, driver)
            error = driver.error
            if driver.result is not None:
                first = driver.result
                break
            if isinstance(error, CheckpointCancelledError):
                break
            if answers is None and isinstance(error, CheckpointResolvedError):
                continue  # resolved with answers (perhaps by a stream nobody read to the end)
            assert isinstance(error, (HumanResponseConflictError, HumanRequestExpiredError)), (
                f"settling {cp}: {error!r}"
            )
        else:
            raise AssertionError("the checkpoint never settled")
        status = await self.status(cp)
        if first is None:
            assert status == "cancelled"
            assert any(op.may_have_cancelled for op in ops)
            return None
        assert status == "resolved"
        for op in ops:
            if op.result is not None:
                assert op.result == first, "a repeat returned another result"
        result = first
        for _ in range(8):
            if result.status != "interrupted":
                break
            nxt = result.checkpoint_id
            assert nxt is not None
            self.seen.add(nxt)
            answers = tuple(answer(q, self.later.pop()) for q in result.pending_requests)
            if any(q.outcome_unknown for q in result.pending_requests):
                event("asked again: outcome unknown")
            driver = Op(len(ops) + 1, "driver", answers)
            await self.drive(nxt, driver)
            assert driver.error is None, repr(driver.error)
            assert driver.result is not None
            result = driver.result
        assert result.status == "completed", result
        assert result.output == DONE
        return first

    async def drive(self, cp: str, op: Op) -> None:
        op.go.set()
        op.release.set()
        await run_op(self.runtime, self.agent, cp, op)
        assert not op.cancelled
        assert not self.world.violations, self.world.violations
        if op.result is not None:
            self.learn(op.result)

    async def check_end(
        self,
        cp: str,
        requests: Sequence[HumanRequest],
        ops: list[Op],
        first: RunResult | None,
    ) -> None:
        w = self.world
        assert not w.violations, w.violations
        for seen in self.seen:
            assert await self.status(seen) in ("resolved", "cancelled"), seen
        assert await self.pending() == []
        trail = await self.store.decisions(self.run_id)
        assert len({d.request_id for d in trail}) == len(trail), "a request decided twice"
        if first is not None:
            # Repeating the accepted answers gives the same result, again and again.
            decided = await self.cp_decisions(cp)
            if all(d.action == "expire" for d in decided):
                again = await self.runtime.expire(self.agent, checkpoint_id=cp)
            else:
                responses = [d.as_response() for d in decided]
                again = await self.runtime.resume(self.agent, checkpoint_id=cp, responses=responses)
            assert again == first
        approvals: Counter[str] = Counter()
        last: dict[str, str] = {}
        approved_amount: dict[str, set[int]] = defaultdict(set)
        for op in ops:
            if op.result is not None:
                self.learn(op.result)
        request_ref = self.refs
        for d in trail:
            ref = request_ref[d.request_id]
            last[ref] = d.action
            if d.action == "approve":
                approvals[ref] += 1
                assert d.arguments is not None
                approved_amount[ref].add(int(d.arguments["amount"]))
        # Every handler run: in an operation whose answer is the recorded approval.
        for ref, op, amount in w.ran_in:
            assert approvals[ref] > 0, f"{ref} ran in {op.label} without a recorded approval"
            assert amount in approved_amount[ref], f"{ref} ran with {amount}"
            if op.answers is not None:
                mine = [r for r in op.answers if request_ref.get(r.request_id) == ref]
                assert mine, f"{ref} ran in {op.label}, which did not answer it"
                assert mine[0].action == "approve", f"{ref} ran in {op.label}"
                recorded = [d for d in trail if d.request_id == mine[0].request_id]
                assert recorded, f"{ref} ran in {op.label}, its answer unrecorded"
                assert recorded[0].answers_like(mine[0]), (
                    f"{ref} ran in {op.label} with an answer that was not recorded"
                )
        completed = first is not None
        for turn, tools in enumerate(w.plan):
            for index, tool in enumerate(tools):
                ref = f"t{turn}i{index}"
                if tool == FREE and turn == 0:
                    assert w.finishes[ref] == 1, f"free {ref} ran {w.finishes[ref]} times"
                if tool not in GATED:
                    continue
                # A handler that returned has its result recorded: it never runs again. One
                # that raised while its resume was being cancelled counts as cut off (its
                # error may come from the cancellation): asked again, or run again with its
                # key, like one cut off inside.
                assert w.returns[ref] <= 1, f"{ref} returned {w.returns[ref]} times"
                if tool == "pay":
                    assert w.starts[ref] <= approvals[ref], f"{ref} started twice"
                    assert w.finishes[ref] <= approvals[ref], f"{ref} finished twice"
                    assert w.effects[ref] <= approvals[ref], f"{ref} acted twice"
                else:
                    assert len(w.keys[ref]) <= 1, f"{ref} ran under several keys"
                    assert w.effects[ref] <= 1
                if approvals[ref] == 0:
                    assert w.starts[ref] == 0, f"{ref} ran unapproved"
                if completed and last.get(ref) == "approve":
                    assert w.finishes[ref] >= 1, f"approved {ref} never finished"
                    assert w.effects[ref] >= 1 or ref in w.broke, f"approved {ref} never acted"


@asynccontextmanager
async def memory_store() -> AsyncIterator[Any]:
    yield InMemoryCheckpointStore()


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[Any]:
    with tempfile.TemporaryDirectory(prefix="runlet-conc-") as root:
        async with SQLiteCheckpointStore(Path(root) / "store.db") as store:
            yield store


STORES: dict[str, Callable[[], AbstractAsyncContextManager[Any]]] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
}

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("store_kind", list(STORES))
@SETTINGS
@given(data=st.data())
async def test_concurrent_resumes(anyio_backend: str, store_kind: str, data: st.DataObject) -> None:
    example = Example(data)
    async with STORES[store_kind]() as store:
        await example.run(store)


@SETTINGS
@given(data=st.data())
async def test_concurrent_resumes_postgres(
    anyio_backend: str, postgres_server: str, data: st.DataObject
) -> None:
    from _postgres import postgres_store

    example = Example(data)
    async with postgres_store(postgres_server, 60.0) as store:
        await example.run(store)
