"""The data types: messages, tools, agents, and the public surface of the package."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import attrs
import jsonschema_rs
import pytest

import runlet
from runlet import (
    Agent,
    ConfigurationError,
    Message,
    ModelRequest,
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
        assert Message.tool(result) == Message("tool", "done", (), result)

    def test_role_is_checked(self) -> None:
        with pytest.raises(ValueError, match="role must be one of"):
            Message("robot", "hi")  # type: ignore[arg-type]

    def test_messages_are_frozen(self) -> None:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            Message.user("x").content = "y"  # type: ignore[misc]


class TestUsage:
    def test_adds_up(self) -> None:
        total = Usage(1, 2, 1) + Usage(10, 20, 1)
        assert total == Usage(input_tokens=11, output_tokens=22, requests=2)

    def test_refuses_other_types(self) -> None:
        with pytest.raises(TypeError):
            Usage() + 1  # type: ignore[operator]


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

    @pytest.mark.parametrize("name", ["", "has space", "x" * 65, "ünïcode"])
    def test_unusable_names(self, name: str) -> None:
        with pytest.raises(ConfigurationError, match="is not usable"):
            ToolSpec(name, "d", {}, noop)

    def test_handler_must_be_callable(self) -> None:
        with pytest.raises(ConfigurationError, match="callable handler"):
            ToolSpec("t", "d", {}, "handler")  # type: ignore[arg-type]

    @pytest.mark.parametrize("timeout", [0, -1.0])
    def test_timeout_must_be_positive(self, timeout: float) -> None:
        with pytest.raises(ConfigurationError, match="timeout"):
            ToolSpec("t", "d", {}, noop, timeout=timeout)

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


class TestAgent:
    def test_duplicate_tool_names_are_refused(self) -> None:
        spec = ToolSpec("t", "d", {}, noop)
        with pytest.raises(ConfigurationError, match="two tools named 't'"):
            Agent("a", "i", ScriptedModel([]), (spec, spec))

    def test_tools_must_be_toolspecs(self) -> None:
        with pytest.raises(ConfigurationError, match="must be ToolSpec"):
            Agent("a", "i", ScriptedModel([]), ("t",))  # type: ignore[arg-type]

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

    async def test_unusable_script_items(self) -> None:
        model = ScriptedModel([42])  # type: ignore[list-item]
        with pytest.raises(runlet.ModelError, match="must be a str, ToolCall"):
            await Runtime().run(Agent("a", "i", model), "hi")

    def test_call_helper(self) -> None:
        assert call("t", {"a": 1}, b=2, id="x") == ToolCall("x", "t", {"a": 1, "b": 2})
        assert call("t").id != call("t").id

    def test_chunk_size_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="chunk_size"):
            ScriptedModel([], chunk_size=0)


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

    def test_errors_form_one_tree(self) -> None:
        for name in runlet.__all__:
            obj = getattr(runlet, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert issubclass(obj, RunletError), name
                assert obj.__doc__

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
