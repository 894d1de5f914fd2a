"""Streaming runs: ``async with runtime.stream(...) as stream: async for event in stream``.

Nothing here sleeps to wait for something: tests rendezvous on ``anyio.Event`` objects
(and ``anyio.wait_all_tasks_blocked``), with ``anyio.fail_after`` as a guard against hangs.
"""

from __future__ import annotations

import contextlib
import gc
import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest

import runlet
from runlet import (
    STREAM_BUFFER_SIZE,
    Agent,
    Checkpoint,
    HumanResponse,
    InMemoryCheckpointStore,
    Interrupted,
    Message,
    MessageCompleted,
    ModelError,
    ModelRequest,
    ModelResponse,
    ModelStreamItem,
    RunFinished,
    RunletError,
    RunResult,
    RunStream,
    Runtime,
    StreamEvent,
    StreamingModel,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolSpec,
    Usage,
    ask_human,
)
from runlet.testing import ScriptedModel, ScriptItem, call

pytestmark = pytest.mark.anyio

GUARD = 5  # seconds; only a guard against hangs, never something a test waits for

OBJECT: dict[str, Any] = {"type": "object"}


# --- test models, tools and stores ----------------------------------------------------


Gate = Callable[[int], Awaitable[None]]


class StreamModel:
    """A streaming model: each request streams the items of the next turn.

    Before producing item *n* (0-based, counted over the whole model) it awaits
    ``gate(n)``, so a test can hold it between chunks. An exception in a turn's items
    is raised when reached. It records how many items it produced, whether its stream
    context was left, and whether it saw a cancellation.
    """

    def __init__(
        self, turns: Sequence[Sequence[ModelStreamItem | Exception]], gate: Gate | None = None
    ):
        self._turns = [list(turn) for turn in turns]
        self.gate = gate
        self.requests: list[ModelRequest] = []
        self.produced = 0
        self.entered = 0
        self.exited = 0
        self.cancelled = False

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the runtime must use stream() when the model has it")

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelStreamItem]]:
        self.requests.append(request)
        self.entered += 1
        try:
            yield _Items(self, self._turns.pop(0))
        finally:
            self.exited += 1


class _Items:
    """The items of one turn of a :class:`StreamModel` (a plain async iterator, so no
    async generator is left for the garbage collector to finalize)."""

    def __init__(self, model: StreamModel, items: list[ModelStreamItem | Exception]) -> None:
        self._model = model
        self._items = iter(items)

    def __aiter__(self) -> _Items:
        return self

    async def __anext__(self) -> ModelStreamItem:
        model = self._model
        item = next(self._items, None)
        if item is None:
            raise StopAsyncIteration
        if model.gate is not None:
            try:
                await model.gate(model.produced)
            except anyio.get_cancelled_exc_class():
                model.cancelled = True
                raise
        if isinstance(item, Exception):
            raise item
        model.produced += 1
        return item


def text_turn(*chunks: str, usage: Usage = Usage(requests=1)) -> list[ModelStreamItem | Exception]:
    return [
        *(TextDelta(c) for c in chunks),
        ModelResponse(Message.assistant("".join(chunks)), usage),
    ]


class CompleteOnlyModel:
    """A model without ``stream``: the runtime must fall back to ``complete``."""

    def __init__(self, script: Sequence[ScriptItem]) -> None:
        self._inner = ScriptedModel(script)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self._inner.complete(request)


class FailingModel:
    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise RuntimeError("connection reset")


@attrs.define
class Blocker:
    """A tool handler that blocks until cancelled, and records what happened to it."""

    started: anyio.Event = attrs.Factory(anyio.Event)
    cancelled: bool = False

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.started.set()
        try:
            await anyio.Event().wait()  # never set: only cancellation ends this
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        raise AssertionError("unreachable")  # pragma: no cover


def tool(name: str, handler: Any, **kwargs: Any) -> ToolSpec:
    return ToolSpec(name, f"The {name} tool.", kwargs.pop("schema", OBJECT), handler, **kwargs)


