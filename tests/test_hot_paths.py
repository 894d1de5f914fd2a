"""The shortcuts on the human round trip's hot path give the same answers as the long
way: structuring shares equal data only when it is equal, the one-shot JSON encoders
write what ``json`` writes, and a run's first usage is the model's own."""

from __future__ import annotations

import datetime
import json
import types
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import event_strategies, json_objects, json_values, not_json, run_results

from runlet import (
    CallRecord,
    CheckpointSerializationError,
    Claim,
    Decision,
    Message,
    ModelRequest,
    Resolution,
    RunResult,
    StoredCheckpoint,
    ToolCall,
    ToolContext,
    ToolResult,
    Usage,
    structure_checkpoint,
    unstructure,
    unstructure_checkpoint,
)
from runlet._checkpoint import (
    Checkpoint,
    _check_object,
    _is_json_object,
    _verified,
    check_integrity,
)
from runlet._errors import RunletError
from runlet._human import HumanRequest, utc_now
from runlet._messages import ZERO_USAGE
from runlet._tools import _encode, show_arguments
from runlet._util import same_json, slot_builder


def _checkpoint(**changes: Any) -> Checkpoint:
    """A one-call approval checkpoint whose parts are equal but not the same objects, as
    a checkpoint read from JSON would be before sharing."""
    call = ToolCall("call_1", "refund", {"order_id": "7", "amount": 5})
    fields: dict[str, Any] = {
        "id": "cp_1",
        "run_id": "run_1",
        "agent_name": "support",
        "messages": (Message.system("Be careful."), Message.user("Refund order 7.")),
        "options": {},
        "metadata": {},
        "transcript": (
            Message.system("Be careful."),
            Message.user("Refund order 7."),
            Message.assistant("", (call,)),
        ),
        "pending_tool_calls": (ToolCall("call_1", "refund", {"order_id": "7", "amount": 5}),),
        "request": HumanRequest(
            "req_1",
            "approval",
            "Refund?",
            tool_call=ToolCall("call_1", "refund", {"order_id": "7", "amount": 5}),
            created_at=utc_now(),
        ),
        "turns": 1,
    }
    fields.update(changes)
    return Checkpoint(**fields)


def _json(checkpoint: Checkpoint) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(unstructure_checkpoint(checkpoint)))
    return data


def test_equal_parts_of_a_checkpoint_are_structured_once_and_shared() -> None:
    original = _checkpoint()

    again = structure_checkpoint(_json(original))

    assert original == again
    assert again.transcript[0] is again.messages[0]
    assert again.transcript[1] is again.messages[1]
    call = again.transcript[-1].tool_calls[0]
    assert again.pending_tool_calls[0] is call
    assert again.request.tool_call is call


@pytest.mark.parametrize(
    "instance",
    [
        ToolCall("call_1", "refund", {"amount": 5}),
        Message.assistant("Let me.", (ToolCall("call_1", "refund"),)),
        _checkpoint().request,
        _checkpoint(turns=3),
    ],
    ids=lambda instance: type(instance).__name__,
)
def test_the_slot_builders_make_what_init_makes(instance: Any) -> None:
    values = [getattr(instance, field.name) for field in attrs.fields(type(instance))]

    by_position = slot_builder(type(instance))(*values)
    by_name = slot_builder(type(instance))(**attrs.asdict(instance, recurse=False))

    assert by_position == instance
    assert by_name == instance
    assert type(by_position) is type(instance)
    for field in attrs.fields(type(instance)):
        assert getattr(by_position, field.name) is getattr(instance, field.name)


@pytest.mark.parametrize(
    "cls",
    [
        ToolCall,
        HumanRequest,
        Checkpoint,
        Decision,
        CallRecord,
        Resolution,
        StoredCheckpoint,
        Claim,
        RunResult,
        ModelRequest,
        ToolContext,
        ToolResult,
        Usage,
    ],
)
def test_classes_built_from_slots_have_no_checks_that_init_would_run(cls: type) -> None:
    # The library builds these without __init__ (Message too: its hook does the checks of
    # its __attrs_post_init__). A validator, converter or post-init hook added later
    # would be skipped silently: this test says to look at the builders first.
    assert not hasattr(cls, "__attrs_post_init__")
    for field in attrs.fields(cls):
        assert (field.validator, field.converter) == (None, None), field.name


def test_a_slot_builder_needs_every_field_and_a_slotted_class() -> None:
    with pytest.raises(TypeError):
        slot_builder(ToolCall)("call_1", "refund")

    @attrs.frozen(slots=False)
    class Plain:
        value: int

    with pytest.raises(RunletError, match=r"Plain\.value is not a slot"):
        slot_builder(Plain)


