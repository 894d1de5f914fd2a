"""The Runtime: thin entry points (run, resume, stream) over the turn loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._agent import Agent
from ._checkpoint import Checkpoint
from ._errors import (
    CheckpointStoreRequiredError,
    ConfigurationError,
    HumanResponseError,
    MissingToolError,
    RunletError,
)
from ._events import RunFinished, StreamEvent
from ._human import REJECTION_MESSAGE, HumanResponse, answer_result, check_response
from ._loop import Emit, Loop, RunState, edited_result, new_id, run_tool
from ._messages import Message, ToolResult, Usage
from ._result import RunResult
from ._store import CheckpointStore, ClaimingCheckpointStore, InMemoryCheckpointStore
from ._tracing import RunTrace, Tracing, resume_span, run_span

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["STREAM_BUFFER_SIZE", "RunStream", "Runtime"]

STREAM_BUFFER_SIZE = 64
"""How many events a :class:`RunStream` holds for a consumer that has not read them
yet. When the buffer is full the run waits for the consumer, so a slow consumer slows
the run down instead of making it buffer without bound."""

_EMPTY: Mapping[str, Any] = {}


class Runtime:
    """Runs agents: drives the model → tool call → tool result loop, stops for a person
    when a call needs one, and resumes from the checkpoint it saved.

    A runtime holds no per-run state; share one across an application.

    Args:
        checkpoint_store: Where interrupted runs are saved. Without one, a run that must
            stop for a person raises :class:`~runlet.CheckpointStoreRequiredError`.
        max_turns: The most model requests one run may make (across resumes) before it
            fails with :class:`~runlet.MaxTurnsExceededError`.
        tracer_provider: An OpenTelemetry tracer provider for this runtime's spans
            (needs ``runlet[otel]``). Without one, runs are traced with the global
            provider once the application has set one, and not at all before; see
            :doc:`tracing`.
        trace_content: Whether spans record message contents (instructions, messages,
            tool arguments and results, the person's answers). ``None`` (the default)
            follows the ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
            environment variable, off unless it is ``true``.

    Raises:
        ConfigurationError: *max_turns* is not a positive integer.
    """

    __slots__ = ("_claims", "_in_memory", "_loop", "_tracing", "checkpoint_store", "max_turns")

    def __init__(
        self,
        checkpoint_store: CheckpointStore | None = None,
        *,
        max_turns: int = 50,
        tracer_provider: TracerProvider | None = None,
        trace_content: bool | None = None,
    ) -> None:
        if type(max_turns) is not int or max_turns < 1:
            raise ConfigurationError(f"max_turns must be a positive int, not {max_turns!r}.")
        self.checkpoint_store = checkpoint_store
        self.max_turns = max_turns
        self._claims = isinstance(checkpoint_store, ClaimingCheckpointStore)
        self._in_memory = type(checkpoint_store) is InMemoryCheckpointStore
        self._loop = Loop(checkpoint_store, max_turns)
        self._tracing = Tracing(tracer_provider, trace_content)

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
                stored as JSON.

        Returns:
            A completed result, or an interrupted one with the request and the id of the
            checkpoint to resume.

        Raises:
            ModelError: The model adapter failed.
            MaxTurnsExceededError: The run made too many model requests.
            CheckpointStoreRequiredError: A call needs a person and there is no store.
        """
        run = self._start(agent, input, options, metadata, None)
        with run_span(self._tracing, run):
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
        :meth:`resume`, which returns a plain result.

        Leaving the ``async with`` block early (``break``, an exception, cancellation)
        stops the run: the model stream is closed and running tools are cancelled
        before the block exits.
        """
        run = self._start(agent, input, options, metadata, None)
        return RunStream(self._loop, run, self._tracing)

    async def resume(
        self, agent: Agent, *, checkpoint_id: str, response: HumanResponse
    ) -> RunResult:
        """Continue an interrupted run with a person's *response*.

        The response must answer the checkpoint's open request. Approve runs the real
        handler (with ``edited_arguments`` if given); reject records the fixed rejection
        result; select and submit become the result of the ``ask_human`` call. Then the
        run goes on until it completes or interrupts again (with a new checkpoint).

        When the resume finishes, its checkpoint is retired (deleted) as the very last
        step. When it raises, including when it is cancelled, the checkpoint stays as it
        was: loadable and resumable.

        Args:
            agent: An agent with the same name and tools as the interrupted one; it
                supplies the handlers, which checkpoints never hold.
            checkpoint_id: The ``checkpoint_id`` of the interrupted result.
            response: The person's answer to ``result.interruption``.

        Raises:
            CheckpointStoreRequiredError: The runtime has no store.
            CheckpointNotFoundError: No such checkpoint (or it was already resumed).
            CheckpointClaimedError: Another resume of it is under way.
            HumanResponseError: The response does not answer the open request.
            MissingToolError: *agent* lacks a tool the checkpoint needs.
            ModelError: The model adapter failed after the response was applied.
        """
        store = self.checkpoint_store
        if store is None:
            raise CheckpointStoreRequiredError(
                "resume() needs the checkpoint store the run was saved in; this Runtime "
                "has none. Create it with Runtime(checkpoint_store=...)."
            )
        if self._claims:
            checkpoint = await store.claim(checkpoint_id)  # type: ignore[attr-defined]
        else:
            checkpoint = await store.load(checkpoint_id)
        try:
            with resume_span(self._tracing, agent, checkpoint, response) as trace:
                result = await self._continue(agent, checkpoint, response, trace)
        except BaseException:
            if self._claims:
                with anyio.CancelScope(shield=True):
                    await store.release(checkpoint_id)  # type: ignore[attr-defined]
            raise
        if self._in_memory:
            # Its delete never yields, so no cancellation can stop it halfway; a shield
            # would change nothing, and costs ~13 µs per resume on trio.
            await store.delete(checkpoint_id)
        else:
            with anyio.CancelScope(shield=True):
                await store.delete(checkpoint_id)
        return result

    async def _continue(
        self,
        agent: Agent,
        checkpoint: Checkpoint,
        response: HumanResponse,
        trace: RunTrace | None = None,
    ) -> RunResult:
        request = checkpoint.request
        check_response(request, response)
        _check_agent(agent, checkpoint)
        call = checkpoint.pending_tool_calls[0]
        tool = agent._by_name[call.name]
        run = RunState(
            agent=agent,
            run_id=checkpoint.run_id,
            messages=checkpoint.messages,
            transcript=list(checkpoint.transcript),
            options=checkpoint.options,
            metadata=checkpoint.metadata,
            usage=checkpoint.usage,
            turns=checkpoint.turns,
            emit=None,
        )
        run.trace = trace
        action = response.action
        if action == "approve":
            edited = response.edited_arguments
            if edited is None:
                result = await run_tool(run, call, tool, call.arguments)
            else:
                problem = tool._check_arguments(edited)
                if problem is not None:
                    raise HumanResponseError(
                        f"edited_arguments do not fit tool {call.name!r}: {problem}. "
                        "Correct them and resume again; the checkpoint is unchanged."
                    )
                result = edited_result(await run_tool(run, call, tool, edited), edited)
        elif action == "reject":
            result = ToolResult(call.id, REJECTION_MESSAGE, True)
        else:
            result = answer_result(request, response)
        results = {known.tool_call_id: known for known in checkpoint.results}
        results[call.id] = result
        interrupted = await self._loop.settle(run, results, checkpoint.pending_tool_calls[1:])
        if interrupted is not None:
            return interrupted
        return await self._loop.drive(run)

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
            messages: tuple[Message, ...] = (Message("user", input),)
        else:
            messages = tuple(input)
            for message in messages:
                if not isinstance(message, Message):
                    raise RunletError(
                        "input must be a str or a sequence of Message objects; found a "
                        f"{type(message).__name__}. Build messages with Message.user(...)."
                    )
        return RunState(
            agent=agent,
            run_id=new_id("run"),
            messages=messages,
            transcript=list(messages),
            options=_EMPTY if options is None else dict(options),
            metadata=_EMPTY if metadata is None else dict(metadata),
            usage=Usage(),
            turns=0,
            emit=emit,
        )


def _check_agent(agent: Agent, checkpoint: Checkpoint) -> None:
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"Expected an Agent, got {type(agent).__name__}.")
    if agent.name != checkpoint.agent_name:
        raise MissingToolError(
            f"Checkpoint {checkpoint.id!r} belongs to agent {checkpoint.agent_name!r}, but "
            f"resume() was given agent {agent.name!r}. Resume with the agent that was "
            "interrupted.",
            checkpoint_id=checkpoint.id,
            tool_name=None,
        )
    for call in checkpoint.pending_tool_calls:
        if call.name not in agent._by_name:
            raise MissingToolError(
                f"Checkpoint {checkpoint.id!r} has a pending call of tool {call.name!r}, but "
                f"the agent given to resume() has no such tool. Add the tool to agent "
                f"{agent.name!r}.",
                checkpoint_id=checkpoint.id,
                tool_name=call.name,
            )


class RunStream:
    """A streaming run, returned by :meth:`Runtime.stream`.

    Use it as an async context manager, then iterate it for
    :data:`~runlet.StreamEvent` objects. The run executes in a task owned by the
    ``async with`` block and hands events over a memory stream holding at most
    :data:`STREAM_BUFFER_SIZE` events; when that is full the run waits for you.

    If the run fails, iterating raises its exception (for example
    :class:`~runlet.ModelError`), unwrapped.
    """

    __slots__ = ("_error", "_group", "_loop", "_receive", "_result", "_run", "_send", "_tracing")

    def __init__(self, loop: Loop, run: RunState, tracing: Tracing) -> None:
        self._loop = loop
        self._run = run
        self._tracing = tracing
        self._result: RunResult | None = None
        self._error: Exception | None = None
        self._group: TaskGroup | None = None
        self._send: MemoryObjectSendStream[StreamEvent] | None = None
        self._receive: MemoryObjectReceiveStream[StreamEvent] | None = None

    @property
    def result(self) -> RunResult:
        """The run's result, once the stream has handed out :class:`~runlet.RunFinished`.

        Raises:
            RunletError: The run has not finished (keep iterating), or it failed.
        """
        if self._result is None:
            if self._error is not None:
                raise RunletError(
                    "The stream has no result because the run failed; iterating it raised "
                    f"the run's error ({type(self._error).__name__})."
                )
            raise RunletError("The stream has no result yet: iterate it until RunFinished first.")
        return self._result

    async def __aenter__(self) -> RunStream:
        if self._group is not None:
            raise RunletError("A RunStream can be entered only once; call stream() again.")
        send, receive = anyio.create_memory_object_stream[StreamEvent](STREAM_BUFFER_SIZE)
        self._send, self._receive = send, receive
        self._run.emit = send.send
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self._produce, send)
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
        group.cancel_scope.cancel()
        # A cancellation must reach the task group so each backend can account for it;
        # any other exception from the block propagates as it is, never wrapped in an
        # exception group, because the run's own errors never leave its task.
        passed = exc if isinstance(exc, anyio.get_cancelled_exc_class()) else None
        try:
            await group.__aexit__(type(passed) if passed else None, passed, tb if passed else None)
        finally:
            self._send.close()
            self._receive.close()

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> StreamEvent:
        receive = self._receive
        if receive is None:
            raise RunletError("Use the stream inside `async with runtime.stream(...) as s:`.")
        try:
            return await receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self._error is not None:
                raise self._error  # noqa: B904 - the run's own error, unchained
            raise StopAsyncIteration from None

    async def _produce(self, send: MemoryObjectSendStream[StreamEvent]) -> None:
        with send:
            try:
                with run_span(self._tracing, self._run):
                    result = await self._loop.drive(self._run)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer
                self._error = exc
                return
            self._result = result
            await send.send(RunFinished(result))
