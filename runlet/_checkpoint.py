"""Checkpoints: a suspended run as plain data, and its JSON-compatible form."""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from types import MappingProxyType, UnionType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin, overload

import attrs
import cattrs
from cattrs.errors import IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_unstructure_fn, override

from ._errors import CheckpointSerializationError, RunletError
from ._human import Decision, HumanOption, HumanRequest, _new_request
from ._messages import ZERO_USAGE, Message, ReasoningPart, ToolCall, ToolResult, Usage
from ._tools import MAX_NESTING, ToolDefinition, show_arguments
from ._util import same_json, slot_builder

if TYPE_CHECKING:
    from ._events import StreamEvent
    from ._human import HumanResponse
    from ._model import ModelRequest, ModelResponse
    from ._result import RunResult
    from ._store import CallRecord, Claim, PendingRequest, Resolution, StoredCheckpoint

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "structure",
    "structure_checkpoint",
    "unstructure",
    "unstructure_checkpoint",
]

CHECKPOINT_VERSION = 2
"""The checkpoint schema version this Runlet writes (and the newest it reads). Version 1
data still loads: it is migrated on read."""

# Version 1 recorded no request times; migrated requests say "created at the epoch".
_V1_CREATED_AT = "1970-01-01T00:00:00+00:00"


@attrs.frozen(kw_only=True)
class Checkpoint:
    """A run suspended while it waits for a person: plain data, never a callable.

    The resuming process supplies the agent (and so the handlers); the checkpoint
    supplies everything else.

    Attributes:
        id: This checkpoint's id. Every interruption saves a new checkpoint.
        version: The schema version of this data (:data:`CHECKPOINT_VERSION`).
        run_id: The run's id, the same across all its checkpoints.
        agent_name: The name of the agent that was interrupted.
        messages: The messages the run was started with.
        options: The ``options`` given to ``run()``.
        metadata: The ``metadata`` given to ``run()``.
        transcript: The whole transcript so far; it ends with the assistant message
            whose tool calls are being handled.
        results: Results already known for that message's calls (calls that needed no
            person, and those a person has already answered).
        pending_tool_calls: The calls still waiting for a person, in call order; the
            first is the one :attr:`request` asks about. A call's arguments are what runs
            when its request is approved.
        request: The first open request (the run's ``interruption``).
        more_requests: The other open requests, one per further pending call, in order.
        decisions: Every answer given in this run before this checkpoint (audit trail).
        usage: Usage so far.
        turns: Model requests made so far, counted against the runtime's ``max_turns``.
    """

    id: str
    version: int = CHECKPOINT_VERSION
    run_id: str
    agent_name: str
    messages: tuple[Message, ...]
    options: Mapping[str, Any] = attrs.field(hash=False)
    metadata: Mapping[str, Any] = attrs.field(hash=False)
    transcript: tuple[Message, ...]
    results: tuple[ToolResult, ...] = ()
    pending_tool_calls: tuple[ToolCall, ...]
    request: HumanRequest
    more_requests: tuple[HumanRequest, ...] = ()
    decisions: tuple[Decision, ...] = ()
    usage: Usage = ZERO_USAGE
    turns: int = 0

    @property
    def open_requests(self) -> tuple[HumanRequest, ...]:
        """All open requests in call order, starting with :attr:`request`."""
        if not self.more_requests:
            return (self.request,)
        return (self.request, *self.more_requests)


_JSON_SCALARS = (str, int, bool, type(None))
_PLAIN = frozenset(_JSON_SCALARS)


def _check_json(value: object, path: str, _outer: dict[int, str] | None = None) -> None:
    """Raise if *value* is not something ``json.dumps`` writes and ``json.loads`` reads
    back unchanged (apart from tuples, which come back as lists).

    *_outer* maps the ids of the containers that hold *value* to their paths, so a
    container that holds itself is reported instead of recursing without end.
    """
    kind = type(value)
    if kind in _PLAIN or ((kind is dict or kind is list or kind is tuple) and not value):
        return  # the common cases first: exact scalars and empty containers
    if isinstance(value, _JSON_SCALARS):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CheckpointSerializationError(
                f"{path} is {value!r}, which JSON cannot hold; use a finite number or a string.",
                path=path,
            )
        return
    outer = {} if _outer is None else _outer
    if id(value) in outer:
        raise CheckpointSerializationError(
            f"{path} is {outer[id(value)]} itself: a value that contains itself cannot be "
            "written as JSON. Store a copy, or an id, instead of the reference back.",
            path=path,
        )
    # Only real dicts: json.dumps cannot write other mappings. A run's own options are a
    # read-only view of a dict, which the converter writes as a dict; such a view is
    # accepted where the check starts, never nested inside the data.
    if isinstance(value, dict) or (_outer is None and type(value) is MappingProxyType):
        outer[id(value)] = path
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointSerializationError(
                    f"{path} has the key {key!r} ({type(key).__name__}); JSON object keys "
                    "must be strings.",
                    path=path,
                )
            if type(item) not in _PLAIN:  # plain scalars need no call (nor a path)
                _check_json(item, f"{path}[{key!r}]", outer)
        del outer[id(value)]
        return
    if isinstance(value, (list, tuple)):
        outer[id(value)] = path
        for index, item in enumerate(value):
            if type(item) not in _PLAIN:
                _check_json(item, f"{path}[{index}]", outer)
        del outer[id(value)]
        return
    raise CheckpointSerializationError(
        f"{path} is a {type(value).__name__}, which is not JSON-compatible. Checkpoints "
        "hold only JSON values (dict, list, str, int, float, bool, None): convert it, "
        "e.g. a datetime to an ISO string.",
        path=path,
    )


def _check_checkpoint(checkpoint: Checkpoint) -> None:
    """Raise for the first value JSON cannot hold, naming its path. Only runs to explain
    a failure of the copying hooks, which check the same things without paths."""
    _check_json(checkpoint.metadata, "metadata")
    _check_json(checkpoint.options, "options")
    for name in ("transcript", "messages"):
        for index, message in enumerate(getattr(checkpoint, name)):
            for number, call in enumerate(message.tool_calls):
                _check_arguments(call.arguments, f"{name}[{index}].tool_calls[{number}]")
    for index, call in enumerate(checkpoint.pending_tool_calls):
        _check_arguments(call.arguments, f"pending_tool_calls[{index}]")
    for index, decision in enumerate(checkpoint.decisions):
        _check_json(decision.arguments, f"decisions[{index}].arguments")
        _check_json(decision.metadata, f"decisions[{index}].metadata")


