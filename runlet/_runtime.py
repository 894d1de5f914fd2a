"""The Runtime: thin entry points (run, stream, resume, expire, cancel) over the turn
loop and the resume bookkeeping."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, overload

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._agent import Agent, is_async_method
from ._checkpoint import _check_json, _new_message
from ._errors import (
    CheckpointStoreRequiredError,
    ConfigurationError,
    HumanResponseError,
    ResumeError,
    RunletError,
)
from ._events import RunFinished, StreamEvent
from ._human import HumanResponse, utc_now
from ._loop import Clock, Emit, Loop, RunState, new_id
from ._messages import ZERO_USAGE, Message
from ._result import RunResult
from ._resume import resume
from ._store import DURABLE_MEMBERS, DURABLE_ONLY, CheckpointStore, DurableCheckpointStore
from ._tracing import RunTrace, TracerProviderLike, Tracing, cancel_span, run_span
from ._util import ReadOnlyDict, cancelled_here, is_cancellation, own_copy, the_one_interrupt

__all__ = ["STREAM_BUFFER_SIZE", "RunStream", "Runtime"]

STREAM_BUFFER_SIZE = 64
"""How many events a :class:`RunStream` holds for a consumer that has not read them
yet. When the buffer is full the run waits for the consumer, so a slow consumer slows
the run down instead of making it buffer without bound."""


class Runtime:
    """Runs agents: drives the model → tool call → tool result loop, stops for a person
    when a call needs one, and resumes from the checkpoint it saved.

    A runtime holds no per-run state; share one across an application.

    Args:
        checkpoint_store: Where interrupted runs are saved. Without one, a run that must
            stop for a person raises :class:`~runlet.CheckpointStoreRequiredError`.
        max_turns: The most model requests one run may make (across resumes) before it
            fails with :class:`~runlet.MaxTurnsExceededError`.
        clock: Returns the current time as an aware ``datetime`` (a time in another zone
            is turned into UTC); requests' ``created_at`` and ``expires_at`` and
            decisions' times come from it. Tests pass a fake clock to move time without
            sleeping. It is called once when the runtime is built, to check it, and a
            reading that is not an aware ``datetime`` later raises
            :class:`~runlet.ConfigurationError` where it is read.
        tracer_provider: An OpenTelemetry tracer provider for this runtime's spans
            (needs ``runlet[otel]``). Without one, runs are traced with the global
            provider once the application has set one, and not at all before; see
            :doc:`tracing`.
        trace_content: Whether spans record message contents (instructions, messages,
            tool arguments and results, the person's answers). ``None`` (the default)
            follows the ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
            environment variable, off unless it is ``true``.

    Raises:
        ConfigurationError: *checkpoint_store* lacks an async ``save``, ``load`` or
            ``delete`` method or has only part of the durable protocol, *max_turns* is
            not a positive integer, *clock* is not callable, *tracer_provider* has no
            ``get_tracer``, or *trace_content* is not a bool or None.
    """

    __slots__ = ("_durable", "_json_only", "_loop")

    def __init__(
        self,
        checkpoint_store: CheckpointStore | None = None,
        *,
        max_turns: int = 50,
        clock: Clock | None = None,
        tracer_provider: TracerProviderLike | None = None,
        trace_content: bool | None = None,
    ) -> None:
        if type(max_turns) is not int or max_turns < 1:
            raise ConfigurationError(f"max_turns must be a positive int, not {max_turns!r}.")
        if clock is not None and not callable(clock):
            raise ConfigurationError(
                f"clock must be a function returning an aware UTC datetime, not {clock!r}."
            )
        if tracer_provider is not None and not callable(
            getattr(tracer_provider, "get_tracer", None)
        ):
            raise ConfigurationError(
                "tracer_provider must be an OpenTelemetry TracerProvider (an object with "
                f"get_tracer()), not {tracer_provider!r}; leave it out to use the global one."
            )
        if trace_content is not None and type(trace_content) is not bool:
            raise ConfigurationError(
                f"trace_content must be True, False or None, not {trace_content!r}."
            )
        if checkpoint_store is not None and not all(
            is_async_method(checkpoint_store, name) for name in ("save", "load", "delete")
        ):
            raise ConfigurationError(
                "checkpoint_store must be a CheckpointStore, an object with async save(), "
                f"load() and delete() methods; got {type(checkpoint_store).__name__}. Use "
                "InMemoryCheckpointStore() or a store of your own."
            )
        self._durable = isinstance(checkpoint_store, DurableCheckpointStore)
        if checkpoint_store is not None and not self._durable:
            _refuse_half_durable(checkpoint_store)
        # A store that keeps checkpoints as JSON (Runlet's SQL stores say so) gets a run's
        # options and metadata checked when the run starts.
        self._json_only = getattr(checkpoint_store, "_keeps_json", False) is True
        self._loop = Loop(checkpoint_store, max_turns, utc_now if clock is None else _aware(clock))
        self._loop.tracing = Tracing(tracer_provider, trace_content)

    # Read-only: every run of this runtime uses what it was built with. For another store
    # or limit, build another Runtime (a runtime is cheap).
    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """The store interrupted runs are saved in (read-only)."""
        return self._loop.store

    @property
    def max_turns(self) -> int:
        """The most model requests one run may make (read-only)."""
        return self._loop.max_turns

    def __repr__(self) -> str:
        return f"Runtime(checkpoint_store={self.checkpoint_store!r}, max_turns={self.max_turns})"

    async def run(
        self,
        agent: Agent,
        input: str | Sequence[Message],
        *,
        options: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Run *agent* on *input* until it answers or must stop for a person.

        Args:
            agent: The agent to run.
            input: The user's text, or the messages to start from.
            options: Passed to the model adapter with every request (e.g. temperature).
            metadata: Your own data for the run (user ids, tenant, ...); tools see it as
                ``context.metadata``. Keep it JSON-compatible if checkpoints must be
                stored as JSON: with Runlet's SQLite and PostgreSQL stores, a value JSON
                cannot hold (in it or in *options*) is refused before the run starts.

        Returns:
            A completed result, or an interrupted one with the request and the id of the
            checkpoint to resume.

        Raises:
            ConfigurationError: *agent* is not an :class:`~runlet.Agent`, *input* is not
                a ``str`` or a sequence, or *options* or *metadata* is not a mapping.
            RunletError: *input* holds something other than ``Message`` objects.
            ModelError: The model adapter failed.
            MaxTurnsExceededError: The run made too many model requests.
            CheckpointStoreRequiredError: A call needs a person and there is no store.
            CheckpointSerializationError: *options* or *metadata* holds a value JSON
                cannot hold and the store keeps JSON (before anything runs), or the store
                could not save the checkpoint; other errors from the store propagate.
        """
        run = self._start(agent, input, options, metadata, None)
        # A cancelled caller runs nothing, even where nothing below would wait (a model
        # and tools that never do): no handler starts, no checkpoint is saved.
        await anyio.lowlevel.checkpoint_if_cancelled()
        span = run_span(self._loop.tracing, run)
        if not isinstance(span, RunTrace):  # not traced: nothing to enter
            return await self._loop.drive(run)
        with span:
            return await self._loop.drive(run)

    def stream(
        self,
        agent: Agent,
        input: str | Sequence[Message],
        *,
        options: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunStream:
        """Run *agent* like :meth:`run`, handing out events as things happen.

        Use it as ``async with runtime.stream(agent, input) as stream:`` and then
        ``async for event in stream:``. The last event is :class:`~runlet.RunFinished`;
        afterwards :attr:`RunStream.result` is the :class:`RunResult`. An interruption
        ends the stream (after an :class:`~runlet.Interrupted` event); continue with
        :meth:`resume` (a plain result) or :meth:`stream_resume` (a stream again).

        Leaving the ``async with`` block early (``break``, an exception, cancellation)
        stops the run: the model stream is closed and running tools are cancelled
        before the block exits.

        Raises:
            ConfigurationError: *agent* is not an :class:`~runlet.Agent` (at once).
            RunletError: *input* is neither a ``str`` nor a sequence of ``Message`` (at
                once). The errors of :meth:`run` are raised while iterating.
        """
        run = self._start(agent, input, options, metadata, None)
        loop = self._loop

        async def start(emit: Emit) -> RunResult:
            run.emit = emit
            with run_span(loop.tracing, run):  # inside the stream's task
                return await loop.drive(run)

        return RunStream(start)

    # Two forms, so a type checker catches a call with neither answer or with both.
    @overload
    async def resume(
        self, agent: Agent, *, checkpoint_id: str, response: HumanResponse
    ) -> RunResult: ...

    @overload
    async def resume(
        self, agent: Agent, *, checkpoint_id: str, responses: Sequence[HumanResponse]
    ) -> RunResult: ...

    async def resume(
        self,
        agent: Agent,
        *,
        checkpoint_id: str,
        response: HumanResponse | None = None,
        responses: Sequence[HumanResponse] | None = None,
    ) -> RunResult:
        """Continue an interrupted run with a person's answer.

        Give ``response=`` (the answer to ``result.interruption``) or ``responses=`` (answers
        to any of ``result.pending_requests``, in one call). Approve runs the real handler
        (with ``edited_arguments`` if given); reject records the fixed rejection result
        (and the reason, if one is given); select and submit become the result of the
        ``ask_human`` call. When every request of the turn is answered, the run goes on
        until it completes or interrupts again (with a new checkpoint); otherwise it
        interrupts again at once, with a new checkpoint for the requests left.

        With a :class:`~runlet.DurableCheckpointStore` (the in-memory store and Runlet's
        durable stores) this is exactly once: the response is checked before the
        checkpoint is claimed; decisions and tool results are recorded before the run
        goes on, so a retry after any failure never runs a recorded call again; and once a
        resume finished, repeating it with an equal response returns the same result
        without running anything. With a plain :class:`~runlet.CheckpointStore`, a resume
        that fails after an approved call ran runs it again when retried.

        A resume that raises, including when it is cancelled, leaves the checkpoint
        resumable and keeps every result it recorded.

        Args:
            agent: An agent with the same name and tools as the interrupted one; it
                supplies the handlers, which checkpoints never hold.
            checkpoint_id: The ``checkpoint_id`` of the interrupted result.
            response: The person's answer to ``result.interruption``.
            responses: Answers to several of ``result.pending_requests``.

        Raises:
            ConfigurationError: *agent* is not an :class:`~runlet.Agent`.
            CheckpointStoreRequiredError: The runtime has no store.
            CheckpointNotFoundError: No such checkpoint.
            CheckpointCancelledError: It was cancelled with :meth:`cancel`.
            CheckpointClaimedError: Another resume of it is under way right now.
            HumanResponseError: A response does not answer an open request (wrong id,
                action, option, or arguments that fail the tool's schema or are not
                JSON).
            HumanResponseConflictError: The request was already answered differently,
                or at an earlier checkpoint of the run; or a resume already finished with
                this checkpoint without this answer, and the request is open at a later
                checkpoint or was answered the same way there (``next_checkpoint_id``
                names it).
            HumanRequestExpiredError: The request expired before the answer came.
            MissingToolError: *agent* lacks a tool the checkpoint needs.
            CheckpointSerializationError: The checkpoint does not hang together.
            LeaseLostError: The resume took longer than its store's lease without being
                able to renew it, and another resume took over.
            ModelError: The model adapter failed after the response was applied.
            MaxTurnsExceededError: The run made too many model requests.
        """
        answers = _responses(response, responses)
        try:
            return await resume(self._loop, self._durable, agent, checkpoint_id, answers, None)
        except ResumeError as exc:
            _name_the_checkpoint(exc, checkpoint_id)
            raise

    @overload
    def stream_resume(
        self, agent: Agent, *, checkpoint_id: str, response: HumanResponse
    ) -> RunStream: ...

    @overload
    def stream_resume(
        self, agent: Agent, *, checkpoint_id: str, responses: Sequence[HumanResponse]
    ) -> RunStream: ...

    def stream_resume(
        self,
        agent: Agent,
        *,
        checkpoint_id: str,
        response: HumanResponse | None = None,
        responses: Sequence[HumanResponse] | None = None,
    ) -> RunStream:
        """:meth:`resume` as a :class:`RunStream`, used exactly like :meth:`stream`:
        ``async with runtime.stream_resume(...) as stream: async for event in stream``.

        Errors that :meth:`resume` raises are raised from the iteration. If the resumed
        run interrupts again, an :class:`~runlet.Interrupted` event is sent once the next
        checkpoint is stored.
        """
        answers = _responses(response, responses)
        loop, durable = self._loop, self._durable

        async def start(emit: Emit) -> RunResult:
            try:
                return await resume(loop, durable, agent, checkpoint_id, answers, emit)
            except ResumeError as exc:
                _name_the_checkpoint(exc, checkpoint_id)
                raise

        return RunStream(start)

    async def expire(self, agent: Agent, *, checkpoint_id: str) -> RunResult:
        """Give up waiting: every open request of the checkpoint gets the fixed expiry
        result (:data:`~runlet.EXPIRY_MESSAGE`, an error result the model reads) and the
        run goes on, exactly like a resume. Use it once a request's ``expires_at`` passed
        (a late answer raises :class:`~runlet.HumanRequestExpiredError`), or any time an
        application stops waiting. Repeating it returns the stored result.

        Raises:
            CheckpointResolvedError: The checkpoint was already answered.
            RunletError: The other errors of :meth:`resume`, except those about a response.
        """
        try:
            return await resume(self._loop, self._durable, agent, checkpoint_id, None, None)
        except ResumeError as exc:
            _name_the_checkpoint(exc, checkpoint_id)
            raise

    async def cancel(self, checkpoint_id: str) -> None:
        """Retire a checkpoint without running anything; resuming it then raises
        :class:`~runlet.CheckpointCancelledError`. Cancelling twice is fine. With a plain
        :class:`~runlet.CheckpointStore` the checkpoint is deleted instead (a resume then
        raises :class:`~runlet.CheckpointNotFoundError`).

        It retires the checkpoint whatever its records say, also when an earlier resume
        recorded an approval and died inside that call's handler: the call may have
        acted, and nobody is asked about it again. Where that matters, look first
        (``(await store.get(checkpoint_id)).records``: an approved record without a
        result), or use :meth:`expire`, which asks a person about such a call again
        (``outcome_unknown``, at the next checkpoint) instead of dropping it.

        Raises:
            CheckpointStoreRequiredError: The runtime has no store.
            CheckpointNotFoundError: No such checkpoint.
            CheckpointClaimedError: A resume holds it right now; try again.
            CheckpointResolvedError: A resume already finished with it.
        """
        store = self.checkpoint_store
        if store is None:
            raise CheckpointStoreRequiredError(
                "cancel() needs the checkpoint store the run was saved in; this Runtime has none."
            )
        await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller retires nothing
        with cancel_span(self._loop.tracing, checkpoint_id) as span:
            try:
                if self._durable:
                    if span is not None:  # traced: name the run (one read more)
                        await _name_the_run(span, store, checkpoint_id)
                    await store.cancel(checkpoint_id)  # type: ignore[attr-defined]
                else:
                    checkpoint = await store.load(checkpoint_id)
                    if span is not None:
                        span.attributes_of(checkpoint)
                    await store.delete(checkpoint_id)
            except ResumeError as exc:
                _name_the_checkpoint(exc, checkpoint_id)
                raise

    def _start(
        self,
        agent: Agent,
        input: str | Sequence[Message],
        options: Mapping[str, Any] | None,
        metadata: Mapping[str, Any] | None,
        emit: Emit | None,
    ) -> RunState:
        if not isinstance(agent, Agent):
            raise ConfigurationError(f"Expected an Agent, got {type(agent).__name__}.")
        if isinstance(input, str):
            # A user message with nothing for Message's own checks to fix or refuse.
            messages: tuple[Message, ...] = (_new_message("user", input, (), None, ()),)
        else:
            given: object = input  # typed, but a user's: checked as anything
            if not isinstance(given, Iterable) or isinstance(given, (bytes, bytearray)):
                raise ConfigurationError(
                    "input must be a str or a sequence of Message objects, not "
                    f"{type(given).__name__}. Pass the user's text, or [Message.user(...)]."
                )
            messages = tuple(input)
            for message in messages:
                if not isinstance(message, Message):
                    raise RunletError(
                        "input must be a str or a sequence of Message objects; found a "
                        f"{type(message).__name__}. Build messages with Message.user(...)."
                    )
        run_options, run_metadata = _NO_OPTIONS, {}
        if options is not None or metadata is not None:
            try:
                _check_run_data(options, metadata, self._json_only)
                # Each run gets its own copies, nested lists and dicts included, so
                # nothing one run (or its model adapter) does to them reaches another run
                # or the caller's dicts, and a change the caller makes later does not
                # reach a checkpoint kept in memory.
                if options is not None:
                    run_options = ReadOnlyDict(own_copy(options))
                if metadata is not None:
                    run_metadata = own_copy(metadata)
            except RecursionError:
                raise ConfigurationError(
                    "options or metadata are nested too deeply (hundreds of levels) to be "
                    "copied or stored; flatten them."
                ) from None
        return RunState(
            agent=agent,
            run_id=new_id("run"),
            messages=messages,
            transcript=list(messages),
            options=run_options,
            metadata=run_metadata,
            usage=ZERO_USAGE,
            turns=0,
            emit=emit,
        )


def _refuse_half_durable(store: object) -> None:
    """Refuse a store (not a durable one) with some of the methods only a durable store
    has: it was meant to be one, and would otherwise be used as a plain store (at least
    once) without a word."""
    if sum(hasattr(store, name) for name in DURABLE_ONLY) < 2:
        return
    missing = [name for name in DURABLE_MEMBERS if not hasattr(store, name)]
    raise ConfigurationError(
        f"checkpoint_store {type(store).__name__} looks like a DurableCheckpointStore but "
        f"lacks {', '.join(missing)}, so Runlet would use it as a plain store, at least once "
        "(an approved call could run twice). Add them (runlet.testing."
        "store_conformance_tests checks a store), or remove the others."
    )


def _check_run_data(
    options: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None, json_only: bool
) -> None:
    """Refuse options or metadata that are not mappings; with *json_only* (a store that
    keeps checkpoints as JSON), also values JSON cannot hold, now, before a tool runs,
    rather than when the first checkpoint is saved."""
    for name, value in (("options", options), ("metadata", metadata)):
        if value is not None and not isinstance(value, Mapping):
            raise ConfigurationError(
                f"{name} must be a dict (or None), not {type(value).__name__}."
            )
        if value and json_only:
            _check_json(value, name)


# The options of a run given none: read-only, so one empty view serves every such run.
_NO_OPTIONS: Mapping[str, Any] = ReadOnlyDict()


def _aware(clock: Clock) -> Clock:
    """*clock*, checked once now and at every reading: a time without a time zone would
    be written into checkpoints that could then never be read back. An aware time in
    another zone is turned into UTC, so every time Runlet records is in UTC, whichever
    store keeps it."""

    def now() -> datetime:
        value: object = clock()  # typed, but a user's: checked as anything
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise ConfigurationError(
                f"clock must return an aware datetime (in UTC), got {value!r}. Use "
                "datetime.now(timezone.utc), not datetime.utcnow()."
            )
        if value.tzinfo is not timezone.utc:
            value = value.astimezone(timezone.utc)
        return value

    now()
    return now


def _name_the_checkpoint(exc: ResumeError, checkpoint_id: str) -> None:
    """Give a store's error without a checkpoint id the one it concerns."""
    if exc.checkpoint_id is None:
        exc.checkpoint_id = checkpoint_id


async def _name_the_run(span: Any, store: Any, checkpoint_id: str) -> None:
    """Give a traced cancel() the run's id and agent, if the store shows them; whether it
    does changes nothing (cancel() itself reports what is wrong)."""
    try:
        stored = await store.get(checkpoint_id)
    except Exception:  # noqa: BLE001 - only for the span; cancel() raises it properly
        return
    span.attributes_of(stored.checkpoint)


def _responses(
    response: HumanResponse | None, responses: Sequence[HumanResponse] | None
) -> Sequence[HumanResponse]:
    if response is not None:
        if responses is not None:
            raise HumanResponseError("Give either response= or responses= to resume(), not both.")
        return (response,)
    if responses is None:
        raise HumanResponseError(
            "resume() needs the person's answer: response=HumanResponse(...) or responses=[...]."
        )
    if isinstance(responses, (str, bytes, HumanResponse)) or not isinstance(responses, Sequence):
        raise HumanResponseError(
            f"responses= must be a list of HumanResponse objects, not {type(responses).__name__}."
        )
    if not responses:
        raise HumanResponseError("responses= is empty; answer at least one pending request.")
    return tuple(responses)


class RunStream:
    """A streaming run, returned by :meth:`Runtime.stream`.

    Use it as an async context manager, then iterate it for
    :data:`~runlet.StreamEvent` objects. The run executes in a task owned by the
    ``async with`` block and hands events over a memory stream holding at most
    :data:`STREAM_BUFFER_SIZE` events; when that is full the run waits for you.

    If the run fails, iterating raises its exception (for example
    :class:`~runlet.ModelError`), unwrapped.
    """

    __slots__ = (
        "_cancelled",
        "_context",
        "_error",
        "_exited",
        "_group",
        "_interrupt",
        "_receive",
        "_result",
        "_send",
        "_start",
    )

    def __init__(self, start: Callable[[Emit], Awaitable[RunResult]]) -> None:
        self._start = start
        # The run sees the context of the stream() call, as a run() sees its caller's: a
        # span current there is the run span's parent, even if the block is entered later.
        self._context = contextvars.copy_context()
        self._exited = False
        self._cancelled = False
        self._result: RunResult | None = None
        self._error: Exception | None = None
        self._interrupt: BaseException | None = None
        self._group: TaskGroup | None = None
        self._send: MemoryObjectSendStream[StreamEvent] | None = None
        self._receive: MemoryObjectReceiveStream[StreamEvent] | None = None

    @property
    def result(self) -> RunResult:
        """The run's result, once the run has finished (after
        :class:`~runlet.RunFinished`, and also after a ``break`` at
        :class:`~runlet.Interrupted`, since an interrupted run ends there).

        Raises:
            RunletError: The run has not finished (keep iterating), or it failed.
        """
        if self._result is None:
            if self._error is not None:
                raise RunletError(
                    "The stream has no result because the run failed; iterating it raises "
                    f"the run's error ({type(self._error).__name__})."
                )
            if self._exited:
                raise RunletError(
                    "The stream has no result: its `async with` block was left before the "
                    "run finished, which stopped the run. Iterate it to RunFinished inside "
                    "the block; an interrupted run's checkpoint, if one was saved, can still "
                    "be resumed."
                )
            if self._cancelled:
                raise RunletError(
                    "The stream has no result: the run was cancelled before it finished (a "
                    "cancel scope around the stream's `async with` block was cancelled). An "
                    "interrupted run's checkpoint, if one was saved, can still be resumed."
                )
            raise RunletError("The stream has no result yet: iterate it until RunFinished first.")
        return self._result

    async def __aenter__(self) -> RunStream:
        if self._group is not None:
            raise RunletError("A RunStream can be entered only once; call stream() again.")
        send, receive = anyio.create_memory_object_stream[StreamEvent](STREAM_BUFFER_SIZE)
        self._send, self._receive = send, receive
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        self._context.run(group.start_soon, self._produce, send)  # the task copies it
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        group = self._group
        assert group is not None
        assert self._send is not None
        assert self._receive is not None
        self._exited = True
        group.cancel_scope.cancel()
        # A cancellation must reach the task group so each backend can account for it;
        # any other exception from the block propagates as it is, never wrapped in an
        # exception group, because the run's own errors never leave its task.
        cancelled = anyio.get_cancelled_exc_class()
        passed = exc if isinstance(exc, cancelled) else None
        try:
            await group.__aexit__(type(passed) if passed else None, passed, tb if passed else None)
        except cancelled:
            if passed is not None or exc is None or not cancelled_here():
                raise  # (not a cancel scope's cancellation: it would not come again)
            # The block raised an error of its own while a scope around it was cancelled,
            # and waiting for the run's task met that cancellation. The error goes on, as
            # from a task group; the cancellation comes again at the next checkpoint.
        except BaseException as raised:
            # Should a KeyboardInterrupt or SystemExit (or the like) still leave the
            # run's task, it comes out as itself, as from run(), not in an exception group.
            alone = the_one_interrupt(raised)
            if alone is None:
                raise
            raise alone from None
        finally:
            self._send.close()
            self._receive.close()
        interrupt = self._interrupt
        if interrupt is not None and exc is not interrupt:
            raise interrupt  # the run's KeyboardInterrupt or SystemExit, before all else

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> StreamEvent:
        receive = self._receive
        if receive is None:
            raise RunletError("Use the stream inside `async with runtime.stream(...) as s:`.")
        try:
            return await receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self._interrupt is not None:
                raise self._interrupt  # noqa: B904 - the run's own, unchained
            if self._error is not None:
                raise self._error  # noqa: B904 - the run's own error, unchained
            if self._exited and self._result is None:
                raise RunletError(
                    "The stream's `async with` block was left before the run finished, "
                    "which stopped the run: there are no more events. Iterate it inside "
                    "the block."
                ) from None
            raise StopAsyncIteration from None

    async def _produce(self, send: MemoryObjectSendStream[StreamEvent]) -> None:
        with send:
            try:
                result = await self._start(send.send)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer
                self._error = exc
                return
            except BaseException as exc:
                assert self._group is not None
                if is_cancellation(exc):  # (on trio, perhaps a group from a tool's nursery)
                    if self._group.cancel_scope.cancel_called or cancelled_here():
                        self._cancelled = True  # iterating ends; the cancellation goes on
                        raise
                    # A stray one, raised though nothing cancelled the run (on asyncio, a
                    # tool that awaited a future someone else cancelled): the task group
                    # would let it pass silently, so it goes to the consumer, as run()
                    # raises it.
                    self._interrupt = exc
                    self._group.cancel_scope.cancel()
                    return
                # A KeyboardInterrupt or SystemExit from a tool. Raised from this task, it
                # would also stop an asyncio event loop, whatever the caller does with it;
                # so the block is stopped at once, and raises it as itself.
                self._interrupt = exc
                self._group.cancel_scope.cancel()
                return
            self._result = result
            await send.send(RunFinished(result))
