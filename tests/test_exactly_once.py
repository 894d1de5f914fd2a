"""Exactly-once human in the loop: records, repeated resumes, outcome-unknown calls,
idempotency keys, approval policies, expiry, cancellation, leases and integrity."""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest

import runlet
from runlet import (
    Agent,
    CallRecord,
    Checkpoint,
    CheckpointCancelledError,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointResolvedError,
    CheckpointSerializationError,
    ConfigurationError,
    HumanRequestExpiredError,
    HumanResponse,
    HumanResponseConflictError,
    HumanResponseError,
    InMemoryCheckpointStore,
    LeaseLostError,
    Resolution,
    RunResult,
    Runtime,
    ToolCall,
    ToolContext,
    ToolSpec,
    ask_human,
    structure_checkpoint,
    unstructure_checkpoint,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

UTC = datetime.timezone.utc
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
}


class Clock:
    """A clock tests move by hand."""

    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


class Payments:
    """A payment service that honours idempotency keys, as tools should use them."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.paid: dict[str, str] = {}
        self.block: anyio.Event | None = None
        self.entered = anyio.Event()

    async def refund(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.attempts.append(context.idempotency_key)
        self.entered.set()
        if self.block is not None:
            await self.block.wait()
        self.paid.setdefault(context.idempotency_key, arguments["order_id"])
        return f"Refunded order {arguments['order_id']}."


def refund_spec(payments: Payments, **options: Any) -> ToolSpec:
    options.setdefault("requires_approval", True)
    return ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, payments.refund, **options)


def agent_with(model: runlet.Model, *tools: ToolSpec) -> Agent:
    return Agent("support", "Refund when approved.", model, tools)


def approve(result: RunResult, **fields: Any) -> HumanResponse:
    assert result.interruption is not None
    return HumanResponse(result.interruption.id, "approve", **fields)


def cp(result: RunResult) -> str:
    assert result.checkpoint_id is not None
    return result.checkpoint_id


async def refund_run(
    *,
    store: runlet.CheckpointStore | None = None,
    script: Sequence[Any] = (),
    clock: Clock | None = None,
    **tool_options: Any,
) -> tuple[Runtime, Agent, Payments, ScriptedModel, RunResult]:
    payments = Payments()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), *script])
    agent = agent_with(model, refund_spec(payments, **tool_options))
    rt = Runtime(
        checkpoint_store=store if store is not None else InMemoryCheckpointStore(), clock=clock
    )
    first = await rt.run(agent, "Refund order 1.")
    assert "interrupted" == first.status
    return rt, agent, payments, model, first


# --- Records: a recorded result never runs again ---------------------------------------


async def test_the_decision_and_result_are_recorded_before_the_run_goes_on() -> None:
    log: list[str] = []

    class Recording(InMemoryCheckpointStore):
        async def record(
            self, checkpoint_id: str, token: str, records: Sequence[CallRecord]
        ) -> None:
            log.extend("result" if r.result else "decision" for r in records)
            await super().record(checkpoint_id, token, records)

    def model_turn(request: runlet.ModelRequest) -> str:
        log.append("model")
        return "Done."

    rt, agent, _payments, _, first = await refund_run(store=Recording(), script=[model_turn])
    await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert ["decision", "result", "model"] == log


async def test_a_model_error_after_the_tool_ran_does_not_run_it_again() -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    rt, agent, payments, model, first = await refund_run(script=[down, "Done."])
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert ("completed", "Done.") == (result.status, result.output)
    assert 1 == len(payments.attempts)
    assert "Refunded order 1." == model.requests[-1].messages[-1].content


async def test_results_of_calls_that_ran_beside_the_approval_are_not_run_again() -> None:
    lookups: list[str] = []

    async def lookup(arguments: Mapping[str, Any], context: ToolContext) -> str:
        lookups.append(arguments["order_id"])
        return "Order 2: 10 EUR."

    payments = Payments()
    calls = [call("lookup", id="c0", order_id="2"), call("refund", id="c1", order_id="1")]

    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    model = ScriptedModel([calls, down, "Done."])
    lookup_tool = ToolSpec("lookup", "Look up.", ORDER_SCHEMA, lookup)
    agent = agent_with(model, lookup_tool, refund_spec(payments))
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    first = await rt.run(agent, "Go.")
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert "completed" == result.status
    assert (["2"], 1) == (lookups, len(payments.attempts))
    assert ["Order 2: 10 EUR.", "Refunded order 1."] == [
        m.content for m in result.transcript if m.role == "tool"
    ]


async def test_a_rejection_is_recorded_with_its_result_and_shown_again_on_retry() -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    store = InMemoryCheckpointStore()
    rt, agent, payments, model, first = await refund_run(store=store, script=[down, "Ok."])
    reject = HumanResponse(approve(first).request_id, "reject", "duplicate")
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=reject)
    [recorded] = (await store.get(cp(first))).records

    result = await rt.resume(agent, checkpoint_id=cp(first), response=reject)

    rejection = runlet.ToolResult("c1", f"{runlet.REJECTION_MESSAGE} Reason: duplicate", True)
    assert rejection == recorded.result
    assert rejection == model.requests[-1].messages[-1].tool_result
    assert ("completed", []) == (result.status, payments.attempts)


@pytest.mark.parametrize("reason", [None, ""])
async def test_a_rejection_without_a_reason_says_only_that_it_was_rejected(
    reason: str | None,
) -> None:
    rt, agent, payments, model, first = await refund_run(script=["Ok."])
    reject = HumanResponse(approve(first).request_id, "reject", reason)

    await rt.resume(agent, checkpoint_id=cp(first), response=reject)

    told = model.requests[-1].messages[-1].tool_result
    assert runlet.ToolResult("c1", runlet.REJECTION_MESSAGE, True) == told
    assert [] == payments.attempts


async def test_the_first_accepted_answer_is_final_even_before_the_resume_finished() -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    store = InMemoryCheckpointStore()
    rt, agent, payments, _, first = await refund_run(store=store, script=[down, "Done."])
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    with pytest.raises(HumanResponseConflictError, match="already answered") as info:
        await rt.resume(
            agent,
            checkpoint_id=cp(first),
            response=HumanResponse(approve(first).request_id, "reject"),
        )
    assert (cp(first), approve(first).request_id, None) == (
        info.value.checkpoint_id,
        info.value.request_id,
        info.value.next_checkpoint_id,
    )
    [recorded] = await store.decisions(first.run_id)  # who decided, and when
    assert recorded == info.value.decision
    assert 1 == len(payments.attempts)


@pytest.mark.parametrize(
    ("accepted", "retried"),
    [
        (
            {"edited_arguments": {"order_id": "1", "note": 1}},
            {"edited_arguments": {"order_id": "1", "note": True}},
        ),
        ({"metadata": {"ticket": 0}}, {"metadata": {"ticket": False}}),
        ({"metadata": {"ticket": 1}}, {"metadata": {"ticket": 1.0}}),
    ],
    ids=["edit-1-then-True", "metadata-0-then-False", "metadata-1-then-1.0"],
)
async def test_a_retry_whose_values_differ_in_json_type_is_a_conflict(
    accepted: dict[str, Any], retried: dict[str, Any]
) -> None:
    # Python says True == 1 and 0 == False; JSON, and so the audit trail, does not.
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    rt, agent, payments, _, first = await refund_run(script=[down, "Done."], allow_edit=True)
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first, **accepted))

    with pytest.raises(HumanResponseConflictError, match="already answered"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first, **retried))
    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first, **accepted))
    assert ("completed", 1) == (result.status, len(payments.attempts))


# --- Repeated resumes and telling the cases apart ---------------------------------------


async def test_a_repeated_resume_returns_an_equal_result_without_model_or_tools() -> None:
    rt, agent, payments, model, first = await refund_run(
        script=[call("refund", id="c2", order_id="2"), "Done."]
    )
    second = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    requests_before = len(model.requests)

    again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert second == again
    assert second.checkpoint_id == again.checkpoint_id is not None
    assert requests_before == len(model.requests)
    assert 1 == len(payments.attempts)


async def test_a_web_handler_tells_the_failure_cases_apart_by_class() -> None:
    rt, agent, _, _, first = await refund_run(script=["Done."])
    await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    _, _, _, _, other = await refund_run()
    cancelled_rt, cancelled_agent, _, _, doomed = await refund_run()
    await cancelled_rt.cancel(cp(doomed))

    with pytest.raises(CheckpointNotFoundError) as never:
        await rt.resume(agent, checkpoint_id="cp_never", response=approve(first))
    with pytest.raises(HumanResponseConflictError):
        await rt.resume(
            agent, checkpoint_id=cp(first), response=approve(first, responded_by="someone else")
        )
    with pytest.raises(CheckpointCancelledError) as cancelled:
        await cancelled_rt.resume(
            cancelled_agent, checkpoint_id=cp(doomed), response=approve(doomed)
        )

    assert type(never.value) is CheckpointNotFoundError
    assert type(cancelled.value) is CheckpointCancelledError
    assert isinstance(cancelled.value, CheckpointNotFoundError)
    assert isinstance(HumanResponseConflictError("x", checkpoint_id="c"), HumanResponseError)
    assert other.status == "interrupted"


ANSWERED = {"edited_arguments": {"order_id": "9"}, "responded_by": "ann", "metadata": {"t": 1}}


@pytest.mark.parametrize(
    ("given", "repeated"),
    [
        (ANSWERED, {**ANSWERED, "edited_arguments": {"order_id": "8"}}),
        (ANSWERED, {**ANSWERED, "edited_arguments": None}),
        ({**ANSWERED, "edited_arguments": None}, ANSWERED),
        (ANSWERED, {**ANSWERED, "metadata": {"t": 2}}),
        (ANSWERED, {**ANSWERED, "metadata": None}),
        (ANSWERED, {**ANSWERED, "responded_by": "bob"}),
        ({"action": "reject", "value": "too much"}, {"action": "reject", "value": "fraud"}),
        ({"action": "reject", "value": "too much"}, {"action": "reject"}),
        ({"action": "reject"}, {}),
    ],
    ids=[
        "other-edit",
        "edit-left-out",
        "edit-added",
        "other-metadata",
        "metadata-left-out",
        "other-person",
        "other-reason",
        "reason-left-out",
        "other-action",
    ],
)
async def test_a_repeat_that_differs_in_any_field_is_a_conflict(
    given: dict[str, Any], repeated: dict[str, Any]
) -> None:
    rt, agent, payments, model, first = await refund_run(script=["Done."])
    request_id = approve(first).request_id
    fields = {"action": "approve", **given}
    done = await rt.resume(
        agent, checkpoint_id=cp(first), response=HumanResponse(request_id, **fields)
    )

    with pytest.raises(HumanResponseConflictError, match="was already answered with") as raised:
        await rt.resume(
            agent,
            checkpoint_id=cp(first),
            response=HumanResponse(request_id, **{"action": "approve", **repeated}),
        )

    # It says who gave the first answer, so an interface can show who decided.
    assert (done.decisions[-1], request_id) == (raised.value.decision, raised.value.request_id)
    assert f"(by {fields.get('responded_by') or 'an earlier resume'})" in str(raised.value)
    assert done == await rt.resume(
        agent, checkpoint_id=cp(first), response=HumanResponse(request_id, **fields)
    )
    assert 2 == len(model.requests)  # the repeats asked neither the model nor the tool
    assert (1 if "approve" == fields["action"] else 0) == len(payments.attempts)


async def test_an_unknown_request_id_after_the_run_went_on_is_a_conflict() -> None:
    rt, agent, _, _, first = await refund_run(script=[call("refund", id="c2", order_id="2")])
    second = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert second.checkpoint_id is not None

    with pytest.raises(
        HumanResponseConflictError, match=f"went on to checkpoint '{cp(second)}'"
    ) as info:
        await rt.resume(
            agent, checkpoint_id=cp(first), response=HumanResponse("req_other", "approve")
        )
    error = info.value
    # No checkpoint to send it on to: that request is open nowhere.
    assert (cp(first), "req_other", None) == (
        error.checkpoint_id,
        error.request_id,
        error.next_checkpoint_id,
    )


# --- Cut off inside the handler ------------------------------------------------------------


async def interrupted_inside_handler(
    **tool_options: Any,
) -> tuple[Runtime, Agent, Payments, RunResult]:
    rt, agent, payments, _, first = await refund_run(
        script=["Done.", "Done again."], **tool_options
    )
    await cut_off_inside_handler(rt, agent, payments, first)
    return rt, agent, payments, first


async def cut_off_inside_handler(
    rt: Runtime, agent: Agent, payments: Payments, first: RunResult
) -> None:
    """Approve *first*, and cancel the resume while the refund handler runs."""
    payments.block = anyio.Event()
    async with anyio.create_task_group() as group:

        async def attempt() -> None:
            await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

        group.start_soon(attempt)
        await payments.entered.wait()
        group.cancel_scope.cancel()
    payments.block = None


async def test_an_idempotent_call_cut_off_runs_again_with_the_same_key() -> None:
    rt, agent, payments, first = await interrupted_inside_handler(idempotent=True)

    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert "completed" == result.status
    assert 2 == len(payments.attempts)
    assert payments.attempts[0] == payments.attempts[1]
    assert 1 == len(payments.paid)


async def test_decisions_of_a_cut_off_attempt_come_first_in_the_result_and_the_store() -> None:
    # The first attempt answers b alone and is cut off inside b's handler; the second
    # answers a and b. Oldest first is b, then a, in the result as in the store.
    payments = Payments()
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    model = ScriptedModel([[call("refund", id=n, order_id=n) for n in ("a", "b")], "Done."])
    agent = agent_with(model, refund_spec(payments, idempotent=True))
    first = await rt.run(agent, "Refund both.")
    a, b = first.pending_requests
    payments.block = anyio.Event()
    async with anyio.create_task_group() as group:

        async def attempt() -> None:
            await rt.resume(agent, checkpoint_id=cp(first), response=HumanResponse(b.id, "approve"))

        group.start_soon(attempt)
        await payments.entered.wait()
        group.cancel_scope.cancel()
    payments.block = None

    both = [HumanResponse(a.id, "approve"), HumanResponse(b.id, "approve")]
    done = await rt.resume(agent, checkpoint_id=cp(first), responses=both)
    assert "completed" == done.status
    assert [b.id, a.id] == [d.request_id for d in done.decisions]
    assert list(done.decisions) == list(await store.decisions(done.run_id))


async def leave_stream_after(k: int) -> tuple[Runtime, Agent, RunResult, list[str]]:
    """Stream the approval's resume and go away after *k* scheduling points."""
    entered: list[str] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        entered.append(context.idempotency_key)  # it cannot be cut off: it does not wait
        return "Refunded."

    spec = ToolSpec("refund", "Refund.", ORDER_SCHEMA, refund, requires_approval=True)
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    script = [call("refund", id="c1", order_id="1"), "Done.", "Done."]  # a retry asks again
    agent = agent_with(ScriptedModel(script), spec)
    first = await rt.run(agent, "Refund order 1.")

    async def client() -> None:
        async with rt.stream_resume(agent, checkpoint_id=cp(first), response=approve(first)) as s:
            async for _ in s:
                pass

    async with anyio.create_task_group() as group:
        group.start_soon(client)
        for _ in range(k):
            await anyio.lowlevel.checkpoint()
        group.cancel_scope.cancel()
    return rt, agent, first, entered


