"""Checkpoints: what they hold, when they are saved, their JSON form (with a version-1
golden file), and resuming one in "another process"."""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import checkpoints, json_objects, json_values, not_json, texts, transcripts

import runlet
from runlet import (
    CHECKPOINT_VERSION,
    Agent,
    Checkpoint,
    CheckpointSerializationError,
    Decision,
    HumanOption,
    HumanRequest,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    Runtime,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    Usage,
    ask_human,
    structure_checkpoint,
    unstructure_checkpoint,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).parent / "data" / "checkpoint-v1.json"
GOLDEN_V2 = Path(__file__).parent / "data" / "checkpoint-v2.json"

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
    "additionalProperties": False,
}


class Tools:
    """Fresh handler objects, as a new process would build them."""

    def __init__(self) -> None:
        self.refunds: list[dict[str, Any]] = []
        self.lookups: list[dict[str, Any]] = []

    async def lookup(self, arguments: Mapping[str, Any], context: ToolContext) -> Any:
        self.lookups.append(dict(arguments))
        return {"order_id": arguments["order_id"], "total": 42.5, "currency": "EUR"}

    async def refund(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.refunds.append(dict(arguments))
        return f"Refunded order {arguments['order_id']}."

    def agent(self, model: runlet.Model) -> Agent:
        return Agent(
            "support",
            "Refund only after approval.",
            model,
            (
                ToolSpec("lookup", "Look up an order.", ORDER_SCHEMA, self.lookup),
                ToolSpec(
                    "refund", "Refund an order.", ORDER_SCHEMA, self.refund, requires_approval=True
                ),
                ask_human(),
            ),
        )


def roundtrip(checkpoint: Checkpoint) -> Checkpoint:
    """What a durable store does: to JSON text and back."""
    return structure_checkpoint(json.loads(json.dumps(unstructure_checkpoint(checkpoint))))


def is_plain_json(value: object) -> bool:
    if value is None or type(value) in (str, int, float, bool):
        return True
    if type(value) is list:
        return all(is_plain_json(item) for item in value)
    if type(value) is dict:
        return all(type(k) is str and is_plain_json(v) for k, v in value.items())
    return False


async def interrupted_run(
    store: runlet.CheckpointStore, **run_kwargs: Any
) -> tuple[runlet.RunResult, Checkpoint]:
    tools = Tools()
    model = ScriptedModel(
        [call("lookup", id="c1", order_id="9"), call("refund", id="c2", order_id="9"), "Ok."],
        usage=Usage(input_tokens=7, output_tokens=3, requests=1),
    )
    result = await Runtime(checkpoint_store=store).run(
        tools.agent(model), [Message.system("Be careful."), Message.user("Refund 9.")], **run_kwargs
    )
    assert result.checkpoint_id is not None
    return result, await store.load(result.checkpoint_id)


# --- What a checkpoint holds -------------------------------------------------------------


async def test_checkpoint_holds_the_whole_suspended_run() -> None:
    store = InMemoryCheckpointStore()
    options = {"temperature": 0.5}
    metadata = {"tenant": "acme", "user": {"id": 7}}
    result, checkpoint = await interrupted_run(store, options=options, metadata=metadata)

    assert result.interruption is not None
    assert result.checkpoint_id == checkpoint.id
    assert CHECKPOINT_VERSION == checkpoint.version == 2
    assert result.run_id == checkpoint.run_id
    assert "support" == checkpoint.agent_name
    assert (Message.system("Be careful."), Message.user("Refund 9.")) == checkpoint.messages
    assert options == checkpoint.options
    assert metadata == checkpoint.metadata
    assert result.transcript == checkpoint.transcript
    assert ["system", "user", "assistant", "tool", "assistant"] == [
        m.role for m in checkpoint.transcript
    ]
    assert (ToolCall("c2", "refund", {"order_id": "9"}),) == checkpoint.pending_tool_calls
    assert () == checkpoint.results
    assert result.interruption == checkpoint.request
    assert Usage(input_tokens=14, output_tokens=6, requests=2) == checkpoint.usage
    assert 2 == checkpoint.turns


async def test_checkpoint_data_holds_no_callables_and_is_plain_json() -> None:
    _, checkpoint = await interrupted_run(InMemoryCheckpointStore(), metadata={"a": [1, 2.5]})

    data = unstructure_checkpoint(checkpoint)

    assert is_plain_json(data)
    assert data == json.loads(json.dumps(data))
    assert 2 == data["version"]
    assert "handler" not in json.dumps(data)


async def test_checkpoint_is_saved_before_the_interruption_is_reported() -> None:
    log: list[tuple[str, ...]] = []

    class RecordingStore(InMemoryCheckpointStore):
        async def save(self, checkpoint: Checkpoint) -> None:
            log.append(("save", checkpoint.id))
            await super().save(checkpoint)

        async def resolve(
            self,
            checkpoint_id: str,
            token: str,
            resolution: runlet.Resolution,
            next_checkpoint: Checkpoint | None = None,
        ) -> None:
            assert next_checkpoint is not None
            log.append(("resolve", checkpoint_id, next_checkpoint.id))
            await super().resolve(checkpoint_id, token, resolution, next_checkpoint)

    store = RecordingStore()
    tools = Tools()
    calls = [call("refund", id="c1", order_id="1"), call("refund", id="c2", order_id="2")]
    rt = Runtime(checkpoint_store=store)
    agent = tools.agent(ScriptedModel([calls, "Ok."]))

    async with rt.stream(agent, "Refund 1 and 2.") as stream:
        async for event in stream:
            if isinstance(event, runlet.Interrupted):
                assert event.checkpoint_id in store
                log.append(("reported", event.checkpoint_id))
    first = stream.result
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    assert [("save", first.checkpoint_id), ("reported", first.checkpoint_id)] == log

    async with rt.stream_resume(
        agent,
        checkpoint_id=first.checkpoint_id,
        response=HumanResponse(first.interruption.id, "approve"),
    ) as stream:
        async for event in stream:
            if isinstance(event, runlet.Interrupted):
                assert event.checkpoint_id in store
                log.append(("reported", event.checkpoint_id))
    second = stream.result
    # The next checkpoint is saved in the same step that resolves the old one, and only
    # then reported.
    assert second.checkpoint_id is not None
    assert [
        ("resolve", first.checkpoint_id, second.checkpoint_id),
        ("reported", second.checkpoint_id),
    ] == log[2:]
    assert first.checkpoint_id not in store


async def test_a_failing_save_reports_no_interruption() -> None:
    class BrokenStore(InMemoryCheckpointStore):
        async def save(self, checkpoint: Checkpoint) -> None:
            raise OSError("disk full")

    tools = Tools()
    agent = tools.agent(ScriptedModel([call("refund", id="c1", order_id="1")]))
    events: list[runlet.StreamEvent] = []

    with pytest.raises(OSError, match="disk full"):
        async with Runtime(checkpoint_store=BrokenStore()).stream(agent, "Refund 1.") as stream:
            events.extend([event async for event in stream])

    assert [] == [e for e in events if isinstance(e, runlet.Interrupted)]
    assert [] == tools.refunds


# --- The JSON form -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_kwargs", "path"),
    [
        ({"metadata": {"when": datetime.datetime(2024, 1, 2)}}, "metadata['when']"),
        ({"metadata": {"a": [1, {"b": {1, 2}}]}}, "metadata['a'][1]['b']"),
        ({"metadata": {"x": float("nan")}}, "metadata['x']"),
        ({"metadata": {"x": [float("-inf")]}}, "metadata['x'][0]"),
        ({"metadata": {1: "one"}}, "metadata"),
        ({"options": {"stop": b"\n"}}, "options['stop']"),
        ({"options": {"t": decimal.Decimal("0.1")}}, "options['t']"),
    ],
    ids=["datetime", "nested-set", "nan", "inf", "int-key", "bytes", "decimal"],
)
async def test_non_json_metadata_or_options_are_refused_naming_the_path(
    run_kwargs: dict[str, Any], path: str
) -> None:
    # The in-memory store holds any value; only the JSON form refuses.
    result, checkpoint = await interrupted_run(InMemoryCheckpointStore(), **run_kwargs)
    assert "interrupted" == result.status

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(checkpoint)

    assert path == info.value.path
    assert str(info.value).startswith(path)
    assert isinstance(info.value, runlet.RunletError)