async def echo(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return f"echo {json.dumps(dict(arguments), sort_keys=True)}"


async def explode(arguments: Mapping[str, Any], context: ToolContext) -> str:
    raise ValueError("disk full")


class RecordingStore(InMemoryCheckpointStore):
    """Logs each save, so a test can show it happened before an event was seen."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []

    async def save(self, checkpoint: Checkpoint) -> None:
        await super().save(checkpoint)
        self.log.append(("saved", checkpoint.id))


async def collect(
    runtime: Runtime, agent: Agent, input: str = "go", **kwargs: Any
) -> tuple[list[StreamEvent], RunResult]:
    with anyio.fail_after(GUARD):
        async with runtime.stream(agent, input, **kwargs) as stream:
            events = [event async for event in stream]
    return events, stream.result


def kinds(events: Sequence[StreamEvent]) -> list[type]:
    return [type(event) for event in events]


def outcome(result: RunResult) -> tuple[Any, ...]:
    """What run() and stream() must agree on (run ids and request ids are random)."""
    request = result.interruption
    asked = None if request is None else (request.kind, request.prompt, request.tool_call)
    return (result.status, result.output, result.transcript, result.usage, asked)


# --- 1. the shape of a stream --------------------------------------------------------


async def test_stream_hands_out_events_then_the_result() -> None:
    seen: list[Mapping[str, Any]] = []

    async def lookup(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(context.metadata)
        return "42"

    lookup_call = call("lookup", q="answer", id="c1")
    model = ScriptedModel([lookup_call, "The answer is 42."])
    agent = Agent("a", "Be exact.", model, tools=[tool("lookup", lookup)])

    events, result = await collect(
        Runtime(), agent, "What is it?", options={"temperature": 0}, metadata={"user": "u1"}
    )

    assert kinds(events) == [
        ToolCallDelta,
        MessageCompleted,
        ToolCallStarted,
        ToolCallFinished,
        TextDelta,
        MessageCompleted,
        RunFinished,
    ]
    assert events[-1] == RunFinished(result)
    assert result.status == "completed"
    assert result.output == "The answer is 42."
    assert events[2] == ToolCallStarted(lookup_call)
    assert events[3] == ToolCallFinished(lookup_call, runlet.ToolResult("c1", "42"))
    assert events[1] == MessageCompleted(result.transcript[1])
    assert events[5] == MessageCompleted(result.transcript[-1])
    assert [m.role for m in result.transcript] == ["user", "assistant", "tool", "assistant"]
    assert seen == [{"user": "u1"}]
    assert [r.options for r in model.requests] == [{"temperature": 0}] * 2
    assert result.usage == Usage(requests=2)


async def test_events_are_frozen_attrs_classes_exported_from_runlet() -> None:
    store = InMemoryCheckpointStore()
    model = ScriptedModel([call("hello", id="c1"), call("gated", id="c2")], chunk_size=1)
    agent = Agent(
        "a",
        "",
        model,
        tools=[tool("hello", echo), tool("gated", echo, requires_approval=True)],
    )
    events, _ = await collect(Runtime(store), agent)

    classes = {type(event) for event in events}
    assert classes == {
        ToolCallDelta,
        MessageCompleted,
        ToolCallStarted,
        ToolCallFinished,
        Interrupted,
        RunFinished,
    }
    for event in [TextDelta("x"), *events]:
        cls = type(event)
        assert getattr(runlet, cls.__name__) is cls
        assert cls.__name__ in runlet.__all__
        assert attrs.has(cls)
        field = attrs.fields(cls)[0].name
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(event, field, None)


async def test_interrupted_is_sent_only_after_the_checkpoint_is_saved() -> None:
    store = RecordingStore()
    gated = call("delete", path="/tmp/x", id="c1")
    agent = Agent(
        "a",
        "",
        ScriptedModel([gated, "Deleted."]),
        tools=[tool("delete", echo, requires_approval=True)],
    )
    runtime = Runtime(store)
    events: list[StreamEvent] = []
    with anyio.fail_after(GUARD):
        async with runtime.stream(agent, "clean up") as stream:
            async for event in stream:
                events.append(event)
                if isinstance(event, Interrupted):
                    store.log.append(("seen", event.checkpoint_id))
                    assert (await store.load(event.checkpoint_id)).request == event.request

    assert kinds(events)[-2:] == [Interrupted, RunFinished]
    interrupted = events[-2]
    assert isinstance(interrupted, Interrupted)
    assert store.log == [("saved", interrupted.checkpoint_id), ("seen", interrupted.checkpoint_id)]
    assert interrupted.request.kind == "approval"
    assert interrupted.request.tool_call == gated
    result = stream.result
    assert events[-1] == RunFinished(result)
    assert result.status == "interrupted"
    assert result.output is None
    assert result.checkpoint_id == interrupted.checkpoint_id
    assert result.interruption == interrupted.request
    # The gated call never started: a person has not approved it.
    assert ToolCallStarted not in kinds(events)


class BrokenDiskStore(InMemoryCheckpointStore):
    """A store whose save fails as a store of one's own may: not with a RunletError."""

    async def save(self, checkpoint: Checkpoint) -> None:
        await anyio.lowlevel.checkpoint()
        raise OSError("disk full")


async def test_a_checkpoint_that_could_not_be_saved_is_never_announced() -> None:
    agent = Agent(
        "a",
        "",
        ScriptedModel([call("delete", path="/tmp/x", id="c1")]),
        tools=[tool("delete", echo, requires_approval=True)],
    )
    events: list[StreamEvent] = []
    with pytest.raises(OSError, match="disk full") as caught:
        await collect_into(events, Runtime(BrokenDiskStore()), agent)
    assert type(caught.value) is OSError  # the store's own error, unwrapped
    assert kinds(events) == [ToolCallDelta, MessageCompleted]  # no Interrupted


# --- 2. events arrive as things happen -----------------------------------------------


async def test_a_text_delta_reaches_the_consumer_before_the_model_produces_the_next() -> None:
    consumer_saw_first = anyio.Event()

    async def gate(n: int) -> None:
        if n == 1:
            await consumer_saw_first.wait()

    model = StreamModel([text_turn("Hel", "lo")], gate)
    agent = Agent("a", "", model)
    events: list[StreamEvent] = []
    with anyio.fail_after(GUARD):
        async with Runtime().stream(agent, "hi") as stream:
            async for event in stream:
                events.append(event)
                if event == TextDelta("Hel"):
                    assert model.produced == 1  # the second chunk is not made yet
                    consumer_saw_first.set()

    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        MessageCompleted(Message.assistant("Hello")),
        RunFinished(stream.result),
    ]
    assert stream.result.output == "Hello"
    assert model.exited == 1