def _check_loaded(checkpoint: Checkpoint) -> None:
    """Refuse, when reading, a value JSON cannot hold: a NaN that ``json.loads`` let
    through, or an object in data made by hand. Found only when the resume writes the
    next checkpoint, it would fail every retry, after an approved call ran. Flat JSON
    (the common case) is seen at a glance; anything else gets the full check."""
    if not (_flat(checkpoint.metadata) and _flat(checkpoint.options) and _flat_calls(checkpoint)):
        _check_checkpoint(checkpoint)


def _flat(mapping: Mapping[str, Any] | None) -> bool:
    """Whether every value of *mapping* is a JSON scalar (so no check can fail on it)."""
    if mapping:
        for value in mapping.values():
            if type(value) not in _PLAIN and not (type(value) is float and math.isfinite(value)):
                return False
    return True


def _flat_calls(checkpoint: Checkpoint) -> bool:
    last = None  # a checkpoint's copies of one call share their arguments
    for messages in (checkpoint.messages, checkpoint.transcript):
        for message in messages:
            for call in message.tool_calls:
                if call.arguments is not last and not _flat(call.arguments):
                    return False
                last = call.arguments
    for call in checkpoint.pending_tool_calls:
        if call.arguments is not last and not _flat(call.arguments):
            return False
    for decision in checkpoint.decisions:
        if not (_flat(decision.arguments) and _flat(decision.metadata)):
            return False
    return True


def _check_arguments(arguments: object, call: str) -> None:
    path = f"{call}.arguments"
    if not isinstance(arguments, (dict, MappingProxyType)):
        raise CheckpointSerializationError(
            f"{path} is a {type(arguments).__name__}, but a call's arguments must be a JSON "
            "object (a dict of argument names to values); the model adapter that made the "
            "call should have turned them into one.",
            path=path,
        )
    _check_json(arguments, path)


# Checkpoint objects already found to hang together (by id, with a weak reference to
# rule out a reused id). Checkpoints are frozen, so a check holds for the object's life;
# the resume of a checkpoint just structured from JSON then does not check it twice.
_verified: dict[int, weakref.ref[Checkpoint]] = {}


def check_integrity(checkpoint: Checkpoint) -> None:
    """Refuse a checkpoint that does not hang together, so no resume ever runs a call with
    arguments the person was not shown, or fails halfway with an IndexError.

    Raises:
        CheckpointSerializationError: Naming the inconsistency and where it is.
    """
    known = _verified.get(id(checkpoint))
    if known is not None and known() is checkpoint:
        return
    _check_integrity(checkpoint)
    mark_verified(checkpoint)


def mark_verified(checkpoint: Checkpoint) -> None:
    """Note that *checkpoint* hangs together (the runtime builds its checkpoints so)."""
    if len(_verified) >= 4096:
        _verified.clear()
    _verified[id(checkpoint)] = weakref.ref(checkpoint)


def _check_integrity(checkpoint: Checkpoint) -> None:
    transcript = checkpoint.transcript
    if not transcript or not transcript[-1].tool_calls or transcript[-1].role != "assistant":
        _broken("transcript", "must end with the assistant message whose tool calls wait")
    pending = checkpoint.pending_tool_calls
    if len(pending) == 1 and not checkpoint.more_requests and not checkpoint.results:
        # The common case, one call that waits for one request, checked in one step;
        # anything off is left to the full check below, which says what.
        only, in_message = pending[0], transcript[-1].tool_calls
        asked = checkpoint.request.tool_call
        if (
            len(in_message) == 1
            and (in_message[0] is only or _same_call(in_message[0], only))
            and (asked is only or _same_call(asked, only))
            and checkpoint.request.kind == "approval"
            and not checkpoint.request.options
        ):
            return
    calls = {call.id: call for call in transcript[-1].tool_calls}
    if not pending:
        _broken("pending_tool_calls", "is empty, so there is nothing to resume")
    requests = checkpoint.open_requests
    if len(requests) != len(pending):
        _broken(
            "more_requests",
            f"holds {len(requests)} open requests for {len(pending)} pending calls; "
            "each pending call needs exactly one",
        )
    seen: set[str] = set()
    for index, (call, request) in enumerate(zip(pending, requests, strict=True)):
        made = calls.get(call.id)
        if made is None or made.name != call.name:
            _broken(
                f"pending_tool_calls[{index}]",
                f"call {call.id!r} ({call.name}) is not in the last assistant message",
            )
        if (
            made is not None
            and not same_json(made.arguments, call.arguments)
            and not request.outcome_unknown
        ):
            # Only a call asked about again after an attempt died holds other arguments
            # than the model gave: the ones a person approved with an edit.
            _broken(
                f"pending_tool_calls[{index}].arguments",
                f"differ from those of call {call.id!r} in the last assistant message, so "
                "what runs would not be what the model asked for",
            )
        if call.id in seen:
            _broken(f"pending_tool_calls[{index}]", f"call {call.id!r} is pending twice")
        seen.add(call.id)
        if request.tool_call is not call and not _same_call(request.tool_call, call):
            name = "request" if index == 0 else f"more_requests[{index - 1}]"
            _broken(
                f"{name}.tool_call",
                f"does not match pending call {call.id!r} (its id, tool or arguments "
                "differ), so the person would decide on something other than what runs",
            )
        problem = _request_problem(request)
        if problem is not None:
            _broken("request" if index == 0 else f"more_requests[{index - 1}]", problem)
    if len({request.id for request in requests}) != len(requests):
        _broken("more_requests", "two open requests share an id")
    for index, result in enumerate(checkpoint.results):
        where = (
            f"results[{index}]"
            if result.tool_call_id in seen or result.tool_call_id not in calls
            else ""
        )
        if result.tool_call_id not in calls:
            _broken(
                where,
                f"is for call {result.tool_call_id!r}, which the last assistant "
                "message does not hold",
            )
        if result.tool_call_id in seen:
            _broken(where, f"call {result.tool_call_id!r} has two results, or is also pending")
        seen.add(result.tool_call_id)
    if len(seen) != len(calls):
        missing = ", ".join(repr(i) for i in calls if i not in seen)
        _broken("results", f"calls {missing} have neither a result nor a pending request")