def test_non_json_tool_arguments_are_refused_naming_the_path() -> None:
    checkpoint = structure_checkpoint(json.loads(GOLDEN.read_text()))
    bad = ToolCall("c9", "refund", {"order_id": datetime.date(2024, 1, 1)})
    last = checkpoint.transcript[-1]
    transcript = (*checkpoint.transcript[:-1], Message.assistant("", (*last.tool_calls, bad)))

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(attrs.evolve(checkpoint, transcript=transcript))
    assert "transcript[4].tool_calls[3].arguments['order_id']" == info.value.path

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(attrs.evolve(checkpoint, pending_tool_calls=(bad,)))
    assert "pending_tool_calls[0].arguments['order_id']" == info.value.path


def test_non_json_values_in_a_read_only_arguments_view_are_refused_naming_the_path() -> None:
    checkpoint = structure_checkpoint(json.loads(GOLDEN.read_text()))
    bad = ToolCall("c9", "refund", types.MappingProxyType({"order_id": datetime.date(2024, 1, 1)}))

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(attrs.evolve(checkpoint, pending_tool_calls=(bad,)))
    assert "pending_tool_calls[0].arguments['order_id']" == info.value.path


@pytest.mark.parametrize("field", ["arguments", "metadata"])
def test_non_json_values_in_a_decision_are_refused_naming_the_path(field: str) -> None:
    checkpoint = structure_checkpoint(json.loads(GOLDEN_V2.read_text()))
    [decision] = checkpoint.decisions
    changes = {field: {"at": datetime.date(2024, 1, 1)}}

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(
            attrs.evolve(checkpoint, decisions=(attrs.evolve(decision, **changes),))
        )
    assert f"decisions[0].{field}['at']" == info.value.path


