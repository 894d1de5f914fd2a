"""The one place that runs turns: ask the model, run tools, decide to interrupt.

Everything here is on the per-turn path, so it avoids work that does not change the
outcome: no task group for a single call, no copies beyond the one tuple a
:class:`ModelRequest` needs, and no validation of objects Runlet builds itself.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from ._agent import Agent
from ._checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    _new_checkpoint,
    _new_message,
    mark_verified,
)
from ._errors import (
    CheckpointStoreRequiredError,
    MaxTurnsExceededError,
    ModelError,
    ModelResponseError,
    RunletError,
)
from ._events import (
    Interrupted,
    MessageCompleted,
    StreamEvent,
    ToolCallFinished,
    ToolCallStarted,
)
from ._human import Decision, HumanRequest, check_ask_human, is_ask_human, make_request
from ._messages import Message, ToolCall, ToolResult, Usage
from ._model import (
    Model,
    ModelRequest,
    ModelResponse,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from ._result import RunResult
from ._store import CheckpointStore
from ._tools import ToolContext, ToolSpec, edited_content, handler_failed
from ._tracing import Tracing
from ._util import ReadOnlyDict, in_own_context, own_copy, side_by_side, slot_builder

if TYPE_CHECKING:
    from ._tracing import RunTrace

Emit = Callable[[StreamEvent], Awaitable[None]]
Clock = Callable[[], datetime]


# The loop builds these from values it made itself, without their __init__.
_new_model_request = slot_builder(ModelRequest)
_new_result = slot_builder(RunResult)
_new_context = slot_builder(ToolContext)
_new_tool_result = slot_builder(ToolResult)


# The metadata of a run given none: one read-only empty dict serves every such run.
_NO_METADATA = ReadOnlyDict()


def new_id(prefix: str) -> str:
    """A random id such as ``run_3f2a…``; 96 random bits."""
    return f"{prefix}_{os.urandom(12).hex()}"


class RunState:
    """The mutable state of one run while it executes. Internal; never shared."""

    __slots__ = (
        "agent",
        "context_metadata",
        "decisions",
        "deferred",
        "emit",
        "messages",
        "metadata",
        "options",
        "run_id",
        "trace",
        "transcript",
        "turns",
        "usage",
    )

    def __init__(
        self,
        *,
        agent: Agent,
        run_id: str,
        messages: tuple[Message, ...],
        transcript: list[Message],
        options: Mapping[str, Any],
        metadata: Mapping[str, Any],
        usage: Usage,
        turns: int,
        emit: Emit | None,
        decisions: tuple[Decision, ...] = (),
    ) -> None:
        self.agent = agent
        self.run_id = run_id
        self.messages = messages
        self.transcript = transcript
        self.options = options
        self.metadata = metadata
        self.context_metadata = ReadOnlyDict(metadata) if metadata else _NO_METADATA
        self.usage = usage
        self.turns = turns
        self.emit = emit
        self.decisions = decisions
        # A resume saves its next checkpoint itself, atomically with resolving the one it
        # was given: then interrupt() parks the checkpoint here (a list) instead of saving it.
        self.deferred: list[Checkpoint] | None = None
        self.trace: RunTrace | None = None  # set by _tracing when the run is traced


class Loop:
    """Runs turns for a :class:`~runlet.Runtime`'s settings."""

    __slots__ = ("clock", "max_turns", "store", "tracing")

    def __init__(self, store: CheckpointStore | None, max_turns: int, clock: Clock) -> None:
        self.store = store
        self.max_turns = max_turns
        self.clock = clock
        self.tracing = Tracing(None, None)

    async def drive(self, run: RunState) -> RunResult:
        """Ask the model and handle its tool calls until the run completes or must stop
        for a person."""
        agent = run.agent
        definitions = agent._definitions
        emit = run.emit
        trace = run.trace
        while True:
            if run.turns >= self.max_turns:
                raise MaxTurnsExceededError(
                    f"Run {run.run_id} reached max_turns={self.max_turns} model requests "
                    "without a final answer. If the agent needs more, raise "
                    "Runtime(max_turns=...); otherwise check why it keeps calling tools.",
                    max_turns=self.max_turns,
                )
            run.turns += 1
            request = _new_model_request(
                agent.instructions, tuple(run.transcript), definitions, run.options
            )
            if trace is None and emit is None:  # _ask, without a coroutine of its own
                model = agent.model
                try:
                    response = await model.complete(request)
                except Exception as exc:
                    await handler_failed()  # unless the run was cancelled: see there
                    if isinstance(exc, RunletError):
                        raise
                    raise _adapter_failed(model, exc) from exc
                _check_response(model, response)
            elif trace is None:
                response = await _ask(agent.model, request, emit)
            else:
                response = await trace.chat(_ask, agent.model, request, emit)
            message = response.message
            run.transcript.append(message)
            run.usage = run.usage + response.usage
            if emit is not None:
                await emit(MessageCompleted(message))
            if not message.tool_calls:
                return _new_result(
                    status="completed",
                    output=message.content,
                    interruption=None,
                    checkpoint_id=None,
                    transcript=tuple(run.transcript),
                    usage=run.usage,
                    run_id=run.run_id,
                    pending_requests=(),
                    decisions=run.decisions,
                )
            calls = message.tool_calls
            if len(calls) == 1 and self.store is not None:
                # The usual interruption, one valid call to a tool that always asks a
                # person: nothing runs now, so stop without _handle (a coroutine) and
                # with what it would return. Anything else goes through _handle.
                call = calls[0]
                tool = agent._by_name.get(call.name)
                if tool is not None and tool._gate is True and _check_call(call, tool) is None:
                    return await self.stop_for(run, {}, [call])
            results, pending = await self._handle(run, calls)
            if pending:
                return await self.stop_for(run, results, pending)
            append_results(run, results)

    async def _handle(
        self, run: RunState, calls: tuple[ToolCall, ...]
    ) -> tuple[dict[str, ToolResult], list[ToolCall]]:
        """Answer what can be answered now; return the results and the calls that wait
        for a person, in call order."""
        agent = run.agent
        emit = run.emit
        results: dict[str, ToolResult] = {}
        ready: list[tuple[ToolCall, ToolSpec]] = []
        pending: list[ToolCall] = []
        for call in calls:
            tool = agent._by_name.get(call.name)
            problem = _unknown_tool(call, agent) if tool is None else _check_call(call, tool)
            if problem is None:
                assert tool is not None
                gate = tool._gate
                if gate is False:
                    ready.append((call, tool))
                    continue
                if gate is True:
                    pending.append(call)
                    continue
                try:
                    ask = await tool._needs_approval(call.arguments, tool_context(run, call))
                except Exception as exc:  # noqa: BLE001 - the call is not run; the model is told
                    await handler_failed()  # unless the run was cancelled meanwhile
                    problem = (
                        f"The approval policy of tool {call.name!r} failed "
                        f"({type(exc).__name__}: {exc}), so the call was not run."
                    )
                else:
                    if ask:
                        pending.append(call)
                    else:
                        ready.append((call, tool))
                    continue
            result = results[call.id] = ToolResult(call.id, problem, True)
            if run.trace is not None:
                run.trace.refused_call(call, problem, tool is not None)
            if emit is not None:
                await emit(ToolCallStarted(call))
                await emit(ToolCallFinished(call, result))
        if pending and self.store is None:
            raise CheckpointStoreRequiredError(
                f"Tool call {pending[0].name!r} needs a person, so the run must save a "
                "checkpoint, but this Runtime has no checkpoint store. Create it with "
                "Runtime(checkpoint_store=InMemoryCheckpointStore()) or your own store."
            )
        if len(ready) == 1:
            call, tool = ready[0]
            results[call.id] = await run_tool(run, call, tool, call.arguments)
        elif ready:
            await side_by_side(
                [partial(_run_into, results, run, call, tool) for call, tool in ready]
            )
        return results, pending

    def stop_for(
        self, run: RunState, results: dict[str, ToolResult], pending: Sequence[ToolCall]
    ) -> Awaitable[RunResult]:
        """Interrupt for the pending calls, with a new request for each (the requests are
        made at once; the returned awaitable saves the checkpoint)."""
        if self.store is None:  # pragma: no cover - _handle and resume check this first
            raise CheckpointStoreRequiredError("This Runtime has no checkpoint store.")
        now = self.clock()
        by_name = run.agent._by_name
        if len(pending) == 1:
            # The common case, one call: one read from the OS for both ids (96 random
            # bits each, as new_id), and no list comprehension.
            bits = os.urandom(24).hex()
            call = pending[0]
            request = make_request(f"req_{bits[:24]}", call, by_name[call.name], now)
            return self.interrupt(run, results, pending, [request], f"cp_{bits[24:]}")
        requests = [make_request(new_id("req"), c, by_name[c.name], now) for c in pending]
        return self.interrupt(run, results, pending, requests)

    async def interrupt(
        self,
        run: RunState,
        results: Mapping[str, ToolResult],
        pending: Sequence[ToolCall],
        requests: Sequence[HumanRequest],
        checkpoint_id: str | None = None,
    ) -> RunResult:
        """Save a checkpoint waiting on *requests* (one per pending call), then report it;
        during a resume, park it for the resume to save. The checkpoint's id is
        *checkpoint_id*, or a new one."""
        calls = run.transcript[-1].tool_calls
        checkpoint = _new_checkpoint(
            id=new_id("cp") if checkpoint_id is None else checkpoint_id,
            version=CHECKPOINT_VERSION,
            run_id=run.run_id,
            agent_name=run.agent.name,
            messages=run.messages,
            options=dict(run.options) if run.options else {},  # a dict: it pickles, copies
            metadata=run.metadata,
            transcript=tuple(run.transcript),
            results=tuple([results[c.id] for c in calls if c.id in results]) if results else (),
            pending_tool_calls=tuple(pending),
            request=requests[0],
            more_requests=tuple(requests[1:]) if len(requests) > 1 else (),
            decisions=run.decisions,
            usage=run.usage,
            turns=run.turns,
        )
        mark_verified(checkpoint)  # consistent by construction
        if run.deferred is not None:
            run.deferred.append(checkpoint)  # the resume saves it, and traces it then
        else:
            await self.store.save(checkpoint)  # type: ignore[union-attr]  # stop_for checks
            if run.trace is not None:  # only once it is saved: a failed save is no stop
                run.trace.interrupted(checkpoint)
            if run.emit is not None:
                await run.emit(
                    Interrupted(checkpoint.request, checkpoint.id, checkpoint.open_requests)
                )
        return interrupted_result(checkpoint)


