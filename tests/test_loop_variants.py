"""Event-loop variants and context variables, as an application on asyncio (FastAPI) or
trio meets them: asyncio's eager task factory and debug mode give the same runs as the
default loop; tools and models see the caller's context variables, on both backends,
and what a tool handler sets in one stays in that call; one runtime and one store serve
event loops of both backends in turn."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import inspect
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from runlet import (
    Agent,
    HumanResponse,
    InMemoryCheckpointStore,
    ModelRequest,
    ModelResponse,
    RunResult,
    Runtime,
    ToolContext,
    ToolSpec,
)
from runlet._util import in_own_context
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call

OBJECT: dict[str, Any] = {"type": "object"}

#: What an application keeps per request (a request id, a tenant, a tracing baggage).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


class Seen:
    """What tools and the model saw of REQUEST_ID, in order."""

    def __init__(self) -> None:
        self.tools: list[tuple[str, str]] = []  # (tool, request id)
        self.model: list[str] = []


class ContextModel:
    """A custom model adapter (not a ScriptedModel) that notes REQUEST_ID per request."""

    def __init__(self, script: list[Any], seen: Seen) -> None:
        self._inner = ScriptedModel(script)
        self._seen = seen

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self._seen.model.append(REQUEST_ID.get())
        return await self._inner.complete(request)


def tools(seen: Seen) -> tuple[ToolSpec, ...]:
    async def note(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.tools.append(("note", REQUEST_ID.get()))
        await anyio.lowlevel.checkpoint()
        return "noted"

    def note_sync(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.tools.append(("note_sync", REQUEST_ID.get()))  # in a worker thread
        return "noted"

    async def meddle(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.tools.append(("meddle", REQUEST_ID.get()))
        REQUEST_ID.set("set by meddle")
        await anyio.lowlevel.checkpoint()
        return "meddled"

    def meddle_sync(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.tools.append(("meddle_sync", REQUEST_ID.get()))
        REQUEST_ID.set("set by meddle_sync")
        return "meddled"

    def meddling_policy(arguments: Mapping[str, Any], context: ToolContext) -> bool:
        REQUEST_ID.set("set by a policy")
        return False

    return (
        ToolSpec("note", "Note.", OBJECT, note),
        ToolSpec("note_sync", "Note.", OBJECT, note_sync),
        ToolSpec("gated_note", "Note.", OBJECT, note, requires_approval=True),
        ToolSpec("meddle", "Meddle.", OBJECT, meddle),
        ToolSpec("meddle_sync", "Meddle.", OBJECT, meddle_sync),
        ToolSpec("gated_meddle", "Meddle.", OBJECT, meddle, requires_approval=True),
        ToolSpec("policed", "Note.", OBJECT, note, requires_approval=meddling_policy),
    )


def agent(script: list[Any], seen: Seen) -> Agent:
    return Agent("context", "Be exact.", ContextModel(script, seen), tools(seen))


def approve(result: RunResult) -> list[HumanResponse]:
    return [HumanResponse(request_id=r.id, action="approve") for r in result.pending_requests]


# -- Context variables, on both backends ------------------------------------------------


@pytest.mark.anyio
class TestContextVariables:
    @pytest.mark.parametrize(
        "calls",
        [["note"], ["note_sync"], ["note", "note", "note_sync"]],
        ids=["async", "sync", "side-by-side"],
    )
    async def test_tools_and_the_model_see_the_callers_context(self, calls: list[str]) -> None:
        seen = Seen()
        token = REQUEST_ID.set("req-1")
        try:
            result = await Runtime().run(agent([[call(n) for n in calls], "Done."], seen), "Go")
        finally:
            REQUEST_ID.reset(token)
        assert result.output == "Done."
        assert sorted(seen.tools) == sorted((name, "req-1") for name in calls)
        assert seen.model == ["req-1", "req-1"]

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    async def test_a_resume_runs_in_its_own_callers_context(
        self, kind: str, tmp_path: Path
    ) -> None:
        # The request that answers is not the one that started the run: the approved
        # handler and the model see the answering request's id.
        seen = Seen()
        store = (
            InMemoryCheckpointStore()
            if kind == "memory"
            else SQLiteCheckpointStore(tmp_path / "c.db")
        )
        script = [[call("gated_note"), call("note"), call("note_sync")], [call("note")], "Done."]
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(store, SQLiteCheckpointStore):
                await stack.enter_async_context(store)
            runtime = Runtime(checkpoint_store=store)
            token = REQUEST_ID.set("req-start")
            try:
                first = await runtime.run(agent(script, seen), "Go")
            finally:
                REQUEST_ID.reset(token)
            token = REQUEST_ID.set("req-answer")
            try:
                result = await runtime.resume(
                    agent(script[1:], seen),
                    checkpoint_id=first.checkpoint_id or "",
                    responses=approve(first),
                )
            finally:
                REQUEST_ID.reset(token)
        assert first.status == "interrupted"
        assert result.output == "Done."
        assert sorted(seen.tools[:2]) == [("note", "req-start"), ("note_sync", "req-start")]
        assert seen.tools[2:] == [("note", "req-answer"), ("note", "req-answer")]
        assert seen.model == ["req-start", "req-answer", "req-answer"]

    async def test_a_stream_runs_in_the_context_of_the_stream_call(self) -> None:
        # As docs/streaming.md says: the context of the stream() call, wherever the block
        # is entered; what the consumer sets between events does not reach later tools.
        seen = Seen()
        store = InMemoryCheckpointStore()
        runtime = Runtime(checkpoint_store=store)
        script = [call("note"), call("gated_note"), call("note"), "Done."]
        token = REQUEST_ID.set("req-stream")
        try:
            stream = runtime.stream(agent(script, seen), "Go")
            REQUEST_ID.set("req-entered")
            async with stream:
                async for event in stream:
                    REQUEST_ID.set(f"req-consumer-{type(event).__name__}")
            assert REQUEST_ID.get() == "req-consumer-RunFinished"  # the stream set nothing
            REQUEST_ID.set("req-answer")
            interrupted = stream.result
            again = runtime.stream_resume(
                agent(script[2:], seen),
                checkpoint_id=interrupted.checkpoint_id or "",
                responses=approve(interrupted),
            )
            REQUEST_ID.set("req-entered-again")
            async with again:
                async for event in again:
                    REQUEST_ID.set(f"req-consumer-{type(event).__name__}")
        finally:
            REQUEST_ID.reset(token)
        assert again.result.output == "Done."
        assert seen.tools == [
            ("note", "req-stream"),
            ("note", "req-answer"),
            ("note", "req-answer"),
        ]
        assert seen.model == ["req-stream", "req-stream", "req-answer", "req-answer"]

    @pytest.mark.parametrize(
        "calls",
        [["meddle"], ["meddle_sync"], ["meddle", "meddle_sync"], ["policed"]],
        ids=["one-async", "one-sync", "side-by-side", "approval-policy"],
    )
    async def test_what_a_handler_sets_stays_in_its_call(self, calls: list[str]) -> None:
        # The same whether the model made one call or several in its turn, and whether
        # the handler is async or sync: neither the caller of run(), nor the model, nor a
        # later tool sees it. (One async call used to run in the caller's own context.)
        seen = Seen()
        token = REQUEST_ID.set("req-1")
        try:
            script = [[call(n) for n in calls], call("note"), "Done."]
            result = await Runtime().run(agent(script, seen), "Go")
            after = REQUEST_ID.get()
        finally:
            REQUEST_ID.reset(token)
        assert result.output == "Done."
        assert after == "req-1"
        assert seen.model == ["req-1", "req-1", "req-1"]
        assert seen.tools[-1] == ("note", "req-1")

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    async def test_what_an_approved_handler_sets_stays_in_its_call(
        self, kind: str, tmp_path: Path
    ) -> None:
        seen = Seen()
        store = (
            InMemoryCheckpointStore()
            if kind == "memory"
            else SQLiteCheckpointStore(tmp_path / "c.db")
        )
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(store, SQLiteCheckpointStore):
                await stack.enter_async_context(store)
            runtime = Runtime(checkpoint_store=store)
            first = await runtime.run(agent([call("gated_meddle")], seen), "Go")
            token = REQUEST_ID.set("req-answer")
            try:
                result = await runtime.resume(
                    agent([call("note"), "Done."], seen),
                    checkpoint_id=first.checkpoint_id or "",
                    responses=approve(first),
                )
                after = REQUEST_ID.get()
            finally:
                REQUEST_ID.reset(token)
        assert result.output == "Done."
        assert after == "req-answer"
        assert seen.tools == [("meddle", "req-answer"), ("note", "req-answer")]
        assert seen.model[1:] == ["req-answer", "req-answer"]

    async def test_a_handler_keeps_its_own_context_across_awaits_and_in_its_tasks(
        self,
    ) -> None:
        # What a handler sets, it reads back after waiting, its own tasks and worker
        # threads inherit, and a token resets it: one context for the whole call.
        found: list[str] = []

        async def own(arguments: Mapping[str, Any], context: ToolContext) -> str:
            token = REQUEST_ID.set("inner")
            await anyio.lowlevel.checkpoint()
            found.append(REQUEST_ID.get())

            async def child() -> None:
                found.append(REQUEST_ID.get())

            async with anyio.create_task_group() as group:
                group.start_soon(child)
            found.append(await anyio.to_thread.run_sync(REQUEST_ID.get))
            REQUEST_ID.reset(token)
            await anyio.lowlevel.checkpoint()
            found.append(REQUEST_ID.get())
            return "ok"

        tool = ToolSpec("own", "Own.", OBJECT, own)
        token = REQUEST_ID.set("outer")
        try:
            model = ScriptedModel([call("own"), "Done."])
            result = await Runtime().run(Agent("a", "b", model, (tool,)), "Go")
        finally:
            REQUEST_ID.reset(token)
        assert result.output == "Done."
        assert found == ["inner", "inner", "inner", "outer"]

    async def test_a_handler_that_fails_or_is_cancelled_after_setting_its_context(
        self,
    ) -> None:
        # Errors and cancellation pass through the handler's own context as before.
        async def fails(arguments: Mapping[str, Any], context: ToolContext) -> str:
            REQUEST_ID.set("failing")
            await anyio.lowlevel.checkpoint()
            raise KeyError("gone")

        async def waits(arguments: Mapping[str, Any], context: ToolContext) -> str:
            REQUEST_ID.set("waiting")
            scope.cancel()
            await anyio.sleep_forever()
            raise AssertionError("not reached")  # pragma: no cover

        model = ScriptedModel([call("fails"), "Done.", call("waits")])
        runlet_agent = Agent(
            "a",
            "b",
            model,
            (ToolSpec("fails", "F.", OBJECT, fails), ToolSpec("waits", "W.", OBJECT, waits)),
        )
        token = REQUEST_ID.set("outer")
        try:
            result = await Runtime().run(runlet_agent, "Go")
            assert REQUEST_ID.get() == "outer"
            with anyio.CancelScope() as scope:
                await Runtime().run(runlet_agent, "Go")
            assert scope.cancelled_caught
            assert REQUEST_ID.get() == "outer"
        finally:
            REQUEST_ID.reset(token)
        assert result.transcript[2].content == "Tool 'fails' failed: KeyError: 'gone'"


# -- A handler in its own context awaits as a plain await does --------------------------


class _ReadyAtOnce:
    """An awaitable whose ``__await__`` is a plain iterator, which ``await`` allows."""

    def __await__(self) -> Any:
        return iter(())


class _Landed(Exception):
    """Stands for an exception that lands in the trampoline's own frame between two
    steps of a handler, as trio's KeyboardInterrupt can."""