@pytest.mark.parametrize(
    "usage",
    [
        Usage(input_tokens=1),
        Usage(output_tokens=1),
        Usage(requests=1),
        Usage(cache_read_tokens=1),
        Usage(cache_write_tokens=1),
    ],
    ids=["input", "output", "requests", "cache-read", "cache-write"],
)
def test_a_usage_with_only_one_count_is_kept(usage: Usage) -> None:
    checkpoint = attrs.evolve(structure_checkpoint(_golden()), usage=usage)

    assert usage == roundtrip(checkpoint).usage


def test_unstructure_refuses_something_that_is_not_a_checkpoint() -> None:
    with pytest.raises(CheckpointSerializationError, match="needs a Checkpoint, got dict"):
        unstructure_checkpoint({"id": "cp"})  # type: ignore[arg-type]


def _golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data.pop(key) and None


MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None], str | None, str]] = [
    ("no-version", _drop("version"), "version", "has no 'version' field"),
    ("version-3", _set(("version",), 3), "version", "version 3 is not supported"),
    ("version-0", _set(("version",), 0), "version", "version 0 is not supported"),
    ("version-str", _set(("version",), "1"), "version", "version '1' is not supported"),
    ("version-bool", _set(("version",), True), "version", "version True is not supported"),
    ("version-float", _set(("version",), 2.0), "version", "version 2.0 is not supported"),
    ("no-request", _drop("request"), "checkpoint.request", "required field missing"),
    ("extra-key", _set(("extra",), 1), "checkpoint", "extra fields found (extra)"),
    (
        "bad-role",
        _set(("transcript", 0, "role"), "robot"),
        "checkpoint.transcript[0].role",
        "robot",
    ),
    ("bad-kind", _set(("request", "kind"), "vote"), "checkpoint.request.kind", "vote"),
    ("metadata-list", _set(("metadata",), [1]), "checkpoint.metadata", "expected"),
    ("options-str", _set(("options",), "x"), "checkpoint.options", "expected"),
    (
        "arguments-list",
        _set(("pending_tool_calls", 0, "arguments"), ["123"]),
        "checkpoint.pending_tool_calls[0].arguments",
        "expected",
    ),
    # An array field takes an array: cattrs alone would read {} or "" as no items.
    *[
        (
            f"{'-'.join(map(str, where))}-{kind}",
            _set(where, bad),
            "checkpoint." + ".".join(map(str, where)).replace(".0", "[0]"),
            f"expected a JSON array, got {kind}",
        )
        for where in [
            ("messages",),
            ("transcript",),
            ("results",),
            ("pending_tool_calls",),
            ("more_requests",),
            ("decisions",),
            ("transcript", 0, "tool_calls"),
            ("transcript", 0, "reasoning"),
            ("request", "options"),
        ]
        for kind, bad in [("dict", {}), ("str", ""), ("int", 0)]
    ],
    ("turns-null", _set(("turns",), None), "checkpoint.turns", "int"),
    # Values of the wrong type are refused, never silently converted.
    (
        "content-null",
        _set(("messages", 0, "content"), None),
        "checkpoint.messages[0].content",
        "str",
    ),
    ("id-int", _set(("id",), 5), "checkpoint.id", "str"),
    (
        "call-id-list",
        _set(("request", "tool_call", "id"), ["a"]),
        "checkpoint.request.tool_call.id",
        "str",
    ),
    (
        "is-error-str",
        _set(("results", 0, "is_error"), "false"),
        "checkpoint.results[0].is_error",
        "bool",
    ),
    ("tokens-float", _set(("usage", "input_tokens"), 1.5), "checkpoint.usage.input_tokens", "int"),
    ("tokens-bool", _set(("usage", "requests"), True), "checkpoint.usage.requests", "int"),
    ("turns-str", _set(("turns",), "2"), "checkpoint.turns", "int"),
]


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_or_unknown_version_data_is_refused(
    mutate: Callable[[dict[str, Any]], None], path: str | None, message: str
) -> None:
    data = _golden()
    mutate(data)

    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(data)

    assert path == info.value.path
    assert message in str(info.value)


@pytest.mark.parametrize("data", [[1], "cp", None], ids=["list", "str", "none"])
def test_structure_refuses_something_that_is_not_a_mapping(data: Any) -> None:
    with pytest.raises(CheckpointSerializationError, match="needs a dict") as info:
        structure_checkpoint(data)
    assert info.value.path is None


# --- Checkpoints that do not hang together ----------------------------------------------

_FIRST = ToolCall("c1", "refund", {"order_id": "1"})
_SECOND = ToolCall("c2", "refund", {"order_id": "2"})


def _one_call_checkpoint(**changes: Any) -> dict[str, Any]:
    """The JSON form of a checkpoint waiting on one refund, with *changes* applied."""
    fields: dict[str, Any] = {
        "id": "cp_1",
        "run_id": "run_1",
        "agent_name": "support",
        "messages": (),
        "options": {},
        "metadata": {},
        "transcript": (Message.user("Refund 1."), Message.assistant("", [_FIRST])),
        "pending_tool_calls": (_FIRST,),
        "request": HumanRequest("req_1", "approval", "Allow?", tool_call=_FIRST),
        **changes,
    }
    return json.loads(json.dumps(unstructure_checkpoint(Checkpoint(**fields))))