async def test_a_stream_left_before_the_handler_started_never_leaves_an_unknown_outcome() -> None:
    # For every point the consumer can leave at: a decision stored without a result must
    # mean the handler started, so a retry never asks again about a call that never ran.
    before = 0
    for k in range(40):
        rt, agent, first, entered = await leave_stream_after(k)
        assert isinstance(rt.checkpoint_store, InMemoryCheckpointStore)
        stored = await rt.checkpoint_store.get(cp(first))
        if stored.status == "resolved":
            break
        assert [r.result is None for r in stored.records] == ([False] if entered else [])
        before += not entered
        again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
        assert ("completed", 1) == (again.status, len(entered))
    else:
        raise AssertionError("the stream never finished within 40 scheduling points")
    assert before > 0  # the window before the handler was hit


async def test_a_non_idempotent_call_cut_off_is_asked_about_again() -> None:
    rt, agent, payments, first = await interrupted_inside_handler()

    again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert again.interruption is not None
    request = again.interruption
    assert (True, "approval") == (request.outcome_unknown, request.kind)
    assert request.prompt.startswith(runlet.OUTCOME_UNKNOWN_PROMPT)
    assert first.interruption is not None
    assert first.interruption.tool_call == request.tool_call
    assert 1 == len(payments.attempts)
    # The repeat of the answer that led here gets the same interruption back.
    assert again == await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    rejected = await rt.resume(
        agent,
        checkpoint_id=cp(again),
        response=HumanResponse(request.id, "reject"),
    )
    assert "completed" == rejected.status
    assert runlet.REJECTION_MESSAGE == rejected.transcript[-2].content
    assert 1 == len(payments.attempts)
    assert ["approve", "reject"] == [d.action for d in rejected.decisions]


async def test_a_call_asked_about_again_gets_a_fresh_request_that_expires_in_full() -> None:
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(
        script=["Done."], clock=clock, expires_after=600
    )
    clock.advance(500)
    await cut_off_inside_handler(rt, agent, payments, first)
    clock.advance(200)  # past the first request's expiry

    again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    request = again.interruption
    assert request is not None
    assert request.id != approve(first).request_id
    assert (clock.now, clock.now + datetime.timedelta(seconds=600)) == (
        request.created_at,
        request.expires_at,
    )
    clock.advance(599)
    done = await rt.resume(agent, checkpoint_id=cp(again), response=approve(again))
    assert "completed" == done.status


async def test_an_edited_call_cut_off_is_asked_about_with_the_edited_arguments() -> None:
    rt, agent, payments, _, first = await refund_run(script=["Done."])
    payments.block = anyio.Event()
    edited = approve(first, edited_arguments={"order_id": "9"})
    async with anyio.create_task_group() as group:

        async def attempt() -> None:
            await rt.resume(agent, checkpoint_id=cp(first), response=edited)

        group.start_soon(attempt)
        await payments.entered.wait()
        group.cancel_scope.cancel()
    payments.block = None

    again = await rt.resume(agent, checkpoint_id=cp(first), response=edited)
    assert again.interruption is not None
    assert {"order_id": "9"} == again.interruption.tool_call.arguments

    done = await rt.resume(agent, checkpoint_id=cp(again), response=approve(again))
    assert "completed" == done.status
    assert ["9", "9"] == [payments.paid[key] for key in payments.attempts]


# --- Idempotency keys -------------------------------------------------------------------


async def test_idempotency_keys_differ_per_call_and_turn_even_for_a_reused_call_id() -> None:
    keys: list[tuple[str, str]] = []

    async def note(arguments: Mapping[str, Any], context: ToolContext) -> str:
        keys.append((context.tool_call_id, context.idempotency_key))
        return "ok"

    model = ScriptedModel(
        [
            [call("note", id="a", order_id="1"), call("note", id="b", order_id="2")],
            call("note", id="a", order_id="3"),
            "Done.",
        ]
    )
    result = await Runtime().run(agent_with(model, ToolSpec("note", "N.", ORDER_SCHEMA, note)), "x")

    assert "completed" == result.status
    assert ["a", "b", "a"] == [*sorted(call_id for call_id, _ in keys[:2]), keys[2][0]]
    assert 3 == len({key for _, key in keys})
    assert all(key.startswith(result.run_id) for _, key in keys)


def test_a_tool_context_built_by_hand_gets_a_key() -> None:
    context = ToolContext("run_1", "call_1", "support", {}, "refund")
    assert "run_1/call_1" == context.idempotency_key


# --- Approval policies ---------------------------------------------------------------------


def over_limit(arguments: Mapping[str, Any], context: ToolContext) -> bool:
    return bool(arguments.get("amount", 0) > 100)


async def async_over_limit(arguments: Mapping[str, Any], context: ToolContext) -> bool:
    await anyio.lowlevel.checkpoint()
    assert "support" == context.agent_name
    return over_limit(arguments, context)


@pytest.mark.parametrize("policy", [over_limit, async_over_limit], ids=["sync", "async"])
async def test_an_approval_policy_decides_per_call(policy: runlet.ApprovalPolicy) -> None:
    payments = Payments()
    model = ScriptedModel(
        [
            [
                call("refund", id="small", order_id="1", amount=20),
                call("refund", id="big", order_id="2", amount=500),
            ],
            "Done.",
        ]
    )
    agent = agent_with(model, refund_spec(payments, requires_approval=policy))
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())

    first = await rt.run(agent, "Refund both.")

    assert first.interruption is not None
    assert "big" == first.interruption.tool_call.id
    assert ["1"] == list(payments.paid.values())


class _Ready:
    """An awaitable that is not a coroutine (as a future, or a framework's deferred)."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __await__(self) -> Any:
        yield from ()
        return self.value


def awaitable_over_limit(arguments: Mapping[str, Any], context: ToolContext) -> Any:
    return _Ready(over_limit(arguments, context))


@pytest.mark.parametrize(
    "policy",
    [over_limit, async_over_limit, awaitable_over_limit],
    ids=["sync", "async", "awaitable"],
)
@pytest.mark.parametrize("amount", [20, 500])
async def test_an_approval_policy_decides_a_call_made_alone(
    policy: runlet.ApprovalPolicy, amount: int
) -> None:
    # One call, with a store: the policy is asked (not taken for "always ask").
    payments = Payments()
    model = ScriptedModel([call("refund", id="c1", order_id="1", amount=amount), "Done."])
    agent = agent_with(model, refund_spec(payments, requires_approval=policy))
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())

    result = await rt.run(agent, "Refund it.")

    asked = amount > 100
    assert ("interrupted" if asked else "completed") == result.status
    assert ([] if asked else ["1"]) == list(payments.paid.values())


@pytest.mark.parametrize(
    ("answer", "problem"),
    [(ValueError("no rules"), "ValueError: no rules"), ("yes", "must return True or False")],
    ids=["raises", "not-bool"],
)
async def test_a_broken_policy_runs_nothing_and_tells_the_model(
    answer: object, problem: str
) -> None:
    def policy(arguments: Mapping[str, Any], context: ToolContext) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    payments = Payments()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Done."])
    result = await Runtime().run(
        agent_with(model, refund_spec(payments, requires_approval=policy)), "Go."
    )

    assert "completed" == result.status
    tool_message = result.transcript[-2]
    assert tool_message.tool_result is not None
    assert tool_message.tool_result.is_error
    assert problem in tool_message.content
    assert [] == payments.attempts


@pytest.mark.parametrize("value", ["never", 1, None], ids=["str", "int", "none"])
def test_requires_approval_must_be_a_bool_or_a_policy(value: object) -> None:
    with pytest.raises(ConfigurationError, match="requires_approval"):
        refund_spec(Payments(), requires_approval=value)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("idempotent", "yes"),
        ("allow_edit", 0),
        ("expires_after", 0),
        ("expires_after", "60"),
        ("approval_prompt", 5),
    ],
)
def test_other_tool_options_are_checked_at_construction(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=option):
        refund_spec(Payments(), **{option: value})


def test_tool_options_of_the_design_may_be_given_in_its_order() -> None:
    # DESIGN: ToolSpec(..., requires_approval=False, idempotent=False, expires_after=None).
    payments = Payments()
    spec = ToolSpec("refund", "Refund.", ORDER_SCHEMA, payments.refund, True, True, 30.0)
    assert (spec.requires_approval, spec.idempotent, spec.expires_after) == (True, True, 30.0)
    with pytest.raises(TypeError):  # the options after them stay keyword-only
        ToolSpec("refund", "Refund.", ORDER_SCHEMA, payments.refund, True, True, 30.0, 5.0)  # type: ignore[call-arg]


# --- Expiry and cancellation -------------------------------------------------------------


async def test_a_late_answer_is_refused_and_the_checkpoint_kept() -> None:
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(
        script=["Done."], clock=clock, expires_after=3600
    )
    request = first.interruption
    assert request is not None
    assert (clock.now, clock.now + datetime.timedelta(hours=1)) == (
        request.created_at,
        request.expires_at,
    )
    clock.advance(3600)

    with pytest.raises(HumanRequestExpiredError) as info:
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert (cp(first), request.id) == (info.value.checkpoint_id, info.value.request_id)
    assert [] == payments.attempts
    assert cp(first) in rt.checkpoint_store  # type: ignore[operator]


async def test_an_answer_just_in_time_is_accepted() -> None:
    clock = Clock()
    rt, agent, _payments, _, first = await refund_run(
        script=["Done."], clock=clock, expires_after=60
    )
    clock.advance(59.999)
    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert "completed" == result.status


async def test_expire_records_the_expiry_result_and_continues() -> None:
    clock = Clock()
    rt, agent, payments, model, first = await refund_run(
        script=["Nobody approved it."], clock=clock, expires_after=60
    )
    clock.advance(120)

    result = await rt.expire(agent, checkpoint_id=cp(first))

    assert ("completed", "Nobody approved it.") == (result.status, result.output)
    expired = model.requests[-1].messages[-1]
    assert expired.tool_result is not None
    assert (runlet.EXPIRY_MESSAGE, True) == (expired.content, expired.tool_result.is_error)
    [decision] = result.decisions
    assert ("expire", clock.now) == (decision.action, decision.decided_at)
    assert result == await rt.expire(agent, checkpoint_id=cp(first))
    with pytest.raises(HumanRequestExpiredError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert [] == payments.attempts


async def test_an_answered_checkpoint_cannot_expire() -> None:
    rt, agent, _, _, first = await refund_run(script=["Done."])
    await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    with pytest.raises(CheckpointResolvedError):
        await rt.expire(agent, checkpoint_id=cp(first))


@pytest.mark.parametrize("idempotent", [False, True])
async def test_expire_after_an_approved_call_was_cut_off_keeps_the_answer_and_repeats(
    idempotent: bool,
) -> None:
    # A resume was cut off inside the approved handler (as by a crash); then an expiry
    # job gives up on the checkpoint. The person's answer came in time and is final, so
    # the call is handled as after any cut-off (asked again, or run again with its key),
    # and repeating expire() returns that same outcome instead of an error.
    started = anyio.Event()
    keys: list[str] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        keys.append(context.idempotency_key)
        if len(keys) == 1:
            started.set()
            await anyio.sleep_forever()
        return "Refunded order 1."

    spec = ToolSpec(
        "refund", "Refund.", ORDER_SCHEMA, refund, requires_approval=True, idempotent=idempotent
    )
    script = [call("refund", id="c1", order_id="1"), "Done.", "Done."]  # a retry asks again
    agent = agent_with(ScriptedModel(script), spec)
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    first = await rt.run(agent, "Refund order 1.")
    async with anyio.create_task_group() as group:
        group.start_soon(
            partial(rt.resume, agent, checkpoint_id=cp(first), response=approve(first))
        )
        await started.wait()
        group.cancel_scope.cancel()

    expired = await rt.expire(agent, checkpoint_id=cp(first))

    assert expired == await rt.expire(agent, checkpoint_id=cp(first))
    assert ["approve"] == [decision.action for decision in expired.decisions]
    assert (await store.get(cp(first))).resolution.expired  # type: ignore[union-attr]
    if idempotent:
        assert "completed" == expired.status
        assert [keys[0], keys[0]] == keys
    else:
        assert "interrupted" == expired.status
        assert expired.interruption is not None
        assert expired.interruption.outcome_unknown
        assert 1 == len(keys)


async def test_ask_human_questions_can_expire() -> None:
    clock = Clock()
    model = ScriptedModel([call("ask_human", id="q", kind="input", prompt="Which order?")])
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore(), clock=clock)
    agent = agent_with(model, ask_human(expires_after=30))
    first = await rt.run(agent, "Refund.")
    assert first.interruption is not None
    assert clock.now + datetime.timedelta(seconds=30) == first.interruption.expires_at


async def test_cancel_retires_without_running_anything() -> None:
    rt, agent, payments, model, first = await refund_run()
    await rt.cancel(cp(first))
    await rt.cancel(cp(first))
    with pytest.raises(CheckpointCancelledError, match="cancelled"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    with pytest.raises(CheckpointCancelledError):
        await rt.expire(agent, checkpoint_id=cp(first))
    assert ([], 1) == (payments.attempts, len(model.requests))


async def test_a_cancelled_checkpoint_says_so_even_to_an_answer_that_came_too_late() -> None:
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(clock=clock, expires_after=60)
    await rt.cancel(cp(first))
    clock.advance(120)

    with pytest.raises(CheckpointCancelledError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    with pytest.raises(CheckpointCancelledError):
        await rt.resume(
            agent, checkpoint_id=cp(first), response=HumanResponse("req_other", "approve")
        )
    assert [] == payments.attempts


async def test_cancel_of_an_answered_checkpoint_is_refused() -> None:
    rt, agent, _, _, first = await refund_run(script=["Done."])
    await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    with pytest.raises(CheckpointResolvedError):
        await rt.cancel(cp(first))


async def test_runtime_without_a_store_cannot_cancel() -> None:
    with pytest.raises(runlet.CheckpointStoreRequiredError):
        await Runtime().cancel("cp_1")


# --- Integrity -----------------------------------------------------------------------------


def _one_call_checkpoint(call_: ToolCall, request: runlet.HumanRequest) -> Checkpoint:
    """A checkpoint that waits on *request* about *call_*, the model's only call."""
    return Checkpoint(
        id="cp_1",
        run_id="run_1",
        agent_name="support",
        messages=(runlet.Message.user("Refund."),),
        options={},
        metadata={},
        transcript=(runlet.Message.user("Refund."), runlet.Message.assistant("", [call_])),
        pending_tool_calls=(call_,),
        request=request,
    )


