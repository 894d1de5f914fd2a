"""From a mutation review of the runtime, the in-memory store and the helpers (_runtime.py,
_store.py, _util.py): what no other test pinned down."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import runlet._runtime
from runlet import (
    Agent,
    CallRecord,
    CheckpointNotFoundError,
    HumanResponse,
    HumanResponseConflictError,
    InMemoryCheckpointStore,
    ModelError,
    ModelRequest,
    Resolution,
    RunResult,
    Runtime,
    ToolCallStarted,
    ToolContext,
    ToolSpec,
    Usage,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
}


async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return f"Refunded order {arguments['order_id']}."


def support_agent(*script: Any) -> Agent:
    tool = ToolSpec("refund", "Refund an order.", ORDER_SCHEMA, refund, requires_approval=True)
    return Agent("support", "Refund when approved.", ScriptedModel(list(script)), [tool])


async def interrupted(rt: Runtime, *, metadata: Mapping[str, Any] | None = None) -> RunResult:
    """A run of the support agent, stopped for the approval of a refund."""
    agent = support_agent(call("refund", id="c1", order_id="1"), "Done.")
    result = await rt.run(agent, "Refund order 1.", metadata=metadata)
    assert "interrupted" == result.status
    assert result.checkpoint_id is not None
    return result


# --- list_pending's metadata filter compares as JSON -------------------------------------


async def test_a_nested_filter_object_with_a_key_the_metadata_lacks_matches_nothing() -> None:
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    result = await interrupted(rt, metadata={"address": {"city": "Oslo"}})

    wider = {"address": {"city": "Oslo", "zip": "0150"}}
    assert [] == await store.list_pending(metadata=wider)
    listed = await store.list_pending(metadata={"address": {"city": "Oslo"}})
    assert [result.checkpoint_id] == [found.checkpoint_id for found in listed]


async def test_a_filter_array_given_as_a_tuple_matches_a_metadata_list() -> None:
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    result = await interrupted(rt, metadata={"tags": ["vip", "eu"]})

    listed = await store.list_pending(metadata={"tags": ("vip", "eu")})
    assert [result.checkpoint_id] == [found.checkpoint_id for found in listed]
    assert [] == await store.list_pending(metadata={"tags": ("vip",)})


# --- The in-memory store: what its errors say, what a stray release does ------------------


async def test_loading_a_checkpoint_a_resume_finished_with_says_it_is_retired() -> None:
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    first = await interrupted(rt)
    agent = support_agent("Done.")
    assert first.interruption is not None
    answer = HumanResponse.approve(first.interruption.id)
    done = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
    assert "completed" == done.status

    with pytest.raises(CheckpointNotFoundError, match="is retired") as raised:
        await store.load(first.checkpoint_id)
    assert first.checkpoint_id == raised.value.checkpoint_id
    with pytest.raises(CheckpointNotFoundError, match="never saved"):
        await store.load("cp_unknown")


async def test_giving_back_a_claim_with_no_token_changes_no_finished_state() -> None:
    # An unclaimed checkpoint holds no token; a release given none (a web request's JSON
    # null) must not make a cancelled or resolved checkpoint pending, and so claimable.
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    resolved, cancelled = await interrupted(rt), await interrupted(rt)
    assert resolved.interruption is not None
    answer = HumanResponse.reject(resolved.interruption.id)
    await rt.resume(support_agent("Done."), checkpoint_id=resolved.checkpoint_id, response=answer)
    await rt.cancel(cancelled.checkpoint_id)

    for checkpoint_id in (resolved.checkpoint_id, cancelled.checkpoint_id):
        await store.release(checkpoint_id, None)  # type: ignore[arg-type]
    assert ["resolved", "cancelled"] == [
        (await store.get(each.checkpoint_id)).status for each in (resolved, cancelled)
    ]
    assert [] == await store.list_pending()


# --- RunStream -----------------------------------------------------------------------------


class _Stop(BaseException):
    """Like KeyboardInterrupt (which trio may deliver at any checkpoint of any task): not
    an Exception. A plain BaseException, so asyncio's event loop goes on when it leaves a
    task."""


async def test_an_interrupt_leaving_the_stream_s_task_comes_out_of_the_block_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The stream's task catches what the run raises; the interrupt here comes after the
    # run, as the task hands over RunFinished (a signal's KeyboardInterrupt on trio), so it
    # leaves the task: the block raises it as itself, not in an exception group.
    def finished(result: RunResult) -> Any:
        raise _Stop

    monkeypatch.setattr(runlet._runtime, "RunFinished", finished)
    agent = support_agent("Done.")
    seen: list[str] = []

    async def consume() -> None:
        async with Runtime().stream(agent, "Hello.") as stream:
            seen.extend([type(event).__name__ async for event in stream])

    with pytest.raises(_Stop):
        await consume()
    assert "RunFinished" not in seen


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


async def test_a_stray_cancellation_from_a_streamed_tool_is_the_one_the_block_raises() -> None:
    # Not the stream's own cancel scope's cancellation, leaking out of the block that
    # scope belongs to: the very exception the handler raised, as run() raises it.
    raised: list[BaseException] = []

    async def stray(arguments: Mapping[str, Any], context: ToolContext) -> str:
        raised.append(await _a_cancellation())
        raise raised[0]

    tool = ToolSpec("stray", "Stray.", {"type": "object"}, stray)
    agent = Agent("a", "Go.", ScriptedModel([[call("stray", id="s")], "Done."]), [tool])

    async def consume() -> None:
        async with Runtime().stream(agent, "Go.") as stream:
            async for _ in stream:
                pass

    with pytest.raises(anyio.get_cancelled_exc_class()) as caught:
        await consume()
    assert [caught.value] == raised


async def test_an_interrupt_from_a_streamed_tool_stops_a_block_that_is_not_reading() -> None:
    # The block waits for something else after the call started; the tool's interrupt
    # stops it at once (fail_after only bounds a hang) and comes out as itself.
    async def stop(arguments: Mapping[str, Any], context: ToolContext) -> str:
        raise _Stop

    tool = ToolSpec("stop", "Stop.", {"type": "object"}, stop)
    agent = Agent("a", "Go.", ScriptedModel([[call("stop", id="s")], "Done."]), [tool])
    reached: list[str] = []

    async def consume() -> None:
        async with Runtime().stream(agent, "Go.") as stream:
            async for event in stream:
                if isinstance(event, ToolCallStarted):
                    break
            await anyio.sleep_forever()
            reached.append("after sleep_forever")

    with anyio.fail_after(10), pytest.raises(_Stop):
        await consume()
    assert [] == reached


# --- ReadOnlyDict: copies stay read-only --------------------------------------------------


@pytest.mark.parametrize(
    "again",
    [copy.copy, copy.deepcopy, lambda value: pickle.loads(pickle.dumps(value))],
    ids=["copy", "deepcopy", "pickle"],
)
async def test_a_copy_of_a_handler_s_metadata_is_read_only_too(
    again: Callable[[Any], Any],
) -> None:
    seen: list[Mapping[str, Any]] = []

    async def remember(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(context.metadata)
        return "ok"

    tool = ToolSpec("remember", "Remember.", {"type": "object"}, remember)
    agent = Agent("a", "Go.", ScriptedModel([call("remember"), "Done."]), [tool])
    await Runtime().run(agent, "Go.", metadata={"tenant": "acme", "user": {"id": 7}})
    copied = again(seen[0])
    assert {"tenant": "acme", "user": {"id": 7}} == copied
    assert type(seen[0]) is type(copied)
    with pytest.raises(TypeError, match="read-only"):
        copied["tenant"] = "other"
    with pytest.raises(TypeError, match="read-only"):
        copied.update(tenant="other")
    assert "acme" == copied["tenant"]


# --- What a person answered is recorded as given, and compared as JSON ------------------


async def test_a_change_to_the_caller_s_response_dicts_after_resume_leaves_the_decision() -> None:
    # The decision is the audit trail: the application reusing (changing) the dicts it
    # answered with must not rewrite what was decided.
    store = InMemoryCheckpointStore()
    rt = Runtime(checkpoint_store=store)
    first = await interrupted(rt)
    assert first.interruption is not None
    edited = {"order_id": "2"}
    metadata = {"ticket": "T-1"}
    answer = HumanResponse.approve(
        first.interruption.id, edited_arguments=edited, metadata=metadata
    )
    result = await rt.resume(
        support_agent("Done."), checkpoint_id=first.checkpoint_id, response=answer
    )
    edited["order_id"] = "999"
    metadata["ticket"] = "T-999"

    (decision,) = result.decisions
    assert ({"order_id": "2"}, {"ticket": "T-1"}) == (decision.arguments, decision.metadata)
    (stored,) = await store.decisions(result.run_id)
    assert ({"order_id": "2"}, {"ticket": "T-1"}) == (stored.arguments, stored.metadata)


async def test_a_repeat_whose_metadata_mapping_lacks_a_key_is_a_conflict() -> None:
    # A mapping of another type than dict (a mappingproxy) is compared key for key too.
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    first = await interrupted(rt)
    assert first.interruption is not None
    request_id = first.interruption.id
    agent = support_agent("Done.")
    accepted = {"ticket": "T-1", "by": "desk"}
    answer = HumanResponse.approve(request_id, metadata=accepted)
    done = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)

    fewer = HumanResponse.approve(request_id, metadata=MappingProxyType({"ticket": "T-1"}))
    with pytest.raises(HumanResponseConflictError):
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=fewer)
    same = HumanResponse.approve(request_id, metadata=MappingProxyType(dict(accepted)))
    assert done == await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=same)


async def test_mappings_of_other_types_in_a_response_are_recorded_as_plain_json_objects() -> None:
    rt = Runtime(checkpoint_store=InMemoryCheckpointStore())
    first = await interrupted(rt)
    assert first.interruption is not None
    source = {"ticket": "T-1"}
    answer = HumanResponse.approve(
        first.interruption.id,
        metadata=MappingProxyType(source),
    )
    result = await rt.resume(
        support_agent("Done."), checkpoint_id=first.checkpoint_id, response=answer
    )
    source["ticket"] = "T-999"

    (decision,) = result.decisions
    assert decision.metadata is not None
    assert '{"ticket": "T-1"}' == json.dumps(decision.metadata)
    assert dict is type(decision.metadata)


# --- Log lines name what failed -----------------------------------------------------------


class NoRoom(InMemoryCheckpointStore):
    """A store (not the in-memory class itself, so the resume protects its writes) that
    cannot give a claim back, nor (if *results* is false) record a call's result."""

    def __init__(self, *, results: bool) -> None:
        super().__init__()
        self.results = results

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        if not self.results and any(record.result is not None for record in records):
            await anyio.lowlevel.checkpoint()
            raise OSError("disk full")
        await super().record(checkpoint_id, token, records)

    async def release(self, checkpoint_id: str, token: str) -> None:
        raise OSError  # no message