@pytest.mark.parametrize(
    "last",
    [Message("user", "Refund 1.", (_FIRST,)), Message.assistant("Refunded.")],
    ids=["calls-in-a-user-message", "assistant-message-without-calls"],
)
def test_a_transcript_that_does_not_end_with_the_waiting_assistant_message_is_refused(
    last: Message,
) -> None:
    data = _one_call_checkpoint(transcript=(Message.user("Refund 1."), last))

    with pytest.raises(CheckpointSerializationError, match="must end with the assistant") as info:
        structure_checkpoint(data)
    assert "transcript" == info.value.path


def test_a_pending_call_whose_tool_differs_from_the_models_call_is_refused() -> None:
    # Same call id, other tool: the person would approve a refund the model never asked for.
    asked = ToolCall("c1", "lookup", {"order_id": "1"})
    data = _one_call_checkpoint(
        transcript=(Message.user("Look up 1."), Message.assistant("", [asked]))
    )

    with pytest.raises(CheckpointSerializationError, match="not in the last assistant") as info:
        structure_checkpoint(data)
    assert "pending_tool_calls[0]" == info.value.path


def test_a_second_open_request_for_one_pending_call_is_refused() -> None:
    request = HumanRequest("req_2", "approval", "Allow?", tool_call=_FIRST)
    data = _one_call_checkpoint(more_requests=(request,))

    with pytest.raises(CheckpointSerializationError, match="2 open requests for 1") as info:
        structure_checkpoint(data)
    assert "more_requests" == info.value.path


def test_a_later_open_request_for_other_arguments_is_refused_by_its_place() -> None:
    other = ToolCall("c2", "refund", {"order_id": "999"})
    data = _one_call_checkpoint(
        transcript=(Message.user("Refund 1 and 2."), Message.assistant("", [_FIRST, _SECOND])),
        pending_tool_calls=(_FIRST, _SECOND),
        more_requests=(HumanRequest("req_2", "approval", "Allow?", tool_call=other),),
    )

    with pytest.raises(
        CheckpointSerializationError, match="does not match pending call 'c2'"
    ) as info:
        structure_checkpoint(data)
    assert "more_requests[0].tool_call" == info.value.path