def interrupted_result(checkpoint: Checkpoint) -> RunResult:
    """The result that reports *checkpoint*'s interruption."""
    return _new_result(
        status="interrupted",
        output=None,
        interruption=checkpoint.request,
        checkpoint_id=checkpoint.id,
        transcript=checkpoint.transcript,
        usage=checkpoint.usage,
        run_id=checkpoint.run_id,
        pending_requests=checkpoint.open_requests,
        decisions=checkpoint.decisions,
    )


def append_results(run: RunState, results: Mapping[str, ToolResult]) -> None:
    """Append one tool message per call of the last assistant message, in call order."""
    calls = run.transcript[-1].tool_calls
    if len(calls) == 1:  # the common case, without a generator
        result = results[calls[0].id]
        run.transcript.append(_new_message("tool", result.content, (), result, ()))
    else:
        run.transcript.extend([Message.tool(results[call.id]) for call in calls])


def tool_context(run: RunState, call: ToolCall) -> ToolContext:
    """The context a call's handler (or approval policy) gets. The idempotency key names
    the run, the turn and the call, so it is the same for every attempt of this call and
    differs for a later turn's call that reuses the id."""
    return _new_context(
        run_id=run.run_id,
        tool_call_id=call.id,
        agent_name=run.agent.name,
        metadata=run.context_metadata,
        tool_name=call.name,
        idempotency_key=f"{run.run_id}/{run.turns}/{call.id}",
    )