# Structuring shares the data a checkpoint holds more than once (the run's messages at
# the start of its transcript, each pending call in the last message and in a request)
# when it is equal. Python's == takes False for 0 and 1 for 1.0; the data is checked by
# type as it is structured, except the calls' arguments, which are any JSON: equal data
# is shared only if its arguments are the same JSON too.


_FLAT_JSON = frozenset({str, int, float, bool, type(None)})


def _same_arguments(a: Any, b: Any) -> bool:
    """For equal raw calls *a* and *b*: whether their arguments are the same JSON."""
    if type(a) is not dict or type(b) is not dict:
        return same_json(a, b)  # not calls at all: what reads them says so
    x, y = a.get("arguments"), b.get("arguments")
    if type(x) is dict and type(y) is dict:
        # The usual case, flat arguments in the same order: the same types in the same
        # places make equal values the same JSON.
        kinds = list(map(type, x.values()))
        if _FLAT_JSON.issuperset(kinds) and kinds == list(map(type, y.values())):
            return list(x) == list(y) or same_json(x, y)
    return same_json(x, y)


def _all_same_arguments(a: list[Any], b: list[Any]) -> bool:
    """For equal lists of raw calls: whether each pair's arguments are the same JSON."""
    return all(_same_arguments(x, y) for x, y in zip(a, b, strict=True))


def _by_id(raw_calls: list[Any]) -> dict[Any, int] | None:
    """Where each call of *raw_calls* (the data of structured calls) is, by id (the first
    of a repeated id); ``None`` for a few calls, which a scan finds as fast."""
    if len(raw_calls) <= 8:
        return None
    found: dict[Any, int] = {}
    for at, raw in enumerate(raw_calls):
        key = raw["id"]
        if type(key) is str:
            found.setdefault(key, at)
    return found


def _same_calls_in(messages: list[Any], transcript: list[Any]) -> bool:
    """For raw *messages* equal to the start of the raw *transcript*: whether the tool
    calls in them have the same JSON arguments."""
    for message, other in zip(messages, transcript):  # noqa: B905 - the transcript is longer
        if type(message) is dict and "tool_calls" in message:
            calls, others = message["tool_calls"], other["tool_calls"]
            if type(calls) is not list or not _all_same_arguments(calls, others):
                return False
    return True


def _same_call(a: ToolCall, b: ToolCall) -> bool:
    """The same call, with the same arguments as JSON (``False`` is not ``0``)."""
    return a.id == b.id and a.name == b.name and same_json(a.arguments, b.arguments)


def _request_problem(request: HumanRequest) -> str | None:
    """What is wrong with *request* as the request its call makes, or ``None``: an
    approval offers no options; a question (an ``ask_human`` call) asks what its call's
    arguments ask, with the options they offer."""
    if request.kind == "approval":
        return "is an approval that offers options" if request.options else None
    arguments = request.tool_call.arguments
    raw = arguments.get("options", [])
    offered = tuple(
        (option.get("id"), option.get("label"), option.get("description"))
        if isinstance(option, dict)
        else None
        for option in (raw if isinstance(raw, list) else [None])
    )
    shown = tuple((option.id, option.label, option.description) for option in request.options)
    if (
        arguments.get("kind") != request.kind
        or arguments.get("prompt") != request.prompt
        or offered != shown
    ):
        return (
            f"is a {request.kind!r} question that its call does not ask (its kind, prompt "
            "or options differ from the call's arguments)"
        )
    return None


def _broken(path: str, problem: str) -> None:
    raise CheckpointSerializationError(
        f"This checkpoint does not hang together: {path} {problem}. It was altered or "
        "written by a broken store; it cannot be resumed safely.",
        path=path,
    )


def _unstructure_datetime(value: datetime) -> str:
    return value.isoformat()


# ISO 8601 date-times as Python 3.11's fromisoformat() reads them and 3.10's does not:
# "Z", any number of fraction digits, offsets "+HH" and "+HHMM", the basic format.
_ISO_DATETIME = re.compile(
    r"(\d{4})-?(\d{2})-?(\d{2})[T ](\d{2}):?(\d{2})(?::?(\d{2}))?(?:[.,](\d*))?"
    r"(?:(Z)|([+-])(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?)?",
    re.ASCII,
)


def _fromisoformat(value: str) -> datetime:
    """``datetime.fromisoformat`` that reads, on every Python, the spellings of 3.11's
    that other tools write (PostgreSQL's ``to_json``, Go's RFC 3339): a checkpoint must
    not load on one worker and fail on another."""
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        text = _as_python_310_reads(value)
        if text is None:
            raise
    return datetime.fromisoformat(text)


def _as_python_310_reads(value: str) -> str | None:
    """*value*, an ISO 8601 date-time, spelled as Python 3.10's ``fromisoformat`` reads
    it (``YYYY-MM-DDTHH:MM:SS[.ffffff][+HH:MM[:SS]]``), or ``None`` if it is none."""
    match = _ISO_DATETIME.fullmatch(value)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, z, sign, oh, om, os_ = match.groups()
    text = f"{year}-{month}-{day}T{hour}:{minute}:{second or '00'}"
    if fraction:
        text += "." + fraction[:6].ljust(6, "0")  # beyond microseconds: cut, as 3.11 does
    if z:
        text += "+00:00"
    elif sign:
        text += f"{sign}{oh}:{om or '00'}" + (f":{os_}" if os_ else "")
    return text


def _structure_datetime(value: Any, _: Any) -> datetime:
    if not isinstance(value, str):
        raise TypeError(f"expected an ISO 8601 date-time string, got {type(value).__name__}")
    parsed = _fromisoformat(value)
    if parsed.tzinfo is timezone.utc:  # what Runlet writes: nothing to convert
        return parsed
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone; times are aware UTC")
    return parsed.astimezone(timezone.utc)


class _NotJSON(CheckpointSerializationError):
    """Raised by the copying hooks below for a value JSON cannot hold. The JSON checks
    then run to say what and where (see :func:`unstructure_checkpoint`)."""


def _unstructure_json_object(value: Mapping[str, Any]) -> dict[str, Any]:
    # A copy all the way down, so changing the data (to send or store it) never changes
    # the object it came from: a checkpoint's calls share one arguments dict between its
    # request, its pending calls and its transcript. A read-only view becomes a dict.
    # The copy accepts exactly what _check_json accepts and raises _NotJSON otherwise.
    kind = type(value)
    if kind is not dict and kind is not MappingProxyType and not isinstance(value, dict):
        raise _NotJSON("not a JSON object")
    if not value:
        return {}
    return _copy_object(value)