def _v2(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The version-2 golden data (an approval for a refund, then an ask_human choice),
    with *change* applied."""
    data: dict[str, Any] = json.loads(GOLDEN_V2.read_text())
    change(data)
    return data


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is _DROP:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return change


_DROP = object()


_OPTIONS = [{"id": "yes", "label": "Yes"}]


@pytest.mark.parametrize(
    ("change", "path"),
    [
        # An approval turned into a question: answering it would not run the refund,
        # yet the model would be told the person picked something.
        (_set("request.kind", "choice"), "request"),
        (_set("request.options", _OPTIONS), "request"),
        (_set("more_requests.0.options.0.id", "fax"), "more_requests[0]"),
        (_set("more_requests.0.options.1.label", "Pigeon"), "more_requests[0]"),
        (_set("more_requests.0.prompt", "Refund everything?"), "more_requests[0]"),
        (_set("more_requests.0.kind", "input"), "more_requests[0]"),
        (_set("more_requests.0.options", _DROP), "more_requests[0]"),
    ],
    ids=[
        "approval-made-a-choice",
        "approval-with-options",
        "option-id",
        "option-label",
        "question-prompt",
        "choice-made-input",
        "choice-without-options",
    ],
)
def test_a_request_that_asks_other_than_its_call_is_refused(
    change: Callable[[dict[str, Any]], None], path: str
) -> None:
    with pytest.raises(
        CheckpointSerializationError, match=r"question that its call|approval that offers"
    ) as info:
        structure_checkpoint(_v2(change))
    assert path == info.value.path


async def test_a_question_turned_into_an_approval_is_refused_at_resume() -> None:
    # Without its options, a choice reads as an approval, which loads; but its call is an
    # ask_human call, so approving it would "run" a question. The resume refuses it.
    def change(data: dict[str, Any]) -> None:
        ask = data["more_requests"][0]
        ask["kind"] = "approval"
        del ask["options"]
        data["pending_tool_calls"] = data["pending_tool_calls"][::-1]
        data["request"], data["more_requests"] = ask, [data["request"]]

    store = InMemoryCheckpointStore()
    checkpoint = structure_checkpoint(_v2(change))
    await store.save(checkpoint)
    tools = Tools()
    rt = Runtime(checkpoint_store=store)
    response = HumanResponse(checkpoint.request.id, "approve")

    with pytest.raises(CheckpointSerializationError, match="asks a question") as info:
        await rt.resume(
            tools.agent(ScriptedModel([])), checkpoint_id=checkpoint.id, response=response
        )
    assert "request.kind" == info.value.path
    assert "pending" == (await store.get(checkpoint.id)).status


async def test_an_approval_whose_tool_now_asks_a_question_is_refused_at_resume() -> None:
    store = InMemoryCheckpointStore()
    checkpoint = structure_checkpoint(_v2(lambda data: None))
    await store.save(checkpoint)
    tools = Tools()
    agent = tools.agent(ScriptedModel([]))
    asking = attrs.evolve(ask_human(), name="refund")
    other = Agent(
        agent.name, agent.instructions, agent.model, (agent.tools[0], asking, ask_human())
    )
    response = HumanResponse(checkpoint.request.id, "approve")

    with pytest.raises(CheckpointSerializationError, match="asks a question") as info:
        await Runtime(checkpoint_store=store).resume(
            other, checkpoint_id=checkpoint.id, response=response
        )
    assert "request.kind" == info.value.path
    assert [] == tools.refunds


def test_the_one_call_checkpoint_these_tests_alter_hangs_together() -> None:
    checkpoint = structure_checkpoint(_one_call_checkpoint())

    assert (_FIRST,) == checkpoint.pending_tool_calls
    assert _FIRST == checkpoint.request.tool_call


# --- The version-1 golden file -----------------------------------------------------------


def test_golden_v1_checkpoint_keeps_loading_migrated_to_v2() -> None:
    data = _golden()

    checkpoint = structure_checkpoint(data)

    assert ("cp_golden", 2, "run_golden", "support") == (
        checkpoint.id,
        checkpoint.version,
        checkpoint.run_id,
        checkpoint.agent_name,
    )
    assert {"temperature": 0.2, "stop": ["\n\n"]} == checkpoint.options
    assert {"tenant": "acme", "user": {"id": 7, "roles": ["agent", "admin"]}, "trace": None} == (
        checkpoint.metadata
    )
    assert (
        HumanRequest(
            "req_golden",
            "approval",
            'Allow refund with {"order_id": "123"}?',
            tool_call=ToolCall("call_refund", "refund", {"order_id": "123"}),
            created_at=datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc),
        )
        == checkpoint.request
    )
    # Version 1 made a later call's request only when the run reached it; migration
    # makes it now, with a stable id.
    [ask] = checkpoint.more_requests
    assert ("req_cp_golden_1", "choice", "call_ask") == (ask.id, ask.kind, ask.tool_call.id)
    assert "How should we tell the customer?" == ask.prompt
    assert ("email", "sms") == tuple(option.id for option in ask.options)
    assert ask == structure_checkpoint(_golden()).more_requests[0]
    assert ["call_refund", "call_ask"] == [c.id for c in checkpoint.pending_tool_calls]
    assert (ToolResult("call_notify", checkpoint.results[0].content, is_error=True),) == (
        checkpoint.results
    )
    assert Usage(input_tokens=240, output_tokens=60, requests=2) == checkpoint.usage
    assert 2 == checkpoint.turns
    # Written again, it is version-2 data that reads back equal.
    again = unstructure_checkpoint(checkpoint)
    assert 2 == again["version"]
    assert checkpoint == structure_checkpoint(json.loads(json.dumps(again)))


def _golden_later_calls(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The later pending call's data in both places it is written: transcript and pending."""
    return [data["transcript"][-1]["tool_calls"][1], data["pending_tool_calls"][1]]


def test_v1_migration_asks_for_approval_of_a_later_call_that_is_not_ask_human() -> None:
    # Arguments that look like ask_human's make no question of another tool's call.
    data = _golden()
    for later in _golden_later_calls(data):
        later["name"] = "survey"

    [later] = structure_checkpoint(data).more_requests

    assert ("approval", "call_ask") == (later.kind, later.tool_call.id)
    assert later.prompt.startswith('Allow survey with {"kind": "choice", ')
    assert () == later.options


def test_v1_migration_keeps_only_the_fields_an_option_has() -> None:
    data = _golden()
    for later in _golden_later_calls(data):
        for option in later["arguments"]["options"]:
            option["icon"] = "envelope"

    [ask] = structure_checkpoint(data).more_requests

    assert (
        HumanOption("email", "Email"),
        HumanOption("sms", "Text message", "Only if they opted in"),
    ) == ask.options


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (_set("request.created_at", _DROP), "checkpoint.request"),
        (_set("more_requests.0.created_at", _DROP), "checkpoint.more_requests[0]"),
    ],
    ids=["request", "more_requests"],
)
def test_a_version_2_request_without_its_time_is_refused(
    change: Callable[[dict[str, Any]], None], path: str
) -> None:
    # Not filled in with the time of reading, which would differ at every load.
    with pytest.raises(CheckpointSerializationError, match="created_at is missing") as info:
        structure_checkpoint(_v2(change))
    assert path == info.value.path


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('"trace": null', "metadata['trace']"),
        ('"ticket": 42', "decisions[0].metadata['ticket']"),
    ],
)
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_number_json_cannot_hold_is_refused_when_read(text: str, path: str, value: str) -> None:
    # json.loads reads NaN and Infinity, which no checkpoint can be written with: found
    # only when a resume writes the next checkpoint, after the approved call ran, it
    # would fail every retry. Reading refuses it instead.
    key = text.split(":")[0]
    data = json.loads(GOLDEN_V2.read_text().replace(text, f"{key}: {value}"))

    with pytest.raises(CheckpointSerializationError, match="JSON cannot hold") as info:
        structure_checkpoint(data)
    assert path == info.value.path


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (_set("options.stop", {"\n"}), "options['stop']"),
        (_set("options.temperature", float("nan")), "options['temperature']"),
        (
            _set("transcript.2.tool_calls.0.arguments.when", float("inf")),
            "transcript[2].tool_calls[0].arguments['when']",
        ),
        (
            _set("transcript.4.tool_calls.2.arguments.when", float("-inf")),
            "transcript[4].tool_calls[2].arguments['when']",
        ),
    ],
    ids=["a-set", "nan", "in-a-call", "in-an-answered-call"],
)
def test_data_made_by_hand_with_values_json_cannot_hold_is_refused(
    change: Callable[[dict[str, Any]], None], path: str
) -> None:
    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(_v2(change))
    assert path == info.value.path