def _checkpoint_data() -> dict[str, Any]:
    call_ = ToolCall("c1", "refund", {"order_id": "1"})
    request = runlet.HumanRequest("req_1", "approval", "Allow?", tool_call=call_)
    return unstructure_checkpoint(_one_call_checkpoint(call_, request))


def _edit(data: dict[str, Any], path: Sequence[Any], value: Any) -> dict[str, Any]:
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


BROKEN = [
    ("no-pending", ("pending_tool_calls",), [], "pending_tool_calls"),
    (
        "request-arguments",
        ("request", "tool_call", "arguments"),
        {"order_id": "999"},
        "request.tool_call",
    ),
    ("request-call", ("request", "tool_call", "id"), "c9", "request.tool_call"),
    (
        "pending-not-in-message",
        ("pending_tool_calls", 0, "id"),
        "c9",
        "pending_tool_calls[0]",
    ),
    (
        "result-for-unknown-call",
        ("results",),
        [{"tool_call_id": "c9", "content": "x"}],
        "results[0]",
    ),
    ("ends-with-user", ("transcript", 1), {"role": "user", "content": "hi"}, "transcript"),
]


@pytest.mark.parametrize(
    ("path", "value", "where"), [case[1:] for case in BROKEN], ids=[c[0] for c in BROKEN]
)
def test_a_checkpoint_that_does_not_hang_together_is_refused_when_structured(
    path: Sequence[Any], value: Any, where: str
) -> None:
    data = _edit(_checkpoint_data(), path, value)
    with pytest.raises(CheckpointSerializationError, match="does not hang together") as info:
        structure_checkpoint(data)
    assert where == info.value.path


KIND_MIXUPS = [
    # Python finds each pair equal (False == 0, 1 == True == 1.0); JSON, a person and a
    # handler that tests `is False` do not.
    ("pending-0", ("pending_tool_calls", 0, "arguments", "dry_run"), 0, "pending"),
    ("pending-float", ("pending_tool_calls", 0, "arguments", "count"), 1.0, "pending"),
    ("model-0", ("transcript", 1, "tool_calls", 0, "arguments", "dry_run"), 0, "pending"),
    ("request-0", ("request", "tool_call", "arguments", "dry_run"), 0, "request.tool_call"),
    ("request-true", ("request", "tool_call", "arguments", "count"), True, "request.tool_call"),
]


@pytest.mark.parametrize("detailed", [False, True], ids=["json", "tuples"])
@pytest.mark.parametrize(
    ("path", "value", "where"), [c[1:] for c in KIND_MIXUPS], ids=[c[0] for c in KIND_MIXUPS]
)
def test_arguments_equal_only_to_python_do_not_hang_together(
    path: Sequence[Any], value: Any, where: str, detailed: bool
) -> None:
    call_ = ToolCall("c1", "deploy", {"order_id": "1", "dry_run": False, "count": 1})
    request = runlet.HumanRequest("req_1", "approval", "Allow?", tool_call=call_)
    data = json.loads(json.dumps(unstructure_checkpoint(_one_call_checkpoint(call_, request))))
    _edit(data, path, value)
    if detailed:  # data not straight from json.loads takes the detailed converter
        data["messages"] = tuple(data["messages"])
    with pytest.raises(CheckpointSerializationError, match="does not hang together") as info:
        structure_checkpoint(data)
    expected = "pending_tool_calls[0].arguments" if where == "pending" else where
    assert expected == info.value.path


def test_a_structured_checkpoint_writes_back_the_json_it_was_read_from() -> None:
    call_ = ToolCall("c1", "deploy", {"dry_run": False, "count": 1, "ratio": 1.0, "n": None})
    request = runlet.HumanRequest("req_1", "approval", "Allow?", tool_call=call_)
    text = json.dumps(unstructure_checkpoint(_one_call_checkpoint(call_, request)))
    again = structure_checkpoint(json.loads(text))
    assert text == json.dumps(unstructure_checkpoint(again))
    arguments = again.pending_tool_calls[0].arguments
    assert [bool, int, float] == [type(arguments[k]) for k in ("dry_run", "count", "ratio")]