def _copy_object(value: Mapping[Any, Any]) -> dict[str, Any]:
    return {
        key if type(key) is str else _text_key(key): item
        if type(item) in _PLAIN
        else _copy_json(item)
        for key, item in value.items()
    }


def _text_key(key: object) -> str:
    if isinstance(key, str):
        return key
    raise _NotJSON("a JSON object key that is not a string")


def _copy_json(value: Any) -> Any:
    """*value* with every dict and list in it copied (tuples stay tuples; scalars are
    shared: they cannot change)."""
    kind = type(value)
    if kind is list:
        return [item if type(item) in _PLAIN else _copy_json(item) for item in value]
    if kind is dict:
        return _copy_object(value)
    if kind is float and math.isfinite(value):
        return value
    if kind is tuple:
        return tuple([item if type(item) in _PLAIN else _copy_json(item) for item in value])
    # Subclasses of the JSON types, as _check_json allows them.
    if isinstance(value, _JSON_SCALARS) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, dict):
        return _copy_object(value)
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    if isinstance(value, tuple):
        return tuple([_copy_json(item) for item in value])
    raise _NotJSON("not a JSON value")


def _structure_json_object(value: Any, _: Any) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _is_json_mapping(type_: Any) -> bool:
    return bool(type_ == Mapping[str, Any])


def _exactly(type_: type) -> Any:
    # cattrs would convert (str(None) == "None", bool("false") is True, int(1.5) == 1);
    # data of the wrong type is malformed and must be refused instead.
    def structure(value: Any, _: Any) -> Any:
        if type(value) is not type_:
            raise TypeError(f"expected {type_.__name__}, got {type(value).__name__}")
        return value

    return structure


def _is_literal(type_: Any) -> bool:
    return get_origin(type_) is Literal


def _structure_literal(value: Any, type_: Any) -> Any:
    allowed = get_args(type_)
    if any(value == option and type(value) is type(option) for option in allowed):
        return value
    raise ValueError(f"expected one of {', '.join(map(repr, allowed))}, got {value!r}")


def _is_array(type_: Any) -> bool:
    args = get_args(type_)
    return get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _register_arrays(converter: cattrs.Converter) -> None:
    """A ``tuple[X, ...]`` field takes a JSON array (a list, or a tuple built in Python)
    and nothing else. cattrs' own hook iterates whatever it is given, so ``{}`` or ``""``
    would read as no items, and a dict as its keys."""

    def structure_array(value: Any, type_: Any) -> Any:
        if type(value) is not list and not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a JSON array, got {type(value).__name__}")
        item = get_args(type_)[0]
        hook = converter.get_structure_hook(item)
        if not converter.detailed_validation:
            return tuple([hook(element, item) for element in value])
        made: list[Any] = []
        errors: list[Exception] = []
        for index, element in enumerate(value):
            try:
                made.append(hook(element, item))
            except Exception as exc:  # noqa: BLE001, PERF203 - explaining only: raised below
                note = IterableValidationNote(f"Structuring {type_} @ index {index}", index, item)
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined,unused-ignore]
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {type_!r}", errors, type_)
        return tuple(made)

    converter.register_structure_hook_func(_is_array, structure_array)


def _register_tuples(converter: cattrs.Converter) -> None:
    # cattrs handles tuple[X, ...] with a generic hook that looks up X's hook on every
    # call; binding it once takes ~15% off a checkpoint's (de)serialization. Same data
    # in and out (lists out, tuples in). Items first, so Message's hook binds the
    # tuple[ToolCall, ...] hook made here.
    for item in (ToolCall, ToolResult, HumanOption, ReasoningPart, Message, HumanRequest, Decision):
        structure = converter.get_structure_hook(item)
        unstructure = converter.get_unstructure_hook(item)

        def structure_tuple(value: Any, _: Any, s: Any = structure, t: Any = item) -> Any:
            if type(value) is not list:  # the detailed converter explains, or takes a tuple
                raise TypeError("not a JSON array")
            return tuple([s(element, t) for element in value])

        def unstructure_tuple(value: Any, u: Any = unstructure) -> Any:
            return [u(element) for element in value]

        def is_tuple(type_: Any, target: Any = tuple[item, ...]) -> bool:  # type: ignore[valid-type]
            return bool(type_ == target)

        converter.register_structure_hook_func(is_tuple, structure_tuple)
        converter.register_unstructure_hook_func(is_tuple, unstructure_tuple)


# Structuring builds these from values it has checked, without their __init__; so do
# the loop (checkpoints, and messages with nothing for Message's own checks to do) and
# the run's start (its first user message).
_new_call = slot_builder(ToolCall)
_new_message = slot_builder(Message)
_new_checkpoint = slot_builder(Checkpoint)

_CALL_KEYS = frozenset({"id", "name", "arguments"})
_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls", "tool_result", "reasoning"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})


