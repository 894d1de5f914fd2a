"""Defects an outside review found (issue 12): runs that leak into each other, data a
checkpoint cannot hold, and the order of saving a checkpoint and reporting it."""

from __future__ import annotations

import collections
import copy
import datetime
import json
import pickle
import sys
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from conftest import BACKENDS

import runlet
from runlet import (
    Agent,
    Checkpoint,
    CheckpointSerializationError,
    ConfigurationError,
    HumanResponse,
    HumanResponseError,
    InMemoryCheckpointStore,
    Interrupted,
    Message,
    ModelRequest,
    ModelResponse,
    Runtime,
    ToolContext,
    ToolSpec,
    structure_checkpoint,
    unstructure_checkpoint,
)
from runlet._tools import MAX_EXPIRES_AFTER
from runlet.testing import ScriptedModel, call

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup
from runlet.testing._conformance import sample_checkpoint

pytestmark = pytest.mark.anyio


async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return f"refunded {arguments['order']}"


REFUND = ToolSpec("refund", "Refund an order.", {"type": "object"}, refund, requires_approval=True)


def refund_agent(model: Any) -> Agent:
    return Agent("support", "Refund after approval.", model, (REFUND,))


class Scribbler:
    """A careless adapter: it writes into the options it is given."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.refused = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.seen.append(dict(request.options))
        try:
            request.options["scribbled"] = True  # type: ignore[index]
        except TypeError:
            self.refused += 1
        return ModelResponse(Message.assistant("ok"))


class TestEachRunHasItsOwnOptions:
    async def test_an_adapter_writing_into_default_options_changes_no_other_run(self) -> None:
        model = Scribbler()
        runtime = Runtime()
        agent = Agent("a", "i", model)

        await runtime.run(agent, "one")
        await runtime.run(agent, "two")
        await runtime.run(agent, "three", options=None)

        assert [{}, {}, {}] == model.seen

    async def test_options_are_read_only_and_copied_from_the_caller(self) -> None:
        model = Scribbler()
        options = {"temperature": 0.2}

        await Runtime().run(Agent("a", "i", model), "one", options=options)

        assert [{"temperature": 0.2}] == model.seen
        assert 1 == model.refused
        assert {"temperature": 0.2} == options

    async def test_tools_see_each_runs_own_read_only_metadata(self) -> None:
        seen: list[dict[str, Any]] = []

        async def scribble(arguments: Mapping[str, Any], context: ToolContext) -> str:
            seen.append(dict(context.metadata))
            with pytest.raises(TypeError):
                context.metadata["scribbled"] = True  # type: ignore[index]
            return "done"

        def script(request: ModelRequest) -> Any:
            return "ok" if request.messages[-1].tool_result else call("scribble")

        tool = ToolSpec("scribble", "d", {"type": "object"}, scribble)
        agent = Agent("a", "i", ScriptedModel(script), (tool,))
        metadata = {"user": 1}
        await Runtime().run(agent, "one", metadata=metadata)
        await Runtime().run(agent, "two")

        assert [{"user": 1}, {}] == seen
        assert {"user": 1} == metadata

    async def test_read_only_options_and_metadata_still_make_plain_json(self) -> None:
        store = InMemoryCheckpointStore()
        runtime = Runtime(checkpoint_store=store)
        model = ScriptedModel([call("refund", order="7"), "Done."])
        result = await runtime.run(
            refund_agent(model), "Refund 7.", options={"temperature": 0.2}, metadata={"u": [1]}
        )
        assert result.checkpoint_id is not None
        checkpoint = await store.load(result.checkpoint_id)

        data = unstructure_checkpoint(checkpoint)

        assert dict is type(data["options"])
        assert dict is type(data["metadata"])
        text = json.dumps(data)
        again = structure_checkpoint(json.loads(text))
        assert {"temperature": 0.2} == again.options
        assert {"u": [1]} == again.metadata


class TestCyclicData:
    async def checkpoint(self) -> Checkpoint:
        store = InMemoryCheckpointStore()
        model = ScriptedModel([call("refund", order="7")])
        result = await Runtime(checkpoint_store=store).run(refund_agent(model), "Refund 7.")
        assert result.checkpoint_id is not None
        return await store.load(result.checkpoint_id)

    async def test_a_dict_that_contains_itself_names_its_path(self) -> None:
        metadata: dict[str, Any] = {"user": {"id": 1}}
        metadata["user"]["again"] = metadata
        checkpoint = attrs.evolve(await self.checkpoint(), metadata=metadata)

        with pytest.raises(CheckpointSerializationError, match="contains itself") as caught:
            unstructure_checkpoint(checkpoint)

        assert "metadata['user']['again']" == caught.value.path
        assert "metadata['user']['again'] is metadata itself" in str(caught.value)

    async def test_a_list_that_contains_itself_names_its_path(self) -> None:
        loop: list[Any] = [1]
        loop.append([loop])
        checkpoint = attrs.evolve(await self.checkpoint(), options={"loop": loop})

        with pytest.raises(CheckpointSerializationError, match="contains itself") as caught:
            unstructure_checkpoint(checkpoint)

        assert "options['loop'][1][0]" == caught.value.path

    async def test_the_same_value_twice_is_not_a_cycle(self) -> None:
        shared = {"id": 1}
        both = {"a": shared, "b": [shared, shared]}
        checkpoint = attrs.evolve(await self.checkpoint(), metadata=both)

        data = unstructure_checkpoint(checkpoint)

        assert {"a": {"id": 1}, "b": [{"id": 1}, {"id": 1}]} == json.loads(json.dumps(data))[
            "metadata"
        ]

    async def test_the_same_value_twice_beside_a_bad_value_is_not_called_a_cycle(self) -> None:
        shared, items = {"id": 1}, [1, 2]
        metadata = {"a": shared, "b": [shared], "c": items, "d": [items], "when": {1, 2}}
        checkpoint = attrs.evolve(await self.checkpoint(), metadata=metadata)

        with pytest.raises(CheckpointSerializationError, match="is a set") as caught:
            unstructure_checkpoint(checkpoint)

        assert "metadata['when']" == caught.value.path

    async def test_a_read_only_view_nested_in_the_data_is_refused(self) -> None:
        metadata = {"view": MappingProxyType({"a": 1})}
        checkpoint = attrs.evolve(await self.checkpoint(), metadata=metadata)

        with pytest.raises(CheckpointSerializationError, match="mappingproxy") as caught:
            unstructure_checkpoint(checkpoint)

        assert "metadata['view']" == caught.value.path


class SlowStore(InMemoryCheckpointStore):
    """A store whose save yields to the event loop several times, as a database's would,
    and records when it starts and finishes."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def save(self, checkpoint: Checkpoint) -> None:
        self.log.append("save started")
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        await super().save(checkpoint)
        self.log.append("saved")

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: runlet.Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        # A resume saves its next checkpoint in the step that resolves the old one.
        self.log.append("save started")
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        await super().resolve(checkpoint_id, token, resolution, next_checkpoint)
        self.log.append("saved")