async def test_a_fast_tool_is_reported_before_its_slow_sibling_finishes() -> None:
    release_slow = anyio.Event()
    slow_done = False

    async def slow(arguments: Mapping[str, Any], context: ToolContext) -> str:
        nonlocal slow_done
        await release_slow.wait()
        slow_done = True
        return "slow result"

    async def fast(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "fast result"

    slow_call, fast_call = call("slow", id="s"), call("fast", id="f")
    model = ScriptedModel([[slow_call, fast_call], "both done"])
    agent = Agent("a", "", model, tools=[tool("slow", slow), tool("fast", fast)])
    finished: list[ToolCall] = []
    with anyio.fail_after(GUARD):
        async with Runtime().stream(agent, "go") as stream:
            async for event in stream:
                if isinstance(event, ToolCallFinished):
                    finished.append(event.tool_call)
                    if event.tool_call == fast_call:
                        assert not slow_done
                        release_slow.set()

    assert finished == [fast_call, slow_call]
    # The transcript keeps call order, whatever order the calls finished in.
    assert [m.tool_result.tool_call_id for m in stream.result.transcript if m.tool_result] == [
        "s",
        "f",
    ]
    assert stream.result.output == "both done"


# --- 3. model streaming --------------------------------------------------------------


async def test_streaming_model_deltas_and_usage_are_passed_through() -> None:
    tool_call = ToolCall("c1", "echo", {"x": 1})
    model = StreamModel(
        [
            [
                TextDelta("Let me "),
                TextDelta("check."),
                ToolCallDelta(0, "c1", "echo", '{"x"'),
                ToolCallDelta(0, arguments=": 1}"),
                ModelResponse(Message.assistant("Let me check.", [tool_call]), Usage(3, 4, 1)),
            ],
            text_turn("Done", usage=Usage(5, 1, 1)),
        ]
    )
    assert isinstance(model, StreamingModel)
    agent = Agent("a", "", model, tools=[tool("echo", echo)])
    events, result = await collect(Runtime(), agent)

    assert events[:5] == [
        TextDelta("Let me "),
        TextDelta("check."),
        ToolCallDelta(0, "c1", "echo", '{"x"'),
        ToolCallDelta(0, None, None, ": 1}"),
        MessageCompleted(Message.assistant("Let me check.", [tool_call])),
    ]
    assert result.usage == Usage(8, 5, 2)
    assert result.output == "Done"
    assert (model.entered, model.exited) == (2, 2)


async def test_a_model_without_stream_falls_back_to_complete() -> None:
    model = CompleteOnlyModel(
        [
            Message.assistant("Let me check.", [call("echo", id="c1")]),
            call("echo", id="c2"),  # no text: no delta
            "Done.",
        ]
    )
    assert not isinstance(model, StreamingModel)
    agent = Agent("a", "", model, tools=[tool("echo", echo)])
    events, result = await collect(Runtime(), agent)

    assert kinds(events) == [
        TextDelta,
        MessageCompleted,
        ToolCallStarted,
        ToolCallFinished,
        MessageCompleted,
        ToolCallStarted,
        ToolCallFinished,
        TextDelta,
        MessageCompleted,
        RunFinished,
    ]
    assert [e for e in events if isinstance(e, TextDelta)] == [
        TextDelta("Let me check."),
        TextDelta("Done."),
    ]
    assert result.output == "Done."


async def test_scripted_model_streams_in_chunks() -> None:
    calls = [call("echo", {"city": "Zürich", "days": 3}, id="c1"), call("echo", id="c2")]
    model = ScriptedModel([calls, "It will be sunny all week."], chunk_size=4)
    agent = Agent("a", "", model, tools=[tool("echo", echo)])
    events, result = await collect(Runtime(), agent)

    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(texts) == "It will be sunny all week." == result.output
    assert len(texts) == 7
    assert all(1 <= len(t) <= 4 for t in texts)

    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)
    for index, expected in enumerate(calls):
        pieces = [d for d in deltas if d.index == index]
        assert (pieces[0].id, pieces[0].name) == (expected.id, "echo")
        assert all(p.id is None and p.name is None for p in pieces[1:])
        assert all(1 <= len(p.arguments) <= 4 for p in pieces)
        assert json.loads("".join(p.arguments for p in pieces)) == expected.arguments
    assert len([d for d in deltas if d.index == 0]) > 1


async def test_scripted_model_without_chunk_size_streams_one_piece_each() -> None:
    model = ScriptedModel([call("echo", {"a": 1}, id="c1"), "Fine."])
    agent = Agent("a", "", model, tools=[tool("echo", echo)])
    events, _ = await collect(Runtime(), agent)

    assert [e for e in events if isinstance(e, (TextDelta, ToolCallDelta))] == [
        ToolCallDelta(0, "c1", "echo", '{"a": 1}'),
        TextDelta("Fine."),
    ]


@pytest.mark.parametrize("leave", ["break", "error", "cancel"])
async def test_leaving_a_scripted_stream_early_closes_its_generator(leave: str) -> None:
    # Regression: ScriptedModel.stream left its chunk generator to the garbage
    # collector, which trio reports as a ResourceWarning.
    model = ScriptedModel(["x" * (2 * STREAM_BUFFER_SIZE)], chunk_size=1)
    agent = Agent("a", "", model)
    first: list[StreamEvent] = []
    with warnings.catch_warnings(record=True) as caught, anyio.fail_after(GUARD):
        warnings.simplefilter("always")
        with anyio.CancelScope() as scope, contextlib.suppress(Boom):
            async with Runtime().stream(agent, "go") as stream:
                await anyio.wait_all_tasks_blocked()  # the run waits, mid-stream
                async for event in stream:
                    first.append(event)
                    if leave == "break":
                        break
                    if leave == "error":
                        raise Boom("consumer failed")
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()
        gc.collect()
        await anyio.lowlevel.checkpoint()
    assert first == [TextDelta("x")]
    assert scope.cancelled_caught == (leave == "cancel")
    assert [str(w.message) for w in caught] == []


async def test_a_stream_that_ends_without_a_response_is_a_model_error() -> None:
    model = StreamModel([[TextDelta("Hel")]])
    agent = Agent("a", "", model)
    events: list[StreamEvent] = []
    with pytest.raises(runlet.ModelResponseError, match="without its final ModelResponse"):
        await collect_into(events, Runtime(), agent)
    assert events == [TextDelta("Hel")]


async def collect_into(events: list[StreamEvent], runtime: Runtime, agent: Agent) -> RunStream:
    with anyio.fail_after(GUARD):
        async with runtime.stream(agent, "go") as stream:
            async for event in stream:
                events.append(event)  # noqa: PERF401 - keeps the events seen before an error
    return stream


