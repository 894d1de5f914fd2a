"""Human in the loop: what a run asks a person, what the person answers, and ask_human()."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, overload

import attrs

from ._errors import HumanResponseError, RunletError
from ._messages import ToolCall, ToolResult
from ._tools import ToolContext, ToolSpec
from ._util import same_json, slot_builder

__all__ = [
    "EXPIRY_MESSAGE",
    "OUTCOME_UNKNOWN_PROMPT",
    "REJECTION_MESSAGE",
    "Decision",
    "DecisionAction",
    "HumanAction",
    "HumanOption",
    "HumanRequest",
    "HumanRequestKind",
    "HumanResponse",
    "ask_human",
]

HumanRequestKind = Literal["approval", "choice", "input"]
HumanAction = Literal["approve", "reject", "select", "submit"]
DecisionAction = Literal["approve", "reject", "select", "submit", "expire"]

REJECTION_MESSAGE = "A human rejected this tool call, so it was not run."
"""The content of the error result a rejected call gets; the same text every time. A
rejection that gives a reason (``HumanResponse(action="reject", value=...)``) appends
``" Reason: "`` and the reason."""

EXPIRY_MESSAGE = (
    "Nobody answered the request for this tool call before it expired, so it was not run."
)
"""The content of the error result a call gets when :meth:`~runlet.Runtime.expire` gives up
on its request."""

OUTCOME_UNKNOWN_PROMPT = (
    "An earlier attempt to run this approved call did not record how it ended (it was cut "
    "off while the tool was running, or its result could not be stored), so it is unknown "
    "whether it took effect. Check before you decide: approve runs it again, reject "
    "leaves it as it is."
)
"""The text that starts the prompt of an ``outcome_unknown`` request."""

UTC = timezone.utc


# The current time as an aware UTC datetime; the runtime's default clock. A partial, not a
# function, so reading the clock (several times per resume) costs no Python frame.
utc_now: Callable[[], datetime] = functools.partial(datetime.now, UTC)


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


class _Unset:
    """A default that stands for "not given" and says what happens then."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


_REQUIRED: Any = _Unset("<required>")
_NOW: Any = _Unset("<now>")


@attrs.frozen(init=False)
class HumanRequest:
    """What a run asks a person. Render it; answer it with a :class:`HumanResponse`.

    The run makes these; an application builds one only for tests or a store of its own.
    ``tool_call`` is required and may be given by position after ``options``
    (``HumanRequest(id, kind, prompt, options, call)``) or by name.

    Attributes:
        id: Unique per interruption; the response's ``request_id`` must repeat it.
        kind: ``"approval"`` (a gated tool call), ``"choice"`` or ``"input"``
            (the model called :func:`ask_human`).
        prompt: What to show the person.
        options: For ``choice``, the options to pick from; otherwise empty.
        tool_call: The tool call that raised the request. For an approval, its
            arguments are exactly what runs when the person approves (unless they edit
            them).
        created_at: When the run stopped for this request (aware UTC).
        expires_at: After this moment a response is refused with
            :class:`~runlet.HumanRequestExpiredError`; ``None`` means never. Set by the
            tool's ``expires_after``.
        outcome_unknown: ``True`` when an earlier attempt started this approved call and
            was cut off inside the handler, so whether it took effect is unknown; the
            prompt says so. Approve runs it again; reject records the rejection.
    """

    id: str
    kind: HumanRequestKind
    prompt: str
    options: tuple[HumanOption, ...] = ()
    tool_call: ToolCall = attrs.field(kw_only=True)
    created_at: datetime = attrs.field(kw_only=True, factory=utc_now)
    expires_at: datetime | None = attrs.field(kw_only=True, default=None)
    outcome_unknown: bool = attrs.field(kw_only=True, default=False)

    @overload
    def __init__(
        self,
        id: str,
        kind: HumanRequestKind,
        prompt: str,
        options: tuple[HumanOption, ...],
        tool_call: ToolCall,
        *,
        created_at: datetime = ...,
        expires_at: datetime | None = None,
        outcome_unknown: bool = False,
    ) -> None: ...

    @overload
    def __init__(
        self,
        id: str,
        kind: HumanRequestKind,
        prompt: str,
        options: tuple[HumanOption, ...] = (),
        *,
        tool_call: ToolCall,
        created_at: datetime = ...,
        expires_at: datetime | None = None,
        outcome_unknown: bool = False,
    ) -> None: ...

    def __init__(
        self,
        id: str,
        kind: HumanRequestKind,
        prompt: str,
        options: tuple[HumanOption, ...] = (),
        tool_call: ToolCall = _REQUIRED,
        *,
        created_at: datetime = _NOW,
        expires_at: datetime | None = None,
        outcome_unknown: bool = False,
    ) -> None:
        if tool_call is _REQUIRED:
            raise TypeError(
                "HumanRequest() needs tool_call, the ToolCall that raised the request "
                "(after options, or as tool_call=...)."
            )
        self.__attrs_init__(
            id,
            kind,
            prompt,
            options,
            tool_call=tool_call,
            created_at=utc_now() if created_at is _NOW else created_at,
            expires_at=expires_at,
            outcome_unknown=outcome_unknown,
        )