async def test_a_write_that_failed_for_a_cancelled_caller_is_logged_by_its_method_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scopes: list[anyio.CancelScope] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        scopes[0].cancel()
        return "Refunded."

    tool = ToolSpec("refund", "Refund.", {"type": "object"}, refund, requires_approval=True)
    agent = Agent("a", "Go.", ScriptedModel([call("refund", id="c1"), "Done."]), [tool])
    rt = Runtime(checkpoint_store=NoRoom(results=False))
    first = await rt.run(agent, "Refund.")
    assert first.interruption is not None
    answer = HumanResponse.approve(first.interruption.id)
    with caplog.at_level("WARNING", logger="runlet"), anyio.CancelScope() as scope:
        scopes.append(scope)
        await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
    assert scope.cancelled_caught
    [line] = [r.getMessage() for r in caplog.records if "caller was being cancelled" in r.message]
    assert line.startswith("NoRoom.record failed while its caller was being cancelled")


async def test_a_failure_without_a_message_is_logged_by_its_class_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def down(request: ModelRequest) -> str:
        raise OSError("model is down")

    rt = Runtime(checkpoint_store=NoRoom(results=True))
    first = await interrupted(rt)
    assert first.interruption is not None
    answer = HumanResponse.reject(first.interruption.id)
    with caplog.at_level("WARNING", logger="runlet"), pytest.raises(ModelError):
        await rt.resume(support_agent(down), checkpoint_id=first.checkpoint_id, response=answer)
    [line] = [r.getMessage() for r in caplog.records if "giving its claim back failed" in r.message]
    assert line.endswith("(never: the lease is None): OSError")