async def test_a_checkpoint_that_does_not_hang_together_is_refused_at_resume() -> None:
    rt, agent, payments, _, first = await refund_run()
    store = rt.checkpoint_store
    assert isinstance(store, InMemoryCheckpointStore)
    checkpoint = await store.load(cp(first))
    swapped = ToolCall("c1", "refund", {"order_id": "999"})
    await store.save(attrs.evolve(checkpoint, pending_tool_calls=(swapped,)))

    for _ in range(2):  # the same object again is checked as fully, not taken as checked
        with pytest.raises(
            CheckpointSerializationError, match=r"pending_tool_calls\[0\]\.arguments"
        ):
            await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    # Changed in the request too, consistently: what the person reads (the prompt, the
    # transcript) still says order 1, so it is refused all the same.
    request = attrs.evolve(checkpoint.request, tool_call=swapped)
    await store.save(attrs.evolve(checkpoint, pending_tool_calls=(swapped,), request=request))
    with pytest.raises(CheckpointSerializationError, match="what the model asked for"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    with pytest.raises(CheckpointSerializationError, match="what the model asked for"):
        structure_checkpoint(unstructure_checkpoint(await store.load(cp(first))))
    assert [] == payments.attempts


async def test_approved_arguments_are_checked_against_the_resuming_agents_schema() -> None:
    rt, _, payments, _, first = await refund_run()
    stricter = {**ORDER_SCHEMA, "required": ["order_id", "amount"]}
    agent = agent_with(
        ScriptedModel(["Done."]),
        ToolSpec("refund", "Refund.", stricter, payments.refund, requires_approval=True),
    )
    with pytest.raises(HumanResponseError, match="no longer fit"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert [] == payments.attempts


# --- Leases -------------------------------------------------------------------------------


async def test_the_claim_is_renewed_while_a_slow_tool_runs() -> None:
    renewed = anyio.Event()

    class Renewing(InMemoryCheckpointStore):
        async def renew(self, checkpoint_id: str, token: str) -> None:
            await super().renew(checkpoint_id, token)
            renewed.set()

    rt, agent, payments, _, first = await refund_run(store=Renewing(lease=0.03), script=["Done."])
    payments.block = renewed  # the tool finishes only once the lease was renewed
    with anyio.fail_after(10):
        result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert "completed" == result.status


async def test_a_renewal_that_fails_is_logged_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    renewed = anyio.Event()

    class Blip(InMemoryCheckpointStore):
        renewals = 0

        async def renew(self, checkpoint_id: str, token: str) -> None:
            self.renewals += 1
            if self.renewals == 1:
                raise OSError("connection reset")
            await super().renew(checkpoint_id, token)
            renewed.set()

    store = Blip(lease=0.6)  # renewed every 0.2 s; the handler starts long before that
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    payments.block = renewed  # the tool finishes only once a renewal after the blip worked
    with caplog.at_level("WARNING", logger="runlet"), anyio.fail_after(10):
        result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert ("completed", 2, 1) == (result.status, store.renewals, len(payments.attempts))
    [warning] = [r for r in caplog.records if r.name == "runlet"]
    message = warning.getMessage()
    assert repr(cp(first)) in message
    assert "OSError: connection reset" in message
    assert "retrying in 0.2 s" in message


async def test_the_claim_is_renewed_before_its_lease_runs_out() -> None:
    lease = 1.5  # renewed after 0.5 s: a second of slack for a loaded machine
    renewed = anyio.Event()

    class Timed(InMemoryCheckpointStore):
        claimed_at = 0.0
        renewed_after: float | None = None

        async def claim(self, checkpoint_id: str) -> runlet.Claim:
            self.claimed_at = time.monotonic()
            return await super().claim(checkpoint_id)

        async def renew(self, checkpoint_id: str, token: str) -> None:
            if self.renewed_after is None:
                self.renewed_after = time.monotonic() - self.claimed_at
            await super().renew(checkpoint_id, token)
            renewed.set()

    store = Timed(lease=lease)
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    payments.block = renewed
    with anyio.fail_after(30):
        result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert "completed" == result.status
    assert store.renewed_after is not None
    assert store.renewed_after < lease  # every third of it, so one late wake-up does no harm


async def test_a_lost_lease_stops_the_resume() -> None:
    class Losing(InMemoryCheckpointStore):
        async def renew(self, checkpoint_id: str, token: str) -> None:
            raise LeaseLostError("taken over", checkpoint_id=checkpoint_id)

    rt, agent, payments, _, first = await refund_run(store=Losing(lease=0.03), script=["Done."])
    payments.block = anyio.Event()  # never set: only the lost lease ends the wait
    with anyio.fail_after(10), pytest.raises(LeaseLostError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))


async def test_a_renewal_still_running_when_the_work_ends_does_not_hold_up_the_result() -> None:
    renewing = anyio.Event()

    class Hanging(InMemoryCheckpointStore):
        async def renew(self, checkpoint_id: str, token: str) -> None:
            renewing.set()
            await anyio.sleep_forever()  # a renewal that no longer matters

    store = Hanging(lease=0.03)
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    payments.block = renewing  # the tool finishes while the renewal hangs
    with anyio.fail_after(10):
        result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert "completed" == result.status
    assert "resolved" == (await store.get(cp(first))).status


class FailingResolve(InMemoryCheckpointStore):
    """A store whose next *failures* resolves raise ``OSError("disk full")``."""

    def __init__(self, failures: int = 1_000_000) -> None:
        super().__init__()
        self.failures = failures

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("disk full")
        await super().resolve(checkpoint_id, token, resolution, next_checkpoint)


async def test_a_failing_resolve_releases_the_claim() -> None:
    store = FailingResolve()
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done.", "Done."])
    with pytest.raises(OSError, match="disk full"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert "pending" == (await store.get(cp(first))).status

    store.failures = 0
    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert "completed" == result.status
    assert 1 == len(payments.attempts)


class FailingResultRecord(InMemoryCheckpointStore):
    """A store that records decisions but fails to record results (a full disk)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error: Exception | None = error

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        if self.error is not None and any(r.result is not None for r in records):
            raise self.error
        await super().record(checkpoint_id, token, records)


@pytest.mark.parametrize(
    "failure",
    [
        OSError("database or disk is full"),
        # A store closed under the resume (a server shutting down) is no claim problem.
        ConfigurationError("This store is not open."),
    ],
    ids=["disk full", "store closed"],
)
@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_result_the_store_cannot_record_is_on_the_error(
    idempotent: bool, failure: Exception
) -> None:
    store = FailingResultRecord(failure)
    rt, agent, payments, _, first = await refund_run(
        store=store, script=["Done.", "Done."], idempotent=idempotent
    )
    with pytest.raises(runlet.ResultNotRecordedError) as info:
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    error = info.value
    assert isinstance(error, runlet.ResumeError)
    assert error.__cause__ is failure
    assert (error.checkpoint_id, error.tool_call_id) == (cp(first), "c1")
    assert error.result == runlet.ToolResult("c1", "Refunded order 1.")
    assert "Tool 'refund' finished (call 'c1'), but the store could not record" in str(error)
    assert f"{type(failure).__name__}: {failure}" in str(error)
    then = "runs it again with the same idempotency key" if idempotent else "asks a person"
    assert f"so resuming again {then}" in str(error)
    assert 1 == len(payments.attempts)
    # The store still says "started": the next resume cannot know the outcome.
    store.error = None
    again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    if idempotent:  # run again with the same key: the payment service pays once
        assert "completed" == again.status
        assert [payments.attempts[0]] * 2 == payments.attempts
        assert 1 == len(payments.paid)
    else:
        assert "interrupted" == again.status
        assert again.interruption is not None
        assert again.interruption.outcome_unknown
        assert again.interruption.prompt.startswith(runlet.OUTCOME_UNKNOWN_PROMPT)
        assert "or its result could not be stored" in runlet.OUTCOME_UNKNOWN_PROMPT
        assert 1 == len(payments.attempts)


async def test_a_lost_lease_on_the_result_record_stays_a_lease_lost_error() -> None:
    store = FailingResultRecord(runlet.LeaseLostError("taken over"))
    rt, agent, _, _, first = await refund_run(store=store, script=["Done."])
    with pytest.raises(runlet.LeaseLostError, match="taken over"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))


class _NativeCancel:
    """Cancellation the backend's own way, as its timeouts do it: on asyncio
    ``Task.cancel()`` (what ``asyncio.timeout()`` and ``wait_for()`` call), which goes
    through anyio's shields; on trio a trio cancel scope."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.cancel: Any = None
        self.cancelled = False

    async def run(self, work: Any) -> None:
        if self.backend == "trio":
            import trio

            with trio.CancelScope() as scope:
                self.cancel = scope.cancel
                await work()
            self.cancelled = scope.cancelled_caught
            return
        import asyncio

        task = asyncio.current_task()
        assert task is not None
        # Delivered at the next await that yields, once the handler has returned.
        self.cancel = lambda: asyncio.get_running_loop().call_soon(task.cancel)
        try:
            await work()
        except asyncio.CancelledError:
            self.cancelled = True
            if hasattr(task, "uncancel"):  # Python 3.11+ counts cancellations
                task.uncancel()  # this one was the test's own


class Slow(InMemoryCheckpointStore):
    """A store whose release and resolve really wait, so a cancellation can land there."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = anyio.Event()
        self.go = anyio.Event()
        self.slow: str = ""

    async def _pause(self, name: str) -> None:
        if self.slow == name:
            self.waiting.set()
            await self.go.wait()

    async def release(self, checkpoint_id: str, token: str) -> None:
        await self._pause("release")
        await super().release(checkpoint_id, token)

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        await self._pause("resolve")
        await super().resolve(checkpoint_id, token, resolution, next_checkpoint)


@pytest.mark.parametrize("how", ["anyio", "native"])
@pytest.mark.parametrize("where", ["release", "resolve"])
async def test_cancelling_during_release_or_resolve_still_completes_it(
    where: str, how: str, anyio_backend: str
) -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    store = Slow()
    store.slow = where
    rt, agent, _, _, first = await refund_run(
        store=store, script=[down if where == "release" else "Done."]
    )
    native = _NativeCancel(anyio_backend)

    async def attempt() -> None:
        with contextlib.suppress(runlet.ModelError):
            await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    async with anyio.create_task_group() as group:
        group.start_soon(native.run if how == "native" else _call, attempt)
        await store.waiting.wait()
        # Lands inside the release / resolve, which must still be done.
        if how == "native":
            native.cancel()
            await anyio.lowlevel.checkpoint()  # let the cancellation be delivered
        else:
            group.cancel_scope.cancel()
        store.go.set()

    expected = "pending" if where == "release" else "resolved"
    assert expected == (await store.get(cp(first))).status
    assert (await store.get(cp(first))).status != "claimed"
    # On asyncio the task's cancellation goes on once the write is done; trio's lands
    # nowhere (nothing yields after the shielded write), which is as good.
    assert native.cancelled or how == "anyio" or anyio_backend == "trio"


async def _call(work: Any) -> None:
    await work()


# --- Streaming a resume -------------------------------------------------------------------


async def test_stream_resume_gives_the_same_events_and_result_as_stream() -> None:
    rt, agent, _payments, _, first = await refund_run(script=["Done."])
    events: list[runlet.StreamEvent] = []

    async with rt.stream_resume(agent, checkpoint_id=cp(first), response=approve(first)) as s:
        events.extend([event async for event in s])

    kinds = [type(event).__name__ for event in events]
    assert ["ToolCallStarted", "ToolCallFinished"] == kinds[:2]
    assert ["MessageCompleted", "RunFinished"] == kinds[-2:]
    assert s.result == events[-1].result  # type: ignore[union-attr]
    assert s.result == await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))


@pytest.mark.parametrize("again", ["completed", "interrupted"])
async def test_a_repeated_stream_resume_reports_the_stored_outcome(again: str) -> None:
    # A client whose first stream was lost repeats its answer: the repeat runs nothing,
    # and still tells it about the next approval, as the first stream did.
    script: list[Any] = (
        ["Done."] if again == "completed" else [call("refund", id="c2", order_id="2")]
    )
    rt, agent, payments, _, first = await refund_run(script=script)
    streams: list[list[runlet.StreamEvent]] = []
    for _ in range(2):
        async with rt.stream_resume(agent, checkpoint_id=cp(first), response=approve(first)) as s:
            streams.append([event async for event in s])
    original, repeated = streams
    assert again == s.result.status
    assert 1 == len(payments.attempts)
    kept = [e for e in original if isinstance(e, (runlet.Interrupted, runlet.RunFinished))]
    assert kept == repeated


async def test_stream_resume_reports_the_next_interruption_only_once_it_is_saved() -> None:
    store = FailingResolve()
    rt, agent, _, _, first = await refund_run(
        store=store, script=[call("refund", id="c2", order_id="2")]
    )
    events: list[runlet.StreamEvent] = []

    async def watch() -> None:
        async with rt.stream_resume(agent, checkpoint_id=cp(first), response=approve(first)) as s:
            async for event in s:
                events.append(event)  # noqa: PERF401 - the events before the error count

    with pytest.raises(OSError, match="disk full"):
        await watch()

    assert "MessageCompleted" == type(events[-1]).__name__  # the model asked for c2 ...
    assert not any(isinstance(event, runlet.Interrupted) for event in events)  # ... no more
    assert 1 == len(store)  # the first checkpoint, released; nothing saved for c2


async def test_stream_resume_raises_a_bad_response_from_the_iteration() -> None:
    rt, agent, payments, _, first = await refund_run()
    with pytest.raises(HumanResponseError):
        async with rt.stream_resume(
            agent, checkpoint_id=cp(first), response=HumanResponse("req_x", "approve")
        ) as s:
            [event async for event in s]
    assert [] == payments.attempts


# --- Resume arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({}, "needs the person's answer"),
        ({"responses": []}, "is empty"),
        ({"responses": "approve"}, "must be a list"),
    ],
    ids=["none", "empty", "str"],
)
async def test_resume_needs_one_way_of_answering(kwargs: dict[str, Any], problem: str) -> None:
    rt, agent, _, _, first = await refund_run()
    with pytest.raises(HumanResponseError, match=problem):
        await rt.resume(agent, checkpoint_id=cp(first), **kwargs)


async def test_resume_refuses_both_response_and_responses() -> None:
    rt, agent, _, _, first = await refund_run()
    with pytest.raises(HumanResponseError, match="not both"):
        await rt.resume(
            agent, checkpoint_id=cp(first), response=approve(first), responses=[approve(first)]
        )


async def test_a_json_checkpoint_from_another_process_resumes_exactly_once() -> None:
    rt, agent, payments, _, first = await refund_run(script=["Done."])
    assert isinstance(rt.checkpoint_store, InMemoryCheckpointStore)
    text = json.dumps(unstructure_checkpoint(await rt.checkpoint_store.load(cp(first))))
    elsewhere = InMemoryCheckpointStore()
    await elsewhere.save(structure_checkpoint(json.loads(text)))
    other = Runtime(checkpoint_store=elsewhere)

    done = await other.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert done == await other.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert 1 == len(payments.attempts)


async def test_stale_answers_to_a_resolved_checkpoint_get_the_error_of_their_case() -> None:
    clock = Clock()
    payments = Payments()
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store, clock=clock)
    calls = [call("refund", id=name, order_id=name) for name in ("a", "b", "c")]
    agent = agent_with(ScriptedModel([calls, "Done."]), refund_spec(payments, expires_after=60))
    r1 = await rt.run(agent, "Refund three.")
    a, b, c = r1.pending_requests
    r2 = await rt.resume(agent, checkpoint_id=cp(r1), response=HumanResponse(a.id, "approve"))
    r3 = await rt.resume(agent, checkpoint_id=cp(r2), response=HumanResponse(b.id, "approve"))

    # Not a response at all: refused as such, as at a pending checkpoint.
    for nonsense in ({"request_id": c.id, "action": "approve"}, None):
        with pytest.raises(HumanResponseError, match="needs a HumanResponse"):
            await rt.resume(agent, checkpoint_id=cp(r1), responses=[nonsense])  # type: ignore[list-item]

    # Past its deadline, an answer sent to a stale checkpoint is expired, not sent on.
    clock.advance(61)
    with pytest.raises(HumanRequestExpiredError, match=f"waits at checkpoint '{cp(r3)}'"):
        await rt.resume(agent, checkpoint_id=cp(r1), response=HumanResponse(c.id, "approve"))

    # A checkpoint the run went on to that the store no longer has is not named as open.
    await store.delete(cp(r2))
    with pytest.raises(HumanResponseConflictError, match="no longer has") as info:
        await rt.resume(agent, checkpoint_id=cp(r1), response=HumanResponse(c.id, "approve"))
    assert info.value.next_checkpoint_id is None
    assert ["a", "b"] == sorted(payments.paid.values())


async def test_an_answer_sent_to_a_superseded_checkpoint_names_the_current_one() -> None:
    payments = Payments()
    model = ScriptedModel(
        [[call("refund", id="a", order_id="1"), call("refund", id="b", order_id="2")], "Done."]
    )
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = agent_with(model, refund_spec(payments))
    first = await rt.run(agent, "Refund both.")
    one, two = first.pending_requests
    second = await rt.resume(
        agent, checkpoint_id=cp(first), response=HumanResponse(one.id, "approve")
    )
    assert (two,) == second.pending_requests

    with pytest.raises(
        HumanResponseConflictError, match=f"still open at checkpoint '{cp(second)}'"
    ) as info:
        await rt.resume(agent, checkpoint_id=cp(first), response=HumanResponse(two.id, "approve"))
    # A web handler can send the client on to the checkpoint to answer, without parsing.
    assert (two.id, cp(second)) == (info.value.request_id, info.value.next_checkpoint_id)

    done = await rt.resume(
        agent, checkpoint_id=cp(second), response=HumanResponse(two.id, "reject")
    )
    assert "completed" == done.status
    assert ["1"] == list(payments.paid.values())


@pytest.mark.parametrize("end", ["answered", "cancelled", "expired"])
async def test_a_request_answered_one_hop_at_a_time_is_followed_to_where_it_waits(
    end: str,
) -> None:
    payments = Payments()
    calls = [call("refund", id=name, order_id=name) for name in ("a", "b", "c")]
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    model = ScriptedModel([calls, call("refund", id="d", order_id="d"), "Done."])
    agent = agent_with(model, refund_spec(payments))
    r1 = await rt.run(agent, "Refund three.")
    a, b, c = r1.pending_requests
    r2 = await rt.resume(agent, checkpoint_id=cp(r1), response=HumanResponse(a.id, "approve"))
    r3 = await rt.resume(agent, checkpoint_id=cp(r2), response=HumanResponse(b.id, "approve"))
    assert (c,) == r3.pending_requests

    # Sent to the first checkpoint, two resumes ago: named where it waits now.
    c_ok = HumanResponse(c.id, "approve")
    with pytest.raises(HumanResponseConflictError, match="still open") as info:
        await rt.resume(agent, checkpoint_id=cp(r1), response=c_ok)
    assert (cp(r1), c.id, cp(r3)) == (
        info.value.checkpoint_id,
        info.value.request_id,
        info.value.next_checkpoint_id,
    )

    # Sent to the latest checkpoint, an answer to a request decided before it is a
    # conflict (not a made-up request id), equal or not; the checkpoint stays resumable.
    for response in (HumanResponse(a.id, "reject"), HumanResponse(b.id, "approve")):
        with pytest.raises(HumanResponseConflictError, match="already answered") as info:
            await rt.resume(agent, checkpoint_id=cp(r3), responses=[response, c_ok])
        assert (cp(r3), response.request_id, None) == (
            info.value.checkpoint_id,
            info.value.request_id,
            info.value.next_checkpoint_id,
        )
    with pytest.raises(HumanResponseError) as made_up:
        await rt.resume(agent, checkpoint_id=cp(r3), response=HumanResponse("req_x", "approve"))
    assert type(made_up.value) is HumanResponseError

    stale = (r1, r2)
    if end == "answered":
        r4 = await rt.resume(agent, checkpoint_id=cp(r3), response=c_ok)
        for where in stale:
            # The same answer again: sent on to where it was accepted, which repeats
            # its result; a different one is refused for good.
            with pytest.raises(HumanResponseConflictError, match="same response") as info:
                await rt.resume(agent, checkpoint_id=cp(where), response=c_ok)
            assert (cp(r3), r4.decisions[-1]) == (
                info.value.next_checkpoint_id,
                info.value.decision,
            )
            no = HumanResponse(c.id, "reject")
            with pytest.raises(
                HumanResponseConflictError, match=r"answered with 'approve' \(by an earlier"
            ) as info:
                await rt.resume(agent, checkpoint_id=cp(where), response=no)
            assert info.value.next_checkpoint_id is None
            assert r4.decisions[-1] == info.value.decision  # who decided, and when
        assert r4 == await rt.resume(agent, checkpoint_id=cp(r3), response=c_ok)
        assert ["a", "b", "c"] == sorted(payments.paid.values())
    elif end == "cancelled":
        await rt.cancel(cp(r3))
        for where in stale:
            with pytest.raises(HumanResponseConflictError, match="cancelled") as info:
                await rt.resume(agent, checkpoint_id=cp(where), response=c_ok)
            assert info.value.next_checkpoint_id is None
        assert ["a", "b"] == sorted(payments.paid.values())
    else:
        r4 = await rt.expire(agent, checkpoint_id=cp(r3))
        assert r4.checkpoint_id is not None  # the model went on to another call
        # Expired, wherever the answer is sent: before, at, or after where it expired.
        d_ok = HumanResponse(r4.pending_requests[0].id, "approve")
        r5 = await rt.resume(agent, checkpoint_id=cp(r4), response=d_ok)
        for where in (*stale, r3, r4):  # all resolved by now
            with pytest.raises(HumanRequestExpiredError) as expired:
                await rt.resume(agent, checkpoint_id=cp(where), response=c_ok)
            assert c.id == expired.value.request_id
        # A request born after the checkpoint it is sent to is found where it was taken.
        with pytest.raises(HumanResponseConflictError, match="same response") as info:
            await rt.resume(agent, checkpoint_id=cp(r1), response=d_ok)
        assert cp(r4) == info.value.next_checkpoint_id
        assert r5 == await rt.resume(agent, checkpoint_id=cp(r4), response=d_ok)
        assert ["a", "b", "d"] == sorted(payments.paid.values())


async def test_several_answers_in_one_call_and_the_audit_trail() -> None:
    payments = Payments()
    model = ScriptedModel(
        [
            [
                call("refund", id="a", order_id="1"),
                call("refund", id="b", order_id="2"),
                call("refund", id="c", order_id="3"),
            ],
            "Done.",
        ]
    )
    clock = Clock()
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore(), clock=clock)
    agent = agent_with(model, refund_spec(payments))
    first = await rt.run(agent, "Refund all three.")
    a, b, c = first.pending_requests
    assert first.interruption == a

    part = await rt.resume(
        agent,
        checkpoint_id=cp(first),
        responses=[
            HumanResponse(c.id, "reject", "duplicate", responded_by="ann"),
            HumanResponse(a.id, "approve", responded_by="bob", metadata={"ticket": 7}),
        ],
    )
    assert (b,) == part.pending_requests  # the one left keeps its request id
    clock.advance(5)
    done = await rt.resume(
        agent,
        checkpoint_id=cp(part),
        response=HumanResponse(b.id, "approve", edited_arguments={"order_id": "22"}),
    )

    assert "completed" == done.status
    assert ["1", "22"] == sorted(payments.paid.values())
    tool_messages = [m.content for m in done.transcript if m.role == "tool"]
    assert f"{runlet.REJECTION_MESSAGE} Reason: duplicate" == tool_messages[2]
    assert [("a", "approve", "bob"), ("c", "reject", "ann"), ("b", "approve", None)] == [
        (d.tool_call_id, d.action, d.responded_by) for d in done.decisions
    ]
    assert {"ticket": 7} == done.decisions[0].metadata
    assert ({"order_id": "22"}, True) == (done.decisions[2].arguments, done.decisions[2].edited)
    assert clock.now == done.decisions[2].decided_at
    store = rt.checkpoint_store
    assert isinstance(store, InMemoryCheckpointStore)
    assert (
        list(done.decisions)
        == sorted(
            await store.decisions(done.run_id), key=lambda d: (d.decided_at, d.tool_call_id != "a")
        )
        or len(await store.decisions(done.run_id)) == 3
    )


async def test_approval_prompt_and_allow_edit_per_tool() -> None:
    payments = Payments()
    model = ScriptedModel([call("refund", id="a", order_id="1"), "Done."])
    tool = refund_spec(
        payments,
        approval_prompt=lambda arguments: f"Refund order {arguments['order_id']}?",
        allow_edit=False,
    )
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = agent_with(model, tool)
    first = await rt.run(agent, "Refund.")
    assert first.interruption is not None
    assert "Refund order 1?" == first.interruption.prompt

    with pytest.raises(HumanResponseError, match="allow_edit=False"):
        await rt.resume(
            agent,
            checkpoint_id=cp(first),
            response=approve(first, edited_arguments={"order_id": "2"}),
        )
    assert [] == payments.attempts
    fixed = refund_spec(payments, approval_prompt="Refund it?")
    other = await Runtime(checkpoint_store=InMemoryCheckpointStore()).run(
        agent_with(ScriptedModel([call("refund", id="a", order_id="1")]), fixed), "Refund."
    )
    assert other.interruption is not None
    assert "Refund it?" == other.interruption.prompt


# --- Edges -------------------------------------------------------------------------------

MORE_BROKEN = [
    ("pending-twice", "twice", "pending_tool_calls[1]"),
    ("request-ids", "share an id", "more_requests"),
    ("result-and-pending", "two results", "results[0]"),
    ("no-result", "neither a result", "results"),
    ("requests-count", "open requests for", "more_requests"),
]


@pytest.mark.parametrize(
    ("problem", "where"), [c[1:] for c in MORE_BROKEN], ids=[c[0] for c in MORE_BROKEN]
)
def test_more_ways_a_checkpoint_can_fail_to_hang_together(problem: str, where: str) -> None:
    first = ToolCall("c1", "refund", {"order_id": "1"})
    second = ToolCall("c2", "refund", {"order_id": "2"})
    request = runlet.HumanRequest("req_1", "approval", "Allow?", tool_call=first)
    fields: dict[str, Any] = {
        "id": "cp_1",
        "run_id": "run_1",
        "agent_name": "support",
        "messages": (),
        "options": {},
        "metadata": {},
        "transcript": (runlet.Message.assistant("", [first, second]),),
        "pending_tool_calls": (first, second),
        "request": request,
        "more_requests": (attrs.evolve(request, id="req_2", tool_call=second),),
    }
    if problem == "twice":
        fields["transcript"] = (runlet.Message.assistant("", [first]),)
        fields["pending_tool_calls"] = (first, first)
        fields["more_requests"] = (attrs.evolve(request, id="req_2"),)
    elif problem == "share an id":
        fields["more_requests"] = (attrs.evolve(request, tool_call=second),)
    elif problem == "two results":
        fields["results"] = (runlet.ToolResult("c1", "done"),)
    elif problem == "neither a result":
        fields["pending_tool_calls"] = (first,)
        fields["more_requests"] = ()
    else:
        fields["more_requests"] = ()
    data = unstructure_checkpoint(Checkpoint(**fields))
    with pytest.raises(CheckpointSerializationError, match=problem) as info:
        structure_checkpoint(data)
    assert where == info.value.path
    if problem == "neither a result":
        assert "calls 'c2' have neither" in str(info.value)  # the call left without one


@pytest.mark.parametrize(
    ("value", "problem"),
    [(5, "ISO 8601"), ("2026-01-01T00:00:00", "no time zone"), ("soon", "Invalid isoformat")],
    ids=["int", "naive", "garbage"],
)
def test_request_times_must_be_aware_iso_strings(value: Any, problem: str) -> None:
    data = _checkpoint_data()
    data["request"]["created_at"] = value
    with pytest.raises(CheckpointSerializationError, match="created_at"):
        structure_checkpoint(data)


def test_a_z_suffix_is_read_as_utc() -> None:
    data = _checkpoint_data()
    data["request"]["created_at"] = "2026-01-02T03:04:05Z"
    checkpoint = structure_checkpoint(data)
    assert datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) == checkpoint.request.created_at


def test_unstructure_and_structure_round_trip_results_and_decisions() -> None:
    checkpoint = structure_checkpoint(_checkpoint_data())
    result = runlet.RunResult(
        status="interrupted",
        interruption=checkpoint.request,
        checkpoint_id="cp_1",
        transcript=checkpoint.transcript,
        usage=runlet.Usage(1, 2, 3),
        run_id="run_1",
        pending_requests=checkpoint.open_requests,
    )
    data = json.loads(json.dumps(runlet.unstructure(result)))
    assert result == runlet.structure(data, RunResult)
    assert unstructure_checkpoint(checkpoint) == runlet.unstructure(checkpoint)


async def test_two_responses_to_one_request_are_refused() -> None:
    rt, agent, payments, _, first = await refund_run()
    with pytest.raises(HumanResponseError, match="Two responses"):
        await rt.resume(agent, checkpoint_id=cp(first), responses=[approve(first), approve(first)])
    assert [] == payments.attempts


async def test_response_metadata_must_be_json() -> None:
    rt, agent, payments, _, first = await refund_run()
    with pytest.raises(HumanResponseError, match="metadata"):
        await rt.resume(
            agent, checkpoint_id=cp(first), response=approve(first, metadata={"at": object()})
        )
    assert [] == payments.attempts


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"action": "reject", "value": 5}, "reason"),
        ({"action": "approve", "responded_by": 5}, "responded_by"),
        ({"action": "approve", "metadata": [1]}, "metadata"),
    ],
    ids=["reason", "responded-by", "metadata"],
)
def test_bad_response_fields_are_refused_at_construction(
    fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(HumanResponseError, match=problem):
        HumanResponse("req_1", **fields)


async def test_several_approved_calls_run_concurrently_and_each_result_is_recorded() -> None:
    payments = Payments()
    model = ScriptedModel(
        [[call("refund", id="a", order_id="1"), call("refund", id="b", order_id="2")], "Done."]
    )
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = agent_with(model, refund_spec(payments))
    first = await rt.run(agent, "Refund both.")
    result = await rt.resume(
        agent,
        checkpoint_id=cp(first),
        responses=[HumanResponse(r.id, "approve") for r in first.pending_requests],
    )
    assert "completed" == result.status
    assert ["1", "2"] == sorted(payments.paid.values())


async def test_a_renewal_that_fails_for_another_reason_is_retried() -> None:
    attempts: list[int] = []
    renewed = anyio.Event()

    class Flaky(InMemoryCheckpointStore):
        async def renew(self, checkpoint_id: str, token: str) -> None:
            attempts.append(1)
            if len(attempts) == 1:
                raise OSError("database restarting")
            renewed.set()

    rt, agent, payments, _, first = await refund_run(store=Flaky(lease=0.03), script=["Done."])
    payments.block = renewed
    with anyio.fail_after(10):
        result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert "completed" == result.status
    assert len(attempts) >= 2


async def test_a_failure_under_a_lease_is_raised_as_itself() -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    rt, agent, _, _, first = await refund_run(
        store=InMemoryCheckpointStore(lease=60), script=[down]
    )
    with pytest.raises(runlet.ModelError, match="model is down"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))


async def test_a_resume_that_loses_the_race_to_finish_returns_the_stored_result() -> None:
    class Racing(InMemoryCheckpointStore):
        """Reports the checkpoint pending, then finds it resolved when claiming."""

        async def get(self, checkpoint_id: str) -> runlet.StoredCheckpoint:
            stored = await super().get(checkpoint_id)
            return attrs.evolve(stored, status="pending", resolution=None)

    store = Racing()
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    done = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert done == await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert 1 == len(payments.attempts)


async def test_a_lost_race_returns_the_stored_result_from_a_store_that_did_not_attach_it() -> None:
    class Terse(InMemoryCheckpointStore):
        """Reports the checkpoint pending, then refuses the claim without the outcome, as
        a store of its own may."""

        racing = False

        async def get(self, checkpoint_id: str) -> runlet.StoredCheckpoint:
            stored = await super().get(checkpoint_id)
            if self.racing:  # the first read only, from before another resume finished
                self.racing = False
                return attrs.evolve(stored, status="pending", resolution=None)
            return stored

        async def claim(self, checkpoint_id: str) -> runlet.Claim:
            try:
                return await super().claim(checkpoint_id)
            except CheckpointResolvedError as exc:
                raise CheckpointResolvedError(str(exc), checkpoint_id=checkpoint_id) from None

    store = Terse()
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    done = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    store.racing = True

    assert done == await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert 1 == len(payments.attempts)


async def test_a_resume_goes_on_from_the_records_its_claim_returns() -> None:
    class Stale(InMemoryCheckpointStore):
        """Reads the records as they were before another attempt recorded its work."""

        async def get(self, checkpoint_id: str) -> runlet.StoredCheckpoint:
            return attrs.evolve(await super().get(checkpoint_id), records=())

    rt, agent, payments, model, first = await refund_run(store=Stale(), script=[_down, "Done."])
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert ("completed", 1) == (result.status, len(payments.attempts))
    assert "Refunded order 1." == model.requests[-1].messages[-1].content


class _PlainStore:
    """The three-method store protocol in a dict (at least once)."""

    def __init__(self) -> None:
        self.rows: dict[str, Checkpoint] = {}

    async def save(self, checkpoint: Checkpoint) -> None:
        self.rows[checkpoint.id] = checkpoint

    async def load(self, checkpoint_id: str) -> Checkpoint:
        try:
            return self.rows[checkpoint_id]
        except KeyError:
            raise CheckpointNotFoundError("gone", checkpoint_id=checkpoint_id) from None

    async def delete(self, checkpoint_id: str) -> None:
        self.rows.pop(checkpoint_id, None)


class _TerseStore(_PlainStore):
    """A store of one's own that raises Runlet's errors with a message alone."""

    async def load(self, checkpoint_id: str) -> Checkpoint:
        if checkpoint_id not in self.rows:
            raise CheckpointNotFoundError("No such row.")
        return self.rows[checkpoint_id]


@pytest.mark.parametrize("how", ["resume", "stream_resume", "expire", "cancel"])
async def test_a_store_s_error_given_a_message_alone_gets_the_checkpoint_s_id(how: str) -> None:
    # A store author writes `raise CheckpointNotFoundError("...")`: that must be the error
    # the application sees (not a TypeError), naming the checkpoint as Runlet's own do.
    rt, agent, payments, _, first = await refund_run(store=_TerseStore())
    response = approve(first)

    async def attempt() -> None:
        if how == "resume":
            await rt.resume(agent, checkpoint_id="cp_gone", response=response)
        elif how == "stream_resume":
            async with rt.stream_resume(
                agent, checkpoint_id="cp_gone", response=response
            ) as stream:
                async for _ in stream:
                    pass  # pragma: no cover - the first step raises
        elif how == "expire":
            await rt.expire(agent, checkpoint_id="cp_gone")
        else:
            await rt.cancel("cp_gone")

    with pytest.raises(CheckpointNotFoundError, match="No such row") as caught:
        await attempt()
    assert "cp_gone" == caught.value.checkpoint_id
    assert [] == payments.attempts


async def test_a_durable_store_s_error_given_a_message_alone_gets_the_checkpoint_s_id() -> None:
    class Busy(InMemoryCheckpointStore):
        async def claim(self, checkpoint_id: str) -> runlet.Claim:
            raise CheckpointClaimedError("Someone else has it.")

    rt, agent, payments, _, first = await refund_run(store=Busy())
    with pytest.raises(CheckpointClaimedError, match="Someone else") as caught:
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert cp(first) == caught.value.checkpoint_id
    assert [] == payments.attempts
    # An id the store gave is kept as it is.
    assert "cp_x" == CheckpointClaimedError("busy", checkpoint_id="cp_x").checkpoint_id
    assert None is CheckpointClaimedError("busy").checkpoint_id


@pytest.mark.parametrize("kind", ["memory", "plain"])
async def test_a_resume_of_a_caller_already_cancelled_runs_nothing(kind: str) -> None:
    # Nothing in this resume would yield (the store, the model and the tool never wait),
    # so without a check of its own the approved refund ran for a caller whose cancel
    # scope was already cancelled.
    store: Any = InMemoryCheckpointStore() if kind == "memory" else _PlainStore()
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert scope.cancelled_caught
    assert [] == payments.attempts
    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert ("completed", 1) == (result.status, len(payments.attempts))


async def test_cancel_with_a_plain_store_deletes_the_checkpoint() -> None:
    store = _PlainStore()
    rt, _agent, _, _, first = await refund_run(store=store)
    await rt.cancel(cp(first))
    assert {} == store.rows
    with pytest.raises(CheckpointNotFoundError):
        await rt.cancel(cp(first))


def test_a_runtime_s_store_and_turn_limit_are_read_only() -> None:
    # Every run uses what the runtime was built with; a later assignment would be
    # silently ignored by runs (and half-used by cancel()), so it is refused.
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store, max_turns=3)
    assert (rt.checkpoint_store, rt.max_turns) == (store, 3)
    with pytest.raises(AttributeError):
        rt.max_turns = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        rt.checkpoint_store = InMemoryCheckpointStore()  # type: ignore[misc]
    assert (rt.checkpoint_store, rt.max_turns) == (store, 3)


def test_runtime_refuses_a_clock_that_is_not_callable() -> None:
    with pytest.raises(ConfigurationError, match="clock"):
        Runtime(clock="now")  # type: ignore[arg-type]


def test_runtime_refuses_a_clock_without_a_time_zone() -> None:
    # Its times would go into checkpoints that could never be read back: refused when
    # the runtime is built, not when a run is lost.
    with pytest.raises(ConfigurationError, match="aware datetime"):
        Runtime(clock=lambda: datetime.datetime(2026, 11, 30, 9, 0))
    with pytest.raises(ConfigurationError, match="aware datetime"):
        Runtime(clock=lambda: "2026-11-30T09:00:00Z")  # type: ignore[arg-type, return-value]


async def test_times_from_a_clock_in_another_zone_are_recorded_in_utc() -> None:
    # DESIGN: created_at, expires_at (and decision times) are aware UTC datetimes, so
    # every store shows the same time whatever zone the application's clock uses.
    oslo = datetime.timezone(datetime.timedelta(hours=2))
    local = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=oslo)
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store, clock=lambda: local)
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Done."])
    agent = agent_with(model, refund_spec(Payments(), expires_after=60))
    first = await rt.run(agent, "Refund order 1.")
    request = first.interruption
    assert request is not None
    assert request.expires_at is not None
    noon_utc = datetime.datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    for moment in (request.created_at, request.expires_at - datetime.timedelta(seconds=60)):
        assert (moment, moment.tzinfo) == (noon_utc, UTC)
    [pending] = await store.list_pending()
    assert pending.created_at.tzinfo is UTC
    await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    [decision] = await store.decisions(first.run_id)
    assert (decision.decided_at, decision.decided_at.tzinfo) == (noon_utc, UTC)


async def test_a_clock_that_loses_its_time_zone_later_stops_the_run_before_it_saves() -> None:
    readings = iter(
        [datetime.datetime(2026, 11, 30, 9, 0, tzinfo=UTC), datetime.datetime(2026, 11, 30, 9, 1)]
    )
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store, clock=lambda: next(readings))
    model = ScriptedModel([call("refund", id="c1", order_id="1")])
    agent = agent_with(model, refund_spec(Payments()))
    with pytest.raises(ConfigurationError, match="aware datetime"):
        await rt.run(agent, "Refund order 1.")
    assert [] == await store.list_pending()


@pytest.mark.parametrize(
    ("prompt", "logged"),
    [
        (lambda arguments: 1 / 0, "raised"),
        (lambda arguments: 42, "returned int, not a str"),
        (lambda arguments: None, None),  # None asks for the default: nothing to warn of
    ],
    ids=["raises", "not-str", "none"],
)
async def test_a_broken_approval_prompt_falls_back_to_the_default(
    prompt: Any, logged: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([call("refund", id="a", order_id="1")])
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    with caplog.at_level("WARNING", logger="runlet"):
        first = await rt.run(
            agent_with(model, refund_spec(Payments(), approval_prompt=prompt)), "x"
        )
    assert first.interruption is not None
    assert 'Allow refund with {"order_id": "1"}?' == first.interruption.prompt
    warnings = [r for r in caplog.records if r.name == "runlet"]
    if logged is None:
        assert [] == warnings
        return
    [warning] = warnings
    assert "WARNING" == warning.levelname
    assert "approval_prompt of tool 'refund'" in warning.getMessage()
    assert logged in warning.getMessage()
    # A prompt that raised comes with its traceback, for whoever fixes it.
    assert (warning.exc_info is not None) == (logged == "raised")


async def test_a_resumed_run_gets_read_only_options() -> None:
    seen: list[Any] = []

    def meddle(request: runlet.ModelRequest) -> str:
        try:
            request.options["temperature"] = 2.0  # type: ignore[index]
        except TypeError:
            seen.append("refused")
        return "Done."

    payments = Payments()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), meddle])
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = agent_with(model, refund_spec(payments))
    first = await rt.run(agent, "Refund.", options={"temperature": 0.1})
    text = json.dumps(unstructure_checkpoint(await rt.checkpoint_store.load(cp(first))))  # type: ignore[union-attr]
    elsewhere = InMemoryCheckpointStore()
    await elsewhere.save(structure_checkpoint(json.loads(text)))

    await Runtime(checkpoint_store=elsewhere).resume(
        agent, checkpoint_id=cp(first), response=approve(first)
    )

    assert ["refused"] == seen
    assert {"temperature": 0.1} == (await elsewhere.get(cp(first))).checkpoint.options


class _CancelledDeleting(_PlainStore):
    """A three-method store whose first delete goes through and then waits, so a
    cancellation lands after the checkpoint is gone; *fail_saves* makes the saves after
    it fail."""

    def __init__(self) -> None:
        super().__init__()
        self.deleting = anyio.Event()
        self.fail_saves = False

    async def save(self, checkpoint: Checkpoint) -> None:
        if self.fail_saves and self.deleting.is_set():
            raise OSError("disk gone")
        await super().save(checkpoint)

    async def delete(self, checkpoint_id: str) -> None:
        self.rows.pop(checkpoint_id, None)
        if not self.deleting.is_set():  # the resume's own delete: cancelled in there
            self.deleting.set()
            await anyio.sleep_forever()


async def _cancel_while_deleting(
    rt: Runtime, agent: Agent, store: _CancelledDeleting, first: RunResult
) -> list[str]:
    outcomes: list[str] = []
    async with anyio.create_task_group() as group:

        async def attempt() -> None:
            try:
                await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
            except anyio.get_cancelled_exc_class():
                outcomes.append("cancelled")
                raise
            outcomes.append("returned")

        group.start_soon(attempt)
        await store.deleting.wait()
        group.cancel_scope.cancel()
    return outcomes


async def test_cancelling_during_a_plain_stores_delete_leaves_the_checkpoint_resumable() -> None:
    store = _CancelledDeleting()
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done.", "Done."])
    assert ["cancelled"] == await _cancel_while_deleting(rt, agent, store, first)
    assert [cp(first)] == list(store.rows)  # saved back: the delete had gone through
    # At least once, as a plain store is: resuming it again runs the approved call again.
    again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert ("completed", 2) == (again.status, len(payments.attempts))


async def test_cancelling_during_a_plain_stores_delete_takes_the_next_checkpoint_back() -> None:
    store = _CancelledDeleting()
    second = call("refund", id="c2", order_id="2")
    rt, agent, _, _, first = await refund_run(store=store, script=[second, "Done."])
    assert ["cancelled"] == await _cancel_while_deleting(rt, agent, store, first)
    assert [cp(first)] == list(store.rows)  # the run's next checkpoint: nobody heard of it


async def test_cancelling_while_a_plain_store_saves_the_next_checkpoint_takes_it_back() -> None:
    class CancelledSaving(_PlainStore):
        """Its save of the run's next checkpoint goes through, then waits."""

        def __init__(self) -> None:
            super().__init__()
            self.saving = anyio.Event()

        async def save(self, checkpoint: Checkpoint) -> None:
            await super().save(checkpoint)
            if len(self.rows) > 1 and not self.saving.is_set():
                self.saving.set()
                await anyio.sleep_forever()

    store = CancelledSaving()
    second = call("refund", id="c2", order_id="2")
    rt, agent, _, _, first = await refund_run(store=store, script=[second, "Done."])
    async with anyio.create_task_group() as group:
        group.start_soon(
            partial(rt.resume, agent, checkpoint_id=cp(first), response=approve(first))
        )
        await store.saving.wait()
        group.cancel_scope.cancel()
    assert [cp(first)] == list(store.rows)  # the next one, which nobody heard of, is gone


async def test_a_plain_store_that_cannot_save_a_cancelled_resumes_checkpoint_back_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _CancelledDeleting()
    store.fail_saves = True
    rt, agent, _, _, first = await refund_run(store=store, script=["Done."])
    with caplog.at_level("WARNING", logger="runlet"):
        assert ["cancelled"] == await _cancel_while_deleting(rt, agent, store, first)
    assert {} == store.rows
    [warning] = [r for r in caplog.records if r.name == "runlet"]
    message = warning.getMessage()
    assert repr(cp(first)) in message
    assert "saving it back failed" in message
    assert "OSError: disk gone" in message


async def test_a_contradicting_answer_is_refused_before_it_claims_anything() -> None:
    claims: list[str] = []

    class Counting(InMemoryCheckpointStore):
        async def claim(self, checkpoint_id: str) -> runlet.Claim:
            claims.append(checkpoint_id)
            return await super().claim(checkpoint_id)

    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    rt, agent, payments, _, first = await refund_run(store=Counting(), script=[down, "Done."])
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert 1 == len(claims)

    with pytest.raises(HumanResponseConflictError):
        await rt.resume(
            agent,
            checkpoint_id=cp(first),
            response=HumanResponse(approve(first).request_id, "reject"),
        )

    assert 1 == len(claims)  # refused from the records, without a claim
    assert 1 == len(payments.attempts)


# --- Found in review --------------------------------------------------------------------


async def test_a_store_failure_among_several_approved_calls_is_raised_as_itself() -> None:
    class Failing(InMemoryCheckpointStore):
        fail = True

        async def record(
            self, checkpoint_id: str, token: str, records: Sequence[CallRecord]
        ) -> None:
            if self.fail and any(record.result is not None for record in records):
                raise OSError("disk full")
            await super().record(checkpoint_id, token, records)

    payments = Payments()
    model = ScriptedModel(
        [[call("refund", id="a", order_id="1"), call("refund", id="b", order_id="2")], "Done."]
    )
    store = Failing()
    rt = Runtime(checkpoint_store=store)
    agent = agent_with(model, refund_spec(payments, idempotent=True))
    first = await rt.run(agent, "Refund both.")
    answers = [HumanResponse(r.id, "approve") for r in first.pending_requests]

    # Not an exception group: the one failure, as itself.
    with pytest.raises(runlet.ResultNotRecordedError, match="disk full") as info:
        await rt.resume(agent, checkpoint_id=cp(first), responses=answers)
    assert isinstance(info.value.__cause__, OSError)
    assert "pending" == (await store.get(cp(first))).status

    store.fail = False
    result = await rt.resume(agent, checkpoint_id=cp(first), responses=answers)
    assert "completed" == result.status
    assert ["1", "2"] == sorted(payments.paid.values())


async def test_a_store_failure_among_several_approved_calls_stops_the_others() -> None:
    class Failing(InMemoryCheckpointStore):
        async def record(
            self, checkpoint_id: str, token: str, records: Sequence[CallRecord]
        ) -> None:
            if any(record.result is not None for record in records):
                raise OSError("disk full")
            await super().record(checkpoint_id, token, records)

    slow_started = anyio.Event()
    finished: list[str] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        if "2" == arguments["order_id"]:
            slow_started.set()
            await anyio.Event().wait()  # runs until the failure beside it stops it
        else:
            await slow_started.wait()
        finished.append(arguments["order_id"])
        return "Refunded."

    model = ScriptedModel(
        [[call("refund", id="a", order_id="1"), call("refund", id="b", order_id="2")], "Done."]
    )
    store = Failing()
    rt = Runtime(checkpoint_store=store)
    tool = ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, refund, requires_approval=True)
    first = await rt.run(agent_with(model, tool), "Refund both.")
    answers = [HumanResponse(r.id, "approve") for r in first.pending_requests]

    with anyio.fail_after(10), pytest.raises(runlet.ResultNotRecordedError, match="disk full"):
        await rt.resume(agent_with(model, tool), checkpoint_id=cp(first), responses=answers)

    assert ["1"] == finished
    assert "pending" == (await store.get(cp(first))).status


def _down(request: runlet.ModelRequest) -> str:
    raise OSError("model is down")


async def test_an_answer_recorded_in_time_is_not_refused_as_late_on_retry() -> None:
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(
        script=[_down, "Refunded."], clock=clock, expires_after=60
    )
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    clock.advance(120)  # the request has expired by the time the answer is retried

    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert ("completed", "Refunded.") == (result.status, result.output)
    assert ["approve"] == [decision.action for decision in result.decisions]
    assert 1 == len(payments.attempts)


async def test_expire_after_a_failed_attempt_keeps_the_recorded_answer() -> None:
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(
        script=[_down, "Refunded."], clock=clock, expires_after=60
    )
    with pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    clock.advance(120)

    result = await rt.expire(agent, checkpoint_id=cp(first))

    assert "completed" == result.status
    assert ["approve"] == [decision.action for decision in result.decisions]
    assert 1 == len(payments.attempts)


@pytest.mark.parametrize(
    ("expired_at", "answered_at"), [(30, 40), (120, 130)], ids=["before-expires_at", "after"]
)
async def test_an_answer_after_an_unfinished_expire_is_refused_as_expired(
    expired_at: int, answered_at: int
) -> None:
    # expire() stored its decision, then its model call failed: the request is expired,
    # not answered, so a person's answer gets the expired error (410), never a conflict
    # with an "expire" answer no HumanResponse can give. expire() then finishes the run.
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(
        script=[_down, "Told the customer."], clock=clock, expires_after=60
    )
    clock.advance(expired_at)  # expire() gives up waiting, maybe before expires_at
    with pytest.raises(runlet.ModelError):
        await rt.expire(agent, checkpoint_id=cp(first))
    clock.advance(answered_at - expired_at)

    with pytest.raises(HumanRequestExpiredError, match=r"expired with runtime\.expire") as info:
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert first.interruption is not None
    assert (cp(first), first.interruption.id) == (info.value.checkpoint_id, info.value.request_id)

    result = await rt.expire(agent, checkpoint_id=cp(first))
    assert ("completed", ["expire"]) == (result.status, [d.action for d in result.decisions])
    assert [] == payments.attempts


async def test_expire_repeated_after_a_failed_attempt_returns_its_result() -> None:
    clock = Clock()
    payments = Payments()
    model = ScriptedModel(
        [[call("refund", id="a", order_id="1"), call("refund", id="b", order_id="2")], "Done."]
    )
    agent = agent_with(model, refund_spec(payments, expires_after=60))
    rt = Runtime(checkpoint_store=FailingResolve(failures=1), clock=clock)
    first = await rt.run(agent, "Refund both.")
    one = HumanResponse(first.pending_requests[0].id, "approve")
    with pytest.raises(OSError, match="disk full"):  # recorded, then not resolved
        await rt.resume(agent, checkpoint_id=cp(first), responses=[one])
    clock.advance(120)

    result = await rt.expire(agent, checkpoint_id=cp(first))

    assert ["approve", "expire"] == [decision.action for decision in result.decisions]
    assert result == await rt.expire(agent, checkpoint_id=cp(first))
    assert 1 == len(payments.attempts)


async def test_edited_arguments_that_are_not_json_are_a_response_error() -> None:
    rt, agent, payments, _, first = await refund_run(script=["Done."])

    # Which check refuses them depends on the jsonschema-rs version; the class does not.
    with pytest.raises(HumanResponseError, match="edited_arguments"):
        await rt.resume(
            agent,
            checkpoint_id=cp(first),
            response=approve(first, edited_arguments={"order_id": "1", "note": {1: "x"}}),
        )
    assert "pending" == (await rt.checkpoint_store.get(cp(first))).status  # type: ignore[union-attr]
    assert [] == payments.attempts


async def test_an_evolved_ask_human_still_stops_for_a_person() -> None:
    tool = attrs.evolve(ask_human(), description="Ask the user.")
    model = ScriptedModel([call("ask_human", id="q", kind="input", prompt="Which order?")])
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())

    result = await rt.run(Agent("support", "Ask.", model, (tool,)), "Refund.")

    assert "interrupted" == result.status
    assert result.interruption is not None
    assert "input" == result.interruption.kind


