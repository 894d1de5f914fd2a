"""The data types: messages, tools, agents, and the public surface of the package."""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import inspect
import typing
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import attrs
import cattrs
import jsonschema_rs
import pytest
from _parsing import parse_python

import runlet
import runlet.testing
from runlet import (
    Agent,
    ConfigurationError,
    Message,
    ModelRequest,
    ReasoningPart,
    RunletError,
    Runtime,
    ToolCall,
    ToolContext,
    ToolDefinition,
    ToolResult,
    ToolSpec,
    Usage,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio


async def noop(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return "ok"


class TestMessage:
    def test_constructors(self) -> None:
        result = ToolResult("c1", "done")
        calls = [ToolCall("c1", "add", {"a": 1})]
        assert Message.system("s") == Message("system", "s")
        assert Message.user("u") == Message("user", "u")
        assert Message.assistant() == Message("assistant", "")
        assert Message.assistant("a", calls).tool_calls == tuple(calls)
        # Built directly from lists, a message still holds tuples.
        direct = Message("assistant", "a", calls, reasoning=[ReasoningPart("r")])  # type: ignore[arg-type]
        assert (tuple(calls), (ReasoningPart("r"),)) == (direct.tool_calls, direct.reasoning)
        assert Message.tool(result) == Message("tool", "done", (), result)

    def test_role_is_checked(self) -> None:
        with pytest.raises(ConfigurationError, match="role must be one of"):
            Message("robot", "hi")  # type: ignore[arg-type]

    def test_messages_are_frozen(self) -> None:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            Message.user("x").content = "y"  # type: ignore[misc]


class TestUsage:
    def test_adds_up(self) -> None:
        total = Usage(1, 2, 1) + Usage(10, 20, 1)
        assert total == Usage(input_tokens=11, output_tokens=22, requests=2)

    def test_every_count_adds_up(self) -> None:
        first = Usage(1, 2, 3, cache_read_tokens=4, cache_write_tokens=5)
        second = Usage(10, 20, 30, cache_read_tokens=40, cache_write_tokens=50)

        assert Usage(11, 22, 33, cache_read_tokens=44, cache_write_tokens=55) == first + second

    def test_refuses_other_types(self) -> None:
        with pytest.raises(TypeError):
            Usage() + 1  # type: ignore[operator]


class TestModelTypes:
    def test_a_response_without_usage_counts_nothing(self) -> None:
        assert runlet.ModelResponse(Message.assistant("x")).usage == Usage()

    def test_a_tool_call_delta_holds_no_argument_text_unless_given(self) -> None:
        first = runlet.ToolCallDelta(0, "c1", "t")
        rest = runlet.ToolCallDelta(0, arguments='{"a": 1}')
        assert (first.id, first.name, first.arguments) == ("c1", "t", "")
        assert first.arguments + rest.arguments == '{"a": 1}'
        assert (rest.id, rest.name) == (None, None)


class TestRunResult:
    def test_results_differing_only_in_pending_requests_are_not_equal(self) -> None:
        request = runlet.HumanRequest("r1", "input", "Name?", tool_call=ToolCall("c", "t"))
        result = runlet.RunResult(status="interrupted", transcript=(), usage=Usage(), run_id="r")
        assert result.pending_requests == ()
        assert result.decisions == ()
        assert result != attrs.evolve(result, pending_requests=(request,))


class TestHumanRequest:
    def test_tool_call_may_be_given_by_position_or_by_name(self) -> None:
        call_ = ToolCall("c1", "pay", {"amount": 5})
        when = datetime(2026, 1, 2, tzinfo=timezone.utc)
        by_position = runlet.HumanRequest("r1", "approval", "Pay?", (), call_, created_at=when)
        by_name = runlet.HumanRequest("r1", "approval", "Pay?", tool_call=call_, created_at=when)
        assert by_position == by_name
        assert by_position.tool_call is call_
        assert (by_position.options, by_position.expires_at) == ((), None)
        assert not by_position.outcome_unknown

    def test_without_a_tool_call_it_is_refused(self) -> None:
        with pytest.raises(TypeError, match="needs tool_call"):
            runlet.HumanRequest("r1", "approval", "Pay?")  # type: ignore[call-overload]

    def test_created_at_defaults_to_now_in_utc(self) -> None:
        before = datetime.now(timezone.utc)
        request = runlet.HumanRequest("r1", "input", "Name?", tool_call=ToolCall("c", "t"))
        assert before <= request.created_at <= datetime.now(timezone.utc)
        assert request.created_at.tzinfo is not None

    def test_evolve_keeps_every_other_field(self) -> None:
        request = runlet.HumanRequest(
            "r1", "approval", "Pay?", tool_call=ToolCall("c", "t"), outcome_unknown=True
        )
        changed = attrs.evolve(request, prompt="Pay now?")
        assert (changed.prompt, changed.created_at, changed.outcome_unknown) == (
            "Pay now?",
            request.created_at,
            True,
        )


class TestToolSpec:
    def test_definition_never_holds_the_handler(self) -> None:
        spec = ToolSpec("t", "d", {"type": "object"}, noop)
        assert spec.definition == ToolDefinition("t", "d", {"type": "object"})
        assert not any(callable(v) for v in attrs.asdict(spec.definition).values())

    def test_invalid_schema_is_a_clear_error(self) -> None:
        with pytest.raises(
            ConfigurationError, match="'t': input_schema is not a valid JSON Schema"
        ):
            ToolSpec("t", "d", {"type": "objectx"}, noop)

    def test_schema_must_be_a_mapping(self) -> None:
        with pytest.raises(ConfigurationError, match="must be a JSON Schema object"):
            ToolSpec("t", "d", "object", noop)  # type: ignore[arg-type]

    @pytest.mark.parametrize("name", ["", "has space", "x" * 65, "ünïcode", "refund\n", "\nrefund"])
    def test_unusable_names(self, name: str) -> None:
        with pytest.raises(ConfigurationError, match="is not usable"):
            ToolSpec(name, "d", {}, noop)

    def test_handler_must_be_callable(self) -> None:
        with pytest.raises(ConfigurationError, match="callable handler"):
            ToolSpec("t", "d", {}, "handler")  # type: ignore[arg-type]

    @pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "5", True, [1]])
    def test_timeout_must_be_a_positive_number(self, timeout: Any) -> None:
        with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
            ToolSpec("t", "d", {}, noop, timeout=timeout)

    @pytest.mark.parametrize("timeout", [None, 1, 0.5])
    def test_usable_timeouts(self, timeout: float | None) -> None:
        assert timeout == ToolSpec("t", "d", {}, noop, timeout=timeout).timeout

    @pytest.mark.parametrize("expires", [0, -1.0, float("inf"), float("nan"), "60", True])
    def test_expires_after_must_be_a_positive_finite_number(self, expires: Any) -> None:
        with pytest.raises(ConfigurationError, match="expires_after must be a positive number"):
            ToolSpec("t", "d", {}, noop, expires_after=expires)

    @pytest.mark.parametrize("expires", [None, 1, 0.5])
    def test_usable_expiries(self, expires: float | None) -> None:
        assert expires == ToolSpec("t", "d", {}, noop, expires_after=expires).expires_after

    async def test_schema_problems_tell_the_model_where_they_are(self) -> None:
        schema = {
            "type": "object",
            "properties": {"order": {"type": "object", "properties": {"id": {"type": "string"}}}},
            "required": ["order"],
        }
        spec = ToolSpec("t", "d", schema, noop)
        model = ScriptedModel([[call("t", id="c1", order={"id": 7}), call("t", id="c2")], "done"])

        await Runtime().run(Agent("a", "i", model, (spec,)), "go")

        again = " Call it again with arguments that match its input schema."
        assert [
            "Invalid arguments for tool 't': at ['order']['id']: 7 is not of type \"string\"."
            + again,
            "Invalid arguments for tool 't': \"order\" is a required property." + again,
        ] == [message.content for message in model.requests[1].messages[-2:]]

    async def test_validator_is_compiled_once_not_per_call(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        compiled = 0
        real = jsonschema_rs.validator_for

        def counting(schema: Any) -> Any:
            nonlocal compiled
            compiled += 1
            return real(schema)

        monkeypatch.setattr(jsonschema_rs, "validator_for", counting)
        spec = ToolSpec("t", "d", {"type": "object"}, noop)
        assert compiled == 1
        model = ScriptedModel([[call("t"), call("t")], call("t"), "done"])
        await Runtime().run(Agent("a", "i", model, (spec,)), "go")
        assert compiled == 1


class SyncModel:
    def complete(self, request: ModelRequest) -> Any:
        raise AssertionError("not called")  # pragma: no cover


class TestRuntime:
    class SyncStore:
        def save(self, checkpoint: Any) -> None: ...  # pragma: no cover

        def load(self, checkpoint_id: str) -> Any: ...  # pragma: no cover

        def delete(self, checkpoint_id: str) -> None: ...  # pragma: no cover

    class NoDelete:
        async def save(self, checkpoint: Any) -> None: ...  # pragma: no cover

        async def load(self, checkpoint_id: str) -> Any: ...  # pragma: no cover

    @pytest.mark.parametrize("store", ["oops", {}, SyncStore(), NoDelete()])
    def test_store_must_have_async_save_load_and_delete(self, store: Any) -> None:
        with pytest.raises(ConfigurationError, match="checkpoint_store must be a CheckpointStore"):
            Runtime(checkpoint_store=store)

    def test_a_store_of_your_own_is_accepted(self) -> None:
        class Store:
            async def save(self, checkpoint: Any) -> None: ...  # pragma: no cover

            async def load(self, checkpoint_id: str) -> Any: ...  # pragma: no cover

            async def delete(self, checkpoint_id: str) -> None: ...  # pragma: no cover

        store = Store()
        assert Runtime(checkpoint_store=store).checkpoint_store is store  # type: ignore[arg-type]


class TestAgent:
    def test_duplicate_tool_names_are_refused(self) -> None:
        spec = ToolSpec("t", "d", {}, noop)
        with pytest.raises(ConfigurationError, match="two tools named 't'"):
            Agent("a", "i", ScriptedModel([]), (spec, spec))

    def test_tools_must_be_toolspecs(self) -> None:
        with pytest.raises(ConfigurationError, match="must be ToolSpec"):
            Agent("a", "i", ScriptedModel([]), ("t",))  # type: ignore[arg-type]

    @pytest.mark.parametrize("model", [None, "gpt", object(), SyncModel()])
    def test_model_must_have_an_async_complete(self, model: Any) -> None:
        with pytest.raises(ConfigurationError, match="async def complete"):
            Agent("a", "i", model)

    def test_a_complete_that_cannot_be_called_is_refused(self) -> None:
        async def answer(request: ModelRequest) -> Any:
            raise AssertionError("not called")  # pragma: no cover

        uncallable = type("Uncallable", (), {})()
        uncallable.__call__ = answer  # an instance attribute does not make it callable

        class Model:
            complete = uncallable

        with pytest.raises(ConfigurationError, match="async def complete"):
            Agent("a", "i", Model())  # type: ignore[arg-type]

    def test_a_callable_object_with_an_async_call_is_a_complete_method(self) -> None:
        class Complete:
            async def __call__(self, request: ModelRequest) -> Any:
                raise AssertionError("not called")  # pragma: no cover

        class Model:
            complete = Complete()

        model = Model()
        assert Agent("a", "i", model).model is model  # type: ignore[arg-type]

    def test_tool_lookup_and_tuple_conversion(self) -> None:
        spec = ToolSpec("t", "d", {}, noop)
        agent = Agent("a", "i", ScriptedModel([]), [spec])
        assert agent.tools == (spec,)
        assert agent.tool("t") is spec
        assert agent.tool("missing") is None


class TestScriptedModel:
    async def test_function_script_sees_each_request(self) -> None:
        def answer(request: ModelRequest) -> str:
            return f"{len(request.messages)} messages"

        model = ScriptedModel(answer)
        result = await Runtime().run(Agent("a", "i", model), "hi")
        assert result.output == "1 messages"
        assert model.remaining == 0

    async def test_async_function_items(self) -> None:
        async def answer(request: ModelRequest) -> str:
            return "async answer"

        model = ScriptedModel([answer])
        result = await Runtime().run(Agent("a", "i", model), "hi")
        assert result.output == "async answer"
        assert len(model.requests) == 1

    async def test_exhausted_script_says_so(self) -> None:
        model = ScriptedModel(["one"])
        await Runtime().run(Agent("a", "i", model), "hi")
        assert model.remaining == 0
        with pytest.raises(runlet.ModelError, match="no answer left for request 2"):
            await Runtime().run(Agent("a", "i", model), "again")

    @pytest.mark.parametrize(
        ("script", "message"),
        [
            ([42], "Script item 1: got int; an answer must be a str, ToolCall"),
            (["ok", [call("t"), "x"]], "Script item 2: got list"),
            ("Hello.", "must be a list of answers or a function of the request, not a str"),
            (42, "must be a list of answers or a function"),
            (b"Hello.", "must be a list of answers or a function of the request, not a bytes"),
        ],
    )
    def test_unusable_scripts_are_refused_at_construction(self, script: Any, message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            ScriptedModel(script)

    async def test_a_model_response_answer_keeps_its_own_usage(self) -> None:
        answer = runlet.ModelResponse(Message.assistant("hi"), Usage(input_tokens=99))
        model = ScriptedModel([answer], usage=Usage(requests=1))
        assert await model.complete(ModelRequest("i", (), (), {})) is answer

    async def test_stream_cuts_text_and_arguments_into_chunk_size_pieces(self) -> None:
        answers = ["abcde", "x", call("t", {"k": 1}, id="c")]
        model = ScriptedModel(answers, chunk_size=2)
        request = ModelRequest("i", (Message.user("x"),), (), {})
        pieces = []
        for _ in answers:
            async with model.stream(request) as items:
                pieces.append([item async for item in items][:-1])
        assert pieces[0] == [runlet.TextDelta(t) for t in ("ab", "cd", "e")]
        assert pieces[1] == [runlet.TextDelta("x")]
        assert "".join(d.arguments for d in pieces[2]) == '{"k": 1}'
        assert [len(d.arguments) for d in pieces[2]] == [2, 2, 2, 2]

    async def test_a_tuple_of_tool_calls_is_one_answer(self) -> None:
        model = ScriptedModel([(call("t", id="a"), call("t", id="b"))])
        response = await model.complete(ModelRequest("i", (Message.user("x"),), (), {}))
        assert [c.id for c in response.message.tool_calls] == ["a", "b"]

    def test_usage_must_be_a_usage(self) -> None:
        with pytest.raises(ConfigurationError, match="usage must be a Usage"):
            ScriptedModel([], usage=3)  # type: ignore[arg-type]

    async def test_unusable_answers_from_a_function_are_a_model_response_error(self) -> None:
        model = ScriptedModel([lambda request: 42])
        expected = "function in the script returned int"
        with pytest.raises(runlet.ModelResponseError, match=expected) as caught:
            await Runtime().run(Agent("a", "i", model), "hi")
        assert caught.value.__cause__ is None  # raised by the script, not wrapped

    async def test_a_function_answering_a_list_that_is_not_all_tool_calls_is_refused(
        self,
    ) -> None:
        model = ScriptedModel(lambda request: [call("t"), "x"])
        with pytest.raises(runlet.ModelResponseError, match="function in the script returned list"):
            await model.complete(ModelRequest("i", (Message.user("x"),), (), {}))

    async def test_stream_is_annotated_and_used_as_an_async_context_manager(self) -> None:
        hints = typing.get_type_hints(ScriptedModel.stream)
        assert contextlib.AbstractAsyncContextManager is typing.get_origin(hints["return"])
        model = ScriptedModel(["Hi."])
        assert isinstance(model, runlet.StreamingModel)

        manager = model.stream(ModelRequest("i", (Message.user("x"),), (), {}))

        assert isinstance(manager, contextlib.AbstractAsyncContextManager)
        async with manager as items:
            got = [item async for item in items]
        answer = runlet.ModelResponse(Message.assistant("Hi."), Usage(requests=1))
        assert [runlet.TextDelta("Hi."), answer] == got

    def test_call_helper(self) -> None:
        assert call("t", {"a": 1}, b=2, id="x") == ToolCall("x", "t", {"a": 1, "b": 2})
        assert call("t").id != call("t").id

    def test_call_helper_keywords_override_the_arguments_dict(self) -> None:
        assert call("t", {"a": 1, "b": 1}, b=2).arguments == {"a": 1, "b": 2}

    async def test_message_and_str_and_tool_call_answers_carry_the_scripted_usage(self) -> None:
        class Text(str):
            pass

        @attrs.frozen
        class Call(ToolCall):
            pass

        usage = Usage(input_tokens=7, output_tokens=3, requests=1)
        script = [Message.assistant("m"), Text("s"), Call("c", "t", {}), [call("t", id="l")]]
        model = ScriptedModel(script, usage=usage)
        request = ModelRequest("i", (Message.user("x"),), (), {})
        answers = [await model.complete(request) for _ in script]
        assert [a.usage for a in answers] == [usage] * 4
        assert [a.message.content for a in answers] == ["m", "s", "", ""]
        assert [[c.id for c in a.message.tool_calls] for a in answers] == [[], [], ["c"], ["l"]]
        assert all(a.message.role == "assistant" for a in answers)

    @pytest.mark.parametrize("chunk_size", [0, -1, 1.5, "2", True])
    def test_chunk_size_must_be_a_positive_int(self, chunk_size: Any) -> None:
        with pytest.raises(ConfigurationError, match="chunk_size must be a positive"):
            ScriptedModel([], chunk_size=chunk_size)


def isort_style(name: str) -> tuple[int, str]:
    """Constants first, then classes, then functions, each in code-point order."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


class TestPublicSurface:
    def test_every_public_name_is_exported_documented_and_says_runlet(self) -> None:
        for name in runlet.__all__:
            obj = getattr(runlet, name)
            if getattr(obj, "__origin__", None) is not None:
                continue  # a typing alias such as Handler or StreamEvent
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert obj.__module__ == "runlet", name
                assert obj.__doc__, f"{name} has no docstring"

    def test_all_is_sorted_and_complete(self) -> None:
        public = {n for n in dir(runlet) if not n.startswith("_")}
        assert set(runlet.__all__) == public - {"testing", "providers", "demo", "stores"}
        assert sorted(runlet.__all__, key=isort_style) == runlet.__all__
        assert len(set(runlet.__all__)) == len(runlet.__all__)

    def test_testing_all_is_sorted_and_complete(self) -> None:
        public = {n for n in dir(runlet.testing) if not n.startswith("_")}
        assert set(runlet.testing.__all__) == public - {"annotations"}
        assert sorted(runlet.testing.__all__, key=isort_style) == runlet.testing.__all__

    def test_errors_form_one_tree(self) -> None:
        for name in runlet.__all__:
            obj = getattr(runlet, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert issubclass(obj, RunletError), name
                assert obj.__doc__

    @pytest.mark.parametrize(
        ("error", "parent"),
        [
            ("ConfigurationError", "RunletError"),
            ("CheckpointStoreRequiredError", "ConfigurationError"),
            ("StoreSchemaError", "ConfigurationError"),
            ("ModelError", "RunletError"),
            ("ModelResponseError", "ModelError"),
            ("ModelAPIError", "ModelError"),
            ("ModelConnectionError", "ModelError"),
            ("MaxTurnsExceededError", "RunletError"),
            ("HumanResponseError", "RunletError"),
            ("HumanResponseConflictError", "HumanResponseError"),
            ("HumanRequestExpiredError", "HumanResponseError"),
            ("ResumeError", "RunletError"),
            ("CheckpointNotFoundError", "ResumeError"),
            ("CheckpointCancelledError", "CheckpointNotFoundError"),
            ("CheckpointClaimedError", "ResumeError"),
            ("CheckpointResolvedError", "ResumeError"),
            ("LeaseLostError", "ResumeError"),
            ("MissingToolError", "ResumeError"),
            ("CheckpointSerializationError", "RunletError"),
        ],
    )
    def test_each_error_sits_where_the_documented_tree_puts_it(
        self, error: str, parent: str
    ) -> None:
        # A web handler maps errors to statuses by class alone, so the tree is public.
        assert getattr(runlet, error).__bases__ == (getattr(runlet, parent),)

    def test_errors_keep_their_fields_and_message(self) -> None:
        resolution = object()
        errors = [
            (runlet.StoreSchemaError("m", found=9, expected=2), {"found": 9, "expected": 2}),
            (runlet.ModelAPIError("m", status_code=429, body="slow"), {"status_code": 429}),
            (runlet.ModelAPIError("m", status_code=500), {"body": None}),
            (runlet.MaxTurnsExceededError("m", max_turns=3), {"max_turns": 3}),
            (runlet.HumanResponseConflictError("m", checkpoint_id="cp"), {"checkpoint_id": "cp"}),
            (
                runlet.HumanRequestExpiredError("m", checkpoint_id="cp", request_id="r"),
                {"checkpoint_id": "cp", "request_id": "r"},
            ),
            (runlet.CheckpointNotFoundError("m", checkpoint_id="cp"), {"checkpoint_id": "cp"}),
            (
                runlet.CheckpointResolvedError("m", checkpoint_id="cp", resolution=resolution),
                {"checkpoint_id": "cp", "resolution": resolution},
            ),
            (runlet.CheckpointResolvedError("m", checkpoint_id="cp"), {"resolution": None}),
            (
                runlet.MissingToolError("m", checkpoint_id="cp", tool_name="refund"),
                {"checkpoint_id": "cp", "tool_name": "refund"},
            ),
            (
                runlet.CheckpointSerializationError("m", path="metadata['x']"),
                {"path": "metadata['x']"},
            ),
            (runlet.CheckpointSerializationError("m"), {"path": None}),
        ]
        for error, fields in errors:
            assert str(error) == "m", type(error).__name__
            for field, value in fields.items():
                assert getattr(error, field) is value or getattr(error, field) == value, field
        assert runlet.ModelAPIError("m", status_code=429, body="slow").body == "slow"

    def test_errors_raised_on_purpose_are_runlet_errors(self) -> None:
        # Python's own protocol exceptions; TypeError and ValueError (and cattrs' error
        # that gathers an array's) inside the checkpoint converter's hooks, where
        # structuring turns them into a CheckpointSerializationError;
        # TypeError inside the Anthropic adapter's readers, which `reading()` turns into a
        # ModelResponseError; ValueError from the JSON reader's hook that refuses NaN,
        # which `parse_json()` and `parse_arguments()` turn into a ModelResponseError.
        allowed = {StopAsyncIteration, SystemExit, NotImplementedError, ImportError}
        converter_hooks = {
            "runlet._checkpoint": {TypeError, ValueError, cattrs.errors.IterableValidationError},
            "runlet.providers.anthropic": {TypeError},
            "runlet.providers._http": {ValueError},
            # The read-only dict refuses changes as Python's own read-only mappings do.
            "runlet._util": {TypeError},
            # HumanRequest() without tool_call: Python's own error for a missing argument.
            "runlet._human": {TypeError},
        }
        root = Path(runlet.__file__).parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            module_name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            module = importlib.import_module(module_name)
            for node in ast.walk(parse_python(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Raise) or node.exc is None:
                    continue
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if not isinstance(target, ast.Name):
                    continue
                raised = getattr(module, target.id, getattr(builtins, target.id, None))
                if not (inspect.isclass(raised) and issubclass(raised, BaseException)):
                    continue  # a variable holding an exception, re-raised
                where = f"{module_name}:{node.lineno} raises {raised.__name__}"
                assert (
                    issubclass(raised, RunletError)
                    or raised in allowed
                    or raised in converter_hooks.get(module_name, set())
                ), where

    def test_design_names_are_present(self) -> None:
        for name in [
            "Message",
            "ToolCall",
            "ToolResult",
            "ToolSpec",
            "ToolDefinition",
            "ToolContext",
            "Agent",
            "Model",
            "ModelRequest",
            "ModelResponse",
            "Usage",
            "Runtime",
            "RunResult",
            "HumanRequest",
            "HumanOption",
            "HumanResponse",
            "Checkpoint",
            "CheckpointStore",
            "InMemoryCheckpointStore",
            "ask_human",
            "unstructure_checkpoint",
            "structure_checkpoint",
            "RunletError",
            "CheckpointNotFoundError",
            "CheckpointSerializationError",
            "RunFinished",
        ]:
            assert name in runlet.__all__, name
