"""A model-based (stateful) property test of the exactly-once human-in-the-loop contract.

Hypothesis drives random sequences of application operations (start a run; answer open
requests: approve, approve with edited arguments, reject, submit; a wrong request id; an
answer conflicting with a recorded or final one; an answer sent to the wrong checkpoint;
repeat a finished resume; resume with a fault injected (the model fails, the resume is
cancelled from inside the model or from inside a tool handler before or after its side
effect, a handler raises) and retry; move the injectable clock past expiry;
``runtime.expire()``; ``runtime.cancel()``) against the real :class:`~runlet.Runtime` and
each shipped in-process store (in-memory, SQLite in a fresh file), on asyncio and trio.

A plain Python model of the application's view (open checkpoints and their requests,
recorded and final answers, cancelled checkpoints, approvals per call) predicts every
outcome, and after every step the invariants are checked against a ledger that the tools
keep of their own side effects:

* an approved call's handler finishes at most once (exactly once when its run is done);
  a non-idempotent one acts at most once per approval (a second approval only through an
  ``outcome_unknown`` request), an idempotent one keeps one idempotency key;
* nothing runs without an approval, a rejected or expired call never runs;
* free calls of an interrupted turn never run again;
* ``list_pending()`` lists exactly the model's open checkpoints and requests, oldest
  first; ``store.decisions(run_id)`` and ``result.decisions`` list every accepted answer
  (and expiry) of the run, in the run's order;
* a finished resume repeated with the same answer returns an equal ``RunResult`` without
  calling the model or any tool; a different answer raises
  :class:`~runlet.HumanResponseConflictError`;
* every error is the documented class (anything else fails the test).

Faults are aimed at one named call (or the model), so an example replays identically on
both stores. ``RUNLET_STATEFUL_EXAMPLES=2000`` (with ``--timeout=0``) runs a longer hunt.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from _exact_store import ExactStore
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runlet import (
    EXPIRY_MESSAGE,
    REJECTION_MESSAGE,
    Agent,
    CheckpointCancelledError,
    CheckpointResolvedError,
    HumanRequest,
    HumanRequestExpiredError,
    HumanResponse,
    HumanResponseConflictError,
    HumanResponseError,
    InMemoryCheckpointStore,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    RunResult,
    Runtime,
    ToolCall,
    ToolContext,
    ToolSpec,
    ask_human,
)
from runlet.stores.sqlite import SQLiteCheckpointStore

pytestmark = pytest.mark.anyio

UTC = datetime.timezone.utc
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["ref", "amount"],
    "properties": {"ref": {"type": "string"}, "amount": {"type": "integer"}},
}
GATED = ("pay", "pay_idem")  # approval-gated tools; "pay" expires after an hour
FREE = ("lookup",)
ASK = "ask_human"  # input requests, expiring after two hours
TOOLS = (*GATED, *FREE, ASK)
DONE = "done"
MODEL_FAULTS = ("model_fail", "model_cancel")
TOOL_FAULTS = ("tool_fail", "tool_cancel_before", "tool_cancel_after")
CANCEL_FAULTS = ("model_cancel", "tool_cancel_before", "tool_cancel_after")


class Clock:
    """The injectable clock: moved by hand, never slept on."""

    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime.datetime:
        return self.now


class World:
    """The system side: a deterministic model that answers from the transcript, tools that
    keep a ledger of their side effects, and one armed fault at a time."""

    def __init__(self) -> None:
        self.plans: dict[str, list[list[str]]] = {}  # run name -> turns -> tools
        self.model_calls: Counter[str] = Counter()
        self.starts: Counter[str] = Counter()  # handler entries, by call ref
        self.effects: Counter[str] = Counter()  # side effects performed
        self.finishes: Counter[str] = Counter()  # handlers that returned or raised
        self.keys: defaultdict[str, set[str]] = defaultdict(set)  # idempotency keys seen
        self.allowed: set[str] = set()  # gated refs the model of the app approved
        self.amount: dict[str, int] = {}  # the arguments an approved handler must get
        self.violations: list[str] = []
        self.fault: str | None = None
        self.target: str | None = None  # the ref whose handler a tool fault hits
        self.fired = False
        self.scope: anyio.CancelScope | None = None

    # -- the model ------------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelResponse:
        run = request.messages[0].content
        self.model_calls[run] += 1
        await self._fault_point(MODEL_FAULTS)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        plan = self.plans[run]
        if turn >= len(plan):
            return ModelResponse(Message.assistant(DONE))
        calls = []
        for index, tool in enumerate(plan[turn]):
            ref = f"{run}t{turn}i{index}"
            # Call ids repeat in every turn: idempotency keys must still differ.
            if tool == ASK:
                arguments: dict[str, Any] = {"kind": "input", "prompt": ref}
            else:
                arguments = {"ref": ref, "amount": turn * 10 + index}
            calls.append(ToolCall(f"c{index}", tool, arguments))
        return ModelResponse(Message.assistant("", calls))

    # -- the tools ------------------------------------------------------------------
    async def handler(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        ref = arguments["ref"]
        tool = tool_of(ref, self.plans)
        self.starts[ref] += 1
        self.keys[ref].add(context.idempotency_key)
        if tool in GATED:
            if ref not in self.allowed:
                self.violations.append(f"{ref} ran without an approval")
            if arguments["amount"] != self.amount.get(ref):
                self.violations.append(
                    f"{ref} ran with amount {arguments['amount']}, not {self.amount.get(ref)}"
                )
        fault = await self._fault_point(TOOL_FAULTS, before_effect=True, ref=ref)
        if fault == "tool_fail":
            self.finishes[ref] += 1
            raise RuntimeError(f"tool broke on {ref}")
        self.effects[ref] += 1
        await self._fault_point(("tool_cancel_after",), ref=ref)
        self.finishes[ref] += 1
        return f"ok {ref} {arguments['amount']}"

    async def _fault_point(
        self, kinds: tuple[str, ...], *, before_effect: bool = False, ref: str | None = None
    ) -> str | None:
        fault = self.fault
        if fault is None or self.fired or fault not in kinds or ref != self.target:
            return None
        if before_effect and fault == "tool_cancel_after":
            return None
        self.fired = True
        if fault in ("model_fail",):
            raise RuntimeError("the model is down")
        if fault in CANCEL_FAULTS:
            assert self.scope is not None
            self.scope.cancel()
            await anyio.lowlevel.checkpoint()  # delivered right here
        return fault


def tool_of(ref: str, plans: Mapping[str, list[list[str]]]) -> str:
    run, rest = ref.split("t")
    turn, index = rest.split("i")
    return plans[run][int(turn)][int(index)]


def ref_of(request: HumanRequest) -> str:
    arguments = request.tool_call.arguments
    return str(arguments["prompt"] if request.tool_call.name == ASK else arguments["ref"])


@attrs.define
class Open:
    """An open checkpoint, as the application sees it."""

    run: str
    turn: int
    requests: dict[str, HumanRequest]  # by request id, in call order
    recorded: dict[str, HumanResponse] = attrs.Factory(dict)  # by a failed attempt
    expired_recorded: set[str] = attrs.Factory(set)  # by a failed expire()
    unknown: set[str] = attrs.Factory(set)  # approved refs cut off without a result


@attrs.define
class Resolved:
    run: str
    responses: tuple[HumanResponse, ...] | None  # None: resolved by expire()
    result: RunResult
    requests: dict[str, HumanRequest]  # the requests it held
    answered: set[str]  # the ids of those it decided
    decided: dict[str, HumanResponse | None]  # the accepted answers (None: expired)


class Machine:
    """The model of the application, and the operations it performs."""

    def __init__(self, store: Any, data: st.DataObject) -> None:
        self.world = World()
        self.clock = Clock()
        self.store = store
        self.data = data
        self.runtime = Runtime(checkpoint_store=store, clock=self.clock)
        tools = [
            ToolSpec(
                name="pay",
                description="Pay (expires).",
                input_schema=SCHEMA,
                handler=self.world.handler,
                requires_approval=True,
                expires_after=3600,
            ),
            ToolSpec(
                name="pay_idem",
                description="Pay through an idempotent service.",
                input_schema=SCHEMA,
                handler=self.world.handler,
                requires_approval=True,
                idempotent=True,
            ),
            ToolSpec(
                name="lookup",
                description="Look something up.",
                input_schema=SCHEMA,
                handler=self.world.handler,
            ),
            ask_human(expires_after=7200),
        ]
        self.agent = Agent(name="stateful", instructions="", model=self.world, tools=tuple(tools))
        self.open: dict[str, Open] = {}
        self.resolved: dict[str, Resolved] = {}
        self.cancelled: dict[str, Open] = {}
        self.approvals: Counter[str] = Counter()
        self.final: dict[str, str] = {}  # ref -> the last accepted action
        self.accepted: dict[str, list[HumanResponse]] = defaultdict(list)  # run -> answers
        self.audit: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)  # run ->
        self.run_ids: dict[str, str] = {}  # run name -> run id
        self.frozen: dict[str, int] = {}  # free refs of interrupted turns -> finishes
        self.finished_runs: set[str] = set()
        self.dead_runs: set[str] = set()

    def draw(self, strategy: st.SearchStrategy[Any], label: str) -> Any:
        return self.data.draw(strategy, label=label)

    # -- operations -----------------------------------------------------------------
    def operations(self) -> list[str]:
        ops: list[str] = []
        if len({o.run for o in self.open.values()}) < 3:
            ops += ["start"] * (3 if not self.open else 1)
        if self.open:
            ops += ["answer"] * 6 + ["wrong_id", "expire", "cancel"]
            if any(o.recorded for o in self.open.values()):
                ops += ["conflict_recorded"] * 2 + ["answer"] * 2
            if any(self.stale_answers(cp) for cp in self.open):
                ops += ["stale_answer"]
        if any(r.responses is not None for r in self.resolved.values()):
            ops += ["repeat", "conflict_resolved", "cancel_resolved"]
        if any(self.misdirected(cp) for cp in self.resolved):
            ops += ["misdirected"] * 3
        if any(r.responses is None for r in self.resolved.values()):
            ops += ["repeat_expire", "answer_expired"]
        if self.cancelled:
            ops += ["resume_cancelled"]
        return [*ops, "advance_clock"]

    async def step(self) -> None:
        op = self.draw(st.sampled_from(self.operations()), "op")
        event(f"op {op}")
        await getattr(self, f"op_{op}")()
        await self.check()

    async def op_start(self) -> None:
        name = f"r{len(self.world.plans)}"
        turns = self.draw(
            st.lists(
                st.lists(st.sampled_from(TOOLS), min_size=1, max_size=3), min_size=1, max_size=3
            ),
            "plan",
        )
        self.world.plans[name] = turns
        result = await self.runtime.run(self.agent, name)
        self.run_ids[name] = result.run_id
        self.absorb(name, -1, result, model_called=True)
        # No fault is injected into run(): every free call so far ran exactly once.
        assert all(
            self.world.finishes[ref] == 1 for ref in self.world.starts if ref.startswith(name + "t")
        )

    async def op_advance_clock(self) -> None:
        self.clock.now += datetime.timedelta(
            seconds=self.draw(st.sampled_from([60, 1800, 3600, 5400, 7200]), "seconds")
        )

    def pick_open(self) -> str:
        return self.draw(st.sampled_from(list(self.open)), "checkpoint")

    def response_to(self, request: HumanRequest) -> HumanResponse:
        if request.kind == "input":
            text = self.draw(st.sampled_from(["yes", "no"]), "text")
            return HumanResponse.submit(request.id, text, responded_by="alice")
        action = self.draw(
            st.sampled_from(["approve", "approve_edit", "reject", "reject_reason"]), "action"
        )
        if action == "approve":
            return HumanResponse(request.id, "approve", responded_by="alice")
        if action == "approve_edit":
            arguments = dict(request.tool_call.arguments)
            arguments["amount"] += 1000
            return HumanResponse.approve(request.id, arguments, responded_by="alice")
        reason = "too much" if action == "reject_reason" else None
        return HumanResponse.reject(request.id, reason, responded_by="alice")

    async def op_answer(self) -> None:
        cp = self.pick_open()
        o = self.open[cp]
        if o.expired_recorded:  # an expire() that failed: retry it
            await self.resume(cp, None, *self.draw_fault(o, {}))
            return
        # A retry sends the recorded answers again, all or some: they apply either way.
        resend = (
            self.draw(st.sets(st.sampled_from(list(o.recorded))), "resend") if o.recorded else set()
        )
        responses = {rid: r for rid, r in o.recorded.items() if rid in resend}
        unanswered = [q.id for q in o.requests.values() if q.id not in o.recorded]
        if unanswered:
            chosen = self.draw(
                st.lists(
                    st.sampled_from(unanswered),
                    min_size=0 if responses else 1,
                    max_size=len(unanswered),
                    unique=True,
                ),
                "requests",
            )
            for request_id in sorted(chosen, key=list(o.requests).index):
                responses[request_id] = self.response_to(o.requests[request_id])
        if not responses:
            responses = dict(o.recorded)
        await self.resume(cp, tuple(responses.values()), *self.draw_fault(o, responses))

    def draw_fault(
        self, o: Open, responses: Mapping[str, HumanResponse]
    ) -> tuple[str | None, str | None]:
        fault = self.draw(st.sampled_from([None, None, None, *MODEL_FAULTS, *TOOL_FAULTS]), "fault")
        if fault not in TOOL_FAULTS:
            return fault, None
        # Aimed at one approved call that will run in this attempt (deterministic).
        runs = []
        for r in {**o.recorded, **responses}.values():
            ref = ref_of(o.requests[r.request_id])
            if r.action != "approve" or self.world.finishes[ref] > 0:
                continue
            if ref in o.unknown and tool_of(ref, self.world.plans) != "pay_idem":
                continue  # asked again, not run
            runs.append(ref)
        if not runs:
            return None, None
        return fault, self.draw(st.sampled_from(runs), "target")

    def expired(self, o: Open, response: HumanResponse) -> bool:
        request = o.requests[response.request_id]
        return response.request_id in o.expired_recorded or (
            response.request_id not in o.recorded
            and request.expires_at is not None
            and self.clock.now >= request.expires_at
        )

    async def resume(
        self,
        cp: str,
        responses: tuple[HumanResponse, ...] | None,
        fault: str | None = None,
        target: str | None = None,
    ) -> None:
        """Resume *cp* with *responses* (``None``: ``runtime.expire()``), with *fault*
        injected, and check the outcome against the model."""
        o = self.open[cp]
        before = self.snapshot()
        if responses is not None and any(self.expired(o, r) for r in responses):
            with pytest.raises(HumanRequestExpiredError):
                await self.runtime.resume(self.agent, checkpoint_id=cp, responses=responses)
            assert self.snapshot() == before
            return
        new = [] if responses is None else [r for r in responses if r.request_id not in o.recorded]
        for r in new:
            q = o.requests[r.request_id]
            if r.action == "approve":
                ref = ref_of(q)
                self.world.allowed.add(ref)
                self.world.amount[ref] = int(
                    (r.edited_arguments or q.tool_call.arguments)["amount"]
                )
        expiring = [
            q.id
            for q in o.requests.values()
            if responses is None and q.id not in o.recorded and q.id not in o.expired_recorded
        ]
        starts = {ref_of(q): self.world.starts[ref_of(q)] for q in o.requests.values()}
        world = self.world
        world.fault, world.fired, world.target = fault, False, target
        outcome = "ok"
        result = None
        with anyio.CancelScope() as scope:
            world.scope = scope
            try:
                if responses is None:
                    result = await self.runtime.expire(self.agent, checkpoint_id=cp)
                else:
                    result = await self.runtime.resume(
                        self.agent, checkpoint_id=cp, responses=responses
                    )
            except ModelError:
                assert fault == "model_fail", "a ModelError nobody injected"
                assert world.fired
                outcome = "model_error"
        if scope.cancelled_caught:
            assert fault in CANCEL_FAULTS, "a cancellation nobody injected"
            assert world.fired
            outcome = "cancelled"
        fired = world.fired
        world.fault, world.fired, world.scope, world.target = None, False, None, None
        if fault is not None and not fired:
            assert outcome == "ok"
        verb = "expire" if responses is None else "resume"
        event(f"{verb} {outcome} (fault {fault}, fired {fired})")
        for request_id in expiring:  # expire() runs none of them
            ref = ref_of(o.requests[request_id])
            assert self.world.starts[ref] == starts[ref], f"expire() ran {ref}"
            self.final[ref] = "expire"
        # The decisions are final once accepted (stored before anything acts on them).
        self.audit[o.run] += [(rid, "expire") for rid in expiring]
        self.audit[o.run] += [(r.request_id, r.action) for r in new]
        for r in new:
            q = o.requests[r.request_id]
            self.final[ref_of(q)] = r.action
            self.accepted[o.run].append(r)
            if r.action == "approve":
                self.approvals[ref_of(q)] += 1
        if outcome != "ok":
            o.recorded.update({r.request_id: r for r in new})
            o.expired_recorded.update(expiring)
            if outcome == "cancelled":
                for r in o.recorded.values():
                    q = o.requests[r.request_id]
                    ref = ref_of(q)
                    if r.action == "approve" and self.world.finishes[ref] == 0:
                        o.unknown.add(ref)
            return
        assert result is not None
        assert [(d.request_id, d.action) for d in result.decisions] == self.audit[o.run]
        del self.open[cp]
        if responses is None:
            answered = set(o.requests)
        else:
            answered = set(o.recorded) | set(o.expired_recorded)
            answered |= {r.request_id for r in responses}
        decided: dict[str, HumanResponse | None] = dict.fromkeys(o.expired_recorded)
        decided.update(o.recorded)
        for r in responses or ():
            decided.setdefault(r.request_id, r)
        if responses is None:
            decided.update({rid: None for rid in o.requests if rid not in decided})
        self.resolved[cp] = Resolved(o.run, responses, result, o.requests, answered, decided)
        remaining = [q for q in o.requests.values() if q.id not in answered]
        asks_again = sorted(
            ref for ref in o.unknown if tool_of(ref, self.world.plans) != "pay_idem"
        )
        for ref in o.unknown:  # an idempotent call cut off is run again, with its key
            if tool_of(ref, self.world.plans) == "pay_idem":
                assert self.world.finishes[ref] == 1, ref
        if remaining or asks_again:
            assert result.status == "interrupted"
            assert self.world.model_calls == before[0], "the model was asked mid-turn"
            got = {ref_of(q): q for q in result.pending_requests}
            assert sorted(got) == sorted([ref_of(q) for q in remaining] + asks_again)
            for q in remaining:
                assert got[ref_of(q)] == q  # the same request, in a new checkpoint
            for ref in asks_again:
                event("asked again: outcome unknown")
                assert got[ref].outcome_unknown
                assert got[ref].kind == "approval"
                self.world.allowed.discard(ref)  # a new approval is needed
            self.absorb(o.run, o.turn, result, model_called=False)
        else:
            self.check_answers(result, o, answered)
            self.absorb(o.run, o.turn, result, model_called=True)

    def absorb(self, run: str, turn: int, result: RunResult, *, model_called: bool) -> None:
        """Check *result* against the plan and take its next checkpoint into the model."""
        plan = self.world.plans[run]
        assert result.run_id
        if model_called:
            turn += 1
            while turn < len(plan) and not any(t in GATED or t == ASK for t in plan[turn]):
                turn += 1
            if turn == len(plan):
                assert result.status == "completed", result
                assert result.output == DONE
                assert result.checkpoint_id is None
                self.finished_runs.add(run)
                self.check_run_done(run)
                return
            expected = [
                f"{run}t{turn}i{i}" for i, t in enumerate(plan[turn]) if t in GATED or t == ASK
            ]
            assert result.status == "interrupted"
            assert [ref_of(q) for q in result.pending_requests] == expected
            assert not any(q.outcome_unknown for q in result.pending_requests)
            for i, t in enumerate(plan[turn]):
                ref = f"{run}t{turn}i{i}"
                if t in FREE:
                    assert self.world.finishes[ref] >= 1, ref
                    self.frozen[ref] = self.world.finishes[ref]
        assert result.status == "interrupted"
        assert result.checkpoint_id is not None
        assert result.checkpoint_id not in self.open
        assert result.checkpoint_id not in self.resolved
        assert result.interruption == result.pending_requests[0]
        self.open[result.checkpoint_id] = Open(
            run, turn, {q.id: q for q in result.pending_requests}
        )

    def check_run_done(self, run: str) -> None:
        for turn, tools in enumerate(self.world.plans[run]):
            for index, tool in enumerate(tools):
                ref = f"{run}t{turn}i{index}"
                if tool in GATED and self.final.get(ref) == "approve":
                    assert self.world.finishes[ref] == 1, ref
                if tool in FREE:
                    assert self.world.finishes[ref] >= 1, ref

    async def op_wrong_id(self) -> None:
        cp = self.pick_open()
        before = self.snapshot()
        o = self.open[cp]
        q = self.draw(st.sampled_from(list(o.requests.values())), "request")
        bad = self.draw(st.sampled_from(["id", "twice", "action", "schema"]), "bad")
        if bad == "id":
            responses = [HumanResponse("req_bogus", "approve")]
        elif bad == "twice":
            responses = [self.response_to(q), self.response_to(q)]
        elif bad == "action" or q.kind == "input":
            action = "submit" if q.kind == "approval" else "select"
            responses = [HumanResponse(q.id, action, "x")]
        else:
            responses = [HumanResponse.approve(q.id, {"ref": ref_of(q), "amount": "lots"})]
        with pytest.raises(HumanResponseError) as caught:
            await self.runtime.resume(self.agent, checkpoint_id=cp, responses=responses)
        # The response is refused as malformed, or as too late; never anything else.
        assert type(caught.value) in (HumanResponseError, HumanRequestExpiredError)
        assert self.snapshot() == before

    async def op_conflict_recorded(self) -> None:
        cp = self.draw(st.sampled_from([c for c, o in self.open.items() if o.recorded]), "cp")
        o = self.open[cp]
        responses = dict(o.recorded)
        victim = self.draw(st.sampled_from(list(responses)), "victim")
        responses[victim] = different(responses[victim])
        before = self.snapshot()
        with pytest.raises(HumanResponseConflictError):
            await self.runtime.resume(
                self.agent, checkpoint_id=cp, responses=tuple(responses.values())
            )
        assert self.snapshot() == before

    def stale_answers(self, cp: str) -> list[HumanResponse]:
        o = self.open[cp]
        return [r for r in self.accepted[o.run] if r.request_id not in o.requests]

    async def op_stale_answer(self) -> None:
        cp = self.draw(st.sampled_from([c for c in self.open if self.stale_answers(c)]), "cp")
        response = self.draw(st.sampled_from(self.stale_answers(cp)), "stale")
        before = self.snapshot()
        with pytest.raises(HumanResponseConflictError):
            await self.runtime.resume(self.agent, checkpoint_id=cp, response=response)
        assert self.snapshot() == before

    async def op_expire(self) -> None:
        cp = self.pick_open()
        await self.resume(cp, None, *self.draw_fault(self.open[cp], {}))

    def check_answers(self, result: RunResult, o: Open, answered: set[str]) -> None:
        """The tool message of each answered call says what its answer decided."""
        results = tool_results_of_turn(result, o.turn)
        for request_id in answered:
            q = o.requests[request_id]
            ref = ref_of(q)
            final = self.final[ref]
            if ref in o.unknown and tool_of(ref, self.world.plans) == "pay":
                continue  # asked again (outcome unknown)
            tool_result = results[q.tool_call.id]
            if final == "expire":
                assert tool_result.is_error
                assert tool_result.content == EXPIRY_MESSAGE
            elif final == "reject":
                assert tool_result.is_error
                assert tool_result.content.startswith(REJECTION_MESSAGE)
            elif final == "approve":
                assert self.world.finishes[ref] == 1, ref
                assert f"{ref} {self.world.amount[ref]}" in tool_result.content or (
                    tool_result.is_error and "tool broke" in tool_result.content
                ), tool_result

    async def op_cancel(self) -> None:
        cp = self.pick_open()
        before = self.snapshot()
        await self.runtime.cancel(cp)
        await self.runtime.cancel(cp)  # twice is fine
        assert self.snapshot() == before
        o = self.open.pop(cp)
        self.cancelled[cp] = o
        self.dead_runs.add(o.run)

    async def op_resume_cancelled(self) -> None:
        cp = self.draw(st.sampled_from(list(self.cancelled)), "cp")
        before = self.snapshot()
        with pytest.raises(CheckpointCancelledError):
            await self.runtime.resume(
                self.agent, checkpoint_id=cp, response=HumanResponse("req_any", "approve")
            )
        with pytest.raises(CheckpointCancelledError):
            await self.runtime.expire(self.agent, checkpoint_id=cp)
        assert self.snapshot() == before

    def pick_resolved(self, by_expire: bool) -> str:
        choices = [c for c, r in self.resolved.items() if (r.responses is None) == by_expire]
        return self.draw(st.sampled_from(choices), "resolved")

    async def op_repeat(self) -> None:
        cp = self.pick_resolved(False)
        stored = self.resolved[cp]
        before = self.snapshot()
        assert stored.responses is not None
        again = await self.runtime.resume(self.agent, checkpoint_id=cp, responses=stored.responses)
        assert again == stored.result
        assert self.snapshot() == before

    async def op_repeat_expire(self) -> None:
        cp = self.pick_resolved(True)
        before = self.snapshot()
        again = await self.runtime.expire(self.agent, checkpoint_id=cp)
        assert again == self.resolved[cp].result
        assert self.snapshot() == before

    async def op_answer_expired(self) -> None:
        cp = self.pick_resolved(True)
        result = self.resolved[cp].result
        before = self.snapshot()
        # Any request the expired checkpoint held: find it in the decisions.
        expired = [d for d in result.decisions if d.checkpoint_id == cp and d.action == "expire"]
        if not expired:  # it held only answers recorded by an earlier attempt
            return
        with pytest.raises(HumanRequestExpiredError):
            await self.runtime.resume(
                self.agent,
                checkpoint_id=cp,
                response=HumanResponse(expired[0].request_id, "reject", responded_by="alice"),
            )
        assert self.snapshot() == before

    async def op_conflict_resolved(self) -> None:
        cp = self.pick_resolved(False)
        stored = self.resolved[cp]
        assert stored.responses is not None
        responses = list(stored.responses)
        victim = self.draw(st.integers(0, len(responses) - 1), "victim")
        responses[victim] = different(responses[victim])
        before = self.snapshot()
        with pytest.raises(HumanResponseConflictError):
            await self.runtime.resume(self.agent, checkpoint_id=cp, responses=responses)
        assert self.snapshot() == before

    def misdirected(self, cp: str) -> list[tuple[str, str, str]]:
        """Requests *cp* held but did not decide, with where each is now: ``open``,
        ``cancelled`` or ``decided`` at a later checkpoint of the run."""
        stored = self.resolved[cp]
        found = []
        for request_id in stored.requests:
            if request_id in stored.answered:
                continue
            for other, o in self.open.items():
                if request_id in o.requests and request_id not in o.expired_recorded:
                    found.append((request_id, "open", other))
            for other, o in self.cancelled.items():
                if request_id in o.requests:
                    found.append((request_id, "cancelled", other))
            for other, later in self.resolved.items():
                if request_id in later.decided:
                    found.append((request_id, "decided", other))
        return found

    async def op_misdirected(self) -> None:
        """An answer sent to a checkpoint that was resolved without it."""
        cp = self.draw(st.sampled_from([c for c in self.resolved if self.misdirected(c)]), "cp")
        request_id, state, where = self.draw(st.sampled_from(self.misdirected(cp)), "request")
        request = self.resolved[cp].requests[request_id]
        before = self.snapshot()
        if state == "open":
            o = self.open[where]
            response = o.recorded.get(request_id) or self.response_to(o.requests[request_id])
            expect: type[Exception] = HumanResponseConflictError
            if self.expired(o, response):
                expect = HumanRequestExpiredError
            waits_at: str | None = where
        elif state == "cancelled":
            response = self.response_to(request)
            expect, waits_at = HumanResponseConflictError, None
        else:
            decided = self.resolved[where].decided[request_id]
            same = self.draw(st.booleans(), "same") and decided is not None
            response = decided if same and decided is not None else self.response_to(request)
            expect = HumanResponseConflictError if decided else HumanRequestExpiredError
            waits_at = where if response == decided else None
        with pytest.raises(expect) as caught:
            await self.runtime.resume(self.agent, checkpoint_id=cp, response=response)
        if expect is HumanResponseConflictError and waits_at is not None:
            assert caught.value.next_checkpoint_id == waits_at  # type: ignore[attr-defined]
        assert self.snapshot() == before

    async def op_cancel_resolved(self) -> None:
        cp = self.pick_resolved(False)
        with pytest.raises(CheckpointResolvedError):
            await self.runtime.cancel(cp)
        with pytest.raises(CheckpointResolvedError):
            await self.runtime.expire(self.agent, checkpoint_id=cp)

    # -- invariants ----------------------------------------------------------------
    def snapshot(self) -> tuple[Counter[str], Counter[str], Counter[str]]:
        w = self.world
        return (Counter(w.model_calls), Counter(w.starts), Counter(w.effects))

    async def check(self) -> None:
        w = self.world
        assert not w.violations, w.violations
        keys_seen: dict[str, str] = {}
        for run, turns in w.plans.items():
            for turn, tools in enumerate(turns):
                for index, tool in enumerate(tools):
                    ref = f"{run}t{turn}i{index}"
                    keys = w.keys.get(ref, set())
                    assert len(keys) <= 1, f"{ref} ran under several keys {keys}"
                    for key in keys:
                        assert key not in keys_seen, f"{ref} and {keys_seen[key]} share a key"
                        keys_seen[key] = ref
                    if tool in GATED:
                        approvals = self.approvals[ref]
                        assert w.finishes[ref] <= 1, f"{ref} finished twice"
                        assert w.starts[ref] == 0 or approvals > 0, f"{ref} ran unapproved"
                        if tool == "pay":
                            assert w.effects[ref] <= approvals, f"{ref} acted twice"
                            assert w.starts[ref] <= approvals, f"{ref} started twice"
                        if self.final.get(ref) in ("reject", "expire") and approvals == 0:
                            assert w.starts[ref] == 0, f"rejected {ref} ran"
                    if ref in self.frozen:
                        assert w.finishes[ref] == self.frozen[ref], f"free {ref} ran again"
        for run, run_id in self.run_ids.items():  # the audit trail, in the run's order
            decisions = await self.store.decisions(run_id)
            assert [(d.request_id, d.action) for d in decisions] == self.audit[run]
        listed = await self.store.list_pending(limit=1000)
        assert [p.checkpoint_id for p in listed] == list(self.open)  # oldest first
        assert {p.checkpoint_id: tuple(q.id for q in p.requests) for p in listed} == {
            cp: tuple(o.requests) for cp, o in self.open.items()
        }


def tool_results_of_turn(result: RunResult, turn: int) -> dict[str, Any]:
    """The tool results of the *turn*-th assistant message of *result*, by call id."""
    found: dict[str, Any] = {}
    assistant_seen = -1
    for message in result.transcript:
        if message.role == "assistant":
            assistant_seen += 1
        elif message.role == "tool" and assistant_seen == turn:
            assert message.tool_result is not None
            found[message.tool_result.tool_call_id] = message.tool_result
    return found


def different(response: HumanResponse) -> HumanResponse:
    """A response to the same request that is not the same answer."""
    if response.action == "submit":
        return HumanResponse.submit(response.request_id, f"{response.value}!", responded_by="alice")
    if response.action == "approve" and response.edited_arguments is None:
        return HumanResponse(response.request_id, "approve", responded_by="mallory")
    if response.action == "approve":
        return HumanResponse(response.request_id, "approve", responded_by="alice")
    return HumanResponse(response.request_id, "approve", responded_by="alice")


@asynccontextmanager
async def fresh_store(kind: str) -> AsyncIterator[Any]:
    if kind == "memory":
        yield InMemoryCheckpointStore()
        return
    if kind == "exact":  # the protocol's own signatures: no keyword or default leaned on
        yield ExactStore(InMemoryCheckpointStore())
        return
    with tempfile.TemporaryDirectory(prefix="runlet-stateful-") as root:
        async with SQLiteCheckpointStore(Path(root) / "store.db") as store:
            yield store


@pytest.mark.parametrize("store_kind", ["memory", "exact", "sqlite"])
@settings(
    max_examples=int(os.environ.get("RUNLET_STATEFUL_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_exactly_once_state_machine(store_kind: str, data: st.DataObject) -> None:
    async with fresh_store(store_kind) as store:
        machine = Machine(store, data)
        steps = data.draw(st.integers(1, 30), label="steps")
        for _ in range(steps):
            await machine.step()