@contextlib.asynccontextmanager
async def _store_of_kind(kind: str, where: Any) -> Any:
    if kind == "memory":
        yield InMemoryCheckpointStore()
    else:
        from runlet.stores.sqlite import SQLiteCheckpointStore

        async with SQLiteCheckpointStore(where / "runs.db") as store:
            yield store


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("streamed", [False, True], ids=["resume", "stream_resume"])
async def test_a_cancellation_that_comes_while_the_handler_runs_keeps_its_result(
    kind: str, streamed: bool, tmp_path: Any
) -> None:
    # A deadline that runs out while the approved handler works: the handler finishes,
    # and its result must be recorded before the cancellation takes effect, so the retry
    # finishes the run without asking again or running the call a second time.
    scope = anyio.CancelScope()
    payments = Payments()

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        scope.cancel()
        return await payments.refund(arguments, context)

    spec = ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, refund, requires_approval=True)
    agent = agent_with(
        ScriptedModel([call("refund", id="c1", order_id="7"), "Done.", "Done."]), spec
    )
    async with _store_of_kind(kind, tmp_path) as store:
        rt = Runtime(checkpoint_store=store)
        first = await rt.run(agent, "Refund order 7.")
        events: list[Any] = []
        with scope:
            if streamed:
                async with rt.stream_resume(
                    agent, checkpoint_id=cp(first), response=approve(first)
                ) as stream:
                    events.extend([event async for event in stream])
            else:
                await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
        assert scope.cancel_called  # the first attempt was cancelled or finished first

        retried = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert "completed" == retried.status
    assert 1 == len(payments.attempts)
    assert {payments.attempts[0]: "7"} == payments.paid
    assert "Refunded order 7." == retried.transcript[2].tool_result.content  # type: ignore[union-attr]
    assert not any(isinstance(event, runlet.ToolCallFinished) for event in events)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_native_cancellation_right_after_the_handler_still_records_its_result(
    kind: str, tmp_path: Any, anyio_backend: str
) -> None:
    # asyncio.timeout() running out just as the approved handler returns: the result
    # must still be recorded (and the resolve, or the release, done), so the retry
    # finishes without asking again whether the call ran.
    native = _NativeCancel(anyio_backend)
    payments = Payments()

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        native.cancel()
        return await payments.refund(arguments, context)

    spec = ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, refund, requires_approval=True)
    agent = agent_with(
        ScriptedModel([call("refund", id="c1", order_id="7"), "Done.", "Done."]), spec
    )
    async with _store_of_kind(kind, tmp_path) as store:
        rt = Runtime(checkpoint_store=store)
        first = await rt.run(agent, "Refund order 7.")

        async def attempt() -> None:
            await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

        async with anyio.create_task_group() as group:  # a task of its own to cancel
            group.start_soon(native.run, attempt)
        stored = await store.get(cp(first))
        if native.cancelled and stored.status != "resolved":
            # The result was recorded, and the claim given back. (Or the run finished and
            # was resolved before the cancellation landed: trio delivers it at the next
            # await that yields, which may come only after the resolve.)
            assert "pending" == stored.status
            assert ["Refunded order 7."] == [
                record.result.content for record in stored.records if record.result
            ]
        retried = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert native.cancelled or kind == "memory"  # memory never yields before resolving
    assert "completed" == retried.status
    assert 1 == len(payments.attempts)
    assert "Refunded order 7." == retried.transcript[2].tool_result.content  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_answer_holding_tuples_is_the_same_answer_after_the_store_round_trip(
    kind: str, tmp_path: Any
) -> None:
    # The store keeps decisions as JSON, where tuples come back as lists: the same
    # response object, retried after a failure or repeated after success, must still be
    # recognised as the recorded answer, on every store alike.
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    async with _store_of_kind(kind, tmp_path) as store:
        rt, agent, payments, _, first = await refund_run(store=store, script=[down, "Done."])
        response = approve(
            first,
            edited_arguments={"order_id": "1", "tags": ("vip", ("late", 2))},
            metadata={"ids": (1, 2), "nested": {"pair": ("a", "b")}},
        )
        with pytest.raises(runlet.ModelError):
            await rt.resume(agent, checkpoint_id=cp(first), response=response)
        done = await rt.resume(agent, checkpoint_id=cp(first), response=response)
        again = await rt.resume(agent, checkpoint_id=cp(first), response=response)
        (decision,) = done.decisions

    assert "completed" == done.status
    assert done == again
    assert 1 == len(payments.attempts)
    assert {"order_id": "1", "tags": ["vip", ["late", 2]]} == decision.arguments
    assert {"ids": [1, 2], "nested": {"pair": ["a", "b"]}} == decision.metadata
    assert decision.answers_like(response)