@pytest.mark.anyio
class TestOwnContextAwaits:
    async def test_an_awaitable_whose_await_is_a_plain_iterator(self) -> None:
        def returns_one(arguments: Mapping[str, Any], context: ToolContext) -> Any:
            return _ReadyAtOnce()  # a plain function may return an awaitable

        async def awaits_one(arguments: Mapping[str, Any], context: ToolContext) -> str:
            await _ReadyAtOnce()
            return "awaited"

        tools = (
            ToolSpec("plain", "P.", OBJECT, returns_one),
            ToolSpec("a", "A.", OBJECT, awaits_one),
        )
        model = ScriptedModel([call("plain"), call("a"), "Done."])
        result = await Runtime().run(Agent("a", "b", model, tools), "Go")
        assert [m.content for m in result.transcript if m.role == "tool"] == ["null", "awaited"]

    async def test_a_cancelled_handler_leaves_no_exception_in_a_cycle(self) -> None:
        # trio sends a waiting task its cancellation as an outcome object; kept in the
        # trampoline's frame, it tied the exception, its traceback and the frame in a
        # cycle that only the garbage collector frees. A plain await leaves none.
        async def cancelled(wrap: bool) -> None:
            for _ in range(5):
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    waiting = anyio.sleep_forever()
                    await (in_own_context(waiting) if wrap else waiting)

        def raised_here(exc: BaseException) -> bool:
            trace = exc.__traceback__
            while trace is not None:
                if trace.tb_frame.f_code is cancelled.__code__:
                    return True
                trace = trace.tb_next
            return False

        async def cyclic_exceptions(wrap: bool) -> int:
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                await cancelled(wrap)
                gc.collect()
                # Only this test's exceptions: garbage of other tests' leftovers (a task
                # finishing on the shared loop meanwhile) may be collected here too.
                return sum(
                    isinstance(found, BaseException) and raised_here(found) for found in gc.garbage
                )
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()

        assert await cyclic_exceptions(True) == await cyclic_exceptions(False)

    async def test_an_exception_between_two_steps_runs_the_handlers_clean_up(self) -> None:
        log: list[str] = []

        async def handler() -> None:
            try:
                await anyio.lowlevel.checkpoint()
                await anyio.lowlevel.checkpoint()
            finally:
                log.append("cleaned up")

        code = in_own_context.__code__
        lines, first = inspect.getsourcelines(code)
        # The line that sends the next step: an exception lands just before it runs.
        target = first + next(n for n, line in enumerate(lines) if "run(steps.send, value)" in line)
        armed = [True]

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and frame.f_lineno == target and armed[0]:
                armed[0] = False
                raise _Landed
            return local

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            return local if frame.f_code is code else None

        before = sys.gettrace()  # coverage's, when it measures
        sys.settrace(tracer)
        landed: list[list[str]] = []
        try:
            await in_own_context(handler())
        except _Landed:
            # Checked while the exception, and so the trampoline's frame, is alive: not
            # when the frame goes and the suspended handler is collected with it.
            landed.append(list(log))
        finally:
            sys.settrace(before)
        assert landed == [["cleaned up"]]