async def run_tool(
    run: RunState,
    call: ToolCall,
    tool: ToolSpec,
    arguments: Mapping[str, Any],
    *,
    report: bool = True,
    announce: bool = True,
    edited: bool = False,
) -> ToolResult:
    """Run one call's handler and make its result; with *report* false, the caller emits
    :class:`ToolCallFinished` itself (a resume does so after recording the result), and
    with *announce* false, it emitted :class:`ToolCallStarted` already. With
    *edited*, the result notes that a person changed the arguments (the span shows that
    text too: it is what the model gets)."""
    emit = run.emit
    if emit is not None and announce:
        await emit(ToolCallStarted(call))
    # One place builds the context, so a policy and the handler see the same key.
    context = tool_context(run, call)
    trace = run.trace
    if trace is None and tool._is_async and tool.timeout is None:
        # What tool._invoke does for this case, without a coroutine of its own.
        try:
            # The handler's own copy: what it changes in place is not the call the model
            # made, nor the arguments a person approved (the audit trail keeps those).
            # In a context of its own: what it sets in context variables stays its own.
            value = await in_own_context(tool.handler(own_copy(arguments), context))
        except Exception as exc:  # noqa: BLE001 - any failure goes to the model
            await handler_failed()  # unless the run was cancelled: see there
            content, is_error = tool._failed(exc)
        else:
            content, is_error = tool._content(value)
    elif trace is None:
        content, is_error = await tool._invoke(arguments, context)
    else:
        content, is_error = await trace.tool(tool, call, arguments, context, edited)
    if edited and trace is None:
        content = edited_content(content, arguments)
    result = _new_tool_result(call.id, content, is_error)
    if emit is not None and report:
        await emit(ToolCallFinished(call, result))
    return result


async def _run_into(
    results: dict[str, ToolResult], run: RunState, call: ToolCall, tool: ToolSpec
) -> None:
    results[call.id] = await run_tool(run, call, tool, call.arguments)


