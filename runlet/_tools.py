"""Tools: what the model may call, how its arguments are checked, and how handlers run."""

from __future__ import annotations

import contextvars
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Union

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
import jsonschema_rs

from ._errors import ConfigurationError
from ._util import in_own_context, is_seconds, log, own_copy

__all__ = ["ApprovalPolicy", "Handler", "ToolContext", "ToolDefinition", "ToolSpec"]

Handler = Callable[[dict[str, Any], "ToolContext"], Union[Awaitable[Any], Any]]
"""A tool handler: ``async def handler(arguments, context) -> str | JSON value``.

A plain (non-async) function is accepted too; it runs in a worker thread. *arguments* is
the handler's own ``dict`` (a deep copy of the call's): it may change it. A handler
annotated with ``Mapping[str, Any]`` fits too. It sees the context variables of the
caller of ``run()`` or ``resume()`` (of ``stream()``, for a stream), in a copy of its own:
what it sets there stays in the call.
"""

ApprovalPolicy = Callable[[dict[str, Any], "ToolContext"], Union[Awaitable[bool], bool]]
"""Decides per call whether a person must approve it: ``(arguments, context) -> bool``,
sync or async. It sees the arguments after they passed the tool's schema."""

# The names the OpenAI and Anthropic APIs accept; checking here gives the error early.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# json.dumps() builds a new encoder on every call that passes options; one shared
# encoder halves the cost of turning a handler's return value into text.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
# Arguments shown to people and models: sorted keys so the text is stable, and repr()
# for a value that is not JSON rather than an error in the middle of an interruption.
_SHOWN = json.JSONEncoder(ensure_ascii=False, sort_keys=True, default=repr)


def show_arguments(arguments: Mapping[str, Any]) -> str:
    """Tool arguments as compact JSON text, for prompts and notes. Characters a person
    cannot see or that reorder what they see (zero-width spaces, right-to-left
    overrides, other format and control characters) are escaped, so the text shows
    the arguments as they are: ``"\\u202e3021"``, not an IBAN drawn backwards."""
    if type(arguments) is not dict:
        arguments = dict(arguments)
    for value in arguments.values():
        if type(value) not in _SCALARS:
            return _visible(_shown(arguments))
    return _visible(_shown_flat(arguments))


# Characters str.isprintable() takes that show nothing all the same (Unicode's default
# ignorable code points outside the format category, and the blank braille pattern).
_BLANK = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0100-\U000e01ef]"
)


def _visible(text: str) -> str:
    """*text* with every character that :meth:`str.isprintable` refuses (JSON escaped
    the ASCII control characters but a delete already) or that shows nothing written as
    a JSON escape."""
    if text.isprintable() and (text.isascii() or _BLANK.search(text) is None):
        return text
    # str.translate walks the text in C; each character is judged once per process.
    return text.translate(_ESCAPES)


class _Escapes(dict[int, str]):
    """What :func:`_visible` writes for each character, filled in as characters come
    (at most 65,536 of them kept; any others are judged each time)."""

    __slots__ = ()

    def __missing__(self, code: int) -> str:
        character = chr(code)
        shown = (
            _escaped(character)
            if not character.isprintable() or _BLANK.match(character)
            else character
        )
        if len(self) < 65_536:
            self[code] = shown
        return shown


_ESCAPES = _Escapes()


def _escaped(character: str) -> str:
    code = ord(character)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: a surrogate pair, as JSON writes it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


MAX_NESTING = 100
"""How deep tool arguments may nest (objects and arrays inside each other). Real
arguments stay far below; deeper ones would exhaust Python's recursion limit in the JSON
encoder or a store before the call could be shown to a person or saved."""

# Values that are neither floats nor nested, by exact type: most arguments, at once.
_PLAIN = frozenset({str, int, bool, type(None)})


