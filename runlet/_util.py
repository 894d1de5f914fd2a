"""Small helpers with no better home."""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import logging
import math
import sys
import threading
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import MemberDescriptorType, coroutine
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import attrs

from ._errors import RunletError

T = TypeVar("T")

#: Runlet's one logger. It warns about what Runlet handled on its own but an operator
#: should know of: a claim it could not renew or give back, a checkpoint it could not
#: delete, an approval prompt function that failed. Errors the caller sees are raised,
#: not logged.
log = logging.getLogger("runlet")


class ReadOnlyDict(dict[str, Any]):
    """A dict nobody can change: the options a model adapter gets in a
    :class:`~runlet.ModelRequest` and the metadata a handler gets in its
    :class:`~runlet.ToolContext`. Unlike a ``mappingproxy`` it is a real dict for
    ``json.dumps``, ``pickle`` and ``copy.deepcopy`` (a copy is read-only too); changing
    it raises ``TypeError``, as changing a mappingproxy does."""

    __slots__ = ()

    def _refuse(self) -> typing.NoReturn:
        raise TypeError(
            f"{type(self).__name__} is read-only: make a changed copy with dict(...) or "
            "{**mapping, ...} instead."
        )

    def __setitem__(self, key: str, value: Any) -> None:
        self._refuse()

    def __delitem__(self, key: str) -> None:
        self._refuse()

    def __ior__(self, other: Any) -> typing.NoReturn:  # type: ignore[misc]
        self._refuse()

    def clear(self) -> None:
        self._refuse()

    def pop(self, *args: Any) -> Any:
        self._refuse()

    def popitem(self) -> tuple[str, Any]:
        self._refuse()

    def setdefault(self, *args: Any) -> Any:
        self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._refuse()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadOnlyDict, (dict(self),))

    def __copy__(self) -> ReadOnlyDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyDict:
        return ReadOnlyDict(copy.deepcopy(dict(self), memo))


class PerLoop(dict[object, T]):
    """One value per event loop, keyed by its anyio token, for what belongs to the loop
    (and backend) that made it: a capacity limiter, an HTTP client's connections. Threads
    that each run a loop may share it. The values of the *kept* latest loops are kept;
    older ones (loops that came and went, one ``anyio.run()`` per command) are dropped."""

    __slots__ = ("_kept", "_lock")

    def __init__(self, kept: int) -> None:
        super().__init__()
        self._kept = kept
        self._lock = threading.Lock()

    def this_loop(self) -> T | None:
        """The value of the calling task's loop, if it has one."""
        return self.get(anyio.lowlevel.current_token())

    def this_loop_or(self, make: Callable[[], T]) -> T:
        """The value of the calling task's loop, made with *make* if it has none."""
        token = anyio.lowlevel.current_token()
        with self._lock:  # threads of other loops may add or drop at the same time
            value = self.get(token)
            if value is None:
                if len(self) >= self._kept:
                    del self[next(iter(self))]
                value = self[token] = make()
            return value

    def pop_this_loop(self) -> T | None:
        """Take the value of the calling task's loop out, if it has one."""
        with self._lock:
            return self.pop(anyio.lowlevel.current_token(), None)

    def clear(self) -> None:
        """Forget every loop's value (a thread may be adding its own meanwhile)."""
        with self._lock:
            super().clear()