async def test_a_resume_cancelled_before_its_decisions_are_stored_starts_nothing(
    tmp_path: Any,
) -> None:
    # A client that goes away right after its answer was accepted: on a store that
    # yields, the cancellation lands as the decisions are stored. Nothing was stored and
    # nothing ran, so the retry runs the call as if for the first time (no "outcome
    # unknown" request for a call that never started).
    from runlet.stores.sqlite import SQLiteCheckpointStore

    scope = anyio.CancelScope()

    class Store(SQLiteCheckpointStore):
        async def claim(self, checkpoint_id: str) -> runlet.Claim:
            claim = await super().claim(checkpoint_id)
            scope.cancel()  # delivered at the next await that yields
            return claim

    started: list[str] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        started.append(context.idempotency_key)
        await anyio.lowlevel.checkpoint()
        return "Refunded order 7."

    spec = ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, refund, requires_approval=True)
    agent = agent_with(ScriptedModel([call("refund", id="c1", order_id="7"), "Done."]), spec)
    async with Store(tmp_path / "runs.db") as store:
        rt = Runtime(checkpoint_store=store)
        first = await rt.run(agent, "Refund order 7.")
        with scope:
            await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
        assert scope.cancelled_caught
        assert [] == started
        assert () == (await store.get(cp(first))).records

        retried = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))

    assert "completed" == retried.status
    assert 1 == len(started)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_cancellation_while_several_approved_handlers_run_keeps_their_results(
    kind: str, tmp_path: Any
) -> None:
    # Two approved calls run side by side; a deadline runs out while the first works.
    # Both handlers finish, and both results must be recorded: the retry runs neither.
    scope = anyio.CancelScope()
    payments = Payments()

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        if arguments["order_id"] == "1":
            scope.cancel()
        return await payments.refund(arguments, context)

    spec = ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, refund, requires_approval=True)
    calls = [call("refund", id="c1", order_id="1"), call("refund", id="c2", order_id="2")]
    agent = agent_with(ScriptedModel([calls, "Done.", "Done."]), spec)
    async with _store_of_kind(kind, tmp_path) as store:
        rt = Runtime(checkpoint_store=store)
        first = await rt.run(agent, "Refund orders 1 and 2.")
        answers = [HumanResponse(request.id, "approve") for request in first.pending_requests]
        with scope:
            await rt.resume(agent, checkpoint_id=cp(first), responses=answers)
        assert scope.cancel_called

        retried = await rt.resume(agent, checkpoint_id=cp(first), responses=answers)

    assert "completed" == retried.status
    assert 2 == len(payments.attempts)
    assert ["1", "2"] == sorted(payments.paid.values())