# -- asyncio's eager task factory and debug mode ----------------------------------------


def _eager_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
    return loop


EAGER = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="asyncio.eager_task_factory is new in Python 3.12"
)
ASYNCIO_VARIANTS = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param(("asyncio", {"debug": True}), id="asyncio-debug"),
        pytest.param(("asyncio", {"loop_factory": _eager_loop}), id="asyncio-eager", marks=EAGER),
        pytest.param(
            ("asyncio", {"loop_factory": _eager_loop, "debug": True}),
            id="asyncio-eager-debug",
            marks=EAGER,
        ),
    ],
)


@pytest.mark.anyio
@ASYNCIO_VARIANTS
async def test_runs_resumes_streams_and_deadlines_on_asyncio_variants(
    anyio_backend: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The eager task factory (the first step of a task runs in start_soon) and debug
    mode give the results of the default loop: no hang, no task left, nothing logged
    by asyncio ("Task was destroyed but it is pending", a non-thread-safe call), no
    warning (made errors: "coroutine was never awaited", an unclosed connection)."""
    loop = asyncio.get_running_loop()
    loop.slow_callback_duration = 60.0  # a busy machine is no finding
    tasks_before = asyncio.all_tasks()
    caplog.set_level(logging.WARNING, logger="asyncio")
    seen = Seen()
    memory = InMemoryCheckpointStore()
    async with SQLiteCheckpointStore(tmp_path / "c.db", lease=30.0) as sqlite:
        for store in (memory, sqlite):
            runtime = Runtime(checkpoint_store=store)
            # One call, calls side by side, an interruption and a resume.
            result = await runtime.run(agent([call("note"), "One."], seen), "Go")
            assert result.output == "One."
            script = [[call("note"), call("note_sync"), call("gated_note")], [call("note")], "Two."]
            first = await runtime.run(agent(script, seen), "Go")
            assert first.status == "interrupted"
            answers = approve(first)
            result = await runtime.resume(
                agent(script[1:], seen), checkpoint_id=first.checkpoint_id or "", responses=answers
            )
            assert result.output == "Two."
            # A stream to its interruption, a stream_resume left early (the run stops,
            # the checkpoint stays resumable), then a resume to the end.
            script = [call("note"), call("gated_note"), [call("note"), call("note")], "Three."]
            async with runtime.stream(agent(script, seen), "Go") as stream:
                kinds = [type(event).__name__ async for event in stream]
            assert kinds[-2:] == ["Interrupted", "RunFinished"]
            interrupted = stream.result
            async with runtime.stream_resume(
                agent(script[2:], seen),
                checkpoint_id=interrupted.checkpoint_id or "",
                responses=approve(interrupted),
            ) as stream:
                async for event in stream:
                    if type(event).__name__ == "ToolCallFinished":
                        break
            await _a_deadline_passes_during_a_resume(runtime)
    del stream, runtime
    gc.collect()
    await anyio.lowlevel.checkpoint()
    assert asyncio.all_tasks() <= tasks_before  # none left behind
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert {name for name, _ in seen.tools} == {"note", "note_sync"}


async def _a_deadline_passes_during_a_resume(runtime: Runtime) -> None:
    """A deadline passes while an approved handler waits: the resume is cancelled, the
    checkpoint stays resumable, and is resumed to the end (the tool is idempotent)."""
    waited = anyio.Event()

    async def waits(arguments: Mapping[str, Any], context: ToolContext) -> str:
        if not waited.is_set():
            waited.set()
            deadline.deadline = anyio.current_time()  # the deadline passes now
            await anyio.sleep_forever()
        return "waited"

    slow = ToolSpec("slow", "S.", OBJECT, waits, requires_approval=True, idempotent=True)
    slow_agent = Agent("slow", "S.", ScriptedModel([call("slow"), "Four.", "Four."]), (slow,))
    first = await runtime.run(slow_agent, "Go")
    with anyio.move_on_after(60) as deadline:
        await runtime.resume(
            slow_agent, checkpoint_id=first.checkpoint_id or "", responses=approve(first)
        )
    assert deadline.cancelled_caught
    assert runtime.checkpoint_store is not None
    state = await runtime.checkpoint_store.get(first.checkpoint_id or "")  # type: ignore[attr-defined]
    assert state.status == "pending"
    with anyio.fail_after(60):
        result = await runtime.resume(
            slow_agent, checkpoint_id=first.checkpoint_id or "", responses=approve(first)
        )
    assert result.output == "Four."


@pytest.mark.anyio
@ASYNCIO_VARIANTS
async def test_context_variables_on_asyncio_variants(anyio_backend: Any) -> None:
    # The eager task factory runs a task's first step inside start_soon(): calls side by
    # side and a stream's task still see the caller's context, and set nothing in it.
    seen = Seen()
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
    token = REQUEST_ID.set("req-eager")
    try:
        script = [[call("meddle"), call("note"), call("meddle_sync")], call("meddle"), "Done."]
        result = await runtime.run(agent(script, seen), "Go")
        assert REQUEST_ID.get() == "req-eager"
        async with runtime.stream(agent(script, seen), "Go") as stream:
            async for _ in stream:
                pass
        assert REQUEST_ID.get() == "req-eager"
    finally:
        REQUEST_ID.reset(token)
    assert result.output == stream.result.output == "Done."
    assert {request_id for _, request_id in seen.tools} == {"req-eager"}
    assert set(seen.model) == {"req-eager"}


# -- One runtime and store, several event loops in turn ----------------------------------

#: Built at import time, outside any event loop, as an application module would.
IMPORT_TIME_STORE = InMemoryCheckpointStore()
IMPORT_TIME_RUNTIME = Runtime(checkpoint_store=IMPORT_TIME_STORE)


def test_one_runtime_and_store_serve_asyncio_twice_then_trio(tmp_path: Path) -> None:
    # asyncio.run() per command, then trio.run(), with the import-time runtime and a
    # SQLite store built outside any loop (entered in each): each run interrupts in one
    # loop and is resumed in the next; every approved handler runs once.
    seen = Seen()
    sqlite = SQLiteCheckpointStore(tmp_path / "c.db")
    runtimes = {"memory": IMPORT_TIME_RUNTIME, "sqlite": Runtime(checkpoint_store=sqlite)}
    script = [[call("gated_note"), call("note"), call("note_sync")], call("note"), "Done."]
    pending: dict[str, RunResult] = {}
    done: list[str | None] = []

    async def step(number: int) -> None:
        async with sqlite:
            for kind, runtime in runtimes.items():
                if kind in pending:
                    interrupted = pending.pop(kind)
                    async with runtime.stream_resume(
                        agent(script[1:], seen),
                        checkpoint_id=interrupted.checkpoint_id or "",
                        responses=approve(interrupted),
                    ) as stream:
                        async for _ in stream:
                            pass
                    done.append(stream.result.output)
                if number < 3:
                    pending[kind] = await runtime.run(agent(script, seen), "Go")

    asyncio.run(step(1))
    asyncio.run(step(2))
    anyio.run(step, 3, backend="trio")
    assert done == ["Done."] * 4
    assert not pending
    assert len(seen.tools) == 4 * 4  # two turns of three calls and one, per run