# A lookup the run made before the refund that waits.
_EARLIER = (
    Message.user("Refund 1."),
    Message.assistant("", [ToolCall("c0", "lookup", {"order_id": "1"})]),
    Message.tool(ToolResult("c0", "found")),
)


@pytest.mark.parametrize("where", ["messages", "transcript"])
def test_an_earlier_call_json_cannot_hold_is_refused_when_read(where: str) -> None:
    # Everything else in this checkpoint is flat JSON, seen at a glance.
    data = _one_call_checkpoint(
        messages=_EARLIER, transcript=(*_EARLIER, Message.assistant("", [_FIRST]))
    )
    data[where][1]["tool_calls"][0]["arguments"]["total"] = float("nan")

    with pytest.raises(CheckpointSerializationError, match="JSON cannot hold") as info:
        structure_checkpoint(data)
    assert f"{where}[1].tool_calls[0].arguments['total']" == info.value.path


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("metadata", "metadata['score']"),
        ("options", "options['temperature']"),
        ("decision-arguments", "decisions[0].arguments['total']"),
        ("decision-metadata", "decisions[0].metadata['ticket']"),
    ],
)
def test_the_one_value_json_cannot_hold_in_flat_data_is_refused_when_read(
    where: str, path: str
) -> None:
    # Everything else is flat JSON, which reading lets through at a glance: the glance
    # must still see the one value that is not, wherever it is, also alone in its object.
    decided = Decision(
        request_id="req_0",
        checkpoint_id="cp_0",
        tool_call_id="c0",
        tool_name="lookup",
        kind="approval",
        action="approve",
        arguments={"order_id": "1"},
        metadata={"ticket": 1},
        decided_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    )
    data = _one_call_checkpoint(
        transcript=(*_EARLIER, Message.assistant("", [_FIRST])), decisions=(decided,)
    )
    assert structure_checkpoint(copy.deepcopy(data)).decisions == (decided,)
    nan = float("nan")
    if where == "metadata":
        data["metadata"] = {"score": nan}
    elif where == "options":
        data["options"] = {"temperature": nan}
    elif where == "decision-arguments":
        data["decisions"][0]["arguments"]["total"] = nan
    else:
        data["decisions"][0]["metadata"] = {"ticket": nan}

    with pytest.raises(CheckpointSerializationError, match="JSON cannot hold") as info:
        structure_checkpoint(data)
    assert path == info.value.path


def test_finite_floats_and_nested_values_load() -> None:
    def change(data: dict[str, Any]) -> None:
        data["options"]["temperature"] = -0.0
        data["metadata"]["limits"] = {"max": 1e308, "tags": [1.5, None, {"deep": [True]}]}

    checkpoint = structure_checkpoint(_v2(change))

    assert {"max": 1e308, "tags": [1.5, None, {"deep": [True]}]} == checkpoint.metadata["limits"]
    assert "-0.0" == repr(checkpoint.options["temperature"])


def test_v1_migration_keeps_a_time_the_request_already_has() -> None:
    data = _golden()
    data["request"]["created_at"] = "2025-05-06T07:08:09+00:00"

    checkpoint = structure_checkpoint(data)

    assert datetime.datetime(2025, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc) == (
        checkpoint.request.created_at
    )


def test_golden_v2_checkpoint_writes_back_unchanged() -> None:
    data = json.loads(GOLDEN_V2.read_text())

    checkpoint = structure_checkpoint(data)

    assert 2 == checkpoint.version
    assert datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.timezone.utc) == (
        checkpoint.request.expires_at
    )
    [decision] = checkpoint.decisions
    assert ("approve", "ops@example.com", {"ticket": 42}) == (
        decision.action,
        decision.responded_by,
        decision.metadata,
    )
    assert data == unstructure_checkpoint(checkpoint)