# --- 4. interruptions and resume; same outcome as run() --------------------------------


SCRIPTS: dict[str, list[ScriptItem]] = {
    "answer": ["Just text."],
    "tools": [
        Message.assistant("Looking.", [call("echo", n=1, id="t1"), call("nope", id="t2")]),
        [call("echo", n=2, id="t3"), call("explode", id="t4"), call("echo", n="x", id="t5")],
        "Finished.",
    ],
    "approval": [
        [call("echo", n=1, id="a1"), call("gated", n=2, id="a2")],
        "Approved and done.",
    ],
    "question": [
        call("ask_human", kind="input", prompt="Which file?", id="q1"),
        "Thanks.",
    ],
}


def script_agent(script: list[ScriptItem], *, chunk_size: int | None = None) -> Agent:
    return Agent(
        "scripted",
        "Follow the script.",
        ScriptedModel(script, usage=Usage(10, 2, 1), chunk_size=chunk_size),
        tools=[
            tool(
                "echo",
                echo,
                schema={"type": "object", "properties": {"n": {"type": "integer"}}},
            ),
            tool("explode", explode),
            tool("gated", echo, requires_approval=True),
            ask_human(),
        ],
    )


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_stream_result_equals_run_result(name: str) -> None:
    script = SCRIPTS[name]
    ran = await Runtime(InMemoryCheckpointStore()).run(script_agent(script), "start")
    _, streamed = await collect(
        Runtime(InMemoryCheckpointStore()), script_agent(script, chunk_size=2), "start"
    )
    assert outcome(streamed) == outcome(ran)
    assert streamed.run_id != ran.run_id


@pytest.mark.parametrize(
    ("name", "answer"),
    [("approval", {"action": "approve"}), ("question", {"action": "submit", "value": "a.txt"})],
)
async def test_an_interruption_ends_the_stream_and_resume_continues(
    name: str, answer: dict[str, Any]
) -> None:
    script = SCRIPTS[name]
    stream_runtime = Runtime(InMemoryCheckpointStore())
    events, streamed = await collect(stream_runtime, script_agent(script), "start")
    assert kinds(events)[-2:] == [Interrupted, RunFinished]
    assert streamed.status == "interrupted"
    assert streamed.checkpoint_id is not None
    assert streamed.interruption is not None

    resumed = await stream_runtime.resume(
        script_agent(script[1:]),
        checkpoint_id=streamed.checkpoint_id,
        response=HumanResponse(streamed.interruption.id, **answer),
    )
    assert isinstance(resumed, RunResult)
    assert resumed.status == "completed"
    assert resumed.run_id == streamed.run_id

    run_runtime = Runtime(InMemoryCheckpointStore())
    ran = await run_runtime.run(script_agent(script), "start")
    assert ran.checkpoint_id is not None
    assert ran.interruption is not None
    ran_resumed = await run_runtime.resume(
        script_agent(script[1:]),
        checkpoint_id=ran.checkpoint_id,
        response=HumanResponse(ran.interruption.id, **answer),
    )
    assert outcome(resumed) == outcome(ran_resumed)


async def test_a_resume_that_stops_again_reports_the_decisions_so_far() -> None:
    calls = [call("delete", path="a", id="c1"), call("delete", path="b", id="c2")]
    agent = Agent(
        "a", "", ScriptedModel([calls]), tools=[tool("delete", echo, requires_approval=True)]
    )
    runtime = Runtime(InMemoryCheckpointStore())
    first = await runtime.run(agent, "clean up")
    assert first.checkpoint_id is not None
    answer = HumanResponse(first.pending_requests[0].id, "approve", responded_by="alice")
    events: list[StreamEvent] = []
    with anyio.fail_after(GUARD):
        async with runtime.stream_resume(
            agent, checkpoint_id=first.checkpoint_id, response=answer
        ) as stream:
            events = [event async for event in stream]
    again = stream.result
    assert again.status == "interrupted"
    assert [(d.tool_call_id, d.action, d.responded_by) for d in again.decisions] == [
        ("c1", "approve", "alice")
    ]
    assert [r.tool_call.id for r in again.pending_requests] == ["c2"]
    assert Interrupted in kinds(events)


# --- 5. structured concurrency: leaving early, errors, cancellation --------------------


def never_after_first(*, release: anyio.Event | None = None) -> Gate:
    """A gate that lets the first chunk through and then blocks (until *release*)."""
    block = release or anyio.Event()

    async def gate(n: int) -> None:
        if n >= 1:
            await block.wait()

    return gate


async def test_break_during_model_streaming_closes_the_model_stream() -> None:
    model = StreamModel([text_turn("a", "b", "c")], never_after_first())
    agent = Agent("a", "", model)
    with anyio.fail_after(GUARD):
        async with Runtime().stream(agent, "go") as stream:
            async for event in stream:
                assert event == TextDelta("a")
                with pytest.raises(RunletError, match="no result yet"):
                    stream.result  # noqa: B018 - the property raises
                break
        assert model.cancelled
        assert model.exited == 1
    with pytest.raises(RunletError, match="block was left before the run finished"):
        stream.result  # noqa: B018 - the property raises
    with pytest.raises(RunletError, match="block was left before the run finished"):
        await stream.__anext__()  # no silent end: the rest of the run never happened


async def read_to_interrupted(stream: RunStream) -> Interrupted:
    """Read *stream* up to its Interrupted event, and stop reading there."""
    async for event in stream:
        if isinstance(event, Interrupted):
            return event
    raise AssertionError("the run never interrupted")  # pragma: no cover