def _beyond_json(arguments: dict[str, Any]) -> str | None:
    """Why *arguments*, which passed the schema, still cannot be taken: a value JSON has
    no form for (a float such as ``NaN`` or ``Infinity``, which compares false with every
    bound and with an approval policy's ``amount > 100``; a set, bytes, an object; a
    mapping that is not a dict; a key that is not a string), or nesting deeper than
    :data:`MAX_NESTING`. ``None`` if none. Needs no recursion; dict subclasses count (an
    ``OrderedDict``), as a custom adapter may give them."""
    todo: list[tuple[Any, int]] = [(arguments, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_NESTING:
            return f"they nest deeper than {MAX_NESTING} levels; flatten them"
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    return f"the key {key!r} is not a string, as JSON object keys must be"
            items = value.values()
        else:
            items = value
        for item in items:
            if type(item) in _PLAIN:
                continue
            if isinstance(item, float):
                if not math.isfinite(item):
                    return f"{item!r} is not a JSON number"
            elif isinstance(item, (dict, list, tuple)):
                todo.append((item, depth + 1))
            elif not isinstance(item, (str, int)):  # str and int subclasses write as JSON
                return f"a value of type {type(item).__name__} is not JSON"
    return None


def edited_content(content: str, arguments: Mapping[str, Any]) -> str:
    """A result's *content*, noting for the model (and the transcript) that a person
    changed the call's arguments before it ran."""
    shown = show_arguments(arguments)
    return f"A human edited the arguments to {shown} before the call ran. Result: {content}"


def _c_arguments(encoder: json.JSONEncoder) -> tuple[Any, ...]:
    """The arguments of ``json.encoder.c_make_encoder`` after the first (the markers of
    the cycle check) that give *encoder*'s text."""
    encode_string = (
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring
    )
    return (
        encoder.default,
        encode_string,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )


def _one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` for a dict or list, without the layers it goes through on every
    call (the same text: the C encoder it builds each time, built here)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the C encoder
        return encoder.encode
    arguments = _c_arguments(encoder)

    def encode(value: Any) -> str:
        # A new C encoder per call: its markers (the cycle check) start empty every time.
        return "".join(make({}, *arguments)(value, 0))

    return encode


_shown = _one_shot(_SHOWN)


def _reused(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` for a dict whose values are all scalars (``_SCALARS``): nothing
    nests, so there is no cycle to detect, and one C encoder without markers (the only
    state it keeps per call) serves every call, in any thread. The same text again."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the C encoder
        return encoder.encode
    encode = make(None, *_c_arguments(encoder))
    return lambda value: "".join(encode(value, 0))


# Most calls' arguments are flat; building the C encoder is then a large part of showing
# them (on the path of every interruption), so they get one that is built once.
_SCALARS = frozenset((str, int, float, bool, type(None)))
_shown_flat = _reused(_SHOWN)
_encode = _one_shot(_ENCODER)


MAX_EXPIRES_AFTER = 100 * 365.25 * 24 * 3600
"""The longest ``expires_after`` (100 years, in seconds); ``None`` never expires."""


@attrs.frozen
class ToolContext:
    """What a handler knows about the call it serves.

    Attributes:
        run_id: The run the call belongs to; stable across interruptions and resumes.
        tool_call_id: The model's id for this call.
        agent_name: The name of the agent whose tool this is.
        metadata: The ``metadata`` given to ``run()``; read-only.
        tool_name: The name of the tool being called (``""`` in a context built without
            it, say in a test that calls a handler directly).
        idempotency_key: The same for every attempt of this one call (a retried resume,
            another process taking over after a crash) and different for every other
            call of the run, even when a model reuses a call id in a later turn. Pass it
            to the services your tool calls (as a payment API's idempotency key, a unique
            column, ...) so that a repeated attempt has no second effect.
    """

    run_id: str
    tool_call_id: str
    agent_name: str
    metadata: Mapping[str, Any] = attrs.field(hash=False)
    tool_name: str = ""
    # A default= (not a decorator) so every type checker sees that it has one.
    idempotency_key: str = attrs.field(
        kw_only=True,
        default=attrs.Factory(lambda self: f"{self.run_id}/{self.tool_call_id}", takes_self=True),
    )


@attrs.frozen
class ToolDefinition:
    """What the model is told about a tool: its name, description and argument schema.
    Never the handler.
    """

    name: str
    description: str
    input_schema: Mapping[str, Any] = attrs.field(hash=False)


def _check_name(_: object, __: attrs.Attribute[str], name: str) -> None:
    # fullmatch: a "$" would also match before a trailing newline ("refund\n").
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # type: ignore[redundant-expr]
        raise ConfigurationError(
            f"Tool name {name!r} is not usable: use 1 to 64 letters, digits, '_' or '-'."
        )


def _check_handler(instance: ToolSpec, _: attrs.Attribute[Handler], handler: Handler) -> None:
    if not callable(handler):
        raise ConfigurationError(
            f"Tool {instance.name!r} needs a callable handler, got {type(handler).__name__}: "
            "pass `async def handler(arguments, context)`."
        )


def _compile(schema: Mapping[str, Any], name: str) -> Any:
    if not isinstance(schema, Mapping):
        raise ConfigurationError(
            f"Tool {name!r}: input_schema must be a JSON Schema object (a dict), "
            f"got {type(schema).__name__}."
        )
    try:
        return jsonschema_rs.validator_for(dict(schema))
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigurationError(
            f"Tool {name!r}: input_schema is not a valid JSON Schema: {first}. "
            "Fix the schema; it is checked once, when the ToolSpec is built."
        ) from exc


def _is_async(handler: Handler) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects
    return inspect.iscoroutinefunction(call)


@attrs.frozen
class ToolSpec:
    """A tool the agent may call: its definition for the model plus the handler that
    does the work.

    The schema is checked and compiled when the spec is built, so a bad schema fails
    here, at import time, rather than in the middle of a run.

    Args:
        name: The name the model calls the tool by (letters, digits, ``_``, ``-``).
        description: What the tool does, for the model.
        input_schema: A JSON Schema the arguments must satisfy.
        handler: ``async def handler(arguments, context) -> str | JSON value``. It gets
            the validated arguments (its own copy: changing them in place changes
            neither the model's call nor the arguments a person approved) and a
            :class:`ToolContext`. A ``str`` goes to the model as is; any other JSON
            value is sent as JSON text. A plain function runs in a worker thread (it
            cannot be interrupted there: on cancellation or timeout Runlet stops
            waiting for it, but the thread finishes on its own). It sees the context
            variables of the caller of ``run()`` or ``resume()`` in a copy of its own:
            what it sets there stays in the call.
        requires_approval: ``True`` to stop the run for a person to approve or reject
            every call before the handler runs; or an :data:`ApprovalPolicy`,
            ``(arguments, context) -> bool`` (sync or async), to decide per call (for
            example only for refunds above a limit). The policy runs after the arguments
            pass the schema; if it raises or returns a non-bool, the call is not run and
            the model gets an error result saying so.
        idempotent: Declares that running the call again with the same
            ``context.idempotency_key`` is safe. Only then does a resume re-run an
            approved call whose earlier attempt was cut off inside the handler; otherwise
            it asks a person again (:attr:`HumanRequest.outcome_unknown`).
        expires_after: Seconds after which an approval request for this tool expires
            (:attr:`HumanRequest.expires_at`); ``None`` means never.
        timeout: Seconds a call may take; a slower call is cancelled and the model gets
            an error result saying so. ``None`` (the default) means no limit.
        approval_prompt: The text people see for an approval: a string, or a function
            of the arguments returning one. By default, "Allow <tool> with <arguments>?".
        allow_edit: ``False`` refuses ``edited_arguments`` for this tool's approvals.

    Raises:
        ConfigurationError: The name, schema, handler, timeout or another option is
            unusable.
    """

    name: str = attrs.field(validator=_check_name)
    description: str
    input_schema: Mapping[str, Any] = attrs.field(hash=False)
    handler: Handler = attrs.field(validator=_check_handler)
    requires_approval: bool | ApprovalPolicy = False
    # Positional after requires_approval, in DESIGN's order; the options after them are
    # keyword-only.
    idempotent: bool = False
    expires_after: float | None = None
    timeout: float | None = attrs.field(default=None, kw_only=True)
    approval_prompt: str | Callable[[dict[str, Any]], str] | None = attrs.field(
        default=None, kw_only=True
    )
    allow_edit: bool = attrs.field(default=True, kw_only=True)
    _validator: Any = attrs.field(init=False, repr=False, eq=False)
    _is_async: bool = attrs.field(init=False, repr=False, eq=False)
    _definition: ToolDefinition = attrs.field(init=False, repr=False, eq=False)
    # True (always ask), False (never) or the policy to call.
    _gate: bool | ApprovalPolicy = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        timeout = self.timeout
        if timeout is not None and (
            type(timeout) not in (int, float) or not timeout > 0  # bool is not a number here
        ):
            raise ConfigurationError(
                f"Tool {self.name!r}: timeout must be a positive number of seconds or None, "
                f"not {self.timeout!r}."
            )
        self._check_options()
        set_ = object.__setattr__
        set_(self, "_gate", self.requires_approval)
        set_(self, "_validator", _compile(self.input_schema, self.name))
        set_(self, "_is_async", _is_async(self.handler))
        set_(
            self,
            "_definition",
            ToolDefinition(self.name, self.description, self.input_schema),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # The compiled schema does not pickle: a copy (pickle's, copy's) is built again
        # from what was given to __init__, and checked again.
        given = {field.name: getattr(self, field.name) for field in _INIT_FIELDS}
        return (_rebuild, (type(self), given))

    def _check_options(self) -> None:
        name = self.name
        gate = self.requires_approval
        if type(gate) is not bool and not callable(gate):
            raise ConfigurationError(
                f"Tool {name!r}: requires_approval must be True, False or a policy "
                f"function (arguments, context) -> bool, not {gate!r}."
            )
        for flag in ("idempotent", "allow_edit"):
            if type(getattr(self, flag)) is not bool:
                raise ConfigurationError(
                    f"Tool {name!r}: {flag} must be True or False, not {getattr(self, flag)!r}."
                )
        expires = self.expires_after
        if expires is not None and not (is_seconds(expires, positive=True) and expires >= 1e-6):
            # Times are kept to the microsecond: less would make requests born expired.
            raise ConfigurationError(
                f"Tool {name!r}: expires_after must be a positive number of seconds or "
                f"None (at least one microsecond, 1e-6), not {expires!r}."
            )
        if expires is not None and expires > MAX_EXPIRES_AFTER:
            # A request's expires_at must be a date (the year 9999 at most).
            raise ConfigurationError(
                f"Tool {name!r}: expires_after is {expires!r} seconds, more than 100 years; "
                "give None for requests that never expire."
            )
        prompt = self.approval_prompt
        if prompt is not None and not isinstance(prompt, str) and not callable(prompt):
            raise ConfigurationError(
                f"Tool {name!r}: approval_prompt must be a string or a function of the "
                f"arguments returning one, not {type(prompt).__name__}."
            )

    def _approval_text(self, arguments: Mapping[str, Any]) -> str:
        prompt = self.approval_prompt
        if isinstance(prompt, str):
            return prompt
        if prompt is not None:
            try:
                text: object = prompt(own_copy(arguments))
            except Exception:  # noqa: BLE001 - a broken prompt must not lose the run
                log.warning(
                    "The approval_prompt of tool %r raised; the request shows the default "
                    "prompt instead.",
                    self.name,
                    exc_info=True,
                )
                return self._default_prompt(arguments)
            if isinstance(text, str):
                return text
            if text is not None:  # None asks for the default prompt
                log.warning(
                    "The approval_prompt of tool %r returned %s, not a str; the request "
                    "shows the default prompt instead.",
                    self.name,
                    type(text).__name__,
                )
        return self._default_prompt(arguments)

    def _default_prompt(self, arguments: Mapping[str, Any]) -> str:
        return f"Allow {self.name} with {show_arguments(arguments)}?"

    async def _needs_approval(self, arguments: Mapping[str, Any], context: ToolContext) -> bool:
        """Ask the policy; raises ConfigurationError for an answer that is not a bool."""
        # In a context of its own, as a handler: what it sets stays its own.
        own = contextvars.copy_context()
        answer = own.run(self._gate, own_copy(arguments), context)  # type: ignore[arg-type]
        if inspect.isawaitable(answer):
            answer = await in_own_context(answer, own)
        if type(answer) is not bool:
            raise ConfigurationError(
                f"the approval policy of tool {self.name!r} returned {answer!r}; it must "
                "return True or False"
            )
        return answer

    @property
    def definition(self) -> ToolDefinition:
        """The :class:`ToolDefinition` the model sees."""
        return self._definition

    def _check_arguments(self, arguments: object) -> str | None:
        """Check *arguments* against the schema.

        Returns:
            ``None`` when they are valid, otherwise a sentence saying what is wrong.
        """
        if not isinstance(arguments, dict):
            if not isinstance(arguments, Mapping):
                return f"arguments must be a JSON object, got {type(arguments).__name__}"
            arguments = dict(arguments)
        try:
            if self._validator.is_valid(arguments):
                if _PLAIN.issuperset(map(type, arguments.values())):
                    return None  # most arguments: flat, and no float to check
                return _beyond_json(arguments)
            return self._problems(arguments)
        except ValueError as exc:  # a value that is not JSON at all, or nesting that
            # an older jsonschema-rs gives up on (it says "Recursion limit reached")
            return _beyond_json(arguments) or self._check_plain(arguments, exc)

    def _problems(self, arguments: Any) -> str:
        """What the schema says is wrong with *arguments*, which it refused."""
        return "; ".join(
            f"{_where(error.instance_path)}{error.message}"
            for error in self._validator.iter_errors(arguments)
        )

    def _check_plain(self, arguments: dict[str, Any], refused: ValueError) -> str | None:
        """Check the plain JSON form of *arguments*, which hold subclasses of int, float
        or str (numpy's float64, say): JSON has them, the validator takes only the exact
        types. *refused* is what the validator said of them."""
        try:
            plain = json.loads(_ENCODER.encode(arguments))
            return None if self._validator.is_valid(plain) else self._problems(plain)
        except (TypeError, ValueError, RecursionError):
            return f"arguments are not JSON: {refused}"

    async def _invoke(self, arguments: Mapping[str, Any], context: ToolContext) -> tuple[str, bool]:
        """Run the handler and turn what it returns (or raises) into result text.

        Returns ``(content, is_error)``. Cancellation from outside propagates.
        """
        own = own_copy(arguments)  # the handler's own: the call's stay as they were
        try:
            if self.timeout is None:
                # Awaiting an async handler directly saves a coroutine per call.
                if self._is_async:
                    value = await in_own_context(self.handler(own, context))
                else:
                    value = await self._call(own, context)
            else:
                with anyio.move_on_after(self.timeout) as scope:
                    value = await self._call(own, context)
                if scope.cancelled_caught:
                    return (
                        f"Tool {self.name!r} did not finish within its {self.timeout:g} s "
                        "timeout and was stopped.",
                        True,
                    )
        except Exception as exc:  # noqa: BLE001 - any failure goes to the model
            await handler_failed()  # unless the run was cancelled: see there
            return self._failed(exc)
        return self._content(value)

    def _failed(self, exc: Exception) -> tuple[str, bool]:
        """The result text of a handler that raised *exc*."""
        return f"Tool {self.name!r} failed: {type(exc).__name__}: {exc}", True

    def _content(self, value: Any) -> tuple[str, bool]:
        """The result text of a handler that returned *value*."""
        kind = type(value)
        if kind is str:
            return value, False
        if isinstance(value, str):  # a str subclass, such as a StrEnum member: its text
            return str.__str__(value), False
        try:
            if kind is int:  # what the encoder would write, without its layers
                return int.__repr__(value), False
            return _encode(value), False
        except (TypeError, ValueError, RecursionError) as exc:  # NaN, too deep, not JSON
            return (
                f"Tool {self.name!r} returned a value of type {type(value).__name__} that "
                f"is not JSON: "
                f"{exc}. Its handler must return a str or a JSON value.",
                True,
            )

    async def _call(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        if self._is_async:
            return await in_own_context(self.handler(arguments, context))
        # Boxed, because trio refuses a worker-thread function that returns a coroutine.
        # The thread runs in a copy of the context, so what the handler sets stays its own.
        [value] = await anyio.to_thread.run_sync(
            _boxed, self.handler, arguments, context, abandon_on_cancel=True
        )
        if inspect.isawaitable(value):
            return await in_own_context(value)
        return value


_INIT_FIELDS = tuple(field for field in attrs.fields(ToolSpec) if field.init)


def _rebuild(cls: type[ToolSpec], given: dict[str, Any]) -> ToolSpec:
    """A copy of a tool made by pickle or ``copy``: built from its ``__init__`` fields."""
    return cls(**given)


def _boxed(handler: Handler, arguments: dict[str, Any], context: ToolContext) -> list[Any]:
    return [handler(arguments, context)]


def _where(path: Any) -> str:
    parts = list(path)
    if not parts:
        return ""
    return "at " + "".join(f"[{p!r}]" for p in parts) + ": "


async def handler_failed() -> None:
    """Called when a handler, an approval policy or a model adapter raised an ordinary
    exception: if the run was cancelled meanwhile, go on being cancelled. One whose
    clean-up raises (a ``finally`` that fails while the cancellation passes through) would
    otherwise turn the cancellation into an error result for the model or a
    :class:`~runlet.ModelError`, and on trio, where nothing re-delivers it, a run that
    does not wait again would finish as if no deadline had passed."""
    await anyio.lowlevel.checkpoint_if_cancelled()
