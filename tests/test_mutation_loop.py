"""Tests from a mutation review of the loop, the tools and the checkpoint converter: each
one fails on a change to ``runlet/_loop.py``, ``runlet/_tools.py`` or
``runlet/_checkpoint.py`` that the rest of the suite let pass."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from runlet import (
    Agent,
    Checkpoint,
    CheckpointSerializationError,
    ConfigurationError,
    HumanRequest,
    InMemoryCheckpointStore,
    Message,
    Runtime,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    structure_checkpoint,
    unstructure_checkpoint,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

OBJECT: dict[str, Any] = {"type": "object"}


def tool(name: str, handler: Any, **kwargs: Any) -> ToolSpec:
    return ToolSpec(name, f"The {name} tool.", OBJECT, handler, **kwargs)


def agent(model: Any, *tools: ToolSpec) -> Agent:
    return Agent("tester", "Be exact.", model, tools)


def tool_results(transcript: tuple[Message, ...]) -> list[ToolResult]:
    return [m.tool_result for m in transcript if m.tool_result is not None]


async def echo(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return "echo"  # pragma: no cover - the calls in these tests wait for a person


# --- the loop ---------------------------------------------------------------------------


async def test_an_agent_without_tools_tells_the_model_it_can_call_none() -> None:
    model = ScriptedModel([call("lookup", id="c1"), "Understood."])

    result = await Runtime().run(agent(model), "go")

    assert result.output == "Understood."
    assert tool_results(result.transcript) == [
        ToolResult(
            "c1",
            "There is no tool named 'lookup'. The tools you can call are: none.",
            is_error=True,
        )
    ]


async def test_a_blocking_thread_handler_past_its_timeout_does_not_hold_up_the_run() -> None:
    # A plain function cannot be interrupted in its worker thread: on timeout the run
    # stops waiting for it and goes on, while the thread finishes on its own.
    release, finished = threading.Event(), threading.Event()

    def blocking(arguments: Mapping[str, Any], context: ToolContext) -> str:
        try:
            release.wait(10)
            return "late"
        finally:
            finished.set()

    model = ScriptedModel([call("blocking", id="c1"), "gave up"])
    try:
        with anyio.fail_after(5):
            result = await Runtime().run(
                agent(model, tool("blocking", blocking, timeout=0.05)), "go"
            )
        still_running = not finished.is_set()
    finally:
        release.set()
    await anyio.to_thread.run_sync(finished.wait, 10)

    assert still_running
    assert result.output == "gave up"
    [tool_result] = tool_results(result.transcript)
    assert tool_result.is_error
    assert "did not finish within its 0.05 s timeout" in tool_result.content


async def test_a_text_result_goes_to_the_model_exactly_as_the_handler_returned_it() -> None:
    async def padded(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "  two leading spaces, a trailing newline\n"

    model = ScriptedModel([call("padded", id="c1"), "ok"])

    result = await Runtime().run(agent(model, tool("padded", padded)), "go")

    assert model.requests[1].messages[-1].tool_result == ToolResult(
        "c1", "  two leading spaces, a trailing newline\n"
    )
    assert tool_results(result.transcript) == [
        ToolResult("c1", "  two leading spaces, a trailing newline\n")
    ]


class Float(float):
    """A float subclass, as a custom model adapter may give (numpy's float64 is one)."""


async def test_a_float_subclass_in_the_arguments_is_a_number_unless_json_has_none_for_it() -> None:
    seen: list[float] = []

    async def record(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(arguments["x"])
        return "recorded"

    calls = [
        ToolCall("c1", "record", {"x": Float(1.5)}),
        ToolCall("c2", "record", {"x": Float("nan")}),
    ]
    model = ScriptedModel([calls, "ok"])

    result = await Runtime().run(agent(model, tool("record", record)), "go")

    assert seen == [1.5]
    finite, nan = tool_results(result.transcript)
    assert finite == ToolResult("c1", "recorded")
    assert nan.is_error
    assert nan.content.startswith("Invalid arguments for tool 'record': nan is not a JSON number")


class Int(int):
    """An int subclass, as a custom model adapter may give."""


async def test_number_subclasses_are_checked_against_a_schema_that_types_them() -> None:
    # The validator takes only exact JSON types: subclasses are checked in their plain
    # JSON form, against the schema's bounds too.
    seen: list[Any] = []

    async def record(arguments: Mapping[str, Any], context: ToolContext) -> str:
        seen.append(arguments["x"])
        return "recorded"

    schema = {
        "type": "object",
        "properties": {"x": {"type": "number", "maximum": 10}},
        "required": ["x"],
    }
    calls = [
        ToolCall("c1", "record", {"x": Float(1.5)}),
        ToolCall("c2", "record", {"x": Int(7)}),
        ToolCall("c3", "record", {"x": Float(11.0)}),
    ]
    model = ScriptedModel([calls, "ok"])
    spec = ToolSpec("record", "Record.", schema, record)

    result = await Runtime().run(agent(model, spec), "go")

    assert [1.5, 7] == sorted(seen)  # the calls run side by side
    first, second, third = tool_results(result.transcript)
    assert (first.content, second.content) == ("recorded", "recorded")
    assert third.is_error
    assert "11.0 is greater than the maximum of 10" in third.content


@pytest.mark.parametrize("name", [None, 7, b"refund"])
def test_a_tool_name_that_is_not_a_string_is_a_configuration_error(name: Any) -> None:
    with pytest.raises(ConfigurationError, match="is not usable"):
        ToolSpec(name, "A tool.", OBJECT, echo)


async def test_an_expiry_of_a_hundred_years_is_the_longest_a_tool_takes() -> None:
    hundred_years = 100 * 365.25 * 24 * 3600
    store = InMemoryCheckpointStore()
    model = ScriptedModel([call("gated", id="c1")])
    gated = tool("gated", echo, requires_approval=True, expires_after=hundred_years)

    result = await Runtime(store).run(agent(model, gated), "go")

    assert result.interruption is not None
    assert result.interruption.expires_at is not None
    lasts = result.interruption.expires_at - result.interruption.created_at
    assert lasts.total_seconds() == hundred_years
    with pytest.raises(ConfigurationError, match="more than 100 years"):
        tool("gated", echo, requires_approval=True, expires_after=hundred_years + 1)


# --- checkpoint data --------------------------------------------------------------------

_CALL = ToolCall("c1", "refund", {"order_id": "1"})


def _one_call_data(**changes: Any) -> dict[str, Any]:
    """The JSON form of a checkpoint waiting for the approval of one call."""
    fields: dict[str, Any] = {
        "id": "cp_1",
        "run_id": "run_1",
        "agent_name": "tester",
        "messages": (Message.user("Refund 1."),),
        "options": {},
        "metadata": {},
        "transcript": (Message.user("Refund 1."), Message.assistant("", [_CALL])),
        "pending_tool_calls": (_CALL,),
        "request": HumanRequest("req_1", "approval", "Allow?", tool_call=_CALL),
        **changes,
    }
    data: dict[str, Any] = json.loads(json.dumps(unstructure_checkpoint(Checkpoint(**fields))))
    return data


def test_the_one_call_checkpoint_these_tests_alter_loads() -> None:
    checkpoint = structure_checkpoint(_one_call_data())
    assert checkpoint.request.tool_call == _CALL
    assert checkpoint.pending_tool_calls == (_CALL,)


def test_a_lone_approval_that_offers_options_is_refused() -> None:
    # An approval is answered with approve or reject: options in one mean the data was
    # altered, even in the common one-call checkpoint.
    data = _one_call_data()
    data["request"]["options"] = [{"id": "yes", "label": "Yes"}]

    with pytest.raises(CheckpointSerializationError, match="approval that offers options") as info:
        structure_checkpoint(data)
    assert info.value.path == "request"


async def test_unstructured_checkpoint_data_is_a_copy_even_when_a_mapping_is_empty() -> None:
    store = InMemoryCheckpointStore()
    model = ScriptedModel([call("gated", id="c1")])
    result = await Runtime(store).run(
        agent(model, tool("gated", echo, requires_approval=True)), "go"
    )
    assert result.checkpoint_id is not None
    checkpoint = await store.load(result.checkpoint_id)
    assert (dict(checkpoint.options), dict(checkpoint.metadata)) == ({}, {})

    data = unstructure_checkpoint(checkpoint)
    data["options"]["temperature"] = 2
    data["metadata"]["tenant"] = "other"

    assert (dict(checkpoint.options), dict(checkpoint.metadata)) == ({}, {})
    assert json.loads(json.dumps(unstructure_checkpoint(checkpoint)))["metadata"] == {}


def test_a_transcript_keeps_its_own_arguments_where_the_messages_differ_only_as_json() -> None:
    # Python takes 0 for False; JSON does not. The run's starting messages and the start
    # of the transcript are shared only when they are the same JSON.
    earlier = ToolCall("e1", "lookup", {"flag": False})
    history = (
        Message.user("Refund 1."),
        Message.assistant("", [earlier]),
        Message.tool(ToolResult("e1", "found")),
    )
    data = _one_call_data(
        messages=history,
        transcript=(*history, Message.assistant("", [_CALL])),
    )
    data["transcript"][1]["tool_calls"][0]["arguments"]["flag"] = 0

    checkpoint = structure_checkpoint(data)

    [in_messages] = checkpoint.messages[1].tool_calls
    [in_transcript] = checkpoint.transcript[1].tool_calls
    assert json.dumps(dict(in_messages.arguments)) == '{"flag": false}'
    assert json.dumps(dict(in_transcript.arguments)) == '{"flag": 0}'
    assert json.dumps(unstructure_checkpoint(checkpoint)) == json.dumps(data)


def test_v1_migration_makes_an_input_question_of_a_later_ask_human_input_call() -> None:
    refund = {"id": "c1", "name": "refund", "arguments": {"order_id": "1"}}
    question = {
        "id": "c2",
        "name": "ask_human",
        "arguments": {"kind": "input", "prompt": "Which note goes to the customer?"},
    }
    data = {
        "id": "cp_v1",
        "version": 1,
        "run_id": "run_v1",
        "agent_name": "tester",
        "messages": [{"role": "user", "content": "Refund 1."}],
        "options": {},
        "metadata": {},
        "transcript": [
            {"role": "user", "content": "Refund 1."},
            {"role": "assistant", "content": "", "tool_calls": [refund, question]},
        ],
        "pending_tool_calls": [refund, question],
        "request": {
            "id": "req_1",
            "kind": "approval",
            "prompt": "Allow?",
            "tool_call": refund,
        },
    }

    checkpoint = structure_checkpoint(data)

    [later] = checkpoint.more_requests
    assert (later.id, later.kind, later.prompt, later.options) == (
        "req_cp_v1_1",
        "input",
        "Which note goes to the customer?",
        (),
    )
    assert later.tool_call == ToolCall("c2", "ask_human", question["arguments"])


def test_a_pending_call_differing_only_as_json_is_refused_in_any_key_order() -> None:
    # {"a": 0, "b": false} and {"b": 0, "a": false} are equal to Python, with the same
    # value types in the same places; as JSON they differ.
    made = ToolCall("c1", "refund", {"a": 0, "b": False})
    data = _one_call_data(
        transcript=(Message.user("Refund 1."), Message.assistant("", [made])),
        pending_tool_calls=(made,),
        request=HumanRequest("req_1", "approval", "Allow?", tool_call=made),
    )
    data["transcript"][-1]["tool_calls"][0]["arguments"] = {"b": 0, "a": False}

    with pytest.raises(CheckpointSerializationError, match="differ from those of call") as info:
        structure_checkpoint(data)
    assert info.value.path == "pending_tool_calls[0].arguments"


def test_a_later_pending_call_that_differs_from_the_models_only_as_json_is_refused() -> None:
    first = ToolCall("c1", "refund", {"order_id": "1"})
    second = ToolCall("c2", "refund", {"order_id": "2", "urgent": 0})
    data = _one_call_data(
        transcript=(Message.user("Refund 1 and 2."), Message.assistant("", [first, second])),
        pending_tool_calls=(first, second),
        request=HumanRequest("req_1", "approval", "Allow 1?", tool_call=first),
        more_requests=(HumanRequest("req_2", "approval", "Allow 2?", tool_call=second),),
    )
    assert structure_checkpoint(json.loads(json.dumps(data))).pending_tool_calls == (
        first,
        second,
    )
    data["transcript"][-1]["tool_calls"][1]["arguments"]["urgent"] = False

    with pytest.raises(CheckpointSerializationError, match="differ from those of call") as info:
        structure_checkpoint(data)
    assert info.value.path == "pending_tool_calls[1].arguments"


def test_a_choice_whose_call_offers_options_that_are_not_a_list_is_refused() -> None:
    question = ToolCall("c1", "ask_human", {"kind": "choice", "prompt": "Pick", "options": "basic"})
    data = _one_call_data(
        transcript=(Message.user("Help me choose."), Message.assistant("", [question])),
        pending_tool_calls=(question,),
        request=HumanRequest("req_1", "choice", "Pick", tool_call=question),
    )

    with pytest.raises(CheckpointSerializationError, match="question that its call does not ask"):
        structure_checkpoint(data)