async def test_a_stream_left_at_interrupted_has_the_interrupted_result() -> None:
    # An interruption ends the run: a consumer that stops at Interrupted (to resume
    # later) finds the result there, whatever it did not read after it.
    gated = tool("b", echo, requires_approval=True)
    for _ in range(3):  # not a matter of timing
        agent = Agent("a", "", ScriptedModel([call("b")]), tools=[gated])
        with anyio.fail_after(GUARD):
            runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
            async with runtime.stream(agent, "go") as stream:
                interrupted = await read_to_interrupted(stream)
        assert stream.result.status == "interrupted"
        assert stream.result.checkpoint_id == interrupted.checkpoint_id
        assert stream.result.interruption == interrupted.request


class AwaitingPlainStore:
    """A three-method store whose every call waits, as a database's does."""

    def __init__(self) -> None:
        self.data: dict[str, Checkpoint] = {}
        self.calls: list[str] = []

    async def save(self, checkpoint: Checkpoint) -> None:
        await anyio.lowlevel.checkpoint()
        self.calls.append(f"save {checkpoint.id}")
        self.data[checkpoint.id] = checkpoint

    async def load(self, checkpoint_id: str) -> Checkpoint:
        await anyio.lowlevel.checkpoint()
        return self.data[checkpoint_id]

    async def delete(self, checkpoint_id: str) -> None:
        await anyio.lowlevel.checkpoint()
        self.calls.append(f"delete {checkpoint_id}")
        self.data.pop(checkpoint_id, None)


async def two_approvals_in_turn(
    store: runlet.CheckpointStore,
) -> tuple[Runtime, Agent, runlet.RunResult, HumanResponse]:
    """A run stopped at the first of two gated calls made one after the other, and the
    answer that approves it (its resume stops again, at the second)."""
    gated = tool("b", echo, requires_approval=True)
    agent = Agent("a", "", ScriptedModel([call("b", n=1), call("b", n=2)]), tools=[gated])
    runtime = Runtime(checkpoint_store=store)
    first = await runtime.run(agent, "go")
    assert first.interruption is not None
    return runtime, agent, first, HumanResponse(first.interruption.id, "approve")


async def test_a_plain_store_resume_stream_left_at_interrupted_has_its_result() -> None:
    # A plain store's resume saves the next checkpoint, then deletes the one it resumed,
    # and only then says Interrupted: leaving there stops nothing that was still to do.
    store = AwaitingPlainStore()
    runtime, agent, first, answer = await two_approvals_in_turn(store)
    assert first.checkpoint_id is not None
    with anyio.fail_after(GUARD):
        async with runtime.stream_resume(
            agent, checkpoint_id=first.checkpoint_id, response=answer
        ) as stream:
            interrupted = await read_to_interrupted(stream)
    assert stream.result.status == "interrupted"
    assert stream.result.checkpoint_id == interrupted.checkpoint_id
    assert list(store.data) == [interrupted.checkpoint_id]  # the old one is gone
    assert store.calls[-2:] == [
        f"save {interrupted.checkpoint_id}",
        f"delete {first.checkpoint_id}",
    ]


async def test_a_plain_store_that_cannot_delete_still_announces_the_saved_checkpoint() -> None:
    class Undeletable(AwaitingPlainStore):
        async def delete(self, checkpoint_id: str) -> None:
            await anyio.lowlevel.checkpoint()
            raise OSError("read-only file system")

    store = Undeletable()
    runtime, agent, first, answer = await two_approvals_in_turn(store)
    assert first.checkpoint_id is not None
    seen: list[StreamEvent] = []

    async def consume(checkpoint_id: str) -> None:
        async with runtime.stream_resume(
            agent, checkpoint_id=checkpoint_id, response=answer
        ) as stream:
            async for event in stream:
                seen.append(event)  # noqa: PERF401 - kept up to the error

    with anyio.fail_after(GUARD), pytest.raises(OSError, match="read-only"):
        await consume(first.checkpoint_id)
    # The run interrupted again and its checkpoint is saved: the consumer learned its id
    # before the error that kept the old one from being deleted.
    interrupted = [event for event in seen if isinstance(event, Interrupted)]
    assert [event.checkpoint_id for event in interrupted] == [
        cid for cid in store.data if cid != first.checkpoint_id
    ]


async def test_a_finished_stream_iterated_again_after_its_block_just_ends() -> None:
    async with Runtime().stream(Agent("a", "", ScriptedModel(["Hi."])), "go") as stream:
        events = [event async for event in stream]
    assert isinstance(events[-1], RunFinished)
    assert [] == [event async for event in stream]


@pytest.mark.parametrize("n_tools", [1, 2])
async def test_break_while_tools_run_cancels_them_before_the_block_exits(n_tools: int) -> None:
    blockers = [Blocker() for _ in range(n_tools)]
    tools = [tool(f"block{i}", b) for i, b in enumerate(blockers)]
    calls = [call(f"block{i}", id=f"b{i}") for i in range(n_tools)]
    model = StreamModel(
        [
            [
                *(ToolCallDelta(i, c.id, c.name, "{}") for i, c in enumerate(calls)),
                ModelResponse(Message.assistant("", calls)),
            ]
        ]
    )
    agent = Agent("a", "", model, tools=tools)
    started = 0
    with anyio.fail_after(GUARD):
        async with Runtime().stream(agent, "go") as stream:
            async for event in stream:
                if isinstance(event, ToolCallStarted):
                    started += 1
                    if started == n_tools:
                        for blocker in blockers:
                            await blocker.started.wait()
                        break
        assert [b.cancelled for b in blockers] == [True] * n_tools
    assert model.exited == 1


class Boom(Exception):
    pass