def test_parts_that_differ_are_not_shared() -> None:
    # The transcript's first message differs from the run's first message, and the
    # pending call's arguments from the call in the message (as after an edited approval
    # whose attempt died: the call is asked about again): each keeps its own data.
    call = ToolCall("call_1", "refund", {"order_id": "7", "amount": 5})
    original = _checkpoint(
        transcript=(
            Message.system("Be very careful."),
            Message.user("Refund order 7."),
            Message.assistant("", (ToolCall("call_1", "refund", {"order_id": "8"}),)),
        ),
        request=HumanRequest(
            "req_1",
            "approval",
            "Refund?",
            tool_call=call,
            created_at=utc_now(),
            outcome_unknown=True,
        ),
    )

    again = structure_checkpoint(_json(original))

    assert original == again
    assert "Be very careful." == again.transcript[0].content
    assert "Be careful." == again.messages[0].content
    assert {"order_id": "8"} == again.transcript[-1].tool_calls[0].arguments
    assert {"order_id": "7", "amount": 5} == again.pending_tool_calls[0].arguments
    assert again.request.tool_call is again.pending_tool_calls[0]


def test_a_request_edited_in_the_json_is_still_refused() -> None:
    data = _json(_checkpoint())
    data["request"]["tool_call"]["arguments"]["amount"] = 5000

    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(data)

    assert "request.tool_call" == info.value.path


def test_a_pending_call_edited_in_the_json_is_refused() -> None:
    data = _json(_checkpoint())
    data["pending_tool_calls"][0]["name"] = "delete_everything"

    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(data)

    assert "pending_tool_calls[0]" == info.value.path


def test_a_call_missing_from_the_message_is_refused_in_the_one_call_case() -> None:
    other = Message.assistant("", (ToolCall("call_2", "refund", {"order_id": "7"}),))
    checkpoint = attrs.evolve(_checkpoint(), transcript=(*_checkpoint().transcript[:2], other))

    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(_json(checkpoint))

    assert "pending_tool_calls[0]" == info.value.path


def test_a_message_with_a_second_call_and_no_answer_for_it_is_refused() -> None:
    base = _checkpoint()
    calls = (*base.transcript[-1].tool_calls, ToolCall("call_2", "refund", {"order_id": "9"}))
    checkpoint = attrs.evolve(base, transcript=(*base.transcript[:2], Message.assistant("", calls)))

    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(_json(checkpoint))

    assert "results" == info.value.path


def test_the_record_of_checked_checkpoints_stays_bounded() -> None:
    # A server loads checkpoints for as long as it runs; the note that one was checked
    # must not keep growing with them.
    base = _checkpoint()
    alive = [attrs.evolve(base, id=f"cp_{n}") for n in range(4200)]

    for checkpoint in alive:
        check_integrity(checkpoint)

    assert len(_verified) <= 4096
    assert _verified[id(alive[-1])]() is alive[-1]


def _assert_shown_as_json_writes(arguments: dict[Any, Any]) -> None:
    expected = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=repr)
    shown = show_arguments(arguments)

    # The same JSON text, except that what a person cannot see is escaped: the same data.
    assert shown.isprintable()
    if expected.isprintable():
        assert expected == shown
    else:
        assert json.loads(expected) == json.loads(shown)


@given(json_objects)
def test_shown_arguments_are_what_json_dumps_writes(arguments: dict[str, Any]) -> None:
    _assert_shown_as_json_writes(arguments)


@pytest.mark.parametrize(
    "arguments",
    [
        {"b": "é", "a": 1.5, "c": None, "d": True, "e": float("nan"), "f": -2},
        {3: "x", 1: False, 2.5: 0.0},
        {"a": {"b": [1, 2]}, "c": 1},
        {},
    ],
)
def test_flat_and_nested_arguments_are_shown_alike(arguments: dict[Any, Any]) -> None:
    # Flat arguments are shown by the encoder built once, nested ones by a fresh one.
    _assert_shown_as_json_writes(arguments)


def test_flat_arguments_with_keys_json_cannot_sort_are_refused_as_json_refuses_them() -> None:
    mixed: dict[Any, Any] = {"a": 1, 2: 3}
    with pytest.raises(TypeError):
        json.dumps(mixed, sort_keys=True)
    with pytest.raises(TypeError):
        show_arguments(mixed)


def test_read_only_arguments_are_shown_as_the_json_object_they_hold() -> None:
    view = types.MappingProxyType({"order_id": "7", "amount": 5})

    assert '{"amount": 5, "order_id": "7"}' == show_arguments(view)