# --- Answers the first checks miss -----------------------------------------------------------


async def test_an_expired_request_answered_at_the_next_checkpoint_is_expired() -> None:
    # expire() gave up on the first refund; the run went on to ask about a second one.
    # The late answer to the first, sent to the checkpoint now open, is an expiry (the
    # client shows "too late"), not a conflict, and that checkpoint stays resumable.
    clock = Clock()
    rt, agent, payments, _, first = await refund_run(
        script=[call("refund", id="c2", order_id="2"), "Done."], clock=clock, expires_after=60
    )
    clock.advance(120)
    second = await rt.expire(agent, checkpoint_id=cp(first))
    assert second.checkpoint_id is not None

    with pytest.raises(HumanRequestExpiredError) as info:
        await rt.resume(agent, checkpoint_id=cp(second), response=approve(first))

    assert approve(first).request_id == info.value.request_id
    done = await rt.resume(agent, checkpoint_id=cp(second), response=approve(second))
    assert "completed" == done.status
    assert ["2"] == list(payments.paid.values())


@pytest.mark.parametrize(
    "other",
    [{"responded_by": "mallory"}, {"edited_arguments": {"order_id": "2"}}, {"metadata": {"a": 1}}],
    ids=["other-person", "other-edit", "other-metadata"],
)
async def test_a_retry_after_a_cut_off_with_another_answer_is_a_conflict(
    other: dict[str, Any],
) -> None:
    # The first accepted answer was recorded before its handler was cut off; a retry
    # that differs from it in any field (not only the action) is refused, and the
    # checkpoint still takes the original answer.
    rt, agent, payments, first = await interrupted_inside_handler(idempotent=True)

    with pytest.raises(
        HumanResponseConflictError,
        match=r"already answered with 'approve' \(by an earlier resume\)",
    ) as info:
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first, **other))

    assert approve(first).request_id == info.value.request_id
    done = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert "completed" == done.status
    assert {"1"} == set(payments.paid.values())
    assert [payments.attempts[0]] * 2 == payments.attempts


class StaleReads(InMemoryCheckpointStore):
    """A store whose reads lag its claims: get() shows no records, as just before another
    attempt recorded its answer."""

    stale = False

    async def get(self, checkpoint_id: str) -> runlet.StoredCheckpoint:
        stored = await super().get(checkpoint_id)
        return attrs.evolve(stored, records=()) if self.stale else stored


async def test_an_answer_recorded_after_the_first_read_is_still_final() -> None:
    # The check before the claim saw no records; the claim brings the answer another
    # attempt recorded meanwhile. A different answer is refused under the claim too, and
    # the claim is given back.
    store = StaleReads()
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    await cut_off_inside_handler(rt, agent, payments, first)
    store.stale = True

    with pytest.raises(HumanResponseConflictError, match="already answered"):
        await rt.resume(
            agent,
            checkpoint_id=cp(first),
            response=HumanResponse(approve(first).request_id, "reject"),
        )

    assert "pending" == (await store.get(cp(first))).status
    again = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert again.interruption is not None
    assert again.interruption.outcome_unknown
    assert 1 == len(payments.attempts)


class NoExpiredFlag(InMemoryCheckpointStore):
    """A store that keeps outcomes as data written before Resolution.expired existed."""

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        old = attrs.evolve(resolution, expired=False)
        await super().resolve(checkpoint_id, token, old, next_checkpoint)


async def test_a_repeated_expire_reads_the_expiry_from_the_decisions_too() -> None:
    clock = Clock()
    rt, agent, _, model, first = await refund_run(
        store=NoExpiredFlag(), script=["Nobody approved it."], clock=clock, expires_after=60
    )
    clock.advance(120)
    expired = await rt.expire(agent, checkpoint_id=cp(first))

    assert expired == await rt.expire(agent, checkpoint_id=cp(first))
    assert 2 == len(model.requests)