def _register_hot_paths(converter: cattrs.Converter) -> None:
    """Hand-written hooks for the classes every checkpoint holds many of (messages and
    tool calls): the same data in and out as the generated ones, about twice as fast.

    They only accept data that is exactly right and raise on anything else, since the
    detailed converter then re-does the work to say precisely what is wrong.
    """
    result_in = converter.get_structure_hook(ToolResult)
    result_out = converter.get_unstructure_hook(ToolResult)
    reasoning_in = converter.get_structure_hook(tuple[ReasoningPart, ...])
    reasoning_out = converter.get_unstructure_hook(tuple[ReasoningPart, ...])
    arguments_out = converter.get_unstructure_hook(Mapping[str, Any])

    def call_in(data: Any, _: Any = None) -> ToolCall:
        if type(data) is not dict or not data.keys() <= _CALL_KEYS:
            raise TypeError("not a tool call")
        id_, name = data["id"], data["name"]
        if type(id_) is not str or type(name) is not str:
            raise TypeError("not a tool call")
        if "arguments" not in data:
            return ToolCall(id_, name)
        arguments = data["arguments"]
        if type(arguments) is not dict:
            raise TypeError("not a tool call")
        return _new_call(id_, name, arguments)

    def call_out(call: ToolCall) -> dict[str, Any]:
        data = {"id": call.id, "name": call.name}
        if call.arguments:
            data["arguments"] = arguments_out(call.arguments)
        return data

    def message_in(data: Any, _: Any = None) -> Message:
        if type(data) is not dict or not data.keys() <= _MESSAGE_KEYS:
            raise TypeError("not a message")
        role, content = data["role"], data["content"]
        if type(role) is not str or role not in _ROLES or type(content) is not str:
            raise TypeError("not a message")
        calls: tuple[ToolCall, ...] = ()
        if "tool_calls" in data:
            items = data["tool_calls"]
            if type(items) is not list:
                raise TypeError("not a message")
            calls = tuple([call_in(item) for item in items])
        result = None
        if "tool_result" in data and data["tool_result"] is not None:
            result = result_in(data["tool_result"], ToolResult)
        reasoning: tuple[ReasoningPart, ...] = ()
        if "reasoning" in data:
            reasoning = tuple(reasoning_in(data["reasoning"], tuple[ReasoningPart, ...]))
        # The role and the tuples are checked above: what Message.__attrs_post_init__
        # would check and convert again.
        return _new_message(role, content, calls, result, reasoning)

    def message_out(message: Message) -> dict[str, Any]:
        data: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            data["tool_calls"] = [call_out(call) for call in message.tool_calls]
        if message.tool_result is not None:
            data["tool_result"] = result_out(message.tool_result)
        if message.reasoning:
            data["reasoning"] = reasoning_out(message.reasoning)
        return data

    converter.register_structure_hook(ToolCall, call_in)
    converter.register_unstructure_hook(ToolCall, call_out)
    converter.register_structure_hook(Message, message_in)
    converter.register_unstructure_hook(Message, message_out)


def _make_converter(*, detailed: bool) -> cattrs.Converter:
    converter = cattrs.Converter(
        omit_if_default=True, forbid_extra_keys=True, detailed_validation=detailed
    )
    converter.register_unstructure_hook_func(_is_json_mapping, _unstructure_json_object)
    converter.register_structure_hook_func(_is_json_mapping, _structure_json_object)
    for type_ in (str, int, bool):
        converter.register_structure_hook(type_, _exactly(type_))
    converter.register_structure_hook_func(_is_literal, _structure_literal)
    converter.register_unstructure_hook(datetime, _unstructure_datetime)
    converter.register_structure_hook(datetime, _structure_datetime)
    _register_arrays(converter)
    if not detailed:
        _register_hot_paths(converter)
        _register_tuples(converter)
    # The version is written even though it equals its default: readers rely on it.
    converter.register_unstructure_hook(
        Checkpoint,
        make_dict_unstructure_fn(
            Checkpoint,
            converter,
            _cattrs_omit_if_default=True,
            version=override(omit_if_default=False),
        ),
    )
    if not detailed:
        _register_checkpoint_paths(converter)  # its request hook requires created_at
    else:
        _require_created_at(converter)
    return converter


def _require_created_at(converter: cattrs.Converter) -> None:
    """Stored requests always hold their time: a missing one is refused, never replaced
    by the time of reading (which would differ at each load)."""
    generated = converter.get_structure_hook(HumanRequest)

    def request_in(data: Any, cls: Any = HumanRequest) -> HumanRequest:
        if isinstance(data, Mapping) and "created_at" not in data:
            raise ValueError("required field created_at is missing")
        made: HumanRequest = generated(data, cls)
        return made

    converter.register_structure_hook(HumanRequest, request_in)


_REQUEST_KEYS = frozenset(
    {"id", "kind", "prompt", "options", "tool_call", "created_at", "expires_at", "outcome_unknown"}
)
_KINDS = frozenset({"approval", "choice", "input"})
_CHECKPOINT_KEYS = frozenset(attrs.fields_dict(Checkpoint))
_NO_USAGE = ZERO_USAGE