def _check_call(call: ToolCall, tool: ToolSpec) -> str | None:
    problem = tool._check_arguments(call.arguments)
    if problem is None and tool._gate is True and is_ask_human(tool):
        problem = check_ask_human(call.arguments)
    if problem is None:
        return None
    return (
        f"Invalid arguments for tool {call.name!r}: {problem}. "
        "Call it again with arguments that match its input schema."
    )


def _unknown_tool(call: ToolCall, agent: Agent) -> str:
    names = ", ".join(repr(name) for name in agent._by_name) or "none"
    return f"There is no tool named {call.name!r}. The tools you can call are: {names}."


async def _ask(model: Model, request: ModelRequest, emit: Emit | None) -> ModelResponse:
    try:
        if emit is None:
            response = await model.complete(request)
        else:
            response = await _ask_streaming(model, request, emit)
    except Exception as exc:
        await handler_failed()  # unless the run was cancelled: see there
        if isinstance(exc, RunletError):
            raise
        raise _adapter_failed(model, exc) from exc
    _check_response(model, response)
    if emit is not None and getattr(model, "stream", None) is None:
        # A model that cannot stream still gives the consumer its reasoning and text.
        for part in response.message.reasoning:
            if part.text:
                await emit(ReasoningDelta(part.text))
        if response.message.content:
            await emit(TextDelta(response.message.content))
    return response


def _adapter_failed(model: Model, exc: Exception) -> ModelError:
    return ModelError(
        f"The model adapter {type(model).__name__} failed: {type(exc).__name__}: {exc}"
    )


def _check_response(model: Model, response: object) -> None:
    """Refuse what a model adapter returned unless it is a usable response."""
    if type(response) is not ModelResponse and not isinstance(response, ModelResponse):
        raise ModelResponseError(
            f"{type(model).__name__}.complete() must return a ModelResponse, "
            f"got {type(response).__name__}."
        )
    message = response.message
    if message.role != "assistant":
        raise ModelResponseError(
            f"{type(model).__name__} answered with a {message.role!r} message; a model "
            "response must hold an assistant message (Message.assistant(...))."
        )
    calls = message.tool_calls
    if len(calls) > 1 and len({call.id for call in calls}) != len(calls):
        raise ModelResponseError(
            f"{type(model).__name__} gave two tool calls the same id in one message; "
            "each call needs its own id."
        )
    usage = response.usage
    if usage is not _DEFAULT_USAGE:
        problem = _usage_problem(usage)
        if problem is not None:
            raise ModelResponseError(
                f"{type(model).__name__} gave a response whose usage {problem}. Build it "
                "as Usage(input_tokens, output_tokens, requests=1) with int counts, 0 for "
                "a count the API does not report."
            )


# ModelResponse's default usage (one shared object): nothing to check.
_DEFAULT_USAGE = attrs.fields(ModelResponse).usage.default


def _usage_problem(usage: object) -> str | None:
    if type(usage) is not Usage and not isinstance(usage, Usage):
        return f"is a {type(usage).__name__}, not a Usage"
    for name in _USAGE_COUNTS:
        count = getattr(usage, name)
        if type(count) is not int or count < 0:
            return f"has {name}={count!r}, not a count"
    return None


_USAGE_COUNTS = tuple(field.name for field in attrs.fields(Usage))


async def _ask_streaming(model: Model, request: ModelRequest, emit: Emit) -> ModelResponse:
    stream = getattr(model, "stream", None)
    if stream is None:
        # A model that cannot stream still gives the consumer one delta per message;
        # _ask sends it once the response is known to be usable.
        return await model.complete(request)
    final: ModelResponse | None = None
    async with stream(request) as items:
        try:
            async for item in items:
                if isinstance(item, ModelResponse) and final is None:
                    final = item
                elif isinstance(item, _DELTAS) and final is None:
                    await emit(item)
                else:
                    where = "after its final ModelResponse" if final is not None else "as an item"
                    raise ModelResponseError(
                        f"{type(model).__name__}.stream() yielded a {type(item).__name__} "
                        f"{where}; a stream yields TextDelta, ReasoningDelta and "
                        "ToolCallDelta items, then one final ModelResponse."
                    )
        finally:
            # The iterator may hold the connection (an async generator of the model's
            # own): close it now, not whenever the garbage collector gets to it.
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()
    if final is None:
        raise ModelResponseError(
            f"{type(model).__name__}.stream() ended without its final ModelResponse."
        )
    return final


# What a streaming model may yield before its final ModelResponse.
_DELTAS = (TextDelta, ReasoningDelta, ToolCallDelta)