class TestSavedBeforeReported:
    async def test_run_returns_after_the_save_finished(self) -> None:
        log: list[str] = []
        store = SlowStore(log)
        model = ScriptedModel([call("refund", order="7"), "Done."])

        result = await Runtime(checkpoint_store=store).run(refund_agent(model), "Refund 7.")
        log.append("returned")

        assert ["save started", "saved", "returned"] == log
        assert result.checkpoint_id in store
        assert result.interruption is not None
        # A runtime that never saw the run resumes it from the store alone.
        resumed = await Runtime(checkpoint_store=store).resume(
            refund_agent(model),
            checkpoint_id=result.checkpoint_id,
            response=HumanResponse(result.interruption.id, "approve"),
        )
        assert "Done." == resumed.output

    async def test_stream_reports_the_interruption_after_the_save_finished(self) -> None:
        log: list[str] = []
        store = SlowStore(log)
        model = ScriptedModel([call("refund", order="7")])
        runtime = Runtime(checkpoint_store=store)

        with anyio.fail_after(5):
            async with runtime.stream(refund_agent(model), "Refund 7.") as stream:
                async for event in stream:
                    if isinstance(event, Interrupted):
                        log.append("reported")
                        assert event.checkpoint_id in store

        assert ["save started", "saved", "reported"] == log
        assert stream.result.checkpoint_id in store

    async def test_a_resume_that_interrupts_again_returns_after_the_save_finished(self) -> None:
        log: list[str] = []
        store = SlowStore(log)
        calls = [call("refund", order="1", id="c1"), call("refund", order="2", id="c2")]
        model = ScriptedModel([calls, "Done."])
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(refund_agent(model), "Refund 1 and 2.")
        assert first.checkpoint_id is not None
        assert first.interruption is not None
        log.clear()

        second = await runtime.resume(
            refund_agent(model),
            checkpoint_id=first.checkpoint_id,
            response=HumanResponse(first.interruption.id, "approve"),
        )
        log.append("returned")

        assert ["save started", "saved", "returned"] == log
        assert second.checkpoint_id in store
        assert first.checkpoint_id not in store


# --- Values at the edges of what the contract names -------------------------------------


@pytest.mark.parametrize("seconds", [1e-7, 5e-7, 9.9e-7])
def test_an_expiry_shorter_than_a_microsecond_is_refused(seconds: float) -> None:
    # Times are kept to the microsecond: such a request was born expired, so every
    # answer, even at once, was refused as too late.
    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "ok"

    with pytest.raises(runlet.ConfigurationError, match="at least one microsecond"):
        ToolSpec("pay", "Pay.", {"type": "object"}, handler, expires_after=seconds)
    with pytest.raises(runlet.ConfigurationError, match="at least one microsecond"):
        runlet.ask_human(expires_after=seconds)
    shortest = ToolSpec("pay", "Pay.", {"type": "object"}, handler, expires_after=1e-6)
    assert shortest.expires_after == 1e-6


@pytest.mark.parametrize("seconds", [1e12, 10**20, MAX_EXPIRES_AFTER * 1.01])
def test_an_expiry_no_date_can_hold_is_refused_when_the_tool_is_built(seconds: float) -> None:
    # Past the year 9999 no expires_at can be written: refused up front, not when the run
    # stops (which would lose it).
    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "ok"

    with pytest.raises(runlet.ConfigurationError, match="100 years; give None"):
        ToolSpec("pay", "Pay.", {"type": "object"}, handler, expires_after=seconds)
    with pytest.raises(runlet.ConfigurationError, match="100 years"):
        runlet.ask_human(expires_after=seconds)
    longest = ToolSpec("pay", "Pay.", {"type": "object"}, handler, expires_after=MAX_EXPIRES_AFTER)
    assert MAX_EXPIRES_AFTER == longest.expires_after


async def test_the_longest_expiry_still_makes_a_request() -> None:
    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "ok"

    tool = ToolSpec(
        "pay",
        "Pay.",
        {"type": "object"},
        handler,
        requires_approval=True,
        expires_after=MAX_EXPIRES_AFTER,
    )
    agent = runlet.Agent("a", "Pay.", ScriptedModel([call("pay")]), (tool,))
    result = await runlet.Runtime(checkpoint_store=runlet.InMemoryCheckpointStore()).run(
        agent, "Pay."
    )
    assert result.interruption is not None
    assert result.interruption.expires_at is not None
    assert result.interruption.expires_at.year > result.interruption.created_at.year + 99