@given(json_objects)
def test_encoded_tool_results_are_what_json_dumps_writes(value: dict[str, Any]) -> None:
    assert json.dumps(value, ensure_ascii=False, allow_nan=False) == _encode(value)


def test_the_one_shot_encoders_refuse_what_json_refuses_and_then_work_again() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(ValueError, match="Circular"):
        show_arguments(cyclic)
    with pytest.raises(ValueError, match="Circular"):
        _encode(cyclic)
    with pytest.raises(ValueError):
        _encode([float("nan")])
    with pytest.raises(TypeError):
        _encode({"when": object()})
    # No state is left behind by a failure: the same object is fine once repaired.
    del cyclic["self"]
    assert "{}" == show_arguments(cyclic) == _encode(cyclic)
    thing = object()
    assert json.dumps({"a": repr(thing)}) == show_arguments({"a": thing})  # shown by repr()
    assert show_arguments({"b": 1, "a": "é"}) == '{"a": "é", "b": 1}'


def test_a_first_usage_is_the_models_own_and_later_ones_add_up() -> None:
    first = Usage(3, 4, 1, cache_read_tokens=2)

    assert ZERO_USAGE + first is first
    assert Usage() + first == first
    assert first + first == Usage(6, 8, 2, cache_read_tokens=4)
    assert ZERO_USAGE == Usage()


def test_adding_a_usage_subclass_to_nothing_gives_a_plain_usage() -> None:
    class Counted(Usage):
        pass

    total = ZERO_USAGE + Counted(1, 1, 1)

    assert type(total) is Usage
    assert Usage(1, 1, 1) == total


def test_unstructured_data_shares_nothing_that_can_change_with_the_checkpoint() -> None:
    call = ToolCall("call_1", "refund", {"order": {"id": "7", "lines": [1, 2]}})
    checkpoint = _checkpoint(
        transcript=(*_checkpoint().transcript[:2], Message.assistant("", (call,))),
        pending_tool_calls=(call,),
        request=attrs.evolve(_checkpoint().request, tool_call=call),
        metadata={"user": {"id": 7, "roles": ["agent"]}},
    )
    data = unstructure_checkpoint(checkpoint)

    data["request"]["tool_call"]["arguments"]["order"]["id"] = "999"
    data["request"]["tool_call"]["arguments"]["order"]["lines"].append(3)
    data["metadata"]["user"]["roles"].append("admin")

    assert {"order": {"id": "7", "lines": [1, 2]}} == call.arguments
    assert {"user": {"id": 7, "roles": ["agent"]}} == checkpoint.metadata
    # Changed in one place only, the request no longer matches the call that would run.
    with pytest.raises(CheckpointSerializationError) as info:
        structure_checkpoint(data)
    assert "request.tool_call" == info.value.path


def test_a_non_json_argument_only_in_the_starting_messages_is_found() -> None:
    bad = Message.assistant("", (ToolCall("call_0", "refund", {"at": datetime.date(2024, 1, 1)}),))
    base = _checkpoint()

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(attrs.evolve(base, messages=(*base.messages, bad)))
    assert "messages[2].tool_calls[0].arguments['at']" == info.value.path

    # The same message object at the start of both is reported where it is first met.
    shared = (bad,)
    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(
            attrs.evolve(base, messages=shared, transcript=(*shared, *base.transcript))
        )
    assert "transcript[0].tool_calls[0].arguments['at']" == info.value.path


class _Text(str):
    pass


class _Number(float):
    pass