def _check_action(_: object, __: attrs.Attribute[HumanAction], action: object) -> None:
    if not isinstance(action, str) or action not in _ALL_ACTIONS:  # a list is no key
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
      model's arguments and must satisfy the tool's schema) or ``"reject"`` (optionally
      with ``value`` set to a reason, which the model sees after the fixed rejection text).
    - ``choice``: ``"select"`` with ``value`` set to one of the offered option ids.
    - ``input``: ``"submit"`` with ``value`` set to the person's text.

    The class methods :meth:`approve`, :meth:`reject`, :meth:`select` and :meth:`submit`
    build each kind with exactly the arguments it takes, so a type checker catches a
    response of the wrong shape: ``HumanResponse.select(request.id, "express")``.

    ``responded_by`` (who answered, as your application names them) and ``metadata``
    (JSON-compatible data of your own, e.g. a ticket number) are kept in the audit trail
    (:class:`Decision`) and never sent to the model.

    Raises:
        HumanResponseError: *request_id* is not a non-empty string, the action is
            unknown, ``select``/``submit`` has no string value, ``approve`` carries a
            value, ``reject``'s reason is not a string, ``edited_arguments`` is not a
            mapping or comes with an action other than ``approve``, or
            ``responded_by``/``metadata`` have the wrong type.
    """

    request_id: str
    action: HumanAction = attrs.field(validator=_check_action)
    value: str | None = None
    edited_arguments: Mapping[str, Any] | None = attrs.field(
        default=None, validator=_check_edited, hash=False
    )
    responded_by: str | None = attrs.field(default=None, kw_only=True)
    metadata: Mapping[str, Any] | None = attrs.field(default=None, kw_only=True, hash=False)

    def __attrs_post_init__(self) -> None:
        request_id: object = self.request_id  # typed, but a user's: checked as anything
        if not isinstance(request_id, str) or not request_id:
            raise HumanResponseError(
                "HumanResponse request_id must be the id of the request it answers (a "
                f"non-empty str, e.g. result.interruption.id), not {request_id!r}."
            )
        if self.action in ("select", "submit"):
            if not isinstance(self.value, str):
                raise HumanResponseError(
                    f"HumanResponse action {self.action!r} needs value= a string "
                    f"({'an option id' if self.action == 'select' else 'the text'}), "
                    f"got {self.value!r}."
                )
        elif self.action == "reject":
            if self.value is not None and not isinstance(self.value, str):
                raise HumanResponseError(
                    "A rejection's value is the reason the model is told; give a string "
                    f"or leave it out, not {type(self.value).__name__}."
                )
        elif self.value is not None:
            raise HumanResponseError(
                "HumanResponse action 'approve' takes no value; remove value= (use "
                "edited_arguments= to change the call's arguments)."
            )
        if self.responded_by is not None and not isinstance(self.responded_by, str):
            raise HumanResponseError(
                f"responded_by names who answered and must be a string, not "
                f"{type(self.responded_by).__name__}."
            )
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise HumanResponseError(
                "HumanResponse metadata must be a JSON object (a dict), not "
                f"{type(self.metadata).__name__}."
            )
        if self.edited_arguments is not None and self.action != "approve":
            raise HumanResponseError(
                "edited_arguments only go with action='approve'; "
                f"remove them from this {self.action!r} response."
            )

    # Typed shortcuts: each takes exactly what its action needs, so a type checker
    # refuses a response of the wrong shape (a select without an option id).

    @classmethod
    def approve(
        cls,
        request_id: str,
        edited_arguments: Mapping[str, Any] | None = None,
        *,
        responded_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> HumanResponse:
        """Approve an approval request, optionally with *edited_arguments*."""
        return cls(
            request_id,
            "approve",
            None,
            edited_arguments,
            responded_by=responded_by,
            metadata=metadata,
        )

    @classmethod
    def reject(
        cls,
        request_id: str,
        reason: str | None = None,
        *,
        responded_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> HumanResponse:
        """Reject an approval request; the model is told *reason* after the fixed
        rejection text."""
        return cls(request_id, "reject", reason, responded_by=responded_by, metadata=metadata)

    @classmethod
    def select(
        cls,
        request_id: str,
        option_id: str,
        *,
        responded_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> HumanResponse:
        """Answer a choice request with the id of one of its options."""
        return cls(request_id, "select", option_id, responded_by=responded_by, metadata=metadata)

    @classmethod
    def submit(
        cls,
        request_id: str,
        text: str,
        *,
        responded_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> HumanResponse:
        """Answer an input request with the person's *text*."""
        return cls(request_id, "submit", text, responded_by=responded_by, metadata=metadata)