async def test_golden_v1_checkpoint_can_be_resumed() -> None:
    store = InMemoryCheckpointStore()
    await store.save(structure_checkpoint(_golden()))
    tools = Tools()
    model = ScriptedModel(["Refunded; we will email the customer."])
    agent = tools.agent(model)
    rt = Runtime(checkpoint_store=store)

    second = await rt.resume(
        agent, checkpoint_id="cp_golden", response=HumanResponse("req_golden", "approve")
    )
    assert second.interruption is not None
    assert second.checkpoint_id is not None
    assert "run_golden" == second.run_id
    assert ("choice", "call_ask") == (second.interruption.kind, second.interruption.tool_call.id)
    assert (
        HumanOption("email", "Email"),
        HumanOption("sms", "Text message", "Only if they opted in"),
    ) == second.interruption.options
    assert "cp_golden" not in store

    result = await rt.resume(
        agent,
        checkpoint_id=second.checkpoint_id,
        response=HumanResponse(second.interruption.id, "select", value="email"),
    )

    assert ("completed", "Refunded; we will email the customer.") == (result.status, result.output)
    assert [{"order_id": "123"}] == tools.refunds
    assert [] == tools.lookups
    [request] = model.requests
    assert {"temperature": 0.2, "stop": ["\n\n"]} == request.options
    assert ["call_refund", "call_ask", "call_notify"] == [
        m.tool_result.tool_call_id for m in request.messages[-3:] if m.tool_result
    ]
    assert "Refunded order 123." == request.messages[-3].content
    assert '{"selected": "email", "label": "Email"}' == request.messages[-2].content
    assert Usage(input_tokens=240, output_tokens=60, requests=3) == result.usage
    assert 0 == len(store)


# --- Resume in another process -----------------------------------------------------------


async def test_resume_in_another_process_from_json_text() -> None:
    # Process A: run until the refund needs approval, then write the checkpoint as JSON.
    tools_a = Tools()
    store_a = InMemoryCheckpointStore()
    model_a = ScriptedModel([call("refund", id="c1", order_id="5")])
    first = await Runtime(checkpoint_store=store_a).run(
        tools_a.agent(model_a), "Refund 5.", metadata={"tenant": "acme"}
    )
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    text = json.dumps(unstructure_checkpoint(await store_a.load(first.checkpoint_id)))
    request_id, checkpoint_id = first.interruption.id, first.checkpoint_id
    del store_a, first

    # Process B: only the text and the two ids survive; everything else is new.
    store_b = InMemoryCheckpointStore()
    await store_b.save(structure_checkpoint(json.loads(text)))
    tools_b = Tools()
    contexts: list[ToolContext] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        contexts.append(context)
        return await tools_b.refund(arguments, context)

    model_b = ScriptedModel(["Done."])
    agent_b = Agent(
        "support",
        "Refund only after approval.",
        model_b,
        (ToolSpec("refund", "Refund.", ORDER_SCHEMA, refund, requires_approval=True),),
    )

    result = await Runtime(checkpoint_store=store_b).resume(
        agent_b, checkpoint_id=checkpoint_id, response=HumanResponse(request_id, "approve")
    )

    assert ("completed", "Done.") == (result.status, result.output)
    assert [] == tools_a.refunds
    assert [{"order_id": "5"}] == tools_b.refunds
    assert {"tenant": "acme"} == dict(contexts[0].metadata)
    assert ("c1", "support") == (contexts[0].tool_call_id, contexts[0].agent_name)
    assert ["user", "assistant", "tool"] == [m.role for m in model_b.requests[0].messages]
    assert 0 == len(store_b)


async def test_a_store_that_keeps_only_json_text_works_end_to_end() -> None:
    class JsonStore:
        """A durable-store stand-in: it keeps JSON text and nothing else."""

        def __init__(self, rows: dict[str, str]) -> None:
            self.rows = rows

        async def save(self, checkpoint: Checkpoint) -> None:
            self.rows[checkpoint.id] = json.dumps(unstructure_checkpoint(checkpoint))

        async def load(self, checkpoint_id: str) -> Checkpoint:
            try:
                return structure_checkpoint(json.loads(self.rows[checkpoint_id]))
            except KeyError:
                raise runlet.CheckpointNotFoundError(
                    "missing", checkpoint_id=checkpoint_id
                ) from None

        async def delete(self, checkpoint_id: str) -> None:
            self.rows.pop(checkpoint_id, None)

    rows: dict[str, str] = {}
    assert isinstance(JsonStore(rows), runlet.CheckpointStore)
    assert not isinstance(JsonStore(rows), runlet.DurableCheckpointStore)
    model_a = ScriptedModel([call("ask_human", id="c1", kind="input", prompt="Which order?")])
    first = await Runtime(checkpoint_store=JsonStore(rows)).run(
        Tools().agent(model_a), "Refund my order.", options={"seed": 1}
    )
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    assert [first.checkpoint_id] == list(rows)

    tools_b = Tools()
    model_b = ScriptedModel([call("lookup", id="c2", order_id="77"), "Order 77 costs 42.5 EUR."])
    result = await Runtime(checkpoint_store=JsonStore(dict(rows))).resume(
        tools_b.agent(model_b),
        checkpoint_id=first.checkpoint_id,
        response=HumanResponse(first.interruption.id, "submit", value="77"),
    )

    assert "Order 77 costs 42.5 EUR." == result.output
    assert [{"order_id": "77"}] == tools_b.lookups
    assert '{"answer": "77"}' == model_b.requests[0].messages[-1].content
    assert {"seed": 1} == model_b.requests[0].options