def _register_checkpoint_paths(converter: cattrs.Converter) -> None:
    """Hand-written hooks for a checkpoint and its requests, on top of
    :func:`_register_hot_paths`: the same data in and out as the generated hooks (the
    golden files and the round-trip tests hold them to it), with fewer calls. Like those,
    they raise on anything not exactly right and leave the explaining to the detailed
    converter."""
    call_in = converter.get_structure_hook(ToolCall)
    call_out = converter.get_unstructure_hook(ToolCall)
    message_in = converter.get_structure_hook(Message)
    messages_out = converter.get_unstructure_hook(tuple[Message, ...])
    calls_out = converter.get_unstructure_hook(tuple[ToolCall, ...])
    results_in = converter.get_structure_hook(tuple[ToolResult, ...])
    results_out = converter.get_unstructure_hook(tuple[ToolResult, ...])
    options_in = converter.get_structure_hook(tuple[HumanOption, ...])
    options_out = converter.get_unstructure_hook(tuple[HumanOption, ...])
    decisions_in = converter.get_structure_hook(tuple[Decision, ...])
    decisions_out = converter.get_unstructure_hook(tuple[Decision, ...])
    usage_in = converter.get_structure_hook(Usage)
    usage_out = converter.get_unstructure_hook(Usage)
    json_out = converter.get_unstructure_hook(Mapping[str, Any])

    def shared_calls(raw: Any, raw_known: list[Any], known: tuple[ToolCall, ...]) -> Any:
        """Structure the calls in *raw*, reusing the object in *known* for a call whose
        data equals its data in *raw_known* (what *known* was structured from): a
        checkpoint holds each pending call up to three times, as the same object."""
        if type(raw) is not list:
            raise TypeError("not a list of tool calls")
        by_id = _by_id(raw_known)
        return tuple([share_call(item, raw_known, known, by_id) for item in raw])

    def share_call(
        item: Any,
        raw_known: list[Any],
        known: tuple[ToolCall, ...],
        by_id: dict[Any, int] | None = None,
    ) -> ToolCall:
        if by_id is not None and type(item) is dict:
            # A wide turn: found by id, so structuring is not pending calls times calls.
            at = by_id.get(item.get("id"))
            if at is not None and raw_known[at] == item and _same_arguments(raw_known[at], item):
                return known[at]
        for raw, call in zip(raw_known, known, strict=True):
            if raw == item and _same_arguments(raw, item):
                return call
        made: ToolCall = call_in(item, ToolCall)
        return made

    def request_in(
        data: Any,
        raw_known: list[Any] | None = None,
        known: tuple[ToolCall, ...] = (),
        by_id: dict[Any, int] | None = None,
    ) -> HumanRequest:
        if type(data) is not dict or not data.keys() <= _REQUEST_KEYS:
            raise TypeError("not a request")
        id_, kind, prompt = data["id"], data["kind"], data["prompt"]
        if type(id_) is not str or type(kind) is not str or type(prompt) is not str:
            raise TypeError("not a request")
        if kind not in _KINDS:
            raise TypeError("not a request")
        raw_call = data["tool_call"]
        if raw_known is None:
            call = call_in(raw_call, ToolCall)
        elif raw_known and raw_call == raw_known[0] and _same_arguments(raw_call, raw_known[0]):
            # the usual case: the first pending call
            call = known[0]
        else:
            call = share_call(raw_call, raw_known, known, by_id)
        expires_at = data.get("expires_at")
        if expires_at is not None:
            expires_at = _structure_datetime(expires_at, datetime)
        outcome_unknown = data.get("outcome_unknown", False)
        if type(outcome_unknown) is not bool:
            raise TypeError("not a request")
        return _new_request(
            id_,
            kind,
            prompt,
            options_in(data["options"], None) if "options" in data else (),
            tool_call=call,
            created_at=_structure_datetime(data["created_at"], datetime),
            expires_at=expires_at,
            outcome_unknown=outcome_unknown,
        )

    def request_out(request: HumanRequest) -> dict[str, Any]:
        data: dict[str, Any] = {"id": request.id, "kind": request.kind, "prompt": request.prompt}
        if request.options:
            data["options"] = options_out(request.options)
        data["tool_call"] = call_out(request.tool_call)
        data["created_at"] = request.created_at.isoformat()
        if request.expires_at is not None:
            data["expires_at"] = request.expires_at.isoformat()
        if request.outcome_unknown:
            data["outcome_unknown"] = True
        return data

    def requests_in(
        data: Any, raw_known: list[Any], known: tuple[ToolCall, ...]
    ) -> tuple[HumanRequest, ...]:
        if type(data) is not list:
            raise TypeError("not a list of requests")
        by_id = _by_id(raw_known)
        return tuple([request_in(item, raw_known, known, by_id) for item in data])

    def checkpoint_in(data: Any, _: Any = None) -> Checkpoint:
        if type(data) is not dict or not data.keys() <= _CHECKPOINT_KEYS:
            raise TypeError("not a checkpoint")
        id_, run_id, agent_name = data["id"], data["run_id"], data["agent_name"]
        options, metadata = data["options"], data["metadata"]
        version, turns = data.get("version", CHECKPOINT_VERSION), data.get("turns", 0)
        if type(id_) is not str or type(run_id) is not str or type(agent_name) is not str:
            raise TypeError("not a checkpoint")
        if type(options) is not dict or type(metadata) is not dict:
            raise TypeError("not a checkpoint")
        if type(version) is not int or type(turns) is not int:
            raise TypeError("not a checkpoint")
        # The transcript starts with the messages the run was given, and the pending
        # calls (and the requests' calls) are calls of its last message: equal data is
        # structured once and shared, as it was in the checkpoint that was written.
        raw_messages, raw_transcript = data["messages"], data["transcript"]
        if type(raw_messages) is not list or type(raw_transcript) is not list:
            raise TypeError("not a checkpoint")
        messages = tuple([message_in(item, Message) for item in raw_messages])
        count = len(messages)
        if (
            count
            and raw_transcript[:count] == raw_messages
            and (
                (count == 1 and "tool_calls" not in raw_messages[0])  # a first prompt
                or _same_calls_in(raw_messages, raw_transcript)
            )
        ):
            transcript = messages + tuple(
                [message_in(item, Message) for item in raw_transcript[count:]]
            )
        else:
            transcript = tuple([message_in(item, Message) for item in raw_transcript])
        raw_calls: list[Any] = []
        made: tuple[ToolCall, ...] = ()
        if transcript:
            raw_calls = raw_transcript[-1].get("tool_calls") or []
            made = transcript[-1].tool_calls
        raw_pending = data["pending_tool_calls"]
        if (
            raw_pending == raw_calls
            and type(raw_pending) is list
            and (
                _same_arguments(raw_pending[0], raw_calls[0])
                if len(raw_pending) == 1
                else _all_same_arguments(raw_pending, raw_calls)
            )
        ):
            pending = made
        else:
            pending = shared_calls(raw_pending, raw_calls, made)
        return _new_checkpoint(
            id=id_,
            version=version,
            run_id=run_id,
            agent_name=agent_name,
            messages=messages,
            options=options,
            metadata=metadata,
            transcript=transcript,
            results=results_in(data["results"], None) if "results" in data else (),
            pending_tool_calls=pending,
            request=request_in(data["request"], raw_pending, pending),
            more_requests=(
                requests_in(data["more_requests"], raw_pending, pending)
                if "more_requests" in data
                else ()
            ),
            decisions=decisions_in(data["decisions"], None) if "decisions" in data else (),
            usage=usage_in(data["usage"], Usage) if "usage" in data else _NO_USAGE,
            turns=turns,
        )

    def checkpoint_out(checkpoint: Checkpoint) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": checkpoint.id,
            "version": checkpoint.version,
            "run_id": checkpoint.run_id,
            "agent_name": checkpoint.agent_name,
            "messages": messages_out(checkpoint.messages),
            "options": json_out(checkpoint.options),
            "metadata": json_out(checkpoint.metadata),
            "transcript": messages_out(checkpoint.transcript),
        }
        if checkpoint.results:
            data["results"] = results_out(checkpoint.results)
        data["pending_tool_calls"] = calls_out(checkpoint.pending_tool_calls)
        data["request"] = request_out(checkpoint.request)
        if checkpoint.more_requests:
            data["more_requests"] = [request_out(r) for r in checkpoint.more_requests]
        if checkpoint.decisions:
            data["decisions"] = decisions_out(checkpoint.decisions)
        usage = checkpoint.usage
        if usage is not _NO_USAGE and (
            usage.requests
            or usage.input_tokens
            or usage.output_tokens
            or usage.cache_read_tokens
            or usage.cache_write_tokens
        ):
            data["usage"] = usage_out(usage)
        if checkpoint.turns:
            data["turns"] = checkpoint.turns
        return data

    def request_hook(data: Any, _: Any = None) -> HumanRequest:
        return request_in(data)

    converter.register_structure_hook(HumanRequest, request_hook)
    converter.register_unstructure_hook(HumanRequest, request_out)
    converter.register_structure_hook(Checkpoint, checkpoint_in)
    converter.register_unstructure_hook(Checkpoint, checkpoint_out)