def test_a_tool_context_needs_only_the_fields_the_design_names() -> None:
    context = ToolContext(run_id="run_1", tool_call_id="c1", agent_name="support", metadata={})
    assert ("", "run_1/c1") == (context.tool_name, context.idempotency_key)


def test_a_pending_request_built_from_its_documented_fields_lists_its_request() -> None:
    checkpoint = sample_checkpoint("cp_1")
    request = checkpoint.request
    built = runlet.PendingRequest(
        checkpoint.id,
        checkpoint.run_id,
        checkpoint.agent_name,
        request,
        checkpoint.metadata,
        request.created_at,
    )
    assert (request,) == built.requests
    assert runlet.PendingRequest.of(checkpoint) == built


def _errors_with_their_attributes() -> list[runlet.RunletError]:
    return [
        runlet.RunletError("plain"),
        runlet.ConfigurationError("bad"),
        runlet.StoreSchemaError("schema", found=3, expected=1),
        runlet.ModelAPIError("api", status_code=429, body='{"error": "slow down"}'),
        runlet.ModelConnectionError("down"),
        runlet.MaxTurnsExceededError("turns", max_turns=5),
        runlet.HumanResponseError("wrong"),
        runlet.HumanResponseConflictError("conflict", checkpoint_id="cp_1"),
        runlet.HumanResponseConflictError(
            "conflict",
            checkpoint_id="cp_1",
            request_id="req_1",
            decision=runlet.Decision(
                request_id="req_1",
                checkpoint_id="cp_1",
                tool_call_id="c1",
                tool_name="refund",
                kind="approval",
                action="approve",
                arguments={"order_id": "1"},
                responded_by="ann",
                decided_at=datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc),
            ),
        ),
        runlet.HumanRequestExpiredError("late", checkpoint_id="cp_1", request_id="req_1"),
        runlet.CheckpointNotFoundError("gone", checkpoint_id="cp_1"),
        runlet.CheckpointCancelledError("cancelled", checkpoint_id="cp_1"),
        runlet.CheckpointResolvedError("done", checkpoint_id="cp_1"),
        runlet.CheckpointClaimedError("busy", checkpoint_id="cp_1"),
        runlet.LeaseLostError("lost", checkpoint_id="cp_1"),
        runlet.MissingToolError("tool", checkpoint_id="cp_1", tool_name="refund"),
        runlet.ResultNotRecordedError(
            "full", checkpoint_id="cp_1", tool_call_id="c1", result=runlet.ToolResult("c1", "ok")
        ),
        runlet.CheckpointSerializationError("json", path="metadata['x']"),
    ]


@pytest.mark.parametrize("error", _errors_with_their_attributes(), ids=lambda e: type(e).__name__)
def test_every_error_pickles_and_copies_with_its_attributes(error: runlet.RunletError) -> None:
    # A resume run in a process pool or a task queue raises in the parent as itself.
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(error) is type(again)
        assert (str(error), vars(error)) == (str(again), vars(again))


async def test_checkpoints_pickle_so_a_pickling_store_works() -> None:
    class PickleStore:
        """A three-method store that keeps pickles, as a shelve-backed one would."""

        def __init__(self) -> None:
            self.rows: dict[str, bytes] = {}

        async def save(self, checkpoint: runlet.Checkpoint) -> None:
            self.rows[checkpoint.id] = pickle.dumps(checkpoint)

        async def load(self, checkpoint_id: str) -> runlet.Checkpoint:
            loaded: runlet.Checkpoint = pickle.loads(self.rows[checkpoint_id])
            return loaded

        async def delete(self, checkpoint_id: str) -> None:
            self.rows.pop(checkpoint_id, None)

    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = runlet.Agent("a", "Pay.", ScriptedModel([call("pay"), "Done."]), (tool,))
    store = PickleStore()
    rt = runlet.Runtime(checkpoint_store=store)
    first = await rt.run(agent, "Pay.", options={"temperature": 0.2})
    assert first.checkpoint_id is not None
    assert first.interruption is not None
    loaded = await store.load(first.checkpoint_id)
    assert {"temperature": 0.2} == loaded.options
    assert loaded == copy.deepcopy(loaded)

    done = await rt.resume(
        agent,
        checkpoint_id=first.checkpoint_id,
        response=runlet.HumanResponse(first.interruption.id, "approve"),
    )
    assert ("completed", {}) == (done.status, store.rows)


@pytest.mark.parametrize(
    "name", [name for name in runlet.__all__ if isinstance(getattr(runlet, name), type)]
)
def test_type_hints_of_every_public_class_resolve(name: str) -> None:
    # Tools that read annotations at run time (typing.get_type_hints, msgspec, pydantic,
    # inspect.signature(eval_str=True)) see real types, not names of private modules.
    hints = typing.get_type_hints(getattr(runlet, name))
    assert all(not isinstance(hint, str) for hint in hints.values())


def test_a_request_s_hints_name_the_real_types() -> None:
    hints = typing.get_type_hints(runlet.HumanRequest)
    assert datetime.datetime is hints["created_at"]
    assert Mapping[str, Any] | None == typing.get_type_hints(runlet.HumanResponse)["metadata"]


class _Stop(BaseException):
    """Like KeyboardInterrupt or SystemExit: not an Exception, so no error result."""


def _stopping_tools(approve: bool) -> tuple[ToolSpec, ...]:
    async def stop(arguments: Mapping[str, Any], context: ToolContext) -> str:
        raise _Stop

    async def wait(arguments: Mapping[str, Any], context: ToolContext) -> str:
        await anyio.sleep_forever()
        return "never"

    schema = {"type": "object"}
    return (
        ToolSpec("stop", "Stop.", schema, stop, requires_approval=approve),
        ToolSpec("wait", "Wait.", schema, wait, requires_approval=approve),
    )