def described(exc: BaseException) -> str:
    """*exc* in a log line: its class and message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def or_warn(call: Callable[[], Awaitable[object]], message: str, *args: object) -> None:
    """Await ``call()``; if it raises an :class:`Exception`, log *message* (formatted with
    *args* and then the error) as a warning instead. For clean-ups whose caller has a
    better error to raise (what stopped it, a cancellation): run it inside
    :func:`to_the_end`, which, once its caller is cancelled, raises the cancellation and
    nothing else, so a failure is seen only here."""
    try:
        await call()
    except Exception as exc:  # noqa: BLE001 - logged: the caller raises what matters more
        log.warning(message, *args, described(exc))


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Make the public names of *module_name* say they live there, so reprs, tracebacks
    and the docs show ``runlet.Agent`` rather than ``runlet._agent.Agent``."""
    seen: set[int] = set()

    def fix(name: str, obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        module = getattr(obj, "__module__", None)
        if module is None or not module.startswith(module_name + "._"):
            return
        if isinstance(obj, type) and attrs.has(obj):
            # String annotations are resolved in the defining module; after the move
            # below they would be looked up in the package and fail. So are the class's
            # own __annotations__, for typing.get_type_hints() and the tools built on it.
            attrs.resolve_types(obj)
            _resolve_annotations(obj)
        try:
            obj.__module__ = module_name
        except (AttributeError, TypeError):  # some typing constructs refuse
            return
        if isinstance(obj, type):
            obj.__name__ = name
            obj.__qualname__ = name
            for attr_name, attr in obj.__dict__.items():
                if callable(attr) or isinstance(attr, (classmethod, staticmethod, property)):
                    fix(attr_name, attr)

    for name in namespace.get("__all__", ()):
        fix(name, namespace[name])


def _resolve_annotations(cls: type) -> None:
    own = inspect.get_annotations(cls)
    if not own:
        return
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a name only type checkers see: leave it as text
        return
    cls.__annotations__ = {name: hints.get(name, hint) for name, hint in own.items()}


def is_seconds(value: object, *, positive: bool = False) -> bool:
    """Whether *value* is a finite, non-negative (or, if *positive*, positive) number of
    seconds: an ``int`` or ``float`` (a ``bool`` is not a number of seconds)."""
    if type(value) is not int and type(value) is not float:
        return False
    seconds: float = value
    return (seconds > 0 if positive else seconds >= 0) and seconds < math.inf


def slot_builder(cls: type[T]) -> Callable[..., T]:
    """A function that makes an instance of the slotted attrs class *cls* from a value for
    every field (by position in field order, or by name; none may be left out) without
    calling ``__init__``: no defaults, factories, validators or ``__attrs_post_init__``.

    Only for values already checked to be exactly what ``__init__`` would store: values
    the caller made itself, or checked as the checkpoint structuring hooks do. It sets each
    slot through the slot's own descriptor, which is about a third cheaper than
    ``__init__``'s frozen-class setattr. ``tests/test_hot_paths.py`` fails if a class built
    this way gains a validator, converter or ``__attrs_post_init__``.
    """
    names = [field.name for field in attrs.fields(cls)]  # type: ignore[arg-type]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def build({', '.join(names)}):", "    _self = _new(_cls)"]
    for name in names:
        slot = cls.__dict__.get(name)
        if not isinstance(slot, MemberDescriptorType):
            raise RunletError(f"{cls.__name__}.{name} is not a slot")
        namespace[f"_set_{name}"] = slot.__set__
        lines.append(f"    _set_{name}(_self, {name})")
    lines.append("    return _self")
    exec("\n".join(lines), namespace)  # code made from the class's own field names
    build: Callable[..., T] = namespace["build"]
    return build


@coroutine
def in_own_context(
    awaitable: Awaitable[T], context: contextvars.Context | None = None
) -> typing.Generator[Any, Any, T]:
    """Await *awaitable* with every step of it run in *context* (by default a copy of
    the current context), in the calling task. What a handler sets in a context variable
    then stays its own, as it does when the handler runs in a task of its own (calls of
    one turn side by side) or in a worker thread (a plain function): it never reaches the
    caller of ``run()`` or ``resume()``, nor the model or the tools after it."""
    run = (contextvars.copy_context() if context is None else context).run
    steps = awaitable.__await__()
    if not hasattr(steps, "throw"):  # __await__ may return any iterator
        steps = _stepped(steps)
    try:
        signal = run(steps.send, None)
    except StopIteration as stop:  # the common case: done without waiting
        return stop.value  # type: ignore[no-any-return]
    try:
        while True:
            error: BaseException | None = None
            try:
                value = yield signal
            except GeneratorExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown into the awaitable
                error = exc
            try:
                signal = run(steps.send, value) if error is None else run(steps.throw, error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            finally:
                error = value = None  # no cycle through this frame (trio sends outcomes)
    except BaseException:
        # Closed, or stopped by what the awaitable raised or by an exception that landed
        # in this frame between two steps (trio's KeyboardInterrupt): the awaitable is not
        # left suspended, its clean-up runs now. Closing one that finished does nothing.
        signal = None  # what it waited on keeps nothing of this frame alive
        run(steps.close)
        raise


def _stepped(steps: Iterator[Any]) -> typing.Generator[Any, Any, Any]:
    """*steps*, an iterator that ``__await__`` returned, as a generator."""
    return (yield from steps)


def _name_of(call: Callable[..., Any]) -> str:
    """What a log line calls *call*: its function's name, never its arguments (they may
    hold a tool's result)."""
    while isinstance(call, functools.partial):
        call = call.func
    return getattr(call, "__qualname__", type(call).__name__)


async def to_the_end(call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()`` to its end even if the caller is cancelled meanwhile; the
    cancellation then goes on once it returned or raised. It goes first on both backends
    (asyncio's own ``Task.cancel()`` comes only once, and must not be lost to an error
    the caller may catch): what the call raised is then logged, not raised.

    A shielded cancel scope alone is not enough: on asyncio, ``Task.cancel()`` (what
    ``asyncio.timeout()``, ``wait_for()`` and many frameworks use) goes through anyio's
    shields. So the call runs in a task of its own, in a shielded scope, and the task
    group waits for it whatever happens to the caller's task. Use it for a store write
    that must not stop halfway or never start (a tool's result, a resolve, a release).
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def work() -> None:
        with anyio.CancelScope(shield=True):
            try:
                outcome.append(await call())
            except BaseException as exc:  # noqa: BLE001 - raised below, as itself
                failure.append(exc)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(work)
        # asyncio delivered the caller's cancellation above; trio does so here, whether
        # the call returned or raised. Not over an interrupt (Ctrl-C) the caller is
        # cleaning up after: a cancel scope would take the cancellation, and the
        # interrupt with it.
        if failure or not _interrupted():
            await anyio.lowlevel.checkpoint_if_cancelled()
    except BaseException as exc:
        if failure and is_cancellation(exc):
            log.warning(
                "%s failed while its caller was being cancelled; the cancellation goes on",
                _name_of(call),
                exc_info=failure[0],
            )
        # On trio, Ctrl-C lands in the waiting task and comes out of the task group in
        # a group: raise it as itself, so that `except KeyboardInterrupt` catches it.
        interrupt = the_one_interrupt(exc)
        if interrupt is not None:
            raise interrupt from None
        raise
    if failure:
        raise failure[0]
    return outcome[0]


_SCALARS = frozenset({str, int, float, bool, type(None)})


def json_form(value: Any) -> Any:
    """*value* as it reads back from JSON: tuples (and other sequences of the JSON
    check) as lists, every mapping a dict, each a new copy. A decision holds what a person
    gave in this form, so an answer repeated after a store's JSON round trip compares
    equal, and a handler that changes its arguments in place cannot change the record."""
    kind = type(value)
    if kind is dict:
        for item in value.values():
            if type(item) not in _SCALARS:
                return {key: json_form(item) for key, item in value.items()}
        return dict(value)  # the common case: flat arguments or metadata
    if kind in _SCALARS:
        return value
    if isinstance(value, Mapping):
        return {key: json_form(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_form(item) for item in value]
    return value


_SAME_BY_EQ = frozenset({str, int, float, type(None)})


def same_json(a: Any, b: Any) -> bool:
    """Whether *a* and *b* are the same JSON value: like ``==``, but a bool is never a
    number (``False == 0`` in Python) and an int never a float (``1 == 1.0``), as their
    JSON texts differ; a list and a tuple are both arrays, any two mappings both objects.
    What a person approves must be exactly what runs."""
    if a is b:
        return True
    kind = type(a)
    if (kind is dict or kind is list) and type(b) is kind and a == b and _same_types(a, b):
        # The usual case: equal to Python, and the same JSON, as a bool, an int and a float
        # taken for one another would show in the types. Otherwise (keys in another
        # order, a tuple inside for a list, values that differ) look closer.
        return True
    return _same_json(a, b)


_NESTED = frozenset({dict, list})


def _same_types(a: Any, b: Any) -> bool:
    """Whether *a* and *b*, equal containers of one type, hold values of the same types
    in the same places, all the way down (``False`` may still be the same JSON)."""
    if type(a) is dict:
        if list(a) != list(b):
            return False
        a = list(a.values())
        b = list(b.values())
    kinds = list(map(type, a))
    if kinds != list(map(type, b)):
        return False
    if _NESTED.isdisjoint(kinds):
        return True
    for index, kind in enumerate(kinds):
        if kind in _NESTED and not _same_types(a[index], b[index]):
            return False
    return True


def _same_json(a: Any, b: Any) -> bool:
    if a is b:
        return True
    kind = type(a)
    if kind is type(b):
        if kind in _SAME_BY_EQ:
            return bool(a == b)
        if kind is dict:
            if len(a) != len(b):
                return False
            for key, value in a.items():
                if key not in b:
                    return False
                other = b[key]
                if value is other or (
                    type(value) is type(other) and type(value) in _SAME_BY_EQ and value == other
                ):
                    continue
                if not _same_json(value, other):
                    return False
            return True
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return isinstance(a, float) == isinstance(b, float) and bool(a == b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_json(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def own_copy(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A dict copy of *mapping* in which every nested plain ``dict``, ``list`` and
    ``tuple`` is copied too. Anything else is shared as it is (a ``Counter`` stays the
    caller's ``Counter``, an object stays the same object), a structure that holds itself
    is copied as one, and a flat mapping costs no more than ``dict()``."""
    copy = dict(mapping)
    memo: dict[int, Any] | None = None
    for key, value in copy.items():
        if type(value) in _CONTAINERS:
            if memo is None:
                memo = {id(mapping): copy}
            copy[key] = _copied(value, memo)
    return copy


_CONTAINERS = frozenset({dict, list, tuple})


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    kind = type(value)
    if kind not in _CONTAINERS:
        return value
    known = memo.get(id(value))
    if known is not None:
        return known
    if kind is dict:
        mapping: dict[Any, Any] = {}
        memo[id(value)] = mapping
        mapping.update((key, _copied(item, memo)) for key, item in value.items())
        return mapping
    if kind is list:
        items: list[Any] = []
        memo[id(value)] = items
        items.extend(_copied(item, memo) for item in value)
        return items
    # A tuple cannot hold itself except through a list or dict, which the memo catches.
    return tuple([_copied(item, memo) for item in value])


def _interrupted() -> bool:
    """Whether the caller is handling an interrupt: a ``KeyboardInterrupt``, a
    ``SystemExit`` or the like, not an error and not a cancellation."""
    exc = sys.exc_info()[1]
    return exc is not None and not isinstance(exc, Exception) and not is_cancellation(exc)


def is_cancellation(exc: BaseException) -> bool:
    """Whether *exc* is the backend's cancellation, or an exception group that holds
    nothing else: on trio, a cancelled nursery of a tool's own raises a group of
    ``Cancelled``, which the cancel scope that caused it takes as its own."""
    cancelled = anyio.get_cancelled_exc_class()
    if isinstance(exc, cancelled):
        return True
    split = getattr(exc, "split", None)
    if split is None or not isinstance(getattr(exc, "exceptions", None), tuple):
        return False  # not an exception group
    return split(cancelled)[1] is None  # nothing but cancellations in it


def cancelled_here() -> bool:
    """Whether a cancel scope around the current task has been cancelled (its deadline
    reached or ``cancel()`` called), so a cancellation exception here is a real one."""
    return anyio.current_effective_deadline() == -math.inf


def the_one_interrupt(raised: BaseException) -> BaseException | None:
    """The exception in *raised*, an exception group, when it holds one that is not an
    Exception (beside cancellations, which it caused); else ``None``."""
    found: list[BaseException] = []
    cancelled = anyio.get_cancelled_exc_class()

    def walk(exc: BaseException) -> None:
        inner = getattr(exc, "exceptions", None)
        if isinstance(inner, tuple) and hasattr(exc, "split"):  # an exception group
            for each in inner:
                walk(each)
        elif not isinstance(exc, cancelled):
            found.append(exc)

    if not hasattr(raised, "split"):
        return None
    walk(raised)
    if len(found) == 1 and not isinstance(found[0], Exception):
        return found[0]
    return None


async def side_by_side(works: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Await every one of *works* at once. The first to fail stops the others, and its
    exception is raised as itself, never inside an exception group: an ordinary error,
    and as much a ``KeyboardInterrupt`` or ``SystemExit``. Cancellation goes on as
    cancellation."""
    failures: list[BaseException] = []
    stray: list[BaseException] = []
    async with anyio.create_task_group() as group:
        for work in works:
            group.start_soon(_or_stop, work, group.cancel_scope, failures, stray)
    for failure in failures:  # a KeyboardInterrupt or SystemExit goes before an error
        if not isinstance(failure, Exception):
            raise failure
    if failures:
        raise failures[0]
    if stray:
        # A work raised the cancellation exception though nothing here was cancelled
        # (on asyncio, a handler that awaited a future someone else cancelled). The task
        # group lets it pass silently; raise it, as one work alone would have.
        raise stray[0]


async def _or_stop(
    work: Callable[[], Awaitable[object]],
    scope: anyio.CancelScope,
    failures: list[BaseException],
    stray: list[BaseException],
) -> None:
    try:
        await work()
    except BaseException as exc:
        if is_cancellation(exc):
            if not scope.cancel_called and not cancelled_here():
                stray.append(exc)
            raise
        failures.append(exc)
        scope.cancel()
