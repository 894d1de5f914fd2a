"""The model → tool → result loop (DESIGN.md loop semantics 1 and 3), on both backends."""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from runlet import (
    Agent,
    ConfigurationError,
    HumanResponse,
    InMemoryCheckpointStore,
    MaxTurnsExceededError,
    Message,
    ModelAPIError,
    ModelError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    RunletError,
    Runtime,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    Usage,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

OBJECT = {"type": "object"}
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


async def add(arguments: Mapping[str, Any], context: ToolContext) -> int:
    return int(arguments["a"]) + int(arguments["b"])


def tool(name: str, handler: Any, schema: Mapping[str, Any] = OBJECT, **kwargs: Any) -> ToolSpec:
    return ToolSpec(name, f"The {name} tool.", schema, handler, **kwargs)


def agent(model: Any, *tools: ToolSpec) -> Agent:
    return Agent("tester", "Be exact.", model, tools)


def tool_messages(transcript: tuple[Message, ...]) -> list[ToolResult]:
    return [m.tool_result for m in transcript if m.tool_result is not None]


class TestRun:
    async def test_text_answer_completes_the_run(self) -> None:
        model = ScriptedModel(["Hello."])
        result = await Runtime().run(agent(model), "Hi")
        assert result.status == "completed"
        assert result.output == "Hello."
        assert result.interruption is None
        assert result.checkpoint_id is None
        assert [m.role for m in result.transcript] == ["user", "assistant"]
        assert result.usage == Usage(requests=1)
        assert result.run_id.startswith("run_")

    async def test_an_interruption_gets_ids_of_96_random_bits_each(self) -> None:
        # A one-call interruption reads both its ids from the OS at once; each is its own.
        store = InMemoryCheckpointStore()
        model = ScriptedModel([call("gated", {})] * 2)
        runtime = Runtime(checkpoint_store=store)
        tester = agent(model, tool("gated", add, requires_approval=True))

        first = await runtime.run(tester, "Hi")
        second = await runtime.run(tester, "Hi")

        ids = [
            (r.interruption.id, r.checkpoint_id or "")
            for r in (first, second)
            if r.interruption is not None
        ]
        assert [(r[:4], c[:3]) for r, c in ids] == [("req_", "cp_")] * 2
        hexes = [text.split("_")[1] for pair in ids for text in pair]
        assert all(len(h) == 24 and int(h, 16) >= 0 for h in hexes)
        assert len(set(hexes)) == 4

    async def test_tool_call_result_goes_back_to_the_model(self) -> None:
        model = ScriptedModel([call("add", a=2, b=3, id="c1"), "It is 5."])
        result = await Runtime().run(agent(model, tool("add", add, ADD_SCHEMA)), "2+3?")
        assert result.output == "It is 5."
        assert tool_messages(result.transcript) == [ToolResult("c1", "5")]
        second = model.requests[1]
        assert second.messages[-1] == Message.tool(ToolResult("c1", "5"))
        assert second.instructions == "Be exact."
        assert [t.name for t in second.tools] == ["add"]

    async def test_every_tool_of_the_agent_is_offered_to_the_model_in_order(self) -> None:
        model = ScriptedModel(["ok"])
        tools = (tool("add", add, ADD_SCHEMA), tool("b", add), tool("c", add))
        await Runtime().run(agent(model, *tools), "Hi")
        assert model.requests[0].tools == tuple(t.definition for t in tools)

    async def test_input_messages_start_the_transcript(self) -> None:
        model = ScriptedModel(["ok"])
        history = [Message.user("first"), Message.assistant("noted"), Message.user("second")]
        result = await Runtime().run(agent(model), history)
        assert list(model.requests[0].messages) == history
        assert result.transcript[:3] == tuple(history)

    async def test_options_reach_the_model_and_metadata_reaches_tools(self) -> None:
        seen: list[ToolContext] = []

        async def spy(arguments: Mapping[str, Any], context: ToolContext) -> str:
            seen.append(context)
            return "seen"

        model = ScriptedModel([call("spy", id="c9"), "done"])
        result = await Runtime().run(
            agent(model, tool("spy", spy)),
            "go",
            options={"temperature": 0},
            metadata={"user": "u1"},
        )
        assert model.requests[0].options == {"temperature": 0}
        [context] = seen
        assert context.run_id == result.run_id
        assert context.tool_call_id == "c9"
        assert context.agent_name == "tester"
        assert context.tool_name == "spy"
        assert dict(context.metadata) == {"user": "u1"}
        with pytest.raises(TypeError):
            context.metadata["user"] = "other"  # type: ignore[index]

    async def test_a_run_keeps_the_options_and_metadata_it_started_with(self) -> None:
        options: dict[str, Any] = {"temperature": 0}
        metadata: dict[str, Any] = {"user": "u1"}
        seen: list[dict[str, Any]] = []

        async def meddle(arguments: Mapping[str, Any], context: ToolContext) -> str:
            seen.append(dict(context.metadata))
            options["temperature"] = 1  # the caller changes its own dicts mid-run
            metadata["user"] = "u2"
            return "changed"

        model = ScriptedModel([call("meddle"), call("meddle"), "done"])
        await Runtime().run(
            agent(model, tool("meddle", meddle)), "go", options=options, metadata=metadata
        )
        assert [dict(request.options) for request in model.requests] == [{"temperature": 0}] * 3
        assert seen == [{"user": "u1"}] * 2

    async def test_json_values_are_sent_as_json_text(self) -> None:
        async def lookup(arguments: Mapping[str, Any], context: ToolContext) -> Any:
            return {"name": "Zoë", "tags": [1, 2.5, None, True]}

        model = ScriptedModel([call("lookup", id="c1"), "ok"])
        result = await Runtime().run(agent(model, tool("lookup", lookup)), "go")
        [tool_result] = tool_messages(result.transcript)
        assert json.loads(tool_result.content) == {"name": "Zoë", "tags": [1, 2.5, None, True]}
        assert not tool_result.is_error

    async def test_plain_function_handlers_run_in_a_worker_thread(self) -> None:
        loop_thread = threading.get_ident()

        def blocking(arguments: Mapping[str, Any], context: ToolContext) -> str:
            return "other thread" if threading.get_ident() != loop_thread else "loop thread"

        model = ScriptedModel([call("blocking", id="c1"), "ok"])
        result = await Runtime().run(agent(model, tool("blocking", blocking)), "go")
        assert tool_messages(result.transcript) == [ToolResult("c1", "other thread")]

    async def test_callable_object_with_async_call_is_awaited(self) -> None:
        class Handler:
            async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
                return "awaited"

        model = ScriptedModel([call("obj", id="c1"), "ok"])
        result = await Runtime().run(agent(model, tool("obj", Handler())), "go")
        assert tool_messages(result.transcript) == [ToolResult("c1", "awaited")]

    async def test_plain_function_returning_an_awaitable_is_awaited(self) -> None:
        async def later() -> str:
            return "awaited"

        def handler(arguments: Mapping[str, Any], context: ToolContext) -> Any:
            return later()

        model = ScriptedModel([call("lazy", id="c1"), "ok"])
        result = await Runtime().run(agent(model, tool("lazy", handler)), "go")
        assert tool_messages(result.transcript) == [ToolResult("c1", "awaited")]

    async def test_read_only_mapping_arguments_are_validated_like_a_dict(self) -> None:
        arguments = MappingProxyType({"a": 2, "b": 3})
        model = ScriptedModel([ToolCall("c1", "add", arguments), "ok"])
        result = await Runtime().run(agent(model, tool("add", add, ADD_SCHEMA)), "go")
        assert tool_messages(result.transcript) == [ToolResult("c1", "5")]

    def test_repr_shows_the_settings(self) -> None:
        assert "Runtime(checkpoint_store=None, max_turns=7)" == repr(Runtime(max_turns=7))

    async def test_usage_adds_up_over_turns(self) -> None:
        model = ScriptedModel(
            [call("add", a=1, b=1), "2"], usage=Usage(input_tokens=10, output_tokens=2, requests=1)
        )
        result = await Runtime().run(agent(model, tool("add", add, ADD_SCHEMA)), "1+1")
        assert result.usage == Usage(input_tokens=20, output_tokens=4, requests=2)

    async def test_input_of_the_wrong_type_is_refused(self) -> None:
        with pytest.raises(RunletError, match="sequence of Message"):
            await Runtime().run(agent(ScriptedModel([])), ["not a message"])  # type: ignore[list-item]

    async def test_agent_of_the_wrong_type_is_refused(self) -> None:
        with pytest.raises(ConfigurationError, match="Expected an Agent"):
            await Runtime().run("agent", "hi")  # type: ignore[arg-type]


class TestConcurrentCalls:
    async def test_calls_in_one_message_overlap_in_time(self) -> None:
        # Each tool waits for the other to start: sequential execution would deadlock,
        # and fail_after turns that into a failure instead of a hang.
        started = {"a": anyio.Event(), "b": anyio.Event()}

        async def meet(arguments: Mapping[str, Any], context: ToolContext) -> str:
            me, other = arguments["me"], arguments["other"]
            started[me].set()
            await started[other].wait()
            return me

        model = ScriptedModel(
            [
                [call("meet", me="a", other="b", id="1"), call("meet", me="b", other="a", id="2")],
                "ok",
            ]
        )
        with anyio.fail_after(5):
            result = await Runtime().run(agent(model, tool("meet", meet)), "go")
        assert [r.content for r in tool_messages(result.transcript)] == ["a", "b"]

    async def test_results_keep_call_order_whatever_order_calls_finish_in(self) -> None:
        gates = [anyio.Event() for _ in range(3)]
        finished: list[int] = []

        async def step(arguments: Mapping[str, Any], context: ToolContext) -> str:
            index = arguments["i"]
            await gates[index].wait()
            finished.append(index)
            if index > 0:
                gates[index - 1].set()
            return f"result {index}"

        async def opener(arguments: Mapping[str, Any], context: ToolContext) -> str:
            gates[2].set()
            return "opened"

        calls = [call("step", i=i, id=f"s{i}") for i in range(3)] + [call("open", id="o")]
        model = ScriptedModel([calls, "ok"])
        with anyio.fail_after(5):
            result = await Runtime().run(
                agent(model, tool("step", step), tool("open", opener)), "go"
            )
        assert finished == [2, 1, 0]
        assert [r.tool_call_id for r in tool_messages(result.transcript)] == ["s0", "s1", "s2", "o"]
        assert [r.content for r in tool_messages(result.transcript)] == [
            "result 0",
            "result 1",
            "result 2",
            "opened",
        ]
        assert [m.role for m in model.requests[1].messages[-4:]] == ["tool"] * 4

    async def test_a_checkpoint_keeps_the_finished_results_in_call_order(self) -> None:
        gates = {"s0": anyio.Event(), "s1": anyio.Event()}

        async def step(arguments: Mapping[str, Any], context: ToolContext) -> str:
            if context.tool_call_id == "s0":
                await gates["s0"].wait()  # finishes after s1
            else:
                gates["s0"].set()
            return f"done {context.tool_call_id}"

        calls = [call("step", id="s0"), call("gated", id="g"), call("step", id="s1")]
        store = InMemoryCheckpointStore()
        tools = (tool("step", step), tool("gated", step, requires_approval=True))
        with anyio.fail_after(5):
            result = await Runtime(store).run(agent(ScriptedModel([calls]), *tools), "go")
        assert result.checkpoint_id is not None
        checkpoint = await store.load(result.checkpoint_id)
        assert [(r.tool_call_id, r.content) for r in checkpoint.results] == [
            ("s0", "done s0"),
            ("s1", "done s1"),
        ]
        assert [c.id for c in checkpoint.pending_tool_calls] == ["g"]


class TestErrorResults:
    async def run_one(self, answer: ToolCall, *tools: ToolSpec) -> tuple[ToolResult, ModelRequest]:
        model = ScriptedModel([answer, "recovered"])
        result = await Runtime().run(agent(model, *tools), "go")
        assert result.output == "recovered"
        [tool_result] = tool_messages(result.transcript)
        return tool_result, model.requests[1]

    async def test_an_edited_call_that_fails_is_still_an_error(self) -> None:
        async def refuse(arguments: Mapping[str, Any], context: ToolContext) -> str:
            raise PermissionError(f"cannot delete {arguments['path']}")

        store = InMemoryCheckpointStore()
        runtime = Runtime(store)
        model = ScriptedModel([call("delete", path="/a", id="c1"), "understood"])
        tester = agent(model, tool("delete", refuse, requires_approval=True))
        first = await runtime.run(tester, "go")
        assert first.checkpoint_id is not None
        assert first.interruption is not None
        answer = HumanResponse(first.interruption.id, "approve", edited_arguments={"path": "/b"})
        result = await runtime.resume(tester, checkpoint_id=first.checkpoint_id, response=answer)
        [tool_result] = tool_messages(result.transcript)
        assert tool_result.is_error
        assert tool_result.content.startswith('A human edited the arguments to {"path": "/b"}')
        assert "cannot delete /b" in tool_result.content

    async def test_unknown_tool(self) -> None:
        result, request = await self.run_one(call("nope", id="c1"), tool("add", add, ADD_SCHEMA))
        assert result.is_error
        assert result.tool_call_id == "c1"
        assert "no tool named 'nope'" in result.content
        assert "'add'" in result.content
        assert request.messages[-1].tool_result == result

    async def test_arguments_that_fail_the_schema(self) -> None:
        called = False

        async def never(arguments: Mapping[str, Any], context: ToolContext) -> str:
            nonlocal called  # pragma: no cover - the point is that it never runs
            called = True  # pragma: no cover
            return "no"  # pragma: no cover

        result, _ = await self.run_one(call("add", a="x", id="c1"), tool("add", never, ADD_SCHEMA))
        assert result.is_error
        assert "Invalid arguments for tool 'add'" in result.content
        assert "'x' is not of type" in result.content or '"x" is not of type' in result.content
        assert "'b' is a required property" in result.content or '"b"' in result.content
        assert not called

    async def test_handler_exception_message_reaches_the_model(self) -> None:
        async def broken(arguments: Mapping[str, Any], context: ToolContext) -> str:
            raise ValueError("the ledger is locked")

        result, _ = await self.run_one(call("broken", id="c1"), tool("broken", broken))
        assert result.is_error
        assert result.content == "Tool 'broken' failed: ValueError: the ledger is locked"

    async def test_thread_handler_exception(self) -> None:
        def broken(arguments: Mapping[str, Any], context: ToolContext) -> str:
            raise KeyError("k")

        result, _ = await self.run_one(call("broken", id="c1"), tool("broken", broken))
        assert result.is_error
        assert "KeyError" in result.content

    async def test_handler_that_exceeds_its_timeout(self) -> None:
        cancelled = anyio.Event()

        async def slow(arguments: Mapping[str, Any], context: ToolContext) -> str:
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.set()
            return "never"  # pragma: no cover

        with anyio.fail_after(5):
            result, _ = await self.run_one(call("slow", id="c1"), tool("slow", slow, timeout=0.01))
        assert result.is_error
        assert "did not finish within its 0.01 s timeout" in result.content
        assert cancelled.is_set()

    async def test_handler_that_finishes_within_its_timeout(self) -> None:
        async def quick(arguments: Mapping[str, Any], context: ToolContext) -> str:
            await anyio.lowlevel.checkpoint()
            return "in time"

        def quick_in_a_thread(arguments: Mapping[str, Any], context: ToolContext) -> str:
            return "in time, from a thread"

        for handler, expected in [
            (quick, "in time"),
            (quick_in_a_thread, "in time, from a thread"),
        ]:
            with anyio.fail_after(5):
                result, _ = await self.run_one(
                    call("quick", id="c1"), tool("quick", handler, timeout=60)
                )
            assert ToolResult("c1", expected) == result

    async def test_value_that_is_not_json(self) -> None:
        async def weird(arguments: Mapping[str, Any], context: ToolContext) -> Any:
            return {1, 2}

        result, _ = await self.run_one(call("weird", id="c1"), tool("weird", weird))
        assert result.is_error
        assert "not JSON" in result.content

    async def test_value_nested_deeper_than_json_can_write(self) -> None:
        async def deep(arguments: Mapping[str, Any], context: ToolContext) -> Any:
            value: list[Any] = []
            for _ in range(200_000):  # deeper than any interpreter's recursion limit
                value = [value]
            return value

        result, _ = await self.run_one(call("deep", id="c1"), tool("deep", deep))
        assert result.is_error
        assert "returned a value of type list that is not JSON" in result.content

    async def test_a_str_subclass_goes_to_the_model_as_its_text(self) -> None:
        class Status(str, enum.Enum):
            SHIPPED = "shipped"

        class Note(str):
            def __str__(self) -> str:
                return "something else"

        for value in (Status.SHIPPED, Note("a note")):

            async def returns(arguments: Mapping[str, Any], context: ToolContext) -> Any:
                return value  # noqa: B023 - awaited within this iteration

            result, _ = await self.run_one(call("s", id="c1"), tool("s", returns))
            assert ToolResult("c1", str.__str__(value)) == result
            assert type(result.content) is str

    async def test_json_values_go_to_the_model_as_json(self) -> None:
        # bool is an int subclass; the model must still read JSON's true, not Python's True.
        for value, text in [(True, "true"), (False, "false"), (None, "null"), (7, "7")]:

            async def returns(arguments: Mapping[str, Any], context: ToolContext) -> Any:
                return value  # noqa: B023 - awaited within this iteration

            result, _ = await self.run_one(call("v", id="c1"), tool("v", returns))
            assert ToolResult("c1", text) == result

    async def test_a_timeout_bounds_the_handler_by_its_own_seconds(self) -> None:
        # Read from inside: the handler's deadline is its timeout from now, not later.
        async def budget(arguments: Mapping[str, Any], context: ToolContext) -> float:
            return anyio.current_effective_deadline() - anyio.current_time()

        result, _ = await self.run_one(call("b", id="c1"), tool("b", budget, timeout=30))
        assert 0 < float(result.content) <= 30

    async def test_arguments_that_are_not_an_object(self) -> None:
        bad = ToolCall("c1", "add", [1, 2])  # type: ignore[arg-type]
        result, _ = await self.run_one(bad, tool("add", add, ADD_SCHEMA))
        assert result.is_error
        assert "must be a JSON object" in result.content


class TestLimits:
    async def test_turn_limit_stops_a_runaway_run(self) -> None:
        model = ScriptedModel(lambda request: call("add", a=1, b=1))
        runtime = Runtime(max_turns=4)
        with pytest.raises(MaxTurnsExceededError, match="max_turns=4") as caught:
            await runtime.run(agent(model, tool("add", add, ADD_SCHEMA)), "loop")
        assert caught.value.max_turns == 4
        assert len(model.requests) == 4

    @pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
    def test_max_turns_must_be_a_positive_int(self, bad: Any) -> None:
        with pytest.raises(ConfigurationError, match="max_turns"):
            Runtime(max_turns=bad)


class TestModelErrors:
    async def test_adapter_exception_becomes_model_error(self) -> None:
        class Broken:
            async def complete(self, request: ModelRequest) -> ModelResponse:
                raise ConnectionError("no route")

        with pytest.raises(ModelError, match="Broken failed: ConnectionError: no route") as caught:
            await Runtime().run(agent(Broken()), "hi")
        assert isinstance(caught.value.__cause__, ConnectionError)

    async def test_runlet_errors_from_the_adapter_pass_through(self) -> None:
        model = ScriptedModel([])
        with pytest.raises(ModelError, match="no answer left"):
            await Runtime().run(agent(model), "hi")

        refused = ModelAPIError("The API answered 429.", status_code=429, body="slow down")

        class Limited:
            async def complete(self, request: ModelRequest) -> ModelResponse:
                raise refused

        with pytest.raises(ModelAPIError) as caught:
            await Runtime().run(agent(Limited()), "hi")
        assert caught.value is refused  # as raised: its status decides about retrying

    @pytest.mark.parametrize(
        ("answer", "message"),
        [
            ("just text", "must return a ModelResponse"),
            (ModelResponse(Message.user("hi")), "'user' message"),
            (
                ModelResponse(
                    Message.assistant(tool_calls=[ToolCall("x", "a"), ToolCall("x", "b")])
                ),
                "same id",
            ),
            # A count the API left out must be 0, not None: sums and spans need numbers.
            (ModelResponse(Message.assistant("x"), None), r"usage is a NoneType"),  # type: ignore[arg-type]
            (
                ModelResponse(Message.assistant("x"), Usage(None, 3, 1)),  # type: ignore[arg-type]
                r"usage has input_tokens=None, not a count",
            ),
            (
                ModelResponse(Message.assistant("x"), Usage(2, 3, 1, cache_read_tokens=-1)),
                r"usage has cache_read_tokens=-1",
            ),
            (
                ModelResponse(Message.assistant("x"), Usage(2, 3.0, 1)),  # type: ignore[arg-type]
                r"usage has output_tokens=3.0",
            ),
            # bool is an int to isinstance(), but True is not a token count.
            (
                ModelResponse(Message.assistant("x"), Usage(True, 3, 1)),
                r"usage has input_tokens=True",
            ),
        ],
    )
    async def test_unusable_answers_are_refused(self, answer: Any, message: str) -> None:
        class Odd:
            async def complete(self, request: ModelRequest) -> Any:
                return answer

        with pytest.raises(ModelResponseError, match=message):
            await Runtime().run(agent(Odd()), "hi")

    async def test_a_subclass_of_model_response_is_a_usable_answer(self) -> None:
        class TimedResponse(ModelResponse):
            pass

        class Timed:
            async def complete(self, request: ModelRequest) -> ModelResponse:
                return TimedResponse(Message.assistant("On time."), Usage(requests=1))

        result = await Runtime().run(agent(Timed()), "hi")
        assert result.output == "On time."


class TestCancellation:
    async def test_cancelling_a_run_stops_the_model_call(self) -> None:
        started = anyio.Event()
        stopped = anyio.Event()

        class Hanging:
            async def complete(self, request: ModelRequest) -> ModelResponse:
                started.set()
                try:
                    await anyio.sleep_forever()
                finally:
                    stopped.set()
                raise AssertionError("unreachable")  # pragma: no cover

        outcome: list[str] = []
        scope = anyio.CancelScope()

        async def run_it() -> None:
            with scope:
                await Runtime().run(agent(Hanging()), "hi")
                outcome.append("returned")  # pragma: no cover
            outcome.append("cancelled" if scope.cancelled_caught else "not cancelled")

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(run_it)
                await started.wait()
                scope.cancel()
        assert ["cancelled"] == outcome
        assert stopped.is_set()

    async def test_cancelling_a_run_stops_every_running_tool_and_propagates(self) -> None:
        running = 0
        all_running = anyio.Event()
        cleaned: list[str] = []

        async def wait(arguments: Mapping[str, Any], context: ToolContext) -> str:
            nonlocal running
            running += 1
            if running == 3:
                all_running.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cleaned.append(context.tool_call_id)
                raise
            return "never"  # pragma: no cover

        model = ScriptedModel([[call("wait", id=f"w{i}") for i in range(3)], "never"])
        scope = anyio.CancelScope()

        async def cancel_when_running() -> None:
            await all_running.wait()
            scope.cancel()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(cancel_when_running)
                with scope:
                    await Runtime().run(agent(model, tool("wait", wait)), "go")
                    pytest.fail("run() returned after being cancelled")  # pragma: no cover
        assert scope.cancelled_caught
        # Every tool saw the cancellation before run() gave control back.
        assert sorted(cleaned) == ["w0", "w1", "w2"]

    @pytest.mark.parametrize("shape", ["one call", "side by side", "timed", "policy"])
    async def test_a_cancellation_a_handler_turns_into_an_error_still_cancels(
        self, shape: str
    ) -> None:
        # A handler (or policy) whose cleanup raises replaces the cancellation with its
        # own error. The run must still end cancelled, not hand the error to the model
        # and go on: on trio nothing else would deliver the cancellation again, since
        # the scripted model never waits.
        started = anyio.Event()

        async def slow(arguments: Mapping[str, Any], context: ToolContext) -> str:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                raise RuntimeError("cleanup failed")  # the cancellation is lost here

        async def policy(arguments: Mapping[str, Any], context: ToolContext) -> bool:
            await slow(arguments, context)
            return False  # pragma: no cover

        ids = ["a", "b"] if shape == "side by side" else ["a"]
        if shape == "policy":
            slow_tool = ToolSpec("slow", "", {"type": "object"}, slow, requires_approval=policy)
        else:
            timeout = 3600.0 if shape == "timed" else None
            slow_tool = ToolSpec("slow", "", {"type": "object"}, slow, timeout=timeout)
        model = ScriptedModel([[call("slow", id=i) for i in ids], "finished anyway"])
        scope = anyio.CancelScope()
        returned: list[Any] = []

        async def run_it() -> None:
            with scope:
                returned.append(await Runtime().run(agent(model, slow_tool), "go"))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(run_it)
                await started.wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert returned == []

    async def test_move_on_after_around_run(self) -> None:
        async def forever(arguments: Mapping[str, Any], context: ToolContext) -> str:
            await anyio.sleep_forever()
            return "never"  # pragma: no cover

        model = ScriptedModel([call("forever"), "never"])
        with anyio.fail_after(5), anyio.move_on_after(0.05) as scope:
            await Runtime().run(agent(model, tool("forever", forever)), "go")
        assert scope.cancelled_caught

    async def test_outer_cancellation_is_not_mistaken_for_a_tool_timeout(self) -> None:
        started = anyio.Event()

        async def slow(arguments: Mapping[str, Any], context: ToolContext) -> str:
            started.set()
            await anyio.sleep_forever()
            return "never"  # pragma: no cover

        model = ScriptedModel([call("slow"), "never"])
        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:

                async def cancel_later() -> None:
                    await started.wait()
                    scope.cancel()

                group.start_soon(cancel_later)
                with anyio.CancelScope() as scope:
                    await Runtime().run(agent(model, tool("slow", slow, timeout=60)), "go")
        assert scope.cancelled_caught
        assert len(model.requests) == 1