async def test_an_exception_in_the_loop_body_propagates_unwrapped_and_cancels_tools() -> None:
    blockers = [Blocker(), Blocker()]
    agent = Agent(
        "a",
        "",
        ScriptedModel([[call("b0"), call("b1")]]),
        tools=[tool("b0", blockers[0]), tool("b1", blockers[1])],
    )
    at_exit: list[list[bool]] = []

    async def consume() -> None:
        try:
            async with Runtime().stream(agent, "go") as stream:
                async for event in stream:
                    if isinstance(event, ToolCallStarted) and event.tool_call.name == "b1":
                        await blockers[0].started.wait()
                        await blockers[1].started.wait()
                        raise Boom("consumer failed")
        finally:
            at_exit.append([b.cancelled for b in blockers])

    with anyio.fail_after(GUARD), pytest.raises(Boom) as caught:
        await consume()
    assert type(caught.value) is Boom
    assert at_exit == [[True, True]]


async def test_an_exception_in_the_loop_body_closes_the_model_stream() -> None:
    model = StreamModel([text_turn("a", "b")], never_after_first())
    agent = Agent("a", "", model)
    at_exit: list[tuple[bool, int]] = []

    async def consume() -> None:
        try:
            async with Runtime().stream(agent, "go") as stream:
                async for _ in stream:
                    raise Boom("consumer failed")
        finally:
            at_exit.append((model.cancelled, model.exited))

    with anyio.fail_after(GUARD), pytest.raises(Boom) as caught:
        await consume()
    assert type(caught.value) is Boom
    assert at_exit == [(True, 1)]


async def test_cancelling_the_consumer_cancels_running_tools() -> None:
    blockers = [Blocker(), Blocker()]
    agent = Agent(
        "a",
        "",
        ScriptedModel([[call("b0"), call("b1")]]),
        tools=[tool("b0", blockers[0]), tool("b1", blockers[1])],
    )
    scope = anyio.CancelScope()
    at_exit: list[list[bool]] = []
    after_block: list[str] = []

    async def consume() -> None:
        with scope:
            try:
                async with Runtime().stream(agent, "go") as stream:
                    async for _ in stream:
                        pass
                after_block.append("ran")  # pragma: no cover - cancelled before this
            finally:
                at_exit.append([b.cancelled for b in blockers])

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            await blockers[0].started.wait()
            await blockers[1].started.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert at_exit == [[True, True]]
    assert after_block == []


async def test_cancelling_the_consumer_closes_the_model_stream() -> None:
    first_seen = anyio.Event()
    model = StreamModel([text_turn("a", "b")], never_after_first())
    agent = Agent("a", "", model)
    scope = anyio.CancelScope()
    at_exit: list[tuple[bool, int]] = []

    async def consume() -> None:
        with scope:
            try:
                async with Runtime().stream(agent, "go") as stream:
                    async for _ in stream:
                        first_seen.set()
            finally:
                at_exit.append((model.cancelled, model.exited))

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            await first_seen.wait()
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
    assert scope.cancelled_caught
    assert at_exit == [(True, 1)]


async def test_an_outer_cancellation_is_not_swallowed_by_the_stream() -> None:
    blocker = Blocker()
    agent = Agent("a", "", ScriptedModel([call("b")]), tools=[tool("b", blocker)])
    reached_end = False
    with anyio.fail_after(GUARD):
        with anyio.CancelScope() as outer:
            async with Runtime().stream(agent, "go") as stream:
                async for event in stream:
                    if isinstance(event, ToolCallStarted):
                        await blocker.started.wait()
                        outer.cancel()
                        await anyio.lowlevel.checkpoint()
            reached_end = True  # pragma: no cover - the cancellation must propagate
    assert outer.cancelled_caught
    assert not reached_end
    assert blocker.cancelled


async def _fail_once_the_tool_runs(agent: Agent, blocker: Blocker, cancel: Any) -> None:
    """Stream *agent*'s run; once its tool runs, call *cancel*, then raise in the block."""
    async with Runtime().stream(agent, "go") as stream:
        async for event in stream:
            if isinstance(event, ToolCallStarted):
                await blocker.started.wait()
                cancel()
                raise ValueError("client gone")


async def test_an_error_of_the_block_is_not_lost_to_a_cancellation_around_it() -> None:
    # The block raises while a scope around it is cancelled (a web client that went away:
    # the send fails, and the request's scope is cancelled): waiting for the run's task
    # meets the cancellation, but the block's error goes on, as from a task group, and the
    # cancellation is not lost either: it comes again at the next checkpoint.
    blocker = Blocker()
    agent = Agent("a", "", ScriptedModel([call("b")]), tools=[tool("b", blocker)])
    caught: list[ValueError] = []
    reached_end = False
    with anyio.fail_after(GUARD):
        with anyio.CancelScope() as outer:
            try:
                await _fail_once_the_tool_runs(agent, blocker, outer.cancel)
            except ValueError as exc:
                caught.append(exc)
            await anyio.lowlevel.checkpoint()
            reached_end = True  # pragma: no cover - the cancellation must come again
    assert [str(exc) for exc in caught] == ["client gone"]
    assert outer.cancelled_caught
    assert not reached_end
    assert blocker.cancelled


async def test_a_native_cancellation_meeting_an_error_of_the_block_still_comes_out(
    anyio_backend: str,
) -> None:
    # asyncio's own Task.cancel() comes only once: if waiting for the run's task meets it
    # while the block raises, it is raised (the block's error as its context), never
    # dropped. (On trio the same test cancels a scope: that comes again, so the error goes
    # first and the scope then catches its cancellation.)
    from test_exactly_once import _NativeCancel

    blocker = Blocker()
    agent = Agent("a", "", ScriptedModel([call("b")]), tools=[tool("b", blocker)])
    native = _NativeCancel(anyio_backend)
    raised: list[BaseException] = []

    async def consume() -> None:
        try:
            await _fail_once_the_tool_runs(agent, blocker, native.cancel)
        except BaseException as exc:
            raised.append(exc)
            raise

    with anyio.fail_after(GUARD):
        with contextlib.suppress(ValueError):
            await native.run(consume)
    if anyio_backend == "asyncio":
        assert native.cancelled
        assert isinstance(raised[0], anyio.get_cancelled_exc_class())
        assert isinstance(raised[0].__context__, ValueError)
    else:
        assert isinstance(raised[0], ValueError)
    assert blocker.cancelled


