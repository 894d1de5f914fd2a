"""JSON for every public data class: unstructure/structure round trips, the tagged form of
stream events, and the errors on data that is not JSON or not valid."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any, get_args

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    checkpoints,
    decisions,
    event_strategies,
    human_requests,
    human_responses,
    json_values,
    messages,
    not_json,
    pending_requests,
    run_results,
    stream_events,
    tool_calls,
    tool_results,
    transcripts,
    usages,
)

import runlet
from runlet import (
    EVENT_TYPES,
    CheckpointSerializationError,
    Decision,
    HumanRequest,
    HumanResponse,
    Interrupted,
    Message,
    MessageCompleted,
    PendingRequest,
    RunFinished,
    RunResult,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolResult,
    Usage,
    structure,
    structure_event,
    unstructure,
    unstructure_checkpoint,
    unstructure_event,
)
from runlet._checkpoint import _as_python_310_reads

UTC = datetime.timezone.utc
WHEN = datetime.datetime(2026, 11, 30, 8, 15, 0, 250000, tzinfo=UTC)

DATA_CLASSES: list[tuple[type[Any], st.SearchStrategy[Any]]] = [
    (RunResult, run_results()),
    (HumanRequest, human_requests),
    (HumanResponse, human_responses),
    (PendingRequest, pending_requests),
    (Decision, decisions),
    (Message, messages),
    (ToolCall, tool_calls),
    (ToolResult, tool_results),
    (Usage, usages),
]

CLASS_IDS = [cls.__name__ for cls, _ in DATA_CLASSES]

EVENT_CLASSES: list[type[Any]] = list(get_args(StreamEvent))


def through_json(data: Any) -> Any:
    """What the other end of a wire reads; refuses NaN and infinities like a strict peer."""
    return json.loads(json.dumps(data, allow_nan=False))


class TestRoundTrip:
    @pytest.mark.parametrize(("cls", "objects"), DATA_CLASSES, ids=CLASS_IDS)
    @given(data=st.data())
    def test_every_data_class(
        self, cls: type[Any], objects: st.SearchStrategy[Any], data: st.DataObject
    ) -> None:
        obj = data.draw(objects)
        assert type(obj) is cls
        assert obj == structure(through_json(unstructure(obj)), cls)

    @given(event=stream_events)
    def test_every_stream_event_by_its_class(self, event: StreamEvent) -> None:
        assert event == structure(through_json(unstructure(event)), type(event))

    @given(transcript=transcripts)
    def test_a_sequence_of_data_objects(self, transcript: tuple[Message, ...]) -> None:
        data = through_json(unstructure(transcript))
        assert transcript == structure(data, tuple[Message, ...])

    def test_a_sequence_names_the_index_of_a_bad_value(self) -> None:
        with pytest.raises(CheckpointSerializationError) as caught:
            unstructure([Message.user("hi"), Message.assistant("", [_call(1j)])])
        assert caught.value.path == "[1].tool_calls[0].arguments['when']"

    @given(checkpoint=checkpoints())
    def test_a_checkpoint_unstructures_like_unstructure_checkpoint(self, checkpoint: Any) -> None:
        assert unstructure_checkpoint(checkpoint) == unstructure(checkpoint)

    def test_defaults_are_left_out_and_times_are_iso_strings(self) -> None:
        request = HumanRequest(
            "req_1",
            "approval",
            "Allow refund?",
            tool_call=ToolCall("call_1", "refund", {"order_id": "123"}),
            created_at=WHEN,
        )
        assert unstructure(request) == {
            "id": "req_1",
            "kind": "approval",
            "prompt": "Allow refund?",
            "tool_call": {"id": "call_1", "name": "refund", "arguments": {"order_id": "123"}},
            "created_at": "2026-11-30T08:15:00.250000+00:00",
        }
        assert unstructure(HumanResponse("req_1", "approve")) == {
            "request_id": "req_1",
            "action": "approve",
        }
        assert unstructure(ToolCall("call_1", "ping")) == {"id": "call_1", "name": "ping"}

    @pytest.mark.parametrize(
        "written",
        [
            "2026-11-30T09:15:00.250000+01:00",
            "2026-11-30T08:15:00.250000Z",
            # What other tools write, which Python 3.10's fromisoformat() alone refuses
            # (3.11 reads them): a worker on 3.10 must read what one on 3.13 reads.
            "2026-11-30T08:15:00.25Z",  # fewer fraction digits
            "2026-11-30T08:15:00.25+00:00",  # PostgreSQL's to_json(timestamptz)
            "2026-11-30T08:15:00.250000999Z",  # nanoseconds (Go): cut to microseconds
            "2026-11-30T09:15:00.25+01",  # an offset in hours
            "2026-11-30T03:45:00,25-0430",  # a comma, an offset without a colon
            "20261130T081500.25Z",  # the basic format
            "2026-11-30 08:15:00.25Z",  # a space, as PostgreSQL's text form has it
            "2026-11-30T08:15:00.250000+00:00:00",  # an offset with seconds
        ],
    )
    def test_times_in_other_zones_come_back_as_the_same_instant_in_utc(self, written: str) -> None:
        data = unstructure(attrs.evolve(_request(), created_at=WHEN))
        data["created_at"] = written

        created_at = structure(data, HumanRequest).created_at

        # Equal instants compare equal whatever their zone: the zone is checked too.
        assert (WHEN, UTC) == (created_at, created_at.tzinfo)
        assert "2026-11-30T08:15:00.250000+00:00" == created_at.isoformat()


@pytest.mark.parametrize(
    "written",
    [
        "2026-11-30",  # a date alone
        "2026-11-30T08:15:00",  # no zone: refused, times are aware UTC
        "2026-13-30T08:15:00Z",  # no 13th month
        "2026-11-30T08:15:00+25:00",  # no such offset
        "yesterday",
        "2026-11-30T08:15:00Z and more",  # text after the time
    ],
)
def test_a_time_that_is_not_one_is_refused(written: str) -> None:
    data = unstructure(_request())
    data["created_at"] = written

    with pytest.raises(CheckpointSerializationError, match="created_at"):
        structure(data, HumanRequest)


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("2026-11-30T08:15:00.123456789Z", "2026-11-30T08:15:00.123456+00:00"),
        ("2026-11-30T08:15:00.25Z", "2026-11-30T08:15:00.250000+00:00"),
        ("2026-11-30T08:15:00.Z", "2026-11-30T08:15:00+00:00"),  # 3.11 reads it too
        ("2026-11-30T08:15Z", "2026-11-30T08:15:00+00:00"),
        ("2026-11-30 08:15:00,5+01", "2026-11-30T08:15:00.500000+01:00"),
        ("2026-11-30T08:15:00-0430", "2026-11-30T08:15:00-04:30"),
        ("2026-11-30T08:15:00+01:30:15", "2026-11-30T08:15:00+01:30:15"),
        ("20261130T081500Z", "2026-11-30T08:15:00+00:00"),
        ("2026-11-30T08:15:00", "2026-11-30T08:15:00"),  # no zone: refused later
        ("2026-11-30T08:15:00Z and more", None),
        ("2026-11-30", None),
        ("yesterday", None),
    ],
)
def test_times_are_respelled_as_python_3_10_reads_them(written: str, read: str | None) -> None:
    # The fallback for what 3.10's fromisoformat() refuses, checked on every Python (on
    # 3.11 and later fromisoformat() reads these itself and the fallback never runs).
    assert read == _as_python_310_reads(written)


def _request() -> HumanRequest:
    return HumanRequest(
        "req_1", "approval", "Allow?", tool_call=ToolCall("call_1", "refund"), created_at=WHEN
    )


class TestTaggedEvents:
    @given(event=stream_events)
    def test_round_trip(self, event: StreamEvent) -> None:
        data = through_json(unstructure_event(event))
        assert EVENT_TYPES[data["type"]] is type(event)
        assert event == structure_event(data)

    def test_every_member_of_the_union_has_a_tag_and_a_strategy(self) -> None:
        # A new event class (say a reasoning delta) gets its tag from the union; the
        # round-trip tests need its strategy in tests/strategies.py.
        assert set(EVENT_TYPES.values()) == set(EVENT_CLASSES)
        assert len(EVENT_TYPES) == len(EVENT_CLASSES)
        assert set(event_strategies) == set(EVENT_CLASSES)

    @pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
    def test_tags_are_the_class_names_in_snake_case(self, cls: type[Any]) -> None:
        tag = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        assert EVENT_TYPES[tag] is cls

    def test_the_tags_of_the_wire_format_stay(self) -> None:
        expected = {
            "text_delta": TextDelta,
            "tool_call_delta": ToolCallDelta,
            "message_completed": MessageCompleted,
            "tool_call_started": ToolCallStarted,
            "tool_call_finished": ToolCallFinished,
            "interrupted": Interrupted,
            "run_finished": RunFinished,
        }
        assert expected == {tag: EVENT_TYPES[tag] for tag in expected}

    def test_the_form_is_the_tag_then_the_fields(self) -> None:
        call = ToolCall("call_1", "refund", {"order_id": "123"})
        data = unstructure_event(ToolCallFinished(call, ToolResult("call_1", "Refunded.")))
        assert data == {
            "type": "tool_call_finished",
            "tool_call": {"id": "call_1", "name": "refund", "arguments": {"order_id": "123"}},
            "result": {"tool_call_id": "call_1", "content": "Refunded."},
        }
        assert next(iter(data)) == "type"
        assert unstructure_event(TextDelta("Hel")) == {"type": "text_delta", "text": "Hel"}

    def test_the_run_finished_event_carries_the_whole_result(self) -> None:
        result = RunResult(
            status="interrupted",
            interruption=_request(),
            checkpoint_id="cp_1",
            transcript=(Message.user("Refund order 123"),),
            usage=Usage(10, 5, 1),
            run_id="run_1",
            pending_requests=(_request(),),
        )
        data = through_json(unstructure_event(RunFinished(result)))
        assert data["result"]["checkpoint_id"] == "cp_1"
        assert data["result"]["pending_requests"][0]["id"] == "req_1"
        assert structure_event(data) == RunFinished(result)

    @pytest.mark.parametrize("value", [None, "text_delta", ["text_delta"], 3])
    def test_structure_event_needs_an_object(self, value: Any) -> None:
        with pytest.raises(CheckpointSerializationError, match="needs a JSON object"):
            structure_event(value)

    @pytest.mark.parametrize(
        "data",
        [
            {},
            {"text": "x"},
            {"type": "reasoning"},
            {"type": 1},
            {"type": "TextDelta"},
            {"type": ["text_delta"]},
        ],
    )
    def test_an_unknown_or_missing_type_is_refused_naming_the_known_ones(
        self, data: dict[str, Any]
    ) -> None:
        with pytest.raises(CheckpointSerializationError, match="'text_delta'") as caught:
            structure_event(data)
        assert caught.value.path == "type"

    def test_a_bad_payload_names_its_path(self) -> None:
        data = {"type": "tool_call_started", "tool_call": {"id": "c", "name": 7}}
        with pytest.raises(CheckpointSerializationError, match="expected str") as caught:
            structure_event(data)
        assert caught.value.path == "ToolCallStarted.tool_call.name"

    def test_structure_refuses_the_union_and_points_to_structure_event(self) -> None:
        with pytest.raises(CheckpointSerializationError, match="use structure_event"):
            structure({"text": "x"}, StreamEvent)  # type: ignore[arg-type]
        with pytest.raises(CheckpointSerializationError, match="not the union"):
            structure({"text": "x"}, TextDelta | ToolCallDelta)  # type: ignore[arg-type]

    def test_an_extra_field_is_refused(self) -> None:
        with pytest.raises(CheckpointSerializationError, match=r"extra fields found \(colour\)"):
            structure_event({"type": "text_delta", "text": "x", "colour": "red"})

    @pytest.mark.parametrize("value", [_request(), Usage(), {"type": "text_delta", "text": ""}])
    def test_unstructure_event_refuses_what_is_not_an_event(self, value: Any) -> None:
        with pytest.raises(CheckpointSerializationError, match="takes a stream event"):
            unstructure_event(value)


def _call(bad: Any) -> ToolCall:
    return ToolCall("call_1", "refund", {"order_id": "1", "when": bad})


NOT_JSON_CASES: list[tuple[str, Any, str]] = [
    ("tool call", lambda bad: _call(bad), "arguments['when']"),
    (
        "result transcript",
        lambda bad: RunResult(
            status="completed",
            output="done",
            transcript=(Message.user("hi"), Message.assistant("", [_call(bad)])),
            usage=Usage(),
            run_id="run_1",
        ),
        "transcript[1].tool_calls[0].arguments['when']",
    ),
    (
        "pending request",
        lambda bad: PendingRequest(
            "cp_1", "run_1", "agent", _request(), {"ticket": {"opened": bad}}, WHEN
        ),
        "metadata['ticket']['opened']",
    ),
    (
        "response metadata",
        lambda bad: HumanResponse("req_1", "approve", responded_by="ops", metadata={"at": bad}),
        "metadata['at']",
    ),
    (
        "response edit",
        lambda bad: HumanResponse("req_1", "approve", edited_arguments={"n": [1, bad]}),
        "edited_arguments['n'][1]",
    ),
    (
        "decision",
        lambda bad: Decision(
            request_id="req_1",
            checkpoint_id="cp_1",
            tool_call_id="call_1",
            tool_name="refund",
            kind="approval",
            action="approve",
            arguments={"when": bad},
            decided_at=WHEN,
        ),
        "arguments['when']",
    ),
    (
        "request in an event",
        lambda bad: Interrupted(attrs.evolve(_request(), tool_call=_call(bad)), "cp_1"),
        "request.tool_call.arguments['when']",
    ),
]


class TestNotJSON:
    """A value JSON cannot hold is refused when unstructuring, with the path to it."""

    @pytest.mark.parametrize(
        ("make", "path"), [c[1:] for c in NOT_JSON_CASES], ids=[c[0] for c in NOT_JSON_CASES]
    )
    @given(bad=not_json)
    def test_unstructure_names_the_path(self, make: Any, path: str, bad: Any) -> None:
        with pytest.raises(CheckpointSerializationError, match="JSON") as caught:
            unstructure(make(bad))
        assert caught.value.path == path

    @given(bad=not_json)
    def test_unstructure_event_names_the_path_inside_the_event(self, bad: Any) -> None:
        with pytest.raises(CheckpointSerializationError) as caught:
            unstructure_event(ToolCallStarted(_call(bad)))
        assert caught.value.path == "tool_call.arguments['when']"

    def test_a_bare_value_that_is_not_json_is_named_by_its_type(self) -> None:
        with pytest.raises(CheckpointSerializationError, match=r"^set is a set") as caught:
            unstructure({1, 2})
        assert caught.value.path == "set"

    def test_a_list_that_contains_itself_is_refused_naming_the_path(self) -> None:
        loop: list[Any] = [1]
        loop.append(loop)
        with pytest.raises(CheckpointSerializationError, match="contains itself") as caught:
            unstructure(loop)
        assert caught.value.path == "list[1]"

    def test_a_key_that_is_not_a_string_is_refused(self) -> None:
        with pytest.raises(CheckpointSerializationError, match="keys") as caught:
            unstructure(ToolCall("c", "t", {"n": {1: "one"}}))
        assert caught.value.path == "arguments['n']"


def _valid(cls: type[Any], **changes: Any) -> dict[str, Any]:
    base: dict[type[Any], Any] = {
        RunResult: RunResult(
            status="completed",
            output="done",
            transcript=(Message.user("hi"),),
            usage=Usage(1, 2, 1),
            run_id="run_1",
        ),
        HumanResponse: HumanResponse("req_1", "reject", "too much"),
        Usage: Usage(1, 2, 3),
        ToolCallDelta: ToolCallDelta(0, "call_1", "refund", '{"order'),
        PendingRequest: PendingRequest("cp_1", "run_1", "agent", _request(), {}, WHEN),
    }
    data: dict[str, Any] = unstructure(base[cls])
    data.update(changes)
    return data


MALFORMED_CASES: list[tuple[str, type[Any], Any, str | None, str]] = [
    ("not an object", RunResult, "completed", "RunResult", "expected a JSON object"),
    ("a list", Usage, [1, 2, 3], "Usage", "expected a JSON object"),
    ("a number", HumanResponse, 5, "HumanResponse", "expected a JSON object @"),
    (
        "a request without its time",
        HumanRequest,
        {k: v for k, v in unstructure(_request()).items() if k != "created_at"},
        "HumanRequest",
        "required field created_at is missing",
    ),
    ("null", RunResult, None, "RunResult", "expected a JSON object @"),
    (
        "a number for a call",
        RunResult,
        _valid(RunResult, transcript=[{"role": "assistant", "content": "", "tool_calls": [5]}]),
        "RunResult.transcript[0].tool_calls[0]",
        "expected a JSON object @",
    ),
    (
        "bad literal",
        RunResult,
        _valid(RunResult, status="done"),
        "RunResult.status",
        "expected one of 'completed', 'interrupted', got 'done'",
    ),
    (
        "bad role",
        RunResult,
        _valid(RunResult, transcript=[{"role": "robot", "content": ""}]),
        "RunResult.transcript[0].role",
        "got 'robot'",
    ),
    ("missing", RunResult, {"status": "completed"}, "RunResult.transcript", "missing"),
    ("extra", Usage, _valid(Usage, cost=1), "Usage", r"extra fields found \(cost\)"),
    (
        "extra in a tool call",
        ToolCall,
        {"id": "call_1", "name": "refund", "extra": 1},
        "ToolCall",
        r"extra fields found \(extra\)",
    ),
    (
        "extra in a message",
        Message,
        {"role": "user", "content": "hi", "extra": 1},
        "Message",
        r"extra fields found \(extra\)",
    ),
    (
        "extra in a request",
        HumanRequest,
        {**unstructure(_request()), "extra": 1},
        "HumanRequest",
        r"extra fields found \(extra\)",
    ),
    ("bool is not int", Usage, _valid(Usage, requests=True), "Usage.requests", "expected int"),
    ("float is not int", Usage, _valid(Usage, requests=1.0), "Usage.requests", "expected int"),
    ("int is not str", ToolCallDelta, _valid(ToolCallDelta, id=1), "ToolCallDelta.id", "str"),
    (
        "response that makes no sense",
        HumanResponse,
        _valid(HumanResponse, action="approve"),
        "HumanResponse",
        "'approve' takes no value",
    ),
    (
        "metadata not an object",
        PendingRequest,
        _valid(PendingRequest, metadata=["x"]),
        "PendingRequest.metadata",
        "expected a JSON object, got list",
    ),
    (
        "naive time",
        PendingRequest,
        _valid(PendingRequest, created_at="2026-11-30T08:15:00"),
        "PendingRequest.created_at",
        "no time zone",
    ),
    (
        "time not a string",
        PendingRequest,
        _valid(PendingRequest, created_at=1764490500),
        "PendingRequest.created_at",
        "ISO 8601",
    ),
]


class TestMalformed:
    """Data that is not a valid instance is refused with the path to the first problem."""

    @pytest.mark.parametrize(
        ("cls", "data", "path", "message"),
        [c[1:] for c in MALFORMED_CASES],
        ids=[c[0] for c in MALFORMED_CASES],
    )
    def test_refused_with_path(self, cls: type[Any], data: Any, path: str, message: str) -> None:
        with pytest.raises(CheckpointSerializationError, match=message) as caught:
            structure(data, cls)
        assert caught.value.path == path
        assert str(caught.value).startswith(f"This data is not a valid {cls.__name__}: ")

    @pytest.mark.parametrize(("cls", "objects"), DATA_CLASSES, ids=CLASS_IDS)
    @given(data=st.data())
    def test_any_json_either_structures_exactly_or_is_refused_clearly(
        self, cls: type[Any], objects: st.SearchStrategy[Any], data: st.DataObject
    ) -> None:
        # Start from valid data and damage one field with an arbitrary JSON value.
        valid = unstructure(data.draw(objects))
        key = data.draw(st.sampled_from([field.name for field in attrs.fields(cls)]))
        damaged = {**valid, key: data.draw(json_values)}
        error: CheckpointSerializationError | None = None
        try:
            obj = structure(damaged, cls)
        except CheckpointSerializationError as exc:
            error = exc
        if error is None:
            assert obj == structure(through_json(unstructure(obj)), cls)
        else:
            assert error.path is not None
            assert error.path.startswith(cls.__name__)


class TestEventsOverTheWire:
    """What an SSE client sees: a JSON object per event, and the events back from it."""

    def test_a_stream_as_json_lines_comes_back_equal(self) -> None:
        call = ToolCall("call_1", "refund", {"order_id": "123"})
        result = RunResult(
            status="completed",
            output="Refunded.",
            transcript=(Message.user("Refund 123"),),
            usage=Usage(3, 4, 2),
            run_id="run_1",
        )
        events: list[StreamEvent] = [
            TextDelta("Let me "),
            ToolCallDelta(0, "call_1", "refund", '{"order_id": "123"}'),
            MessageCompleted(Message.assistant("Let me ", [call])),
            ToolCallStarted(call),
            ToolCallFinished(call, ToolResult("call_1", "ok")),
            Interrupted(_request(), "cp_1"),
            RunFinished(result),
        ]
        lines = [json.dumps(unstructure_event(event)) for event in events]
        assert [structure_event(json.loads(line)) for line in lines] == events


# --- structure() refuses what unstructure() would refuse --------------------------------


def test_structure_of_a_checkpoint_makes_every_check_structure_checkpoint_makes() -> None:
    v1 = json.loads((Path(__file__).parent / "data" / "checkpoint-v1.json").read_text())
    assert runlet.structure(v1, runlet.Checkpoint) == runlet.structure_checkpoint(v1)
    with pytest.raises(runlet.CheckpointSerializationError) as info:
        runlet.structure({**v1, "version": 99}, runlet.Checkpoint)
    assert "version" == info.value.path


@pytest.mark.parametrize(
    ("data", "cls", "path"),
    [
        (
            {"request_id": "r", "action": "approve", "metadata": {"x": float("nan")}},
            runlet.HumanResponse,
            "HumanResponse.metadata['x']",
        ),
        (
            {"request_id": "r", "action": "approve", "edited_arguments": {"n": float("inf")}},
            runlet.HumanResponse,
            "HumanResponse.edited_arguments['n']",
        ),
        ({"id": "c", "name": "t", "arguments": {1: "int key"}}, runlet.ToolCall, None),
    ],
)
def test_structure_refuses_values_json_cannot_hold(data: Any, cls: Any, path: Any) -> None:
    with pytest.raises(runlet.CheckpointSerializationError) as info:
        runlet.structure(data, cls)
    if path is not None:
        assert path == info.value.path


def test_a_key_that_is_not_a_string_is_named_not_a_type_error() -> None:
    # (How the extra key is put in words depends on the cattrs version.)
    with pytest.raises(runlet.CheckpointSerializationError, match="not a valid Usage") as info:
        runlet.structure({"input_tokens": 1, 7: "seven"}, runlet.Usage)
    assert "Usage" == info.value.path
