"""Checkpoints: a suspended run as plain data, and its JSON-compatible form."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn

from ._errors import CheckpointSerializationError
from ._human import HumanOption, HumanRequest
from ._messages import Message, ReasoningPart, ToolCall, ToolResult, Usage

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "structure_checkpoint",
    "unstructure_checkpoint",
]

CHECKPOINT_VERSION = 1
"""The checkpoint schema version this Runlet writes (and the newest it reads)."""


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
            first is the one :attr:`request` asks about.
        request: The open request.
        usage: Usage so far.
        turns: Model requests made so far, counted against the runtime's ``max_turns``.
    """

    id: str
    version: int = CHECKPOINT_VERSION
    run_id: str
    agent_name: str
    messages: tuple[Message, ...]
    options: Mapping[str, Any]
    metadata: Mapping[str, Any]
    transcript: tuple[Message, ...]
    results: tuple[ToolResult, ...] = ()
    pending_tool_calls: tuple[ToolCall, ...]
    request: HumanRequest
    usage: Usage = Usage()
    turns: int = 0


_JSON_SCALARS = (str, int, bool, type(None))


def _check_json(value: object, path: str) -> None:
    """Raise if *value* is not something ``json.dumps`` writes and ``json.loads`` reads
    back unchanged (apart from tuples, which come back as lists)."""
    if isinstance(value, _JSON_SCALARS):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CheckpointSerializationError(
                f"{path} is {value!r}, which JSON cannot hold; use a finite number or a string.",
                path=path,
            )
        return
    # Only real dicts: json.dumps cannot write other mappings.
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointSerializationError(
                    f"{path} has the key {key!r} ({type(key).__name__}); JSON object keys "
                    "must be strings.",
                    path=path,
                )
            _check_json(item, f"{path}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    raise CheckpointSerializationError(
        f"{path} is a {type(value).__name__}, which is not JSON-compatible. Checkpoints "
        "hold only JSON values (dict, list, str, int, float, bool, None): convert it, "
        "e.g. a datetime to an ISO string.",
        path=path,
    )


def _check_checkpoint(checkpoint: Checkpoint) -> None:
    _check_json(checkpoint.metadata, "metadata")
    _check_json(checkpoint.options, "options")
    for name in ("transcript", "messages"):
        for index, message in enumerate(getattr(checkpoint, name)):
            for number, call in enumerate(message.tool_calls):
                _check_json(call.arguments, f"{name}[{index}].tool_calls[{number}].arguments")
    for index, call in enumerate(checkpoint.pending_tool_calls):
        _check_json(call.arguments, f"pending_tool_calls[{index}].arguments")


def _passthrough(value: Any) -> Any:
    return value


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


def _register_tuples(converter: cattrs.Converter) -> None:
    # cattrs handles tuple[X, ...] with a generic hook that looks up X's hook on every
    # call; binding it once takes ~15% off a checkpoint's (de)serialization. Same data
    # in and out (lists out, tuples in). Items first, so Message's hook binds the
    # tuple[ToolCall, ...] hook made here.
    for item in (ToolCall, ToolResult, HumanOption, ReasoningPart, Message):
        structure = converter.get_structure_hook(item)
        unstructure = converter.get_unstructure_hook(item)

        def structure_tuple(value: Any, _: Any, s: Any = structure, t: Any = item) -> Any:
            return tuple([s(element, t) for element in value])

        def unstructure_tuple(value: Any, u: Any = unstructure) -> Any:
            return [u(element) for element in value]

        def is_tuple(type_: Any, target: Any = tuple[item, ...]) -> bool:  # type: ignore[valid-type]
            return bool(type_ == target)

        converter.register_structure_hook_func(is_tuple, structure_tuple)
        converter.register_unstructure_hook_func(is_tuple, unstructure_tuple)


def _make_converter(*, detailed: bool) -> cattrs.Converter:
    converter = cattrs.Converter(
        omit_if_default=True, forbid_extra_keys=True, detailed_validation=detailed
    )
    converter.register_unstructure_hook_func(_is_json_mapping, _passthrough)
    converter.register_structure_hook_func(_is_json_mapping, _structure_json_object)
    for type_ in (str, int, bool):
        converter.register_structure_hook(type_, _exactly(type_))
    if not detailed:
        _register_tuples(converter)
    # The version is written even though it equals its default: readers rely on it.
    converter.register_unstructure_hook(
        Checkpoint,
        make_dict_unstructure_fn(Checkpoint, converter, _cattrs_omit_if_default=False),
    )
    return converter


# The fast converter does the work; the detailed one only runs to explain a failure.
_converter = _make_converter(detailed=False)
_explainer = _make_converter(detailed=True)


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
    _check_checkpoint(checkpoint)
    data: dict[str, Any] = _converter.unstructure(checkpoint)
    return data


def structure_checkpoint(data: Mapping[str, Any]) -> Checkpoint:
    """Turn data made by :func:`unstructure_checkpoint` (for instance after a JSON round
    trip) back into a :class:`Checkpoint`.

    Raises:
        CheckpointSerializationError: The data is not a checkpoint, is malformed (the
            message names the offending path), or was written by a schema version this
            Runlet does not read.
    """
    if not isinstance(data, Mapping):
        raise CheckpointSerializationError(
            f"structure_checkpoint() needs a dict, got {type(data).__name__}."
        )
    version = data.get("version")
    if version != CHECKPOINT_VERSION or type(version) is not int:
        if version is None:
            raise CheckpointSerializationError(
                "This data is not a Runlet checkpoint: it has no 'version' field.",
                path="version",
            )
        raise CheckpointSerializationError(
            f"Checkpoint schema version {version!r} is not supported: this Runlet reads "
            f"version {CHECKPOINT_VERSION}. Resume it with the Runlet release that wrote it.",
            path="version",
        )
    try:
        return _converter.structure(data, Checkpoint)
    except Exception:  # noqa: BLE001 - re-done below to say exactly what is wrong
        pass
    try:
        checkpoint = _explainer.structure(data, Checkpoint)
    except Exception as exc:
        details = cattrs.transform_error(exc, path="checkpoint")
        raise CheckpointSerializationError(
            "This data is not a valid checkpoint: " + "; ".join(details),
            path=_first_path(details),
        ) from exc
    return checkpoint  # pragma: no cover - the fast converter accepts what this accepts


def _first_path(details: list[str]) -> str | None:
    for line in details:
        if " @ " in line:
            return line.rsplit(" @ ", 1)[1]
    return None  # pragma: no cover