# --- Property-based round trips ----------------------------------------------------------


@given(checkpoints())
def test_any_checkpoint_round_trips_through_json(checkpoint: Checkpoint) -> None:
    assert checkpoint == roundtrip(checkpoint)


@given(json_objects, json_objects)
def test_any_json_metadata_and_options_round_trip(
    metadata: dict[str, Any], options: dict[str, Any]
) -> None:
    checkpoint = structure_checkpoint(_golden())
    changed = attrs.evolve(checkpoint, metadata=metadata, options=options)

    again = roundtrip(changed)

    assert metadata == again.metadata
    assert options == again.options


@given(transcripts, transcripts)
def test_any_transcript_round_trips(
    transcript: tuple[Message, ...], messages: tuple[Message, ...]
) -> None:
    checkpoint = structure_checkpoint(_golden())
    # A checkpoint's transcript ends with the message whose calls wait.
    transcript = (*transcript, checkpoint.transcript[-1])
    changed = attrs.evolve(checkpoint, transcript=transcript, messages=messages)

    again = roundtrip(changed)

    assert transcript == again.transcript
    assert messages == again.messages


@st.composite
def buried(draw: st.DrawFn) -> tuple[Any, str]:
    """A JSON value with one non-JSON value somewhere inside, and that value's path."""
    value, suffix = draw(not_json), ""
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        if draw(st.booleans()):
            before = draw(st.lists(json_values, max_size=2))
            after = draw(st.lists(json_values, max_size=2))
            value, suffix = [*before, value, *after], f"[{len(before)}]{suffix}"
        else:
            key = draw(texts)
            others = {k: v for k, v in draw(json_objects).items() if k != key}
            value, suffix = {**others, key: value}, f"[{key!r}]{suffix}"
    return value, suffix


@given(st.sampled_from(["metadata", "options"]), texts, buried())
def test_a_non_json_value_anywhere_is_refused_with_its_path(
    field: str, key: str, bad: tuple[Any, str]
) -> None:
    value, suffix = bad
    changes: dict[str, Any] = {field: {key: value}}
    checkpoint = structure_checkpoint(_golden())
    changed = attrs.evolve(checkpoint, **changes)

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(changed)

    assert f"{field}[{key!r}]{suffix}" == info.value.path


def test_read_only_mappings_in_checkpoint_data_are_accepted() -> None:
    # JSON gives dicts; data built in Python may hold other mappings. The fast hooks turn
    # them down and the detailed converter reads them, with the same result.
    data = json.loads(GOLDEN_V2.read_text())
    expected = structure_checkpoint(data)
    data["request"] = types.MappingProxyType(data["request"])

    assert expected == structure_checkpoint(data)


def test_tuples_in_checkpoint_data_are_read_as_arrays() -> None:
    # Data built in Python may hold tuples where JSON gives lists.
    data = json.loads(GOLDEN_V2.read_text())
    expected = structure_checkpoint(data)
    data["transcript"] = tuple(data["transcript"])
    data["decisions"] = tuple(data["decisions"])

    assert expected == structure_checkpoint(data)


async def test_a_question_for_a_tool_that_needs_an_approval_is_refused_at_resume() -> None:
    # The agent's "ask_human" is now an ordinary tool: the stored question would be
    # answered as if a person had been asked what that tool does.
    store = InMemoryCheckpointStore()
    checkpoint = structure_checkpoint(_v2(lambda data: None))
    await store.save(checkpoint)
    tools = Tools()
    agent = tools.agent(ScriptedModel([]))
    plain = ToolSpec("ask_human", "Not the built-in one.", {"type": "object"}, tools.lookup)
    other = Agent(agent.name, agent.instructions, agent.model, (*agent.tools[:2], plain))
    responses = [
        HumanResponse(checkpoint.request.id, "approve"),
        HumanResponse(checkpoint.more_requests[0].id, "select", "email"),
    ]

    with pytest.raises(CheckpointSerializationError, match="needs an approval") as info:
        await Runtime(checkpoint_store=store).resume(
            other, checkpoint_id=checkpoint.id, responses=responses
        )
    assert "more_requests[0].kind" == info.value.path
    assert ([], "pending") == (tools.refunds, (await store.get(checkpoint.id)).status)


async def test_a_checkpoint_nested_beyond_python_is_a_serialization_error_both_ways() -> None:
    # run() refuses such metadata; a checkpoint built or altered by hand may still hold
    # it, and unstructure/structure must say so with their documented error.
    _, checkpoint = await interrupted_run(InMemoryCheckpointStore())
    deep: list[Any] = []
    inner = deep
    for _ in range(5_000):
        inner.append([])
        inner = inner[0]

    with pytest.raises(CheckpointSerializationError, match=r"cannot be written: .* nested"):
        unstructure_checkpoint(attrs.evolve(checkpoint, metadata={"deep": deep}))
    data = {**unstructure_checkpoint(checkpoint), "metadata": {"deep": deep}}
    with pytest.raises(CheckpointSerializationError, match=r"cannot be read: .* nested"):
        structure_checkpoint(data)