# The fast converter does the work; the detailed one only runs to explain a failure.
_converter = _make_converter(detailed=False)
_explainer = _make_converter(detailed=True)
# A checkpoint's own hooks, called directly on the round trip's path.
_checkpoint_out = _converter.get_unstructure_hook(Checkpoint)
_checkpoint_in = _converter.get_structure_hook(Checkpoint)


def always_write(cls: type, *names: str) -> None:
    """Write the fields *names* of *cls* even when they hold their default: a field whose
    default is computed from another (a list of requests that defaults to the one
    request) is what readers loop over, so it is always there."""
    written: dict[str, Any] = {name: override(omit_if_default=False) for name in names}
    for converter in (_converter, _explainer):
        converter.register_unstructure_hook(
            cls, make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True, **written)
        )


def unstructure_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """Turn *checkpoint* into JSON-compatible data (for ``json.dumps``).

    Fields that hold their default value are left out; ``version`` is always written.

    Raises:
        CheckpointSerializationError: A value in ``metadata``, ``options`` or tool
            arguments is not JSON-compatible; the error's ``path`` (and message) says
            where, e.g. ``metadata['when']``.
    """
    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointSerializationError(
            f"unstructure_checkpoint() needs a Checkpoint, got {type(checkpoint).__name__}."
        )
    try:
        data: dict[str, Any] = _checkpoint_out(checkpoint)  # copies only JSON values
    except (_NotJSON, RecursionError) as exc:
        try:
            _check_checkpoint(checkpoint)  # says what is not JSON, and where
        except RecursionError:
            raise _too_deep("written") from None
        raise CheckpointSerializationError(  # pragma: no cover - the check above raises
            f"This checkpoint holds data that JSON cannot hold ({exc})."
        ) from exc
    return data


def _too_deep(done: str) -> CheckpointSerializationError:
    return CheckpointSerializationError(
        f"This checkpoint cannot be {done}: it holds a value nested hundreds of levels deep "
        "(lists or objects inside each other), beyond what Python can follow. Runlet "
        f"itself refuses arguments nested deeper than {MAX_NESTING} levels; flatten the "
        "value."
    )


def structure_checkpoint(data: Mapping[str, Any]) -> Checkpoint:
    """Turn data made by :func:`unstructure_checkpoint` (for instance after a JSON round
    trip) back into a :class:`Checkpoint`. Version 1 data is migrated on read.

    Raises:
        CheckpointSerializationError: The data is not a checkpoint, is malformed (the
            message names the offending path), does not hang together (for example its
            open request does not match the pending call), or was written by a schema
            version this Runlet does not read.
    """
    if type(data) is not dict and not isinstance(data, Mapping):
        raise CheckpointSerializationError(
            f"structure_checkpoint() needs a dict, got {type(data).__name__}."
        )
    version = data.get("version")
    if version != CHECKPOINT_VERSION or type(version) is not int:
        if version == 1 and type(version) is int:
            data = _migrate_v1(data)
        elif version is None:
            raise CheckpointSerializationError(
                "This data is not a Runlet checkpoint: it has no 'version' field.",
                path="version",
            )
        else:
            raise CheckpointSerializationError(
                f"Checkpoint schema version {version!r} is not supported: this Runlet reads "
                f"versions 1 to {CHECKPOINT_VERSION}. Resume it with the Runlet release "
                "that wrote it.",
                path="version",
            )
    try:
        try:
            checkpoint: Checkpoint = _checkpoint_in(data, Checkpoint)
        except Exception:  # noqa: BLE001 - the detailed converter explains, or reads it after all
            checkpoint = _structure(data, Checkpoint, "checkpoint")
        check_integrity(checkpoint)
        _check_loaded(checkpoint)
    except RecursionError:
        raise _too_deep("read") from None
    return checkpoint