def test_a_question_its_call_does_not_ask_is_refused() -> None:
    # One pending ask_human call with no options: the request's prompt must still be the
    # call's, or the person answers a question the model did not ask.
    question = ToolCall("q1", "ask_human", {"kind": "input", "prompt": "Which order?"})
    request = runlet.HumanRequest("req_1", "input", "Which order?", tool_call=question)
    checkpoint = _one_call_checkpoint(question, request)
    data = unstructure_checkpoint(checkpoint)
    assert checkpoint == structure_checkpoint(data)

    data["request"]["prompt"] = "May I refund order 1?"
    with pytest.raises(CheckpointSerializationError, match="question that its call does not ask"):
        structure_checkpoint(data)


async def test_a_repeated_answer_goes_on_after_an_expire_that_failed_for_the_other_call() -> None:
    # The person approved refund 1 only; that resume was cut off inside the handler. An
    # expiry job then expired refund 2, ran refund 1 again (it is idempotent) and failed
    # to store the outcome. The person's answer came in time: repeating it finishes the
    # run, with refund 2's expiry as recorded, instead of calling it expired too.
    store = FailingResolve(failures=0)
    payments = Payments()
    calls = [call("refund", id="c1", order_id="1"), call("refund", id="c2", order_id="2")]
    agent = agent_with(
        ScriptedModel([calls, "Done.", "Done."]), refund_spec(payments, idempotent=True)
    )
    rt = Runtime(checkpoint_store=store)
    first = await rt.run(agent, "Refund orders 1 and 2.")
    one = HumanResponse(first.pending_requests[0].id, "approve")
    payments.block = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(partial(rt.resume, agent, checkpoint_id=cp(first), responses=[one]))
        await payments.entered.wait()
        group.cancel_scope.cancel()
    payments.block = None
    store.failures = 1
    with pytest.raises(OSError, match="disk full"):
        await rt.expire(agent, checkpoint_id=cp(first))

    done = await rt.resume(agent, checkpoint_id=cp(first), responses=[one])

    assert "completed" == done.status
    assert ["approve", "expire"] == [decision.action for decision in done.decisions]
    assert {"1"} == set(payments.paid.values())


@pytest.mark.parametrize("went_on", [False, True], ids=["completed", "went-on"])
async def test_another_answer_to_a_resolved_checkpoint_is_a_conflict_where_ever_the_run_went(
    went_on: bool,
) -> None:
    script = [call("refund", id="c2", order_id="2")] if went_on else ["Done."]
    rt, agent, payments, _, first = await refund_run(script=script)
    done = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert went_on == (done.checkpoint_id is not None)
    request_id = approve(first).request_id

    with pytest.raises(
        HumanResponseConflictError,
        match=r"answered with 'approve' \(by an earlier resume\), and checkpoint '[^']+' was "
        r"resolved with that answer; the first accepted answer is final\. Only that same",
    ) as info:
        await rt.resume(
            agent, checkpoint_id=cp(first), response=HumanResponse(request_id, "reject")
        )
    assert (request_id, None) == (info.value.request_id, info.value.next_checkpoint_id)
    assert done.decisions[0] == info.value.decision
    if not went_on:  # an id the run never asked: nowhere else to look
        with pytest.raises(HumanResponseConflictError, match="already resolved with other") as info:
            await rt.resume(
                agent, checkpoint_id=cp(first), response=HumanResponse("req_other", "approve")
            )
        assert info.value.decision is None  # no answer to that id is on record
    assert ["1"] == list(payments.paid.values())


async def test_an_answer_decided_at_an_earlier_checkpoint_says_by_whom_and_where() -> None:
    payments = Payments()
    calls = [call("refund", id=name, order_id=name) for name in ("a", "b")]
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    agent = agent_with(ScriptedModel([calls, "Done."]), refund_spec(payments))
    r1 = await rt.run(agent, "Refund two.")
    a, b = r1.pending_requests
    answer = HumanResponse(a.id, "approve", responded_by="ann")
    r2 = await rt.resume(agent, checkpoint_id=cp(r1), response=answer)

    expected = (
        rf"Request '{a.id}' was already answered with 'approve' \(by ann\) at checkpoint "
        rf"'{cp(r1)}', before checkpoint '{cp(r2)}'; the first accepted answer is final\. "
        rf"It is waiting on request '{b.id}': answer only that\."
    )
    with pytest.raises(HumanResponseConflictError, match=expected) as info:
        await rt.resume(agent, checkpoint_id=cp(r2), response=answer)
    assert r2.decisions[0] == info.value.decision
    done = await rt.resume(agent, checkpoint_id=cp(r2), response=HumanResponse(b.id, "reject"))
    assert "completed" == done.status
    # Once the later checkpoint is resolved too, the same error, with nothing left to answer.
    with pytest.raises(HumanResponseConflictError, match=expected.split(" It is")[0] + "$"):
        await rt.resume(agent, checkpoint_id=cp(r2), response=answer)
    assert ["a"] == list(payments.paid.values())


# -- a handler that changes its arguments in place ----------------------------------------

ITEMS_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"items": {"type": "array"}}}


async def _ship_and_scribble(arguments: dict[str, Any], context: ToolContext) -> str:
    """A handler that treats its arguments as its own: it sorts, appends and adds."""
    arguments["items"].sort()
    arguments["items"].append("added by the handler")
    arguments["note"] = "scribbled"
    return "shipped"


@pytest.mark.parametrize("edited", [None, {"items": ["y", "x"]}])
async def test_a_handler_that_changes_its_arguments_changes_no_record(
    edited: dict[str, Any] | None,
) -> None:
    """The handler gets its own copy: the model's call, the person's decision (as given
    and as stored) and the edit the caller passed all stay as they were, so repeating
    the same answer returns the stored result instead of a conflict."""
    ship = ToolSpec("ship", "Ship items.", ITEMS_SCHEMA, _ship_and_scribble, requires_approval=True)
    script = [call("ship", {"items": ["b", "a"]}, id="c1"), "Shipped."]
    agent = Agent("shop", "Ship.", ScriptedModel(script), [ship])
    store = InMemoryCheckpointStore()
    runtime = Runtime(checkpoint_store=store)
    first = await runtime.run(agent, "Ship b and a.")
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    answer = HumanResponse(first.interruption.id, "approve", edited_arguments=edited)
    done = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)

    approved = {"items": ["y", "x"]} if edited else {"items": ["b", "a"]}
    assert dict(done.decisions[0].arguments or {}) == approved
    assert [dict(d.arguments or {}) for d in await store.decisions(done.run_id)] == [approved]
    assert dict(done.transcript[1].tool_calls[0].arguments) == {"items": ["b", "a"]}
    assert edited is None or edited == {"items": ["y", "x"]}
    as_sent = None if edited is None else json.loads(json.dumps(edited))  # a client's retry
    again = HumanResponse(first.interruption.id, "approve", edited_arguments=as_sent)
    repeat = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=again)
    assert repeat == done


async def test_a_handler_or_policy_that_changes_its_arguments_leaves_the_call_alone() -> None:
    """Outside approvals too: what the next model request shows is the call the model
    made, whatever the policy and the handler did to their copies."""
    seen: list[dict[str, Any]] = []

    def policy(arguments: dict[str, Any], context: ToolContext) -> bool:
        arguments["items"].clear()
        return False

    ship = ToolSpec(
        "ship", "Ship items.", ITEMS_SCHEMA, _ship_and_scribble, requires_approval=policy
    )

    def answer(request: runlet.ModelRequest) -> Any:
        if len(request.messages) == 1:
            return call("ship", {"items": ["b", "a"]}, id="c1")
        seen.append(dict(request.messages[1].tool_calls[0].arguments))
        return "Shipped."

    agent = Agent("shop", "Ship.", ScriptedModel(answer), [ship])
    result = await Runtime().run(agent, "Ship b and a.")
    assert result.output == "Shipped."
    assert seen == [{"items": ["b", "a"]}]
    assert dict(result.transcript[1].tool_calls[0].arguments) == {"items": ["b", "a"]}


def _scribbling_sync(arguments: dict[str, Any], context: ToolContext) -> str:
    arguments["items"].append("added by a plain function")
    return "shipped"


async def _scribbling_slow(arguments: dict[str, Any], context: ToolContext) -> str:
    arguments["items"].append("added by a handler with a time limit")
    return "shipped"


@pytest.mark.parametrize(
    ("handler", "limit"),
    [(_scribbling_sync, None), (_scribbling_slow, 5.0)],
    ids=["plain-function", "with-timeout"],
)
async def test_every_kind_of_handler_gets_its_own_arguments(handler: Any, limit: Any) -> None:
    ship = ToolSpec("ship", "Ship items.", ITEMS_SCHEMA, handler, timeout=limit)
    script = [call("ship", {"items": ["b", "a"]}, id="c1"), "Shipped."]
    agent = Agent("shop", "Ship.", ScriptedModel(script), [ship])
    result = await Runtime().run(agent, "Ship b and a.")
    assert result.output == "Shipped."
    assert dict(result.transcript[1].tool_calls[0].arguments) == {"items": ["b", "a"]}


async def test_an_approval_prompt_function_gets_its_own_arguments() -> None:
    def prompt(arguments: dict[str, Any]) -> str:
        arguments["items"].clear()
        return "Ship them?"

    ship = ToolSpec(
        "ship",
        "Ship items.",
        ITEMS_SCHEMA,
        _ship_and_scribble,
        requires_approval=True,
        approval_prompt=prompt,
    )
    script = [call("ship", {"items": ["b", "a"]}, id="c1"), "Shipped."]
    agent = Agent("shop", "Ship.", ScriptedModel(script), [ship])
    first = await Runtime(checkpoint_store=InMemoryCheckpointStore()).run(agent, "Ship.")
    assert first.interruption is not None
    assert first.interruption.prompt == "Ship them?"
    assert dict(first.interruption.tool_call.arguments) == {"items": ["b", "a"]}
    assert dict(first.transcript[1].tool_calls[0].arguments) == {"items": ["b", "a"]}


# --- A paused process never starts an approved handler under a lost claim ---------------


class PausedAfterDeciding(InMemoryCheckpointStore):
    """Stands in for a process paused (SIGSTOP, a VM freeze) right after it stored the
    decisions: its clock jumps past the lease and, when *taken_over*, another resume
    has claimed the checkpoint meanwhile."""

    def __init__(self, clock_jump: list[float], *, taken_over: bool) -> None:
        super().__init__(lease=30.0)
        self.clock_jump = clock_jump
        self.taken_over = taken_over
        self.renewals = 0

    async def record(self, checkpoint_id: str, token: str, records: Any) -> None:
        await super().record(checkpoint_id, token, records)
        if any(r.result is None for r in records) and not self.clock_jump[0]:
            self.clock_jump[0] = 31.0  # the pause outlasted the lease
            if self.taken_over:
                await self.release(checkpoint_id, token)
                await self.claim(checkpoint_id)  # the other process's claim

    async def renew(self, checkpoint_id: str, token: str) -> None:
        self.renewals += 1
        await super().renew(checkpoint_id, token)


@pytest.fixture
def clock_jump(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    jump = [0.0]
    real = anyio.current_time
    monkeypatch.setattr(anyio, "current_time", lambda: real() + jump[0])
    return jump


async def test_a_resume_paused_past_its_lease_does_not_run_the_approved_call(
    clock_jump: list[float],
) -> None:
    store = PausedAfterDeciding(clock_jump, taken_over=True)
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    with pytest.raises(runlet.LeaseLostError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert payments.attempts == []  # the new owner decides; this one ran nothing
    assert store.renewals == 1


async def test_a_resume_paused_but_not_taken_over_renews_and_goes_on(
    clock_jump: list[float],
) -> None:
    store = PausedAfterDeciding(clock_jump, taken_over=False)
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    result = await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert (result.output, len(payments.attempts), store.renewals) == ("Done.", 1, 1)


async def test_a_resume_on_time_does_not_renew_before_the_handler(
    clock_jump: list[float],
) -> None:
    store = PausedAfterDeciding(clock_jump, taken_over=False)
    store.clock_jump = [1.0]  # never jumps
    rt, agent, payments, _, first = await refund_run(store=store, script=["Done."])
    await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    assert (len(payments.attempts), store.renewals) == (1, 0)


class ClosedBeforeRelease(InMemoryCheckpointStore):
    """A store a shutting-down server closed while a resume ran: giving the claim back
    fails (the claim then runs out with its lease)."""

    async def release(self, checkpoint_id: str, token: str) -> None:
        raise runlet.ConfigurationError("This store is not open.")


async def test_a_failed_release_does_not_hide_why_the_resume_stopped() -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    rt, agent, _, _, first = await refund_run(
        store=ClosedBeforeRelease(lease=30.0), script=[down, "Done."]
    )
    with pytest.raises(runlet.ModelError, match="model is down"):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))


async def test_a_failed_release_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def down(request: runlet.ModelRequest) -> str:
        raise OSError("model is down")

    rt, agent, _, _, first = await refund_run(
        store=ClosedBeforeRelease(lease=30.0), script=[down, "Done."]
    )
    with caplog.at_level("WARNING", logger="runlet"), pytest.raises(runlet.ModelError):
        await rt.resume(agent, checkpoint_id=cp(first), response=approve(first))
    [warning] = [r for r in caplog.records if r.name == "runlet"]
    assert "WARNING" == warning.levelname
    message = warning.getMessage()
    assert repr(cp(first)) in message
    assert "ConfigurationError: This store is not open." in message
    assert "until the lease runs out (30 s)" in message


async def test_a_failed_release_does_not_hide_a_cancellation() -> None:
    rt, agent, payments, _, first = await refund_run(
        store=ClosedBeforeRelease(lease=30.0), script=["Done."]
    )
    payments.block = anyio.Event()  # the handler waits: cancelled inside it
    with anyio.move_on_after(5) as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(
                partial(rt.resume, agent, checkpoint_id=cp(first), response=approve(first))
            )
            await payments.entered.wait()
            group.cancel_scope.cancel()
    assert not scope.cancelled_caught  # the resume's own cancellation, not a timeout
    assert len(payments.attempts) == 1
