"""Stream events as tagged JSON objects, for relays (server-sent events, websockets).

:func:`~runlet.unstructure` and :func:`~runlet.structure` handle each event class on its
own; a relay needs one form for all of them, so this one names the class in a ``"type"``
key. The tags come from the :data:`~runlet.StreamEvent` union itself, so a new event
class needs no change here: adding it to the union gives it its tag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, get_args

from ._checkpoint import always_write, structure, unstructure
from ._errors import CheckpointSerializationError
from ._events import Interrupted, StreamEvent

__all__ = ["EVENT_TYPES", "structure_event", "unstructure_event"]


always_write(Interrupted, "requests")  # a relay loops over them, one request or several


def _tag(cls: type[Any]) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


EVENT_TYPES: Final[Mapping[str, type[Any]]] = {_tag(cls): cls for cls in get_args(StreamEvent)}
"""The ``"type"`` tag of each stream event class in :func:`unstructure_event`'s form: the
class name in snake case, one per member of :data:`~runlet.StreamEvent` (``"text_delta"``
for :class:`~runlet.TextDelta`, ``"tool_call_started"`` for
:class:`~runlet.ToolCallStarted`, and so on). The tags are part of the wire format and
never change for an existing event."""

_TAGS: Final = {cls: tag for tag, cls in EVENT_TYPES.items()}


def unstructure_event(event: StreamEvent) -> dict[str, Any]:
    """Turn a stream event into a JSON object that says which event it is, for sending
    it on (e.g. as the data of a server-sent event).

    The object is ``{"type": tag, **unstructure(event)}``, with the tag of
    :data:`EVENT_TYPES` for the event's class: ``"text_delta"``, ``"tool_call_delta"``,
    ``"message_completed"``, ``"tool_call_started"``, ``"tool_call_finished"``,
    ``"interrupted"``, ``"run_finished"``, and so on for every member of
    :data:`~runlet.StreamEvent`. :func:`structure_event` turns it back.

    Raises:
        CheckpointSerializationError: *event* is not a stream event, or a value inside
            it is not JSON-compatible (the error's ``path`` says where).
    """
    tag = _TAGS.get(type(event))
    if tag is None:
        raise CheckpointSerializationError(
            f"unstructure_event() takes a stream event ({', '.join(sorted(EVENT_TYPES))}), "
            f"not {type(event).__name__}; use unstructure() for other Runlet data."
        )
    return {"type": tag, **unstructure(event)}


def structure_event(data: Mapping[str, Any]) -> StreamEvent:
    """Turn an object made by :func:`unstructure_event` (for instance after a JSON round
    trip) back into the stream event it was, equal to the original.

    Raises:
        CheckpointSerializationError: *data* is not a JSON object, its ``"type"`` is
            missing or names no event (``path`` is ``"type"``), or the rest is not a
            valid event of that type (``path`` names the first problem).
    """
    if not isinstance(data, Mapping):
        raise CheckpointSerializationError(
            f"structure_event() needs a JSON object, got {type(data).__name__}."
        )
    tag = data.get("type")
    cls = EVENT_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise CheckpointSerializationError(
            f"This data is not a Runlet stream event: its 'type' is {tag!r}; expected "
            f"one of {', '.join(map(repr, EVENT_TYPES))}.",
            path="type",
        )
    fields = {key: value for key, value in data.items() if key != "type"}
    event: StreamEvent = structure(fields, cls)
    return event