async def test_a_base_exception_from_one_of_several_tools_comes_out_as_itself() -> None:
    model = ScriptedModel([[call("wait", id="w"), call("stop", id="s")]])
    agent = runlet.Agent("a", "Go.", model, _stopping_tools(approve=False))
    with pytest.raises(_Stop):  # not a BaseExceptionGroup, on either backend
        await runlet.Runtime().run(agent, "Go.")


@pytest.mark.parametrize("lease", [None, 30.0])
@pytest.mark.parametrize("calls", [["stop"], ["wait", "stop"]])
async def test_a_base_exception_from_an_approved_tool_comes_out_as_itself(
    lease: float | None, calls: list[str]
) -> None:
    # A store with a lease renews it from a task beside the resume; several approved
    # calls run side by side: neither may wrap what a handler raised.
    model = ScriptedModel([[call(name, id=name) for name in calls]])
    agent = runlet.Agent("a", "Go.", model, _stopping_tools(approve=True))
    store = runlet.InMemoryCheckpointStore(lease=lease)
    rt = runlet.Runtime(checkpoint_store=store)
    first = await rt.run(agent, "Go.")
    assert first.checkpoint_id is not None
    answers = [runlet.HumanResponse(r.id, "approve") for r in first.pending_requests]
    with pytest.raises(_Stop):
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, responses=answers)
    assert "pending" == (await store.get(first.checkpoint_id)).status


async def _a_cancellation() -> BaseException:
    """A real cancellation exception of the running backend, caught in a scope of its own
    (trio's cannot be made by hand)."""
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(exc)
            raise
    return caught[0]


async def _stray_cancellation(arguments: Mapping[str, Any], context: ToolContext) -> str:
    # The cancellation exception, raised where nothing is being cancelled (on asyncio, a
    # handler that awaited a future someone else cancelled does this).
    raise await _a_cancellation()


@pytest.mark.parametrize("resume", [False, True])
async def test_a_stray_cancellation_from_one_of_several_tools_comes_out_as_itself(
    resume: bool,
) -> None:
    # The task group lets a child's stray cancellation pass silently; the run then went
    # on without that call's result and failed with a KeyError.
    async def fine(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "fine"

    schema = {"type": "object"}
    tools = (
        ToolSpec("stray", "Stray.", schema, _stray_cancellation, requires_approval=resume),
        ToolSpec("fine", "Fine.", schema, fine, requires_approval=resume),
    )
    model = ScriptedModel([[call("stray", id="s"), call("fine", id="f")], "Done."])
    agent = runlet.Agent("a", "Go.", model, tools)
    store = runlet.InMemoryCheckpointStore()
    rt = runlet.Runtime(checkpoint_store=store)
    if not resume:
        with pytest.raises(anyio.get_cancelled_exc_class()):
            await rt.run(agent, "Go.")
        return
    first = await rt.run(agent, "Go.")
    assert first.checkpoint_id is not None
    answers = [runlet.HumanResponse(r.id, "approve") for r in first.pending_requests]
    with pytest.raises(anyio.get_cancelled_exc_class()):
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, responses=answers)
    assert "pending" == (await store.get(first.checkpoint_id)).status