@pytest.mark.parametrize("finish", ["cancel", "resolve"])
async def test_a_page_goes_on_after_a_checkpoint_keep_finished_forgot(finish: str) -> None:
    # "The page starts after it, even if it was resolved or cancelled since": also when
    # the store no longer keeps it (keep_finished=0 forgets it at once).
    from runlet.testing._conformance import sample_checkpoint

    store = InMemoryCheckpointStore(keep_finished=0)
    for checkpoint_id in ("cp_1", "cp_2", "cp_3"):
        await store.save(sample_checkpoint(checkpoint_id))
    [first] = await store.list_pending(limit=1)
    if finish == "cancel":
        await store.cancel(first.checkpoint_id)
    else:
        claim = await store.claim(first.checkpoint_id)
        result = RunResult(status="completed", transcript=(), usage=Usage(), run_id="r")
        resolution = Resolution(
            decisions=(), result=result, resolved_at=claim.checkpoint.request.created_at
        )
        await store.resolve(first.checkpoint_id, claim.token, resolution)
    assert first.checkpoint_id not in [p.checkpoint_id for p in await store.list_pending()]

    page = await store.list_pending(limit=1, after=first.checkpoint_id)

    assert ["cp_2"] == [p.checkpoint_id for p in page]
    with pytest.raises(CheckpointNotFoundError):  # an id it never had is still refused
        await store.list_pending(after="cp_never")


async def test_a_store_knows_the_place_of_the_latest_forgotten_checkpoints_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runlet import _store
    from runlet.testing._conformance import sample_checkpoint

    monkeypatch.setattr(_store, "_CURSORS_KEPT", 1)
    store = InMemoryCheckpointStore(keep_finished=0)
    for checkpoint_id in ("cp_1", "cp_2", "cp_3"):
        await store.save(sample_checkpoint(checkpoint_id))
    await store.cancel("cp_1")
    await store.cancel("cp_2")  # forgotten after cp_1, whose place goes

    assert ["cp_3"] == [p.checkpoint_id for p in await store.list_pending(after="cp_2")]
    with pytest.raises(CheckpointNotFoundError):
        await store.list_pending(after="cp_1")