async def test_a_consumer_shielded_from_an_outer_cancellation_sees_the_run_end_quietly() -> None:
    # The scope around the block is cancelled while the consumer reads on inside a shield
    # (clean-up code draining the stream): the run stops as cancelled, and iterating ends
    # without an error of its own; the outer cancellation takes over once the shield ends.
    blocker = Blocker()
    agent = Agent("a", "", ScriptedModel([call("b")]), tools=[tool("b", blocker)])
    seen: list[type[StreamEvent]] = []
    drained = False
    with anyio.fail_after(GUARD):
        with anyio.CancelScope() as outer:
            async with Runtime().stream(agent, "go") as stream:
                with anyio.CancelScope(shield=True):
                    async for event in stream:
                        seen.append(type(event))
                        if isinstance(event, ToolCallStarted):
                            await blocker.started.wait()
                            outer.cancel()
                    drained = True
                    with pytest.raises(RunletError, match="the run was cancelled before"):
                        stream.result  # noqa: B018 - the property raises
    # (Whether the outer scope then catches a cancellation depends on the backend: the
    # block's exit need not yield on asyncio once the run's task has ended.)
    assert drained
    assert blocker.cancelled
    assert RunFinished not in seen


async def test_a_model_error_is_raised_from_the_loop_unwrapped() -> None:
    cause = RuntimeError("connection reset")
    model = StreamModel([[TextDelta("Hel"), cause]])
    agent = Agent("a", "", model)
    events: list[StreamEvent] = []
    with pytest.raises(ModelError) as caught:
        await collect_into(events, Runtime(), agent)
    assert type(caught.value) is ModelError
    assert caught.value.__cause__ is cause
    assert "connection reset" in str(caught.value)
    assert events == [TextDelta("Hel")]
    assert model.exited == 1


async def test_a_failing_complete_only_model_is_raised_as_model_error() -> None:
    agent = Agent("a", "", FailingModel())
    stream = Runtime().stream(agent, "go")
    events: list[StreamEvent] = []

    async def consume() -> None:
        async with stream:
            events.extend([event async for event in stream])

    with anyio.fail_after(GUARD), pytest.raises(ModelError) as caught:
        await consume()
    assert type(caught.value) is ModelError
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert events == []
    with pytest.raises(RunletError, match="the run failed"):
        stream.result  # noqa: B018 - the property raises


async def test_an_exhausted_script_is_raised_from_the_loop() -> None:
    agent = Agent("a", "", ScriptedModel([call("echo")]), tools=[tool("echo", echo)])
    events: list[StreamEvent] = []
    with pytest.raises(runlet.testing.ScriptExhaustedError):
        await collect_into(events, Runtime(), agent)
    assert kinds(events) == [ToolCallDelta, MessageCompleted, ToolCallStarted, ToolCallFinished]


async def test_a_run_error_other_than_the_model_is_raised_unwrapped() -> None:
    agent = Agent(
        "a",
        "",
        ScriptedModel([call("gated")]),
        tools=[tool("gated", echo, requires_approval=True)],
    )
    with pytest.raises(runlet.CheckpointStoreRequiredError) as caught:
        await collect_into([], Runtime(), agent)
    assert type(caught.value) is runlet.CheckpointStoreRequiredError


class NotAResponseModel:
    async def complete(self, request: ModelRequest) -> ModelResponse:
        return "hello"  # type: ignore[return-value]  # the bug under test


def duplicate_ids() -> StreamModel:
    calls = [call("e", id="x"), call("e", id="x")]
    return StreamModel([[ModelResponse(Message.assistant("", calls))]])


@pytest.mark.parametrize(
    ("make_model", "match"),
    [
        (NotAResponseModel, "must return a ModelResponse"),
        (
            lambda: StreamModel([[ModelResponse(Message.user("hi"))]]),
            "answered with a 'user' message",
        ),
        (duplicate_ids, "same id"),
        (
            lambda: StreamModel([["Hel", *text_turn("Hello")]]),  # type: ignore[list-item]
            "yielded a str as an item",
        ),
        (
            lambda: StreamModel([[*text_turn("Hello"), TextDelta("!")]]),
            "yielded a TextDelta after its final ModelResponse",
        ),
        (
            lambda: StreamModel([[*text_turn("Hello"), *text_turn("Again")]]),
            "yielded a TextDelta after its final ModelResponse",
        ),
        (
            lambda: StreamModel([[*text_turn("Hello"), ModelResponse(Message.assistant("No"))]]),
            "yielded a ModelResponse after its final ModelResponse",
        ),
    ],
    ids=[
        "not-a-response",
        "not-assistant",
        "duplicate-ids",
        "not-an-item",
        "delta-after-the-end",
        "second-response",
        "two-final-responses",
    ],
)
async def test_an_unusable_model_answer_is_raised_from_the_loop(
    make_model: Callable[[], Any], match: str
) -> None:
    agent = Agent("a", "", make_model(), tools=[tool("e", echo)])
    with pytest.raises(runlet.ModelResponseError, match=match) as caught:
        await collect_into([], Runtime(), agent)
    assert type(caught.value) is runlet.ModelResponseError


