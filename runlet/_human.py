"""Human in the loop: what a run asks a person, what the person answers, and ask_human()."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from ._errors import HumanResponseError, RunletError
from ._messages import ToolCall, ToolResult
from ._tools import ToolContext, ToolSpec, show_arguments

__all__ = [
    "REJECTION_MESSAGE",
    "HumanAction",
    "HumanOption",
    "HumanRequest",
    "HumanRequestKind",
    "HumanResponse",
    "ask_human",
]

HumanRequestKind = Literal["approval", "choice", "input"]
HumanAction = Literal["approve", "reject", "select", "submit"]

REJECTION_MESSAGE = "A human rejected this tool call, so it was not run."
"""The content of the error result a rejected call gets; the same text every time."""

_ACTIONS: dict[str, tuple[str, ...]] = {
    "approval": ("approve", "reject"),
    "choice": ("select",),
    "input": ("submit",),
}
_ALL_ACTIONS = frozenset(a for actions in _ACTIONS.values() for a in actions)


@attrs.frozen
class HumanOption:
    """One option of a ``choice`` request.

    Attributes:
        id: What a ``select`` response names.
        label: What the person sees.
        description: Optional longer text.
    """

    id: str
    label: str
    description: str | None = None


@attrs.frozen
class HumanRequest:
    """What a run asks a person. Render it; answer it with a :class:`HumanResponse`.

    Attributes:
        id: Unique per interruption; the response's ``request_id`` must repeat it.
        kind: ``"approval"`` (a gated tool call), ``"choice"`` or ``"input"``
            (the model called :func:`ask_human`).
        prompt: What to show the person.
        options: For ``choice``, the options to pick from; otherwise empty.
        tool_call: The tool call that raised the request.
    """

    id: str
    kind: HumanRequestKind
    prompt: str
    options: tuple[HumanOption, ...] = ()
    tool_call: ToolCall = attrs.field(kw_only=True)


def _check_action(_: object, __: attrs.Attribute[str], action: str) -> None:
    if action not in _ALL_ACTIONS:
        raise HumanResponseError(
            f"HumanResponse action {action!r} is unknown: use 'approve' or 'reject' for an "
            "approval, 'select' for a choice, 'submit' for an input."
        )


def _check_edited(_: object, __: attrs.Attribute[Any], edited: object) -> None:
    if edited is not None and not isinstance(edited, Mapping):
        raise HumanResponseError(
            "HumanResponse edited_arguments must be a mapping of argument names to values "
            f"(or None), not {type(edited).__name__}."
        )


@attrs.frozen
class HumanResponse:
    """A person's answer to a :class:`HumanRequest`, given to
    :meth:`~runlet.Runtime.resume`.

    Actions by request kind:

    - ``approval``: ``"approve"`` (optionally with ``edited_arguments``, which replace the
      model's arguments and must satisfy the tool's schema) or ``"reject"``.
    - ``choice``: ``"select"`` with ``value`` set to one of the offered option ids.
    - ``input``: ``"submit"`` with ``value`` set to the person's text.

    Raises:
        HumanResponseError: The action is unknown, ``select``/``submit`` has no string
            value, ``approve``/``reject`` carries a value, or ``edited_arguments`` is not
            a mapping or comes with an action other than ``approve``.
    """

    request_id: str
    action: HumanAction = attrs.field(validator=_check_action)
    value: str | None = None
    edited_arguments: Mapping[str, Any] | None = attrs.field(default=None, validator=_check_edited)

    def __attrs_post_init__(self) -> None:
        if self.action in ("select", "submit"):
            if not isinstance(self.value, str):
                raise HumanResponseError(
                    f"HumanResponse action {self.action!r} needs value= a string "
                    f"({'an option id' if self.action == 'select' else 'the text'}), "
                    f"got {self.value!r}."
                )
        elif self.value is not None:
            raise HumanResponseError(
                f"HumanResponse action {self.action!r} takes no value; "
                "remove value= (use edited_arguments= to change an approved call)."
            )
        if self.edited_arguments is not None and self.action != "approve":
            raise HumanResponseError(
                "edited_arguments only go with action='approve'; "
                f"remove them from this {self.action!r} response."
            )


async def _not_called(arguments: Mapping[str, Any], context: ToolContext) -> str:
    # The runtime answers ask_human calls itself, from the human's response.
    raise RunletError("ask_human is answered by the runtime; its handler never runs.")


_ASK_HUMAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {
            "enum": ["choice", "input"],
            "description": "'choice' to pick one of options, 'input' for free text.",
        },
        "prompt": {"type": "string", "minLength": 1, "description": "What to ask."},
        "options": {
            "type": "array",
            "minItems": 1,
            "description": "For kind='choice': the options to choose from.",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "label": {"type": "string", "minLength": 1},
                    "description": {"type": "string"},
                },
                "required": ["id", "label"],
            },
        },
    },
    "required": ["kind", "prompt"],
    "if": {"properties": {"kind": {"const": "choice"}}},
    "then": {"required": ["options"]},
}


def ask_human() -> ToolSpec:
    """The built-in ``ask_human`` tool: lets the model stop the run to ask a person.

    The model calls it with ``kind="choice"``, a ``prompt`` and ``options`` (objects with
    ``id``, ``label`` and optional ``description``; at least one, ids unique), or with
    ``kind="input"`` and a ``prompt``. The run interrupts with a :class:`HumanRequest`
    of that kind; the person's answer becomes this call's tool result. Invalid
    arguments go back to the model as an error result, without interrupting.
    """
    return ToolSpec(
        name="ask_human",
        description=(
            "Ask the human user a question and wait for the answer. Use kind='choice' "
            "with options when the user should pick one, kind='input' for free text."
        ),
        input_schema=_ASK_HUMAN_SCHEMA,
        handler=_not_called,
    )


def is_ask_human(tool: ToolSpec) -> bool:
    """Whether *tool* is the built-in ask_human tool (any instance of it)."""
    return tool.handler is _not_called


def needs_human(tool: ToolSpec) -> bool:
    """Whether a call of *tool* stops the run for a person."""
    return tool.requires_approval or tool.handler is _not_called


def check_ask_human(arguments: Mapping[str, Any]) -> str | None:
    """What the schema cannot say about ask_human arguments; ``None`` when fine."""
    options = arguments.get("options") or ()
    if arguments.get("kind") == "input" and options:
        return "options are only for kind='choice'; remove them or use kind='choice'"
    ids = [option["id"] for option in options]
    if len(set(ids)) != len(ids):
        return f"option ids must be unique, got {ids}"
    return None


def make_request(request_id: str, call: ToolCall, tool: ToolSpec) -> HumanRequest:
    """The request for a call that needs a person."""
    if not is_ask_human(tool):
        shown = show_arguments(call.arguments)
        return HumanRequest(
            request_id, "approval", f"Allow {call.name} with {shown}?", tool_call=call
        )
    args = call.arguments
    options = tuple(
        HumanOption(o["id"], o["label"], o.get("description")) for o in args.get("options", ())
    )
    return HumanRequest(request_id, args["kind"], args["prompt"], options, tool_call=call)


def check_response(request: HumanRequest, response: HumanResponse) -> None:
    """Refuse a response that does not answer *request*."""
    if not isinstance(response, HumanResponse):
        raise HumanResponseError(f"resume() needs a HumanResponse, got {type(response).__name__}.")
    if response.request_id != request.id:
        raise HumanResponseError(
            f"This response answers request {response.request_id!r}, but the checkpoint "
            f"is waiting on request {request.id!r}. Resume with the request id from the "
            "interruption that produced this checkpoint."
        )
    allowed = _ACTIONS[request.kind]
    if response.action not in allowed:
        raise HumanResponseError(
            f"Action {response.action!r} does not answer a {request.kind!r} request; "
            f"use {' or '.join(repr(a) for a in allowed)}."
        )
    if request.kind == "choice" and not any(o.id == response.value for o in request.options):
        offered = ", ".join(repr(o.id) for o in request.options)
        raise HumanResponseError(
            f"{response.value!r} is not one of the offered options ({offered}); "
            "select one of their ids."
        )


def answer_result(request: HumanRequest, response: HumanResponse) -> ToolResult:
    """The ask_human tool result carrying a person's selection or text."""
    call_id = request.tool_call.id
    if request.kind == "choice":
        option = next(o for o in request.options if o.id == response.value)
        payload: dict[str, str] = {"selected": option.id, "label": option.label}
    else:
        payload = {"answer": response.value or ""}
    return ToolResult(call_id, json.dumps(payload, ensure_ascii=False))