def _migrate_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1 made the request for a later pending call only when the run reached it;
    version 2 holds one open request per pending call. Migrated requests get stable ids
    (so loading twice gives the same ids) and the default prompt."""
    migrated = dict(data)
    migrated["version"] = CHECKPOINT_VERSION
    request = migrated.get("request")
    if isinstance(request, Mapping) and "created_at" not in request:
        migrated["request"] = {**request, "created_at": _V1_CREATED_AT}
    pending = migrated.get("pending_tool_calls")
    if isinstance(pending, list) and len(pending) > 1 and "more_requests" not in migrated:
        migrated["more_requests"] = [
            _v1_request(call, f"req_{migrated.get('id')}_{index}")
            for index, call in enumerate(pending[1:], start=1)
        ]
    return migrated


def _v1_request(call: Any, request_id: str) -> Any:
    if not isinstance(call, Mapping):
        return call  # malformed: structuring says where
    arguments = call.get("arguments") or {}
    request: dict[str, Any] = {"id": request_id, "tool_call": call, "created_at": _V1_CREATED_AT}
    kind = arguments.get("kind") if isinstance(arguments, Mapping) else None
    if call.get("name") == "ask_human" and kind in ("choice", "input"):
        request.update(kind=kind, prompt=arguments.get("prompt", ""))
        if kind == "choice":
            options = arguments.get("options")
            request["options"] = [
                {key: option[key] for key in ("id", "label", "description") if key in option}
                for option in (options if isinstance(options, list) else ())
                if isinstance(option, Mapping)
            ]
    else:
        shown = show_arguments(arguments if isinstance(arguments, Mapping) else {})
        request.update(kind="approval", prompt=f"Allow {call.get('name')} with {shown}?")
    return request


T = TypeVar("T")


@overload
def unstructure(
    obj: RunResult
    | HumanRequest
    | HumanResponse
    | PendingRequest
    | Decision
    | Message
    | ToolCall
    | ToolResult
    | Usage
    | HumanOption
    | ReasoningPart
    | Checkpoint
    | CallRecord
    | Resolution
    | StoredCheckpoint
    | Claim
    | ModelRequest
    | ModelResponse
    | ToolDefinition
    | StreamEvent,
) -> dict[str, Any]: ...


@overload
def unstructure(obj: Sequence[Any] | Mapping[str, Any]) -> Any: ...


def unstructure(obj: Any) -> Any:
    """Turn a Runlet data object into JSON-compatible data (for ``json.dumps``), with the
    one converter Runlet uses for checkpoints; :func:`structure` turns it back, equal to
    the original.

    It takes every public data class: :class:`~runlet.RunResult`,
    :class:`~runlet.HumanRequest`, :class:`~runlet.HumanResponse`,
    :class:`~runlet.PendingRequest`, :class:`~runlet.Decision`, :class:`~runlet.Message`,
    :class:`~runlet.ToolCall`, :class:`~runlet.ToolResult`, :class:`~runlet.Usage`, each
    stream event (see :func:`~runlet.unstructure_event` for a tagged form),
    :class:`~runlet.Checkpoint` (like :func:`unstructure_checkpoint`), and the store
    protocol's :class:`~runlet.CallRecord` and :class:`~runlet.Resolution` (what a store of
    your own keeps). Fields that hold their default value are left out; times are ISO 8601
    strings.

    Raises:
        CheckpointSerializationError: A value inside (tool arguments, metadata) is not
            JSON-compatible; the error's ``path`` says where, relative to *obj*, e.g.
            ``transcript[1].tool_calls[0].arguments['when']``.
    """
    if isinstance(obj, Checkpoint):
        return unstructure_checkpoint(obj)
    if not _is_json_object(obj):
        _check_object(obj, "")  # raises, saying where
    return _converter.unstructure(obj)


# The field names of each attrs class met (None for other types): a class's fields do
# not change. Only data classes and the types inside them are met, a bounded set.
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(kind: type) -> tuple[str, ...] | None:
    """The field names of an attrs class, or ``None`` for any other type."""
    try:
        return _FIELD_NAMES[kind]
    except KeyError:
        names = tuple(field.name for field in attrs.fields(kind)) if attrs.has(kind) else None
        _FIELD_NAMES[kind] = names
        return names


def _is_json_object(value: Any) -> bool:
    """Whether :func:`_check_object` finds nothing wrong in *value*, without building the
    paths it needs to say where: valid data, the common case, costs a fraction."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    names = _field_names(kind)
    if names is not None:
        for name in names:
            item = getattr(value, name)
            if type(item) in _PLAIN or isinstance(item, datetime):
                continue
            if not _is_json_object(item):
                return False
        return True
    if isinstance(value, (tuple, list)):
        if not value:
            return True
        if any(_field_names(type(item)) is not None for item in value):
            return all(_is_json_object(item) for item in value)
    try:
        _check_json(value, "")
    except CheckpointSerializationError:
        return False
    return True


def _check_object(value: Any, path: str) -> None:
    """Refuse a value inside *value* that is not JSON-compatible, naming its path the way
    checkpoint errors do (``field.field[index]['key']``)."""
    if attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            item = getattr(value, field.name)
            if not isinstance(item, datetime):
                _check_object(item, f"{path}.{field.name}" if path else field.name)
    elif isinstance(value, (tuple, list)) and any(attrs.has(type(item)) for item in value):
        for index, item in enumerate(value):
            _check_object(item, f"{path}[{index}]")
    else:
        _check_json(value, path or type(value).__name__)


def structure(data: Any, cls: type[T], *, what: str | None = None) -> T:
    """Turn data made by :func:`unstructure` (for instance after a JSON round trip) back
    into an instance of *cls*, exactly: no value is converted to fit, so ``"1"`` is not an
    int and ``1`` is not a string.

    Raises:
        CheckpointSerializationError: The data is malformed: not a JSON object where one
            is needed, a missing or unknown field, a value of the wrong type, or one the
            class refuses (e.g. a :class:`~runlet.HumanResponse` that makes no sense). The
            message names every offending path; ``path`` holds the first, e.g.
            ``RunResult.transcript[0].role``. Also when *cls* is a union (such as
            :data:`~runlet.StreamEvent`): use :func:`~runlet.structure_event` for events.
    """
    if get_origin(cls) in (Union, UnionType):
        raise CheckpointSerializationError(
            f"structure() needs one class, not the union {cls}; for stream events use "
            "structure_event() on data from unstructure_event(), which names the event type."
        )
    if cls is Checkpoint:  # with every check a checkpoint gets, and version 1 migrated
        return structure_checkpoint(data)  # type: ignore[return-value]
    value = _structure(data, cls, what)
    if not _is_json_object(value):  # NaN, Infinity, keys that are not strings, ...
        try:
            _check_object(value, "")
        except CheckpointSerializationError as exc:
            name = what or str(getattr(cls, "__name__", "data"))
            raise CheckpointSerializationError(
                f"This data is not a valid {name}: {exc}",
                path=f"{name}.{exc.path}" if exc.path else name,
            ) from None
    return value


def _structure(data: Any, cls: type[T], what: str | None) -> T:
    """:func:`structure` for a class known not to be a union."""
    try:
        return _converter.structure(data, cls)
    except Exception:  # noqa: BLE001 - re-done below to say exactly what is wrong
        pass
    name = what or str(getattr(cls, "__name__", "data"))
    try:
        value: T = _explainer.structure(data, cls)
    except Exception as exc:
        details = cattrs.transform_error(exc, path=name, format_exception=_explain)
        raise CheckpointSerializationError(
            f"This data is not a valid {name}: " + "; ".join(details),
            path=_first_path(details),
        ) from exc
    # Valid data the hand-written fast hooks turned down (e.g. a read-only mapping where
    # JSON gives a dict): the detailed converter's answer stands.
    return value


def _explain(exc: BaseException, type_: Any) -> str:
    """One problem, in words: our hooks' and validators' own messages where they have one."""
    if isinstance(exc, AttributeError) and not isinstance(exc, RunletError):
        return "expected a JSON object"
    if (
        type(exc) is TypeError
        and (type_ is None or attrs.has(type_))  # None: the class structure() was given
        and str(exc).startswith("argument of type")
    ):
        return "expected a JSON object"  # a number or null where an object belongs
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        # Said here: cattrs' own words assume the keys are strings, which JSON's are but
        # a dict built in Python may not be.
        return "extra fields found (" + ", ".join(sorted(map(str, exc.extra_fields))) + ")"
    if isinstance(exc, KeyError) or not str(exc):
        return cattrs.v.format_exception(exc, type_)
    return str(exc)


def _first_path(details: list[str]) -> str | None:
    for line in details:
        if " @ " in line:
            return line.rsplit(" @ ", 1)[1]
    return None