async def test_max_turns_ends_a_runaway_stream() -> None:
    agent = Agent("a", "", ScriptedModel(lambda request: call("echo")), tools=[tool("echo", echo)])
    events: list[StreamEvent] = []
    with pytest.raises(runlet.MaxTurnsExceededError) as caught:
        await collect_into(events, Runtime(max_turns=2), agent)
    assert type(caught.value) is runlet.MaxTurnsExceededError
    assert kinds(events).count(MessageCompleted) == 2


async def test_a_stream_must_be_entered_once_and_iterated_inside() -> None:
    agent = Agent("a", "", ScriptedModel(["hi"]))
    stream = Runtime().stream(agent, "go")
    with pytest.raises(RunletError, match="inside `async with"):
        await stream.__anext__()
    with anyio.fail_after(GUARD):
        async with stream:
            with pytest.raises(RunletError, match="entered only once"):
                await stream.__aenter__()
            events = [event async for event in stream]
    assert events[-1] == RunFinished(stream.result)
    # Once the block has exited, iterating again simply ends.
    assert [event async for event in stream] == []


# --- 6. backpressure ------------------------------------------------------------------


async def test_a_slow_consumer_makes_the_run_wait_instead_of_buffering() -> None:
    total = 10 * STREAM_BUFFER_SIZE
    chunks = [f"{i} " for i in range(total)]
    model = StreamModel([text_turn(*chunks)])
    agent = Agent("a", "", model)
    with anyio.fail_after(GUARD):
        async with Runtime().stream(agent, "go") as stream:
            await anyio.wait_all_tasks_blocked()
            # The run has filled the buffer and waits for us (plus the delta it holds).
            produced_before_reading = model.produced
            received = [event.text async for event in stream if isinstance(event, TextDelta)]
    assert STREAM_BUFFER_SIZE <= produced_before_reading <= STREAM_BUFFER_SIZE + 2
    assert received == chunks
    assert stream.result.output == "".join(chunks)
    assert model.produced == total + 1


# --- 7. tool events for parallel, unknown and failing calls ---------------------------


async def test_every_call_gets_started_and_finished_events() -> None:
    calls = [
        call("echo", n=1, id="ok"),
        call("nope", id="unknown"),
        call("explode", id="fails"),
        call("echo", n="not an int", id="bad_args"),
        call("echo", n=2, id="ok2"),
    ]
    agent = script_agent([calls, "Done."], chunk_size=3)
    events, result = await collect(Runtime(), agent)

    started = [e.tool_call for e in events if isinstance(e, ToolCallStarted)]
    finished = {e.tool_call.id: e for e in events if isinstance(e, ToolCallFinished)}
    assert sorted(c.id for c in started) == sorted(c.id for c in calls)
    assert set(finished) == {c.id for c in calls}
    for tool_call in calls:
        assert events.index(ToolCallStarted(tool_call)) < events.index(finished[tool_call.id])
        assert finished[tool_call.id].tool_call == tool_call
    errors = {i: finished[i].result.is_error for i in finished}
    assert errors == {"ok": False, "unknown": True, "fails": True, "bad_args": True, "ok2": False}
    assert "nope" in finished["unknown"].result.content
    assert "disk full" in finished["fails"].result.content
    assert "echo" in finished["bad_args"].result.content
    results = [m.tool_result for m in result.transcript if m.tool_result is not None]
    assert results == [finished[c.id].result for c in calls]
    assert result.output == "Done."


def test_stream_buffer_size_is_positive() -> None:
    assert isinstance(STREAM_BUFFER_SIZE, int)
    assert STREAM_BUFFER_SIZE > 0


async def test_a_model_without_stream_hands_out_its_reasoning_before_its_text() -> None:
    from runlet import ReasoningDelta, ReasoningPart

    # A redacted part has no text to hand out: it gets no (empty) delta.
    redacted = ReasoningPart(redacted_data="opaque", provider="anthropic")
    thought = Message("assistant", "42.", reasoning=(redacted, ReasoningPart("Six times seven.")))
    model = CompleteOnlyModel([ModelResponse(thought)])
    events, result = await collect(Runtime(), Agent("a", "", model))

    assert [ReasoningDelta("Six times seven."), TextDelta("42.")] == [
        e for e in events if isinstance(e, (ReasoningDelta, TextDelta))
    ]
    assert "42." == result.output


async def test_a_scripted_model_streams_its_reasoning_before_its_text() -> None:
    from runlet import ReasoningDelta, ReasoningPart

    thought = Message("assistant", "42.", reasoning=(ReasoningPart("Six times seven."),))
    model = ScriptedModel([thought], chunk_size=8)
    events, result = await collect(Runtime(), Agent("a", "", model))

    assert [ReasoningDelta("Six time"), ReasoningDelta("s seven."), TextDelta("42.")] == [
        e for e in events if isinstance(e, (ReasoningDelta, TextDelta))
    ]
    assert thought == result.transcript[-1]


async def test_the_model_s_own_item_generator_is_closed_before_the_block_exits() -> None:
    # A model whose items come from an async generator holding the connection: when the
    # consumer stops early, the generator must be closed then, not by the collector.
    log: list[str] = []

    class GeneratorModel:
        async def complete(self, request: ModelRequest) -> ModelResponse:
            raise AssertionError("streamed")

        @asynccontextmanager
        async def stream(
            self, request: ModelRequest
        ) -> AsyncIterator[AsyncIterator[ModelStreamItem]]:
            yield self._items()

        async def _items(self) -> AsyncIterator[ModelStreamItem]:
            log.append("opened")
            try:
                for _ in range(3):
                    yield TextDelta("more ")
                yield ModelResponse(Message.assistant("more more more "))
            finally:
                log.append("closed")

    agent = Agent("a", "", GeneratorModel())
    async with Runtime().stream(agent, "Go.") as stream:
        async for event in stream:
            assert isinstance(event, TextDelta)
            break
    assert ["opened", "closed"] == log