class _Object(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


class _Tuple(tuple):  # type: ignore[type-arg]
    pass


def test_subclasses_of_json_types_are_copied_like_their_bases() -> None:
    metadata = {
        "a": _Text("x"),
        "b": _Number(1.5),
        "c": _Object(d=_List([1, _Tuple((2.5, {"e": None}))])),
        "f": (1, [2]),
    }
    data = unstructure_checkpoint(_checkpoint(metadata=metadata))

    assert metadata == data["metadata"]
    assert data["metadata"]["c"] is not metadata["c"]
    assert type(data["metadata"]["c"]["d"]) is list
    assert type(data["metadata"]["f"]) is tuple
    assert json.loads(json.dumps(data))["metadata"]["c"] == {"d": [1, [2.5, {"e": None}]]}


def test_subclasses_of_json_types_are_not_blamed_for_a_bad_value_beside_them() -> None:
    arguments = {"a": _Text("x"), "b": _Number(1.5), "c": _List([_Text("y")])}
    assert {"id": "c", "name": "t", "arguments": arguments} == unstructure(
        ToolCall("c", "t", arguments)
    )

    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(_checkpoint(metadata={**arguments, "z": datetime.date(2024, 1, 1)}))

    assert "metadata['z']" == info.value.path


@pytest.mark.parametrize(
    ("metadata", "path"),
    [
        ({"a": [1, float("nan")]}, "metadata['a'][1]"),
        ({"a": _Number("inf")}, "metadata['a']"),
        ({"a": {1: "one"}}, "metadata['a']"),
        ({"a": types.MappingProxyType({"b": 1})}, "metadata['a']"),
        ({"a": _List([{2, 3}])}, "metadata['a'][0]"),
        ({"a": _Tuple(({"b": object()},))}, "metadata['a'][0]['b']"),
    ],
)
def test_what_json_cannot_hold_is_refused_with_its_path(
    metadata: dict[str, Any], path: str
) -> None:
    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(_checkpoint(metadata=metadata))

    assert path == info.value.path


def test_arguments_that_are_not_an_object_are_refused_with_their_path() -> None:
    # A model adapter may hand over a call whose arguments are a list: the run answers
    # that call with an error result, but its checkpoint cannot be written as JSON.
    odd = ToolCall("call_1", "refund", [("order_id", "7")])  # type: ignore[arg-type]
    base = _checkpoint()

    for unstructure_it in (unstructure_checkpoint, unstructure):
        with pytest.raises(CheckpointSerializationError, match="must be a JSON object") as info:
            unstructure_it(attrs.evolve(base, pending_tool_calls=(odd,)))

        assert "pending_tool_calls[0].arguments" == info.value.path


def test_an_empty_read_only_view_inside_the_data_is_refused_like_a_full_one() -> None:
    with pytest.raises(CheckpointSerializationError) as info:
        unstructure_checkpoint(_checkpoint(metadata={"a": types.MappingProxyType({})}))

    assert "metadata['a']" == info.value.path


def test_an_int_too_long_to_write_is_an_error_result_not_a_crash() -> None:
    from runlet import ToolSpec

    async def handler(arguments: Any, context: Any) -> int:
        return 10**5000  # pragma: no cover - not called

    tool = ToolSpec("big", "Big.", {"type": "object"}, handler)

    content, is_error = tool._content(10**5000)

    assert is_error
    assert content.startswith("Tool 'big' returned a value of type int that is not JSON")
    assert ("12", False) == tool._content(12)


@given(run_results())
def test_valid_data_passes_the_quick_json_check(result: RunResult) -> None:
    # unstructure() walks the object again, building paths, only when the quick check
    # finds something; valid data must never take that long way.
    assert _is_json_object(result)
    assert _is_json_object(
        Resolution(decisions=result.decisions, result=result, resolved_at=utc_now())
    )
    assert _is_json_object(result.transcript)


@given(
    st.sampled_from(sorted(event_strategies, key=lambda cls: cls.__name__)).flatmap(
        lambda cls: event_strategies[cls]
    )
)
def test_valid_events_pass_the_quick_json_check(event: Any) -> None:
    assert _is_json_object(event)


@given(not_json)
def test_the_quick_json_check_finds_what_the_long_one_names(bad: Any) -> None:
    for value in (
        ToolCall("c", "t", {"n": [1, {"when": bad}]}),
        Message.assistant("", (ToolCall("c", "t", {"n": bad}),)),
        (Message.user("hi"), ToolResult("c", "ok"), bad),
        [bad],
        {"k": bad},
    ):
        assert not _is_json_object(value)
        with pytest.raises(CheckpointSerializationError):
            _check_object(value, "")


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"x": False}, {"x": False}, True),
        ({"x": False}, {"x": 0}, False),
        ({"x": 1}, {"x": True}, False),
        ({"x": 1}, {"x": 1.0}, False),
        ({"x": [1, {"y": "z"}]}, {"x": (1, {"y": "z"})}, True),  # both arrays
        ({"x": [0]}, {"x": [False]}, False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),  # key order is not JSON's business
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": 1}, {"b": 1}, False),
        ([1, 2], [1, 2, 3], False),
        (types.MappingProxyType({"x": 0.5}), {"x": 0.5}, True),
        ("s", "s", True),
        (None, None, True),
        (None, 0, False),
    ],
)
def test_same_json_tells_values_python_finds_equal_apart(a: Any, b: Any, same: bool) -> None:
    assert (same, same) == (same_json(a, b), same_json(b, a))


@given(json_values)
def test_same_json_holds_for_a_value_and_its_json_copy(value: Any) -> None:
    assert same_json(value, json.loads(json.dumps(value)))


@given(json_objects, json_objects)
def test_same_json_is_narrower_than_python_equality_and_no_narrower_than_json(
    a: Any, b: Any
) -> None:
    same = same_json(a, b)
    assert same == same_json(b, a)
    if same:
        assert a == b
    if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
        assert same