@pytest.mark.parametrize("calls", [1, 2])
async def test_a_stray_cancellation_from_a_streamed_tool_comes_out_as_itself(calls: int) -> None:
    # With several calls the stream's task group let it pass too: the stream just ended,
    # without RunFinished or an error.
    async def fine(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "fine"

    schema = {"type": "object"}
    tools = (
        ToolSpec("stray", "Stray.", schema, _stray_cancellation),
        ToolSpec("fine", "Fine.", schema, fine),
    )
    turn = [call("stray", id="s"), call("fine", id="f")][:calls]
    agent = runlet.Agent("a", "Go.", ScriptedModel([turn, "Done."]), tools)
    events: list[Any] = []

    async def consume() -> None:
        async with runlet.Runtime().stream(agent, "Go.") as stream:
            async for event in stream:
                events.append(event)  # noqa: PERF401 - the events before the error count

    with pytest.raises(anyio.get_cancelled_exc_class()):
        await consume()
    assert not any(isinstance(event, runlet.RunFinished) for event in events)


@pytest.mark.parametrize("resumed", [False, True])
async def test_the_interrupted_event_names_every_open_request(resumed: bool) -> None:
    # A relay that shows the browser what the event says must show every approval of
    # the turn, not only the first.
    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    turn = [call("pay", id="p1", n=1), call("pay", id="p2", n=2), call("pay", id="p3", n=3)]
    agent = runlet.Agent("a", "Pay.", ScriptedModel([turn, "Done."]), (tool,))
    rt = runlet.Runtime(checkpoint_store=runlet.InMemoryCheckpointStore())
    if resumed:  # answering one of three interrupts again for the two left
        first = await rt.run(agent, "Pay.")
        assert first.checkpoint_id is not None
        answer = runlet.HumanResponse(first.pending_requests[0].id, "approve")
        stream = rt.stream_resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
    else:
        stream = rt.stream(agent, "Pay.")
    async with stream:
        events = [event async for event in stream]
    (interrupted,) = [event for event in events if isinstance(event, runlet.Interrupted)]
    result = stream.result
    assert result.pending_requests == interrupted.requests
    assert (3 - resumed) == len(interrupted.requests)
    assert interrupted.request is interrupted.requests[0]
    assert runlet.structure_event(runlet.unstructure_event(interrupted)) == interrupted


async def test_the_lists_of_requests_are_always_in_the_json() -> None:
    # A browser loops over data.requests: it is there with one request as with several.
    checkpoint = sample_checkpoint("cp_1")
    pending = runlet.PendingRequest.of(checkpoint)
    event = runlet.Interrupted(checkpoint.request, checkpoint.id)
    for data in (runlet.unstructure(pending), runlet.unstructure_event(event)):
        assert [checkpoint.request.id] == [request["id"] for request in data["requests"]]
    assert pending == runlet.structure(runlet.unstructure(pending), runlet.PendingRequest)
    assert event == runlet.structure_event(runlet.unstructure_event(event))


async def test_a_keyboard_interrupt_beside_an_error_is_the_one_raised() -> None:
    # One call fails with an error as the other is interrupted: the interrupt must not be
    # lost behind the error.
    from runlet._util import side_by_side

    async def fails() -> None:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("an error")

    async def interrupted() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            raise _Stop  # as Ctrl-C landing while it is cancelled

    with pytest.raises(_Stop):
        await side_by_side([fails, interrupted])


async def test_an_approval_without_edits_runs_the_call_as_the_model_made_it() -> None:
    seen: list[Any] = []

    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(arguments)
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    made = runlet.ToolCall("p1", "pay", {"ids": (1, 2)})
    agent = runlet.Agent("a", "Pay.", ScriptedModel([made, "Done."]), (tool,))
    rt = runlet.Runtime(checkpoint_store=runlet.InMemoryCheckpointStore())
    first = await rt.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    assert first.interruption is not None
    answer = runlet.HumanResponse(first.interruption.id, "approve")
    done = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
    assert [made.arguments] == seen
    assert type(seen[0]["ids"]) is tuple  # the model's own values, in the handler's copy
    assert seen[0] is not made.arguments
    assert [1, 2] == done.decisions[0].arguments["ids"]  # the record holds JSON's form


async def test_a_base_exception_from_a_tool_leaves_a_stream_as_itself() -> None:
    model = ScriptedModel([call("stop", id="s")])
    agent = runlet.Agent("a", "Go.", model, _stopping_tools(approve=False))

    async def consume() -> None:
        async with runlet.Runtime().stream(agent, "Go.") as stream:
            async for _ in stream:
                pass

    with pytest.raises(_Stop):  # as run() raises it: not in an exception group
        await consume()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("calls", [1, 2])
def test_a_system_exit_from_a_streamed_tool_leaves_the_event_loop_running(
    backend: str, calls: int
) -> None:
    # On asyncio a task that raises SystemExit or KeyboardInterrupt also stops the event
    # loop: caught by the caller or not, anyio.run() then raised it. The test runs its own
    # event loop, so that loop is the one that would stop.
    async def leave(arguments: Mapping[str, Any], context: ToolContext) -> str:
        raise SystemExit(3)

    async def fine(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "fine"

    schema = {"type": "object"}
    tools = (ToolSpec("leave", "Leave.", schema, leave), ToolSpec("fine", "Fine.", schema, fine))
    turn = [call("leave", id="l"), call("fine", id="f")][:calls]
    caught: list[BaseException] = []

    async def main() -> str:
        agent = runlet.Agent("a", "Go.", ScriptedModel([turn, "Done."]), tools)
        try:
            async with runlet.Runtime().stream(agent, "Go.") as stream:
                async for _ in stream:
                    pass
        except SystemExit as exc:
            caught.append(exc)
        await anyio.lowlevel.checkpoint()
        return "went on"

    try:
        outcome = anyio.run(main, backend=backend)
    except SystemExit:
        outcome = "the event loop stopped"
    assert "went on" == outcome
    assert [3] == [exc.code for exc in caught]  # type: ignore[attr-defined]


async def test_a_system_exit_from_a_streamed_tool_ends_the_loop_that_reads_it() -> None:
    # A consumer reading inside a shielded scope is not stopped by the stream's cancel:
    # its loop must raise the interrupt, not end as if the run had finished.
    async def leave(arguments: Mapping[str, Any], context: ToolContext) -> str:
        raise SystemExit(3)

    tool = ToolSpec("leave", "Leave.", {"type": "object"}, leave)
    agent = runlet.Agent("a", "Go.", ScriptedModel([[call("leave", id="l")], "Done."]), (tool,))
    after_the_loop: list[str] = []

    async def consume() -> None:
        async with runlet.Runtime().stream(agent, "Go.") as stream:
            with anyio.CancelScope(shield=True):
                async for _ in stream:
                    pass
                after_the_loop.append("the loop ended as if the run had finished")

    with pytest.raises(SystemExit):
        await consume()
    assert [] == after_the_loop


async def test_an_interrupt_in_an_exception_group_from_the_stream_s_task_is_raised_alone() -> None:
    # The stream's own task keeps a tool's KeyboardInterrupt from its task group; should
    # one still leave it (raised between two steps of that task), the block raises it as
    # itself, as run() does, when it is the only one beside the cancellations it caused.
    from runlet._util import the_one_interrupt as _the_one_interrupt

    cancelled = [await _a_cancellation()]
    stop, leave = KeyboardInterrupt(), SystemExit(3)

    group = BaseExceptionGroup
    assert stop is _the_one_interrupt(group("", [stop]))
    assert stop is _the_one_interrupt(group("", [cancelled[0], group("", [stop])]))
    assert leave is _the_one_interrupt(group("", [group("", [cancelled[0]]), leave]))
    assert _the_one_interrupt(group("", [stop, leave])) is None  # two: left as the group
    assert _the_one_interrupt(group("", [cancelled[0]])) is None
    assert _the_one_interrupt(ExceptionGroup("", [ValueError()])) is None
    assert _the_one_interrupt(group("", [ValueError(), cancelled[0]])) is None
    assert _the_one_interrupt(stop) is None  # not a group: raised as it is already

    class Halt(KeyboardInterrupt):
        exceptions = ()  # a tuple by that name does not make it a group

    halt = Halt()
    assert halt is _the_one_interrupt(group("", [halt, cancelled[0]]))


@pytest.mark.parametrize("nested", [False, True])
async def test_a_handler_that_changes_its_arguments_leaves_the_decision_as_approved(
    nested: bool,
) -> None:
    # Handlers should treat their arguments as read-only; one that does not must still
    # not rewrite the audit trail of what the person approved.
    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        changing: Any = arguments
        if nested:
            changing["to"].append("mallory")
        else:
            changing["to"] = "mallory"
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    to: Any = ["bob"] if nested else "bob"
    model = ScriptedModel([[call("pay", id="p", to=to)], "Done."])
    agent = runlet.Agent("a", "Pay.", model, (tool,))
    store = runlet.InMemoryCheckpointStore()
    rt = runlet.Runtime(checkpoint_store=store)
    first = await rt.run(agent, "Pay.")
    assert first.checkpoint_id is not None
    assert first.interruption is not None
    answer = runlet.HumanResponse(first.interruption.id, "approve")
    result = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
    approved = {"to": ["bob"] if nested else "bob"}
    (decision,) = result.decisions
    assert approved == decision.arguments
    assert [approved] == [d.arguments for d in await store.decisions(first.run_id)]


async def test_a_change_to_the_caller_s_nested_metadata_does_not_reach_the_run() -> None:
    # The durable stores keep JSON, so a later change to the caller's dicts cannot reach
    # their checkpoints; the in-memory store keeps objects, so the run takes its own.
    seen: list[Any] = []

    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(copy.deepcopy(dict(context.metadata)))
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    agent = runlet.Agent("a", "Pay.", ScriptedModel([[call("pay", id="p")], "Done."]), (tool,))
    store = runlet.InMemoryCheckpointStore()
    rt = runlet.Runtime(checkpoint_store=store)
    metadata: dict[str, Any] = {"customer": {"id": "c_1", "tags": ["vip"]}, "pair": ([1],)}
    options: dict[str, Any] = {"extra": {"tags": ["a"]}}
    first = await rt.run(agent, "Pay.", metadata=metadata, options=options)
    metadata["customer"]["id"] = "c_2"
    metadata["customer"]["tags"].append("changed")
    metadata["pair"][0].append(2)
    options["extra"]["tags"].append("changed")
    assert first.checkpoint_id is not None
    assert first.interruption is not None
    kept = await store.load(first.checkpoint_id)
    assert {"customer": {"id": "c_1", "tags": ["vip"]}, "pair": ([1],)} == kept.metadata
    assert {"extra": {"tags": ["a"]}} == kept.options
    answer = runlet.HumanResponse(first.interruption.id, "approve")
    await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
    assert [{"customer": {"id": "c_1", "tags": ["vip"]}, "pair": ([1],)}] == seen


async def test_metadata_keeps_its_own_kinds_of_values_and_may_hold_itself() -> None:
    # The in-memory API takes any values: only plain dicts, lists and tuples are copied;
    # a Counter stays a Counter (a tool may count in it), and a cycle does not recurse.
    counted: list[Any] = []

    async def count(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen = context.metadata["state"]["seen"]
        seen["calls"] += 1
        counted.append(seen)
        return "counted"

    tool = ToolSpec("count", "Count.", {"type": "object"}, count)
    agent = runlet.Agent("a", "Go.", ScriptedModel([[call("count", id="c")], "Done."]), (tool,))
    seen: collections.Counter[str] = collections.Counter()
    cyclic: dict[str, Any] = {"state": {"seen": seen}}
    cyclic["state"]["again"] = cyclic
    options: list[Any] = []
    options.append(options)
    result = await runlet.Runtime().run(agent, "Go.", metadata=cyclic, options={"o": options})
    assert "completed" == result.status
    assert [True] == [each is seen for each in counted]  # the caller's own Counter
    assert 1 == seen["calls"]


# -- bad arguments to run(), Agent and Runtime: clear errors, nothing run -----------------


class TestBadArgumentsAreRefusedClearly:
    @pytest.mark.parametrize("given", [None, 5, b"hi"])
    async def test_run_input_that_is_neither_text_nor_messages(self, given: Any) -> None:
        agent = refund_agent(ScriptedModel(["never asked"]))
        with pytest.raises(ConfigurationError, match="input must be a str or a sequence"):
            await Runtime().run(agent, given)

    async def test_run_input_may_be_any_iterable_of_messages(self) -> None:
        agent = refund_agent(ScriptedModel(["Hello."]))
        result = await Runtime().run(agent, (m for m in [Message.user("Hi.")]))
        assert result.output == "Hello."

    @pytest.mark.parametrize("field", ["options", "metadata"])
    @pytest.mark.parametrize("given", [[1], "x", 5])
    async def test_run_options_or_metadata_that_are_not_a_mapping(
        self, field: str, given: Any
    ) -> None:
        agent = refund_agent(ScriptedModel(["never asked"]))
        with pytest.raises(ConfigurationError, match=f"{field} must be a dict"):
            await Runtime().run(agent, "Hi.", **{field: given})

    @pytest.mark.parametrize("field", ["options", "metadata"])
    async def test_run_options_or_metadata_nested_too_deep(self, field: str) -> None:
        deep: dict[str, Any] = {}
        inner = deep
        for _ in range(3000):
            inner["x"] = inner = {}
        model = ScriptedModel(["never asked"])
        with pytest.raises(ConfigurationError, match="nested too deeply"):
            await Runtime().run(refund_agent(model), "Hi.", **{field: deep})
        assert model.requests == []

    async def test_non_json_metadata_is_refused_before_a_tool_runs_with_a_sql_store(
        self, tmp_path: Any
    ) -> None:
        from runlet.stores.sqlite import SQLiteCheckpointStore

        charged: list[str] = []

        async def charge(arguments: Mapping[str, Any], context: ToolContext) -> str:
            charged.append(context.tool_call_id)
            return "charged"

        tools = (ToolSpec("charge", "Charge.", {"type": "object"}, charge), REFUND)
        model = ScriptedModel([[call("charge"), call("refund", order="1")], "done"])
        agent = Agent("support", "Charge, then refund.", model, tools)
        when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
        async with SQLiteCheckpointStore(tmp_path / "store.db") as store:
            runtime = Runtime(checkpoint_store=store)
            with pytest.raises(CheckpointSerializationError, match=r"metadata\['when'\]"):
                await runtime.run(agent, "Go.", metadata={"when": when})
            with pytest.raises(CheckpointSerializationError, match=r"options\['stop'\]"):
                await runtime.run(agent, "Go.", options={"stop": {1, 2}})
            assert charged == []
            assert list(await store.list_pending()) == []

    async def test_non_json_metadata_stays_allowed_in_memory(self) -> None:
        when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        result = await runtime.run(
            refund_agent(ScriptedModel(["Hello."])), "Hi.", metadata={"when": when}
        )
        assert result.output == "Hello."

    @pytest.mark.parametrize("name", [None, "", 5])
    def test_agent_name_must_be_non_empty_text(self, name: Any) -> None:
        with pytest.raises(ConfigurationError, match="name must be a non-empty str"):
            Agent(name, "x", ScriptedModel(["ok"]))

    def test_agent_instructions_must_be_text(self) -> None:
        with pytest.raises(ConfigurationError, match="instructions must be a str"):
            Agent("a", None, ScriptedModel(["ok"]))  # type: ignore[arg-type]

    @pytest.mark.parametrize("name", ["bill\ud800", "\udfff"])
    def test_agent_name_with_a_lone_surrogate_is_refused(self, name: str) -> None:
        # No database text column holds it: the SQL stores failed to save the checkpoint
        # after the first turn's free tools ran.
        with pytest.raises(ConfigurationError, match="lone surrogate"):
            Agent(name, "x", ScriptedModel(["ok"]))
        assert Agent("bill \U0001f600", "x", ScriptedModel(["ok"])).name == "bill \U0001f600"

    @pytest.mark.parametrize("tools", [None, REFUND, "refund", 5])
    def test_agent_tools_must_be_a_list_of_tools(self, tools: Any) -> None:
        with pytest.raises(ConfigurationError, match="tools must be a list of ToolSpec"):
            Agent("a", "x", ScriptedModel(["ok"]), tools)

    @pytest.mark.parametrize(
        ("keyword", "value", "words"),
        [
            ("tracer_provider", 5, "tracer_provider must be"),
            ("tracer_provider", object(), "tracer_provider must be"),
            ("trace_content", "yes", "trace_content must be"),
            ("trace_content", 1, "trace_content must be"),
        ],
    )
    def test_runtime_tracing_settings(self, keyword: str, value: Any, words: str) -> None:
        with pytest.raises(ConfigurationError, match=words):
            Runtime(**{keyword: value})


def test_the_conformance_suite_says_it_needs_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    from runlet.testing import store_conformance_tests

    monkeypatch.setitem(sys.modules, "pytest", None)  # as if it were not installed
    with pytest.raises(ImportError, match="needs pytest: pip install pytest"):
        store_conformance_tests(lambda lease: InMemoryCheckpointStore())  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize("backends", [(), ("asynco",), ("asyncio", "curio")])
def test_the_conformance_suite_refuses_unknown_backends(backends: Any) -> None:
    from runlet.testing import store_conformance_tests

    with pytest.raises(ConfigurationError, match="backends must name anyio backends"):
        store_conformance_tests(lambda lease: InMemoryCheckpointStore(), backends=backends)  # type: ignore[arg-type,return-value]


class _HalfDurable:
    """A store meant to be durable that lacks most of the protocol."""

    async def save(self, checkpoint: Any) -> None: ...
    async def load(self, checkpoint_id: str) -> Any: ...
    async def delete(self, checkpoint_id: str) -> None: ...
    async def claim(self, checkpoint_id: str) -> Any: ...
    async def resolve(self, *args: Any) -> None: ...


def test_a_store_with_part_of_the_durable_protocol_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="lacks lease, get, renew, record, release"):
        Runtime(checkpoint_store=_HalfDurable())  # type: ignore[arg-type]


def test_a_plain_store_with_a_method_of_the_same_name_is_still_plain() -> None:
    class WithRelease:
        async def save(self, checkpoint: Any) -> None: ...
        async def load(self, checkpoint_id: str) -> Any: ...
        async def delete(self, checkpoint_id: str) -> None: ...
        async def release(self, *args: Any) -> None: ...

    store = WithRelease()
    assert Runtime(checkpoint_store=store).checkpoint_store is store


class TestTheApprovalPromptShowsWhatIsThere:
    """The default prompt escapes what a person cannot see or what reorders what they
    see: a model cannot draw an IBAN backwards or hide a second key behind a look-alike."""

    @pytest.mark.parametrize(
        ("arguments", "shown"),
        [
            ({"iban": "\u202e3021 20ED\u202c"}, '{"iban": "\\u202e3021 20ED\\u202c"}'),
            ({"amount": 250, "amount\u200b": 25}, '{"amount": 250, "amount\\u200b": 25}'),
            ({"tag": "x\U000e0041"}, '{"tag": "x\\udb40\\udc41"}'),  # beyond the BMP
            ({"tag": "\uffff"}, '{"tag": "\\uffff"}'),  # the last of the BMP
            # Printable to Python, yet blank: a grapheme joiner, a variation selector,
            # a Hangul filler, blank braille.
            (
                {"amount": 250, "amount\u034f": 25, "a\ufe0f\u3164\u2800": 1},
                '{"amount": 250, "amount\\u034f": 25, "a\\ufe0f\\u3164\\u2800": 1}',
            ),
            ({"order": {"note": "a\u2028b\x7f"}}, '{"order": {"note": "a\\u2028b\\u007f"}}'),
            # Text people can read stays as it is, spaces and all.
            ({"name": "Müller ½ 東京 😀"}, '{"name": "Müller ½ 東京 😀"}'),
            ({"name": "a\tb"}, '{"name": "a\\tb"}'),  # escaped by JSON already
        ],
    )
    async def test_invisible_characters_are_escaped(
        self, arguments: dict[str, Any], shown: str
    ) -> None:
        model = ScriptedModel([call("refund", **arguments), "done"])
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        result = await runtime.run(refund_agent(model), "go")
        assert result.interruption is not None
        assert result.interruption.prompt == f"Allow refund with {shown}?"
        assert result.interruption.tool_call.arguments == arguments  # the call is unchanged


def _nested(depth: int) -> dict[str, Any]:
    """Arguments *depth* levels deep: the arguments object itself is level 1."""
    value: Any = 1
    for level in range(depth - 1):
        value = {"k": value} if level % 2 else [value]
    return {"v": value}


class TestArgumentsJSONCannotHold:
    """Arguments that pass the schema but are not JSON a store and a person can take: a
    float JSON has no number for, or nesting deep enough to exhaust Python's recursion.
    The call does not run, no policy sees it, and the model is told."""

    @pytest.mark.parametrize(
        ("arguments", "problem"),
        [
            ({"amount": float("nan")}, "nan is not a JSON number"),
            ({"amount": float("inf")}, "inf is not a JSON number"),
            ({"amounts": [1.5, {"x": -float("inf")}]}, "-inf is not a JSON number"),
            ({"amounts": (1.5, float("nan"))}, "nan is not a JSON number"),  # a tuple
            ({"order": collections.OrderedDict(x=float("inf"))}, "inf is not a JSON number"),
            (_nested(101), "they nest deeper than 100 levels; flatten them"),
            (_nested(5000), "they nest deeper than 100 levels; flatten them"),
            # Values JSON has no form for, where the schema leaves the property open: the
            # person would be shown their repr() as if it were a string.
            ({"memo": {1, 2}}, "a value of type set is not JSON"),
            ({"memo": [b"\x00"]}, "a value of type bytes is not JSON"),
            ({"meta": {7: "x"}}, "the key 7 is not a string, as JSON object keys must be"),
            (
                {"meta": {"a": MappingProxyType({"b": 1})}},
                "a value of type mappingproxy is not JSON",
            ),
            ({"memo": object()}, "a value of type object is not JSON"),
        ],
    )
    @pytest.mark.parametrize("gated", [True, False])
    async def test_refused_before_anything_runs(
        self, arguments: dict[str, Any], problem: str, gated: bool
    ) -> None:
        ran: list[Any] = []
        asked: list[Any] = []

        async def pay(args: Mapping[str, Any], context: ToolContext) -> str:
            ran.append(args)
            return "paid"

        def policy(args: Mapping[str, Any], context: ToolContext) -> bool:
            asked.append(args)
            return gated

        # No "type" in the schema: NaN passes "minimum" (it compares false with anything).
        schema = {"type": "object", "properties": {"amount": {"minimum": 0, "maximum": 100}}}
        tool = ToolSpec("pay", "Pay.", schema, pay, requires_approval=policy)
        model = ScriptedModel([call("pay", **arguments), "gave up"])
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        result = await runtime.run(Agent("a", "Pay.", model, (tool,)), "go")
        assert result.status == "completed"
        assert (ran, asked) == ([], [])
        [answer] = [m for m in result.transcript if m.role == "tool"]
        assert answer.content == (
            f"Invalid arguments for tool 'pay': {problem}. Call it again with arguments that "
            "match its input schema."
        )

    @pytest.mark.parametrize("depth", [2, 99, 100])
    async def test_nesting_up_to_the_limit_is_taken(self, depth: int) -> None:
        seen: list[Any] = []

        async def keep(args: Mapping[str, Any], context: ToolContext) -> str:
            seen.append(args)
            return "kept"

        tool = ToolSpec("keep", "Keep.", {"type": "object"}, keep)
        arguments = _nested(depth)
        model = ScriptedModel([call("keep", **arguments), "done"])
        result = await Runtime().run(Agent("a", "Keep.", model, (tool,)), "go")
        assert result.status == "completed"
        assert seen == [arguments]

    async def test_edited_arguments_with_nan_are_refused(self) -> None:
        tool = ToolSpec(
            "pay", "Pay.", {"type": "object"}, refund, requires_approval=True, allow_edit=True
        )
        model = ScriptedModel([call("pay", order=1), "done"])
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        agent = Agent("a", "Pay.", model, (tool,))
        first = await runtime.run(agent, "go")
        assert first.interruption is not None
        assert first.checkpoint_id is not None
        response = HumanResponse(
            first.interruption.id, "approve", edited_arguments={"order": float("nan")}
        )
        with pytest.raises(HumanResponseError, match="nan is not a JSON number"):
            await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=response)
        fixed = HumanResponse(first.interruption.id, "approve", edited_arguments={"order": 2})
        done = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=fixed)
        assert "refunded 2" in done.transcript[-2].content


def test_nesting_a_validator_gives_up_on_is_still_named() -> None:
    # jsonschema-rs before 0.30 stops at deep nesting with "Recursion limit reached";
    # the refusal still says what is wrong with the arguments.
    class GivesUp:
        def is_valid(self, instance: object) -> bool:
            raise ValueError("Recursion limit reached")

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, refund)
    object.__setattr__(tool, "_validator", GivesUp())  # a frozen class
    assert "they nest deeper than 100 levels; flatten them" == tool._check_arguments(_nested(500))
    assert "arguments are not JSON: Recursion limit reached" == tool._check_arguments({"a": 1})