@attrs.frozen(kw_only=True)
class Decision:
    """One answer to a :class:`HumanRequest`, as recorded: the audit trail of a run.

    Runlet records a decision before it acts on it (so it survives a crash right after),
    keeps the run's decisions in its checkpoints and its stored outcome, and returns them
    as :attr:`RunResult.decisions <runlet.RunResult.decisions>`. Durable stores also list
    them by run id.

    Attributes:
        request_id: The request answered.
        checkpoint_id: The checkpoint the answer was given to.
        tool_call_id: The call the request was about.
        tool_name: That call's tool (``"ask_human"`` for a choice or input).
        kind: The request's kind.
        action: What was decided: the response's action, or ``"expire"`` when
            :meth:`~runlet.Runtime.expire` gave up on the request.
        value: The option id, the text, or a rejection's reason.
        arguments: For ``approve``, the arguments as approved (edited or not): exactly
            what the tool ran with.
        edited: Whether the person edited the arguments.
        responded_by: Who answered, as the application named them.
        metadata: The response's own metadata.
        decided_at: When Runlet accepted the answer (aware UTC).
    """

    request_id: str
    checkpoint_id: str
    tool_call_id: str
    tool_name: str
    kind: HumanRequestKind
    action: DecisionAction
    value: str | None = None
    arguments: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    edited: bool = False
    responded_by: str | None = None
    metadata: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    decided_at: datetime

    def answers_like(self, response: HumanResponse) -> bool:
        """Whether *response* is the answer this decision recorded (every field equal,
        values as JSON: ``True`` is not ``1``)."""
        return (
            response.request_id == self.request_id
            and response.action == self.action
            and same_json(response.value, self.value)
            and same_json(response.edited_arguments, self.arguments if self.edited else None)
            and response.responded_by == self.responded_by
            and same_json(response.metadata, self.metadata)
        )

    def same_answer(self, other: Decision) -> bool:
        """Whether *other* took this decision (every field equal but ``decided_at``,
        values as JSON: ``True`` is not ``1``)."""
        return (
            attrs.evolve(other, decided_at=self.decided_at) == self
            and same_json(other.value, self.value)
            and same_json(other.arguments, self.arguments)
            and same_json(other.metadata, self.metadata)
        )

    def as_response(self) -> HumanResponse | None:
        """The response this decision recorded; ``None`` for an expiry."""
        if self.action == "expire":
            return None
        return HumanResponse(
            self.request_id,
            self.action,
            self.value,
            self.arguments if self.edited else None,
            responded_by=self.responded_by,
            metadata=self.metadata,
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


def ask_human(expires_after: float | None = None) -> ToolSpec:
    """The built-in ``ask_human`` tool: lets the model stop the run to ask a person.

    The model calls it with ``kind="choice"``, a ``prompt`` and ``options`` (objects with
    ``id``, ``label`` and optional ``description``; at least one, ids unique), or with
    ``kind="input"`` and a ``prompt``. The run interrupts with a :class:`HumanRequest`
    of that kind; the person's answer becomes this call's tool result. Invalid
    arguments go back to the model as an error result, without interrupting.

    Args:
        expires_after: Seconds after which a question expires (see
            :attr:`HumanRequest.expires_at`); ``None`` means never.
    """
    return ToolSpec(
        name="ask_human",
        description=(
            "Ask the human user a question and wait for the answer. Use kind='choice' "
            "with options when the user should pick one, kind='input' for free text."
        ),
        # Each tool its own copy: an adapter that adapts schemas in place changes only it.
        input_schema=copy.deepcopy(_ASK_HUMAN_SCHEMA),
        handler=_not_called,
        requires_approval=True,  # it always stops for a person (for an answer, not a yes)
        expires_after=expires_after,
    )


def is_ask_human(tool: ToolSpec) -> bool:
    """Whether *tool* is the built-in ask_human tool (any instance of it)."""
    return tool.handler is _not_called


def check_ask_human(arguments: Mapping[str, Any]) -> str | None:
    """What the schema cannot say about ask_human arguments; ``None`` when fine."""
    options = arguments.get("options") or ()
    if arguments.get("kind") == "input" and options:
        return "options are only for kind='choice'; remove them or use kind='choice'"
    ids = [option["id"] for option in options]
    if len(set(ids)) != len(ids):
        return f"option ids must be unique, got {ids}"
    return None


# Approval requests (made here) and structured requests (made in _checkpoint) are built
# from values already checked, without __init__.
_new_request = slot_builder(HumanRequest)


def make_request(
    request_id: str,
    call: ToolCall,
    tool: ToolSpec,
    created_at: datetime,
    *,
    outcome_unknown: bool = False,
) -> HumanRequest:
    """The request for a call that needs a person, created at *created_at*."""
    expires_after = tool.expires_after
    expires_at = None if expires_after is None else created_at + timedelta(seconds=expires_after)
    if not is_ask_human(tool):
        prompt = tool._approval_text(call.arguments)
        if outcome_unknown:
            prompt = f"{OUTCOME_UNKNOWN_PROMPT} {prompt}"
        return _new_request(
            id=request_id,
            kind="approval",
            prompt=prompt,
            options=(),
            tool_call=call,
            created_at=created_at,
            expires_at=expires_at,
            outcome_unknown=outcome_unknown,
        )
    args = call.arguments
    options = tuple(
        HumanOption(o["id"], o["label"], o.get("description")) for o in args.get("options", ())
    )
    return HumanRequest(
        request_id,
        args["kind"],
        args["prompt"],
        options,
        tool_call=call,
        created_at=created_at,
        expires_at=expires_at,
    )


def check_response(request: HumanRequest, response: HumanResponse) -> None:
    """Refuse a response that does not answer *request* (the request id is matched by
    the caller)."""
    allowed = _ACTIONS[request.kind]
    if response.action not in allowed:
        raise HumanResponseError(
            f"Action {response.action!r} does not answer a {request.kind!r} request "
            f"{request.id!r}; use {' or '.join(repr(a) for a in allowed)}."
        )
    if request.kind == "choice" and not any(o.id == response.value for o in request.options):
        offered = ", ".join(repr(o.id) for o in request.options)
        raise HumanResponseError(
            f"{response.value!r} is not one of the offered options ({offered}); "
            "select one of their ids."
        )


def answer_result(request: HumanRequest, response: HumanResponse) -> ToolResult:
    """The tool result a reject, select or submit response gives the call of *request*."""
    call_id = request.tool_call.id
    if response.action == "reject":
        reason = response.value
        text = REJECTION_MESSAGE if not reason else f"{REJECTION_MESSAGE} Reason: {reason}"
        return ToolResult(call_id, text, True)
    if request.kind == "choice":
        option = next(o for o in request.options if o.id == response.value)
        payload: dict[str, str] = {"selected": option.id, "label": option.label}
    else:
        payload = {"answer": response.value or ""}
    return ToolResult(call_id, json.dumps(payload, ensure_ascii=False))
