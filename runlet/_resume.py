"""Resume, exactly once: the whole bookkeeping of continuing an interrupted run.

Read top to bottom, :func:`resume` is the list of crash windows:

1. **Read and check** (``get``): the stored state and the response are checked before
   anything is claimed, so a wrong answer never blocks a right one. A resolved
   checkpoint answers a repeated, equal response with its stored result.
2. **Claim** (``claim``): one resume at a time holds the checkpoint, under a lease that a
   background task renews while the resume works. A crash from here on leaves the claim
   to run out; another process then takes over with the records below.
3. **Record decisions** (``record``): the person's answers are stored before anything acts
   on them; the first accepted answer is final. An approved call's record without a
   result means "started".
4. **Run and record results** (``record`` after each approved handler): a call with a
   recorded result never runs again. A call recorded as started by an attempt that never
   finished runs again only if its tool is idempotent (same idempotency key); otherwise
   it comes back to a person as an ``outcome_unknown`` approval.
5. **Continue**: ordinary turns, with no store writes per tool call.
6. **Resolve** (``resolve``): the outcome is stored and the next checkpoint (if the run
   interrupted again) saved in one atomic step; only then is the result reported.

A failure or cancellation anywhere before step 6 releases the claim (shielded) and keeps
every record. With a plain three-method :class:`~runlet.CheckpointStore` steps 2-4 and
6 are skipped (load, continue, delete at the end): at least once, not exactly once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel

from ._agent import Agent
from ._checkpoint import Checkpoint, _check_json, check_integrity
from ._errors import (
    CheckpointNotFoundError,
    CheckpointResolvedError,
    CheckpointSerializationError,
    CheckpointStoreRequiredError,
    ConfigurationError,
    HumanRequestExpiredError,
    HumanResponseConflictError,
    HumanResponseError,
    LeaseLostError,
    MissingToolError,
    ResultNotRecordedError,
    ResumeError,
)
from ._events import Interrupted, ToolCallFinished, ToolCallStarted
from ._human import (
    EXPIRY_MESSAGE,
    Decision,
    HumanRequest,
    HumanResponse,
    answer_result,
    check_response,
    is_ask_human,
    make_request,
)
from ._loop import (
    Emit,
    Loop,
    RunState,
    append_results,
    new_id,
    run_tool,
)
from ._messages import ToolCall, ToolResult
from ._result import RunResult
from ._store import (
    CallRecord,
    CheckpointStore,
    DurableCheckpointStore,
    InMemoryCheckpointStore,
    Resolution,
    cancelled_error,
)
from ._tracing import RunTrace, resume_span
from ._util import (
    ReadOnlyDict,
    described,
    is_cancellation,
    json_form,
    log,
    or_warn,
    side_by_side,
    slot_builder,
    to_the_end,
)

__all__ = ["resume"]

# Built from values the resume made itself, without the classes' __init__.
_new_decision = slot_builder(Decision)
_new_record = slot_builder(CallRecord)
_new_resolution = slot_builder(Resolution)

Record = Callable[[Sequence[CallRecord]], Awaitable[None]]


def resume(
    loop: Loop,
    durable: bool,
    agent: Agent,
    checkpoint_id: str,
    responses: Sequence[HumanResponse] | None,
    emit: Emit | None,
) -> Awaitable[RunResult]:
    """Continue the run saved in *checkpoint_id* with *responses*, or, when *responses* is
    ``None``, give up on every open request with the expiry result. Await the result at
    once: the checks here raise when it is called."""
    store = loop.store
    if store is None:
        raise CheckpointStoreRequiredError(
            "resume() needs the checkpoint store the run was saved in; this Runtime has "
            "none. Create it with Runtime(checkpoint_store=...)."
        )
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"Expected an Agent, got {type(agent).__name__}.")
    span = resume_span(loop.tracing, agent, checkpoint_id, responses)
    if not isinstance(span, RunTrace):  # not traced: no span to wrap it in
        return _resume(loop, durable, agent, checkpoint_id, responses, emit, None)
    return _traced(span, partial(_resume, loop, durable, agent, checkpoint_id, responses, emit))


async def _traced(span: RunTrace, start: Callable[[RunTrace], Awaitable[RunResult]]) -> RunResult:
    with span:
        return await start(span)


async def _resume(
    loop: Loop,
    durable: bool,
    agent: Agent,
    checkpoint_id: str,
    responses: Sequence[HumanResponse] | None,
    emit: Emit | None,
    trace: RunTrace | None,
) -> RunResult:
    """The steps of :func:`resume`, inside its span."""
    store = loop.store
    if not durable:
        return await _resume_plain(loop, agent, checkpoint_id, responses, emit, trace)
    durable_store: DurableCheckpointStore = store  # type: ignore[assignment]

    # 1. Read and check, before claiming anything.
    stored = await durable_store.get(checkpoint_id)
    if trace is not None:  # the run's id joins the span, whatever happens next
        trace.found(stored.checkpoint)
    if stored.status == "cancelled":
        raise cancelled_error(checkpoint_id)
    if stored.status == "resolved":
        repeat = await _repeat(loop, durable_store, stored.checkpoint, stored.resolution, responses)
        return await _repeated(trace, emit, repeat)
    checkpoint = stored.checkpoint
    answers = _decide(loop, agent, checkpoint, responses, stored.records)
    _refuse_conflicts(checkpoint, answers, stored.records)
    if trace is not None:
        trace.resumed(checkpoint, tuple(answers.values()))

    # 2. Claim. A caller cancelled by now claims nothing and runs nothing, even where no
    # step below would yield (the in-memory store, a model and tools that never wait).
    await anyio.lowlevel.checkpoint_if_cancelled()
    lease = durable_store.lease
    claimed_after = anyio.current_time() if lease else 0.0  # the store's lease starts later
    try:
        claim = await durable_store.claim(checkpoint_id)
    except CheckpointResolvedError as exc:  # another resume finished in between
        resolution = exc.resolution
        if not isinstance(resolution, Resolution):
            resolution = (await durable_store.get(checkpoint_id)).resolution
        repeat = await _repeat(loop, durable_store, checkpoint, resolution, responses)
        return await _repeated(trace, emit, repeat)
    token = claim.token
    deferred: list[Checkpoint] = []
    in_memory = type(durable_store) is InMemoryCheckpointStore
    held = _Held(durable_store, checkpoint_id, token, lease, claimed_after) if lease else None
    try:
        record: Record = partial(durable_store.record, checkpoint_id, token)
        record_result = record
        if not in_memory:
            # A store that yields could be stopped by a cancellation that came while a
            # handler ran: its result must still be recorded. (The in-memory store never
            # yields, so nothing can stop it; protecting it would only cost time.) The
            # decisions are not protected: cancelled before they are stored, nothing ran.
            record_result = partial(_record_to_the_end, record)
            # A cancellation that came while the decisions were written (a SQL store
            # finishes the write in its thread, and raises nothing) starts no handler.
            record = partial(_record_then_stop_if_cancelled, record)
        # 3-5. Record decisions, run, record results, continue.
        work = _continue(
            loop,
            agent,
            claim.checkpoint,
            answers,
            claim.records,
            record,
            deferred,
            emit,
            trace,
            record_result,
            held,
        )
        # 6. Resolve: the outcome and the next checkpoint, atomically.
        if held is not None:
            # Resolved while the lease is still renewed: a cancellation that comes as the
            # renewals stop must not throw the finished run away.
            resolve = partial(
                _resolve, loop, durable_store, in_memory, checkpoint_id, token, responses, deferred
            )
            result = await _holding_lease(held, work, resolve)
        else:
            result, decided = await work
            await _resolve(
                loop,
                durable_store,
                in_memory,
                checkpoint_id,
                token,
                responses,
                deferred,
                result,
                decided,
            )
        next_checkpoint = deferred[0] if deferred else None
    except BaseException:
        if in_memory:
            await durable_store.release(checkpoint_id, token)
        else:
            # What stopped the resume is what the caller must see, not a failure to give
            # the claim back (a store closed by a shutting-down server, a lost database):
            # the claim then runs out with its lease.
            runs_out = "never: the lease is None" if lease is None else f"{lease:g} s"
            await to_the_end(
                partial(
                    or_warn,
                    partial(durable_store.release, checkpoint_id, token),
                    "The resume of checkpoint %r stopped, and giving its claim back failed; "
                    "it stays claimed until the lease runs out (%s): %s",
                    checkpoint_id,
                    runs_out,
                )
            )
        raise
    if trace is not None and next_checkpoint is not None:  # saved by the resolve
        trace.interrupted(next_checkpoint)
    if emit is not None:
        await _announce(emit, next_checkpoint)
    return result


async def _resolve(
    loop: Loop,
    store: DurableCheckpointStore,
    in_memory: bool,
    checkpoint_id: str,
    token: str,
    responses: Sequence[HumanResponse] | None,
    deferred: list[Checkpoint],
    result: RunResult,
    decided: tuple[Decision, ...],
) -> None:
    """Store the outcome and the next checkpoint (the first of *deferred*, if any)."""
    resolution = _new_resolution(
        decisions=decided, result=result, resolved_at=loop.clock(), expired=responses is None
    )
    next_checkpoint = deferred[0] if deferred else None
    if in_memory:  # it never yields, so nothing can stop it halfway
        await store.resolve(checkpoint_id, token, resolution, next_checkpoint)
    else:  # nothing may stop the final write halfway
        await to_the_end(partial(store.resolve, checkpoint_id, token, resolution, next_checkpoint))


async def _resume_plain(
    loop: Loop,
    agent: Agent,
    checkpoint_id: str,
    responses: Sequence[HumanResponse] | None,
    emit: Emit | None,
    trace: RunTrace | None,
) -> RunResult:
    """At least once: load, continue, save the next checkpoint (if the run interrupted
    again), delete this one, and only then report the interruption: a stream consumer
    that leaves at the ``Interrupted`` event finds the resume finished."""
    store = loop.store
    assert store is not None
    checkpoint = await store.load(checkpoint_id)
    if trace is not None:
        trace.found(checkpoint)
    answers = _decide(loop, agent, checkpoint, responses)
    if trace is not None:
        trace.resumed(checkpoint, tuple(answers.values()))
    await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller runs nothing
    deferred: list[Checkpoint] = []
    result, _ = await _continue(loop, agent, checkpoint, answers, (), None, deferred, emit, trace)
    next_checkpoint = deferred[0] if deferred else None
    if next_checkpoint is not None:  # saved before this one goes: never neither
        try:
            await store.save(next_checkpoint)
        except BaseException as exc:
            if is_cancellation(exc):  # it may be saved all the same: nobody will hear of it
                await to_the_end(partial(_take_back, store, next_checkpoint))
            raise
        if trace is not None:
            trace.interrupted(next_checkpoint)
    try:
        await store.delete(checkpoint_id)
    except BaseException as exc:
        if is_cancellation(exc):
            # A cancelled resume leaves its checkpoint resumable, though the delete may have
            # gone through: it is saved back (resuming it runs its approved calls again: a
            # plain store is at least once), and the next one, which nobody will hear of,
            # is taken back.
            await to_the_end(partial(_roll_back, store, checkpoint, next_checkpoint))
        elif isinstance(exc, Exception):
            # The next checkpoint is saved all the same: a stream says so before the error.
            await _announce(emit, next_checkpoint)
        raise
    await _announce(emit, next_checkpoint)
    return result


async def _roll_back(
    store: CheckpointStore, checkpoint: Checkpoint, next_checkpoint: Checkpoint | None
) -> None:
    """Undo a plain-store resume's writes: *checkpoint* saved back, *next_checkpoint*
    deleted. Failures are logged: the caller raises what stopped the resume."""
    await or_warn(
        partial(store.save, checkpoint),
        "The resume of checkpoint %r was cancelled while it deleted the checkpoint, and "
        "saving it back failed, so it may be gone although its caller was told nothing "
        "finished: %s",
        checkpoint.id,
    )
    if next_checkpoint is not None:
        await _take_back(store, next_checkpoint)


async def _take_back(store: CheckpointStore, checkpoint: Checkpoint) -> None:
    """Delete *checkpoint*, saved by a plain-store resume that is being cancelled."""
    await or_warn(
        partial(store.delete, checkpoint.id),
        "Checkpoint %r, saved by a resume that was then cancelled, could not be deleted; "
        "nothing refers to it, and resuming it would continue a run whose earlier "
        "checkpoint is still waiting: %s",
        checkpoint.id,
    )


async def _announce(emit: Emit | None, checkpoint: Checkpoint | None) -> None:
    """Send :class:`Interrupted` for *checkpoint*, if there is one and a stream."""
    if emit is not None and checkpoint is not None:
        await emit(Interrupted(checkpoint.request, checkpoint.id, checkpoint.open_requests))


def _decide(
    loop: Loop,
    agent: Agent,
    checkpoint: Checkpoint,
    responses: Sequence[HumanResponse] | None,
    records: Sequence[CallRecord] = (),
) -> dict[str, Decision]:
    """Check everything that can be checked before a claim; return the decisions by call
    id. *records* are the checkpoint's recorded decisions: a request one of them answered
    in time does not expire. Raises without side effects."""
    check_integrity(checkpoint)
    _check_agent(agent, checkpoint)
    now = loop.clock()
    requests = checkpoint.open_requests
    if responses is None:  # expire(): every open request gets the expiry result
        return {
            request.tool_call.id: _decision(checkpoint, request, "expire", now)
            for request in requests
        }
    by_id = (
        {requests[0].id: requests[0]}
        if len(requests) == 1
        else {request.id: request for request in requests}
    )
    answers: dict[str, Decision] = {}
    for response in responses:
        if type(response) is not HumanResponse and not isinstance(response, HumanResponse):
            raise HumanResponseError(
                f"resume() needs a HumanResponse, got {type(response).__name__}."
            )
        request = by_id.get(response.request_id)
        if request is None:
            waiting = ", ".join(repr(r.id) for r in requests)
            noun = "request" if len(requests) == 1 else "requests"
            answered = _earlier_decision(checkpoint, response.request_id)
            if answered is not None and answered.action == "expire":
                raise _expired_before(checkpoint.id, answered.request_id)
            if answered is not None:  # answered at an earlier checkpoint of the run
                them = "that" if len(requests) == 1 else "those"
                hint = f" It is waiting on {noun} {waiting}: answer only {them}."
                raise _decided_before(checkpoint, answered, hint)
            raise HumanResponseError(
                f"This response answers request {response.request_id!r}, but checkpoint "
                f"{checkpoint.id!r} is waiting on {noun} {waiting}. Resume with a request id "
                "from the interruption that produced this checkpoint."
            )
        call_id = request.tool_call.id
        if call_id in answers:
            raise HumanResponseError(
                f"Two responses answer request {request.id!r}; give one per request."
            )
        check_response(request, response)
        if records and any(
            r.tool_call_id == call_id and r.decision.action == "expire" for r in records
        ):
            # An expire() stored its decision and has not finished (it is running, or
            # failed and will be retried): the request is expired, not answered.
            raise HumanRequestExpiredError(
                f"Request {request.id!r} was expired with runtime.expire(), so this "
                "response can no longer be applied; the run goes on without it once the "
                "expiry finishes (retry runtime.expire(...) if it failed).",
                checkpoint_id=checkpoint.id,
                request_id=request.id,
            )
        late = _past_deadline(request, records, now, checkpoint.id)
        if late is not None:
            raise late
        answers[call_id] = _accept(agent, checkpoint, request, response, now)
    return answers


def _past_deadline(
    request: HumanRequest,
    records: Sequence[CallRecord],
    now: Any,
    checkpoint_id: str,
    waits_at: str | None = None,
) -> HumanRequestExpiredError | None:
    """The error for an answer to *request* after its ``expires_at``, or ``None`` if it
    is still in time or one of *records* (its checkpoint's) answered it in time.
    *waits_at* names the checkpoint where it waits, when that is not *checkpoint_id*."""
    expires_at = request.expires_at
    if expires_at is None or now < expires_at:
        return None
    call_id = request.tool_call.id
    if any(record.tool_call_id == call_id for record in records):
        return None
    where = "" if waits_at is None else f" (it waits at checkpoint {waits_at!r})"
    return HumanRequestExpiredError(
        f"Request {request.id!r} expired at {expires_at.isoformat()}, before this response "
        f"came{where}. Record the expiry with runtime.expire(...) or retire the run with "
        "runtime.cancel(...).",
        checkpoint_id=checkpoint_id,
        request_id=request.id,
    )


def _earlier_decision(checkpoint: Checkpoint, request_id: object) -> Decision | None:
    """The decision an earlier checkpoint of the run took on *request_id*, if any."""
    for decision in checkpoint.decisions:
        if decision.request_id == request_id:
            return decision
    return None


def _accept(
    agent: Agent,
    checkpoint: Checkpoint,
    request: HumanRequest,
    response: HumanResponse,
    now: Any,
) -> Decision:
    metadata = response.metadata
    if metadata is not None:
        try:
            _check_json(dict(metadata), "metadata")
        except CheckpointSerializationError as exc:
            raise HumanResponseError(f"HumanResponse {exc}") from None
    if response.action != "approve":
        return _decision(checkpoint, request, response.action, now, response)
    call = request.tool_call
    tool = agent._by_name[call.name]
    edited = response.edited_arguments
    if edited is not None and not tool.allow_edit:
        raise HumanResponseError(
            f"Tool {call.name!r} does not allow edited arguments (allow_edit=False); approve "
            "the call as it is or reject it. The checkpoint is unchanged."
        )
    arguments = call.arguments if edited is None else edited
    problem = tool._check_arguments(arguments)
    if problem is not None:
        if edited is not None:
            raise HumanResponseError(
                f"edited_arguments do not fit tool {call.name!r}: {problem}. Correct them and "
                "resume again; the checkpoint is unchanged."
            )
        raise HumanResponseError(
            f"The arguments of call {call.id!r} no longer fit tool {call.name!r} of the agent "
            f"given to resume(): {problem}. Reject the call, or approve it with "
            "edited_arguments that fit; the checkpoint is unchanged."
        )
    if edited is not None:
        try:
            _check_json(dict(edited), "edited_arguments")
        except CheckpointSerializationError as exc:
            raise HumanResponseError(f"HumanResponse {exc}") from None
    # As the store gives it back (tuples as lists), so a retry with this same response
    # compares equal to the recorded decision.
    return _decision(checkpoint, request, "approve", now, response, json_form(arguments))


def _decision(
    checkpoint: Checkpoint,
    request: HumanRequest,
    action: Any,
    now: Any,
    response: HumanResponse | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> Decision:
    call = request.tool_call
    return _new_decision(
        request_id=request.id,
        checkpoint_id=checkpoint.id,
        tool_call_id=call.id,
        tool_name=call.name,
        kind=request.kind,
        action=action,
        value=None if response is None else response.value,
        arguments=arguments,
        edited=response is not None and response.edited_arguments is not None,
        responded_by=None if response is None else response.responded_by,
        metadata=None
        if response is None or response.metadata is None
        else json_form(response.metadata),
        decided_at=now,
    )


def _check_same(
    checkpoint: Checkpoint, request: HumanRequest, recorded: Decision, given: Decision
) -> None:
    """The first accepted answer is final: refuse a different one."""
    if not recorded.same_answer(given):
        raise HumanResponseConflictError(
            f"Request {request.id!r} was already answered {_by(recorded)}; the first "
            "accepted answer is final. Resume with that same response to continue.",
            checkpoint_id=checkpoint.id,
            request_id=request.id,
            decision=recorded,
        )


def _by(decision: Decision) -> str:
    """How a conflict names the first accepted answer: what it was, and who gave it."""
    return f"with {decision.action!r} (by {decision.responded_by or 'an earlier resume'})"


def _refuse_conflicts(
    checkpoint: Checkpoint, answers: Mapping[str, Decision], records: Sequence[CallRecord]
) -> None:
    """Before claiming: an answer that contradicts a recorded one is refused at once, so
    it never holds the checkpoint away from a right one."""
    if not records or all(answer.action == "expire" for answer in answers.values()):
        return
    known = {record.tool_call_id: record.decision for record in records}
    for request in checkpoint.open_requests:
        call_id = request.tool_call.id
        if call_id in known and call_id in answers:
            _check_same(checkpoint, request, known[call_id], answers[call_id])


async def _continue(
    loop: Loop,
    agent: Agent,
    checkpoint: Checkpoint,
    answers: dict[str, Decision],
    records: Sequence[CallRecord],
    record: Record | None,
    deferred: list[Checkpoint] | None,
    emit: Emit | None = None,
    trace: RunTrace | None = None,
    record_result: Record | None = None,
    held: _Held | None = None,
) -> tuple[RunResult, tuple[Decision, ...]]:
    """Steps 3-5: record the decisions (with *record*), run the approved calls (recording
    each result with *record_result*, by default *record*; each only while *held*, the
    claim, still holds), then interrupt for what is left or continue the run. Returns the
    result and this checkpoint's decisions, oldest first (those an earlier attempt
    recorded, then this one's in call order)."""
    # The common case (a first attempt, nothing answered beside it) skips the building.
    earlier = {known.tool_call_id: known for known in records} if records else {}
    expiring = bool(earlier) and all(answer.action == "expire" for answer in answers.values())
    decided: dict[str, Decision] = {}
    known_results = checkpoint.results
    results = {known.tool_call_id: known for known in known_results} if known_results else {}
    fresh: list[CallRecord] = []
    open_requests = checkpoint.open_requests
    for request in open_requests:
        call_id = request.tool_call.id
        known = earlier.get(call_id)
        answer = answers.get(call_id)
        if known is not None:
            if answer is not None and not expiring:
                _check_same(checkpoint, request, known.decision, answer)
            decided[call_id] = known.decision
            if known.result is not None:
                results[call_id] = known.result
        elif answer is not None:
            decided[call_id] = answer
            if answer.action != "approve":
                answered = results[call_id] = _answer_result(request, answer)
                fresh.append(_new_record(tool_call_id=call_id, decision=answer, result=answered))
            else:
                fresh.append(_new_record(tool_call_id=call_id, decision=answer, result=None))
    to_run: list[tuple[ToolCall, Decision]] = []
    unknown: list[str] = []
    for call_id, decision in decided.items():
        if decision.action != "approve" or call_id in results:
            continue
        if call_id in earlier and not agent._by_name[decision.tool_name].idempotent:
            unknown.append(call_id)  # started by an attempt that never finished
        else:
            to_run.append((_approved_call(checkpoint, call_id, decision), decision))
    if emit is not None:
        # Announced before the decisions are stored: a stream left at this point (each
        # event may wait for its consumer) has stored nothing, so its retry runs the
        # calls as new. Once stored, nothing waits before the handlers start, so a call
        # recorded as approved without a result was cut off inside its handler.
        for call, _ in to_run:
            await emit(ToolCallStarted(call))
    if record is not None and fresh:
        await record(fresh)  # 3. decisions first: the first accepted answer is final
    if earlier:
        # Oldest first, as the store lists them: those an earlier attempt recorded, in
        # the order it recorded them, then this attempt's, in call order.
        ordered = {call_id: decided[call_id] for call_id in earlier if call_id in decided}
        ordered.update(decided)  # a key already there keeps its place
        decided = ordered

    run = RunState(
        agent=agent,
        run_id=checkpoint.run_id,
        messages=checkpoint.messages,
        transcript=list(checkpoint.transcript),
        options=_read_only(checkpoint.options),
        metadata=checkpoint.metadata,
        usage=checkpoint.usage,
        turns=checkpoint.turns,
        emit=emit,
        decisions=checkpoint.decisions + tuple(decided.values()),
    )
    run.deferred = deferred
    run.trace = trace
    if record_result is None:
        record_result = record
    if len(to_run) == 1:  # 4. run the approved calls, recording each result
        await _run_approved(run, *to_run[0], results, record_result, held)
    elif to_run:
        # A failure (a lost lease, a store error) stops the others and is raised as
        # itself, as with one call, not wrapped in an exception group.
        await side_by_side(
            [
                partial(_run_approved, run, call, decision, results, record_result, held)
                for call, decision in to_run
            ]
        )

    pending: list[ToolCall] = []
    requests: list[HumanRequest] = []
    if unknown or len(decided) < len(checkpoint.pending_tool_calls):
        now = loop.clock()
        for request in open_requests:
            call_id = request.tool_call.id
            if call_id in unknown:
                call = _approved_call(checkpoint, call_id, decided[call_id])
                tool = agent._by_name[call.name]
                request = make_request(new_id("req"), call, tool, now, outcome_unknown=True)
            elif call_id in decided:
                continue
            pending.append(request.tool_call)
            requests.append(request)
    if pending:
        result = await loop.interrupt(run, results, pending, requests)
    else:
        append_results(run, results)
        result = await loop.drive(run)  # 5. ordinary turns from here
    return result, tuple(decided.values())


def _read_only(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The resumed run's options, read-only like a new run's, so an adapter cannot change
    the stored checkpoint through them."""
    return options if type(options) is ReadOnlyDict else ReadOnlyDict(options)


def _approved_call(checkpoint: Checkpoint, call_id: str, decision: Decision) -> ToolCall:
    # check_integrity guarantees the decided call is pending (next() would say otherwise).
    call = next(call for call in checkpoint.pending_tool_calls if call.id == call_id)
    if not decision.edited or decision.arguments is None:
        return call  # the call as the model made it (the decision holds its JSON form)
    return ToolCall(call.id, call.name, decision.arguments)


def _answer_result(request: HumanRequest, decision: Decision) -> ToolResult:
    if decision.action == "expire":
        return ToolResult(request.tool_call.id, EXPIRY_MESSAGE, True)
    response = decision.as_response()
    assert response is not None
    return answer_result(request, response)


async def _run_approved(
    run: RunState,
    call: ToolCall,
    decision: Decision,
    results: dict[str, ToolResult],
    record: Record | None,
    held: _Held | None = None,
) -> None:
    tool = run.agent._by_name[call.name]
    if held is not None:
        await held.check()  # never start an approved handler under a lost claim
    result = await run_tool(
        run, call, tool, call.arguments, report=False, announce=False, edited=decision.edited
    )
    results[call.id] = result
    # The result is recorded before anything else can be awaited (a cancellation may be
    # waiting since the handler ran), then reported: a retry never runs the call again.
    if record is not None:
        try:
            await record([_new_record(tool_call_id=call.id, decision=decision, result=result)])
        except ResumeError:  # about the claim (a lost lease, say): the store's own words
            raise
        except Exception as exc:
            then = (
                "runs it again with the same idempotency key (the tool is idempotent)"
                if tool.idempotent
                else "asks a person whether to run it again (outcome_unknown)"
            )
            raise ResultNotRecordedError(
                f"Tool {call.name!r} finished (call {call.id!r}), but the store could not "
                f"record its result: {type(exc).__name__}: {exc}. The call stays recorded "
                f"as started, so resuming again {then}. The handler's result is on this "
                "error's `result`.",
                tool_call_id=call.id,
                result=result,
            ) from exc
    if run.emit is not None:
        await run.emit(ToolCallFinished(call, result))


async def _record_then_stop_if_cancelled(record: Record, records: Sequence[CallRecord]) -> None:
    """*record*, then raise the cancellation if one came meanwhile: the approved handlers
    that would start next must not start for a caller who has gone."""
    await record(records)
    await anyio.lowlevel.checkpoint_if_cancelled()


async def _record_to_the_end(record: Record, records: Sequence[CallRecord]) -> None:
    """*record*, which no cancellation can stop halfway or before it starts."""
    await to_the_end(partial(record, records))


class _Held:
    """The claim a resume holds, and until when it surely holds by this process's clock:
    the store started the lease after *claimed_after*, and restarts it after each
    renewal began."""

    __slots__ = ("checkpoint_id", "lease", "store", "token", "until")

    def __init__(
        self,
        store: DurableCheckpointStore,
        checkpoint_id: str,
        token: str,
        lease: float,
        claimed_after: float,
    ) -> None:
        self.store = store
        self.checkpoint_id = checkpoint_id
        self.token = token
        self.lease = lease
        self.until = claimed_after + lease

    async def renew(self) -> None:
        began = anyio.current_time()
        await self.store.renew(self.checkpoint_id, self.token)
        self.until = began + self.lease

    async def check(self) -> None:
        """Make sure the claim holds before an approved handler starts. Renewals come
        every third of the lease; one overdue by a third more means this process was
        paused or its event loop blocked (a VM freeze, a long GC pause), long enough for
        the lease to run out and another resume to take over and run the call. Renewing
        now says which: :class:`~runlet.LeaseLostError` if the claim is gone."""
        if anyio.current_time() >= self.until - self.lease / 3:
            await self.renew()


async def _holding_lease(
    held: _Held,
    work: Awaitable[tuple[RunResult, tuple[Decision, ...]]],
    resolve: Callable[[RunResult, tuple[Decision, ...]], Awaitable[None]],
) -> RunResult:
    """Await *work*, then ``resolve(*outcome)``, while a background task renews the claim
    every third of the lease; if the claim is lost during the work, stop it and raise
    :class:`~runlet.LeaseLostError`. Returns the work's result.

    The resolve runs before the renewals stop: ending their task is where a cancellation
    that came meanwhile (a deadline passed during the last turn) is delivered, and it
    must find the outcome stored, not throw the finished run away. During the resolve
    the renewals only keep the lease: the resolve's own token check says whether the
    claim still holds, and a renewal refused because the resolve just retired the token
    is no loss."""
    lease = held.lease
    lost: list[LeaseLostError] = []
    outcome: list[tuple[RunResult, tuple[Decision, ...]]] = []
    failure: list[BaseException] = []
    done = anyio.Event()
    renewing = [False]
    resolving = [False]

    async def keep(scope: anyio.CancelScope) -> None:
        while True:
            # Waiting for the work's end, rather than sleeping until cancelled, lets the
            # task end without a cancellation: ~20 µs less per resume, more in context.
            with anyio.move_on_after(lease / 3):
                await done.wait()
                return
            renewing[0] = True
            try:
                await held.renew()
            except LeaseLostError as exc:
                if not resolving[0]:
                    lost.append(exc)
                    scope.cancel()
                return
            except Exception as exc:  # noqa: BLE001 - a passing fault; the next renewal retries
                log.warning(
                    "Renewing the claim on checkpoint %r failed (%s); retrying in %.3g s. "
                    "The claim lasts %.3g s from the last renewal that worked: if renewals "
                    "keep failing that long, another resume can take it over.",
                    held.checkpoint_id,
                    described(exc),
                    lease / 3,
                    lease,
                )
                continue
            except BaseException as exc:
                if is_cancellation(exc):
                    raise
                # A KeyboardInterrupt or SystemExit: raised below as itself, before all
                # else, not from this task inside an exception group.
                failure.append(exc)
                scope.cancel()
                return
            finally:
                renewing[0] = False

    async with anyio.create_task_group() as group:
        group.start_soon(keep, group.cancel_scope)
        try:
            outcome.append(await work)
            resolving[0] = True
            await resolve(*outcome[0])
        except BaseException as exc:
            if is_cancellation(exc):  # a lost lease's, the caller's: the group handles it
                raise
            failure.append(exc)
        done.set()
        if renewing[0]:  # do not wait for a renewal that is no longer needed
            group.cancel_scope.cancel()
    for each in failure:  # a KeyboardInterrupt or SystemExit goes before all else
        if not isinstance(each, Exception):
            raise each
    if lost:
        raise lost[0]
    if failure:
        raise failure[0]
    return outcome[0][0]


async def _repeated(trace: RunTrace | None, emit: Emit | None, result: RunResult) -> RunResult:
    """*result*, served again from the stored outcome; marked so on the span. A stream
    gets the interruption it reports again, as the first time (a client that lost the
    first stream learns of the next approval from the repeat)."""
    if trace is not None:
        trace.repeated(result)
    if emit is not None and result.interruption is not None and result.checkpoint_id:
        await emit(Interrupted(result.interruption, result.checkpoint_id, result.pending_requests))
    return result


async def _repeat(
    loop: Loop,
    store: DurableCheckpointStore,
    checkpoint: Checkpoint,
    resolution: Resolution | None,
    responses: Sequence[HumanResponse] | None,
) -> RunResult:
    """A resolved *checkpoint*: the stored result for the same answer, else a clear
    error."""
    checkpoint_id = checkpoint.id
    if resolution is None:  # pragma: no cover - a store must keep the outcome
        raise CheckpointResolvedError(
            f"Checkpoint {checkpoint_id!r} was resolved, but its store kept no outcome.",
            checkpoint_id=checkpoint_id,
        )
    decisions = {decision.request_id: decision for decision in resolution.decisions}
    if responses is None:
        # An expire() resolved it: the same call gets the same result. (Only expire()
        # decides "expire"; the flag also covers one that met only answers recorded by an
        # earlier attempt that died, and data stored before the flag existed.)
        if resolution.expired or any(d.action == "expire" for d in decisions.values()):
            return resolution.result
        raise CheckpointResolvedError(
            f"Checkpoint {checkpoint_id!r} was already answered, so it cannot expire.",
            checkpoint_id=checkpoint_id,
            resolution=resolution,
        )
    for response in responses:
        if type(response) is not HumanResponse and not isinstance(response, HumanResponse):
            raise HumanResponseError(
                f"resume() needs a HumanResponse, got {type(response).__name__}."
            )
        decision = decisions.get(response.request_id)
        if decision is not None and decision.answers_like(response):
            continue
        if decision is None:  # decided before this checkpoint, perhaps
            decision = _earlier_decision(checkpoint, response.request_id)
            if decision is not None and decision.action != "expire":
                raise _decided_before(checkpoint, decision)
        if decision is not None and decision.action == "expire":
            raise _expired_before(checkpoint_id, decision.request_id)
        later = resolution.result.checkpoint_id
        if decision is None and later is not None:  # perhaps decided, or open, later on
            raise await _not_decided_here(loop, store, checkpoint_id, response, later)
        if decision is not None:  # this checkpoint's resume answered it differently
            raise HumanResponseConflictError(
                f"Request {decision.request_id!r} was already answered {_by(decision)}, and "
                f"checkpoint {checkpoint_id!r} was resolved with that answer; the first "
                "accepted answer is final. Only that same response (the same action, "
                "values and responder) gets its stored result again.",
                checkpoint_id=checkpoint_id,
                request_id=decision.request_id,
                decision=decision,
            )
        raise HumanResponseConflictError(
            f"Checkpoint {checkpoint_id!r} was already resolved with other answers (the first "
            "accepted answer is final). Repeat the original response to get its result "
            "again.",
            checkpoint_id=checkpoint_id,
            request_id=response.request_id,
        )
    return resolution.result


def _decided_before(
    checkpoint: Checkpoint, decision: Decision, hint: str = ""
) -> HumanResponseConflictError:
    """The error for a response to a request an earlier checkpoint of the run decided."""
    return HumanResponseConflictError(
        f"Request {decision.request_id!r} was already answered {_by(decision)} at "
        f"checkpoint {decision.checkpoint_id!r}, before checkpoint {checkpoint.id!r}; the "
        f"first accepted answer is final.{hint}",
        checkpoint_id=checkpoint.id,
        request_id=decision.request_id,
        decision=decision,
    )


# How many checkpoints of a run _not_decided_here follows: far more than any run stops for.
_MOST_HOPS = 1_000


async def _not_decided_here(
    loop: Loop,
    store: DurableCheckpointStore,
    checkpoint_id: str,
    response: HumanResponse,
    later: str,
) -> HumanResponseError:
    """The error for *response* to resolved *checkpoint_id*, which neither it nor an
    earlier checkpoint decided: follow the run from *later*, its next checkpoint, to
    where the request is open now (other resumes may have moved it on since) or was
    decided, and say so."""
    request_id = response.request_id

    def conflict(
        what: str, next_checkpoint_id: str | None = None, decision: Decision | None = None
    ) -> HumanResponseError:
        return HumanResponseConflictError(
            f"Checkpoint {checkpoint_id!r} was resolved without an answer to request "
            f"{request_id!r}; {what}",
            checkpoint_id=checkpoint_id,
            request_id=request_id,
            next_checkpoint_id=next_checkpoint_id,
            decision=decision,
        )

    where = later
    for _ in range(_MOST_HOPS):
        try:
            stored = await store.get(where)
        except CheckpointNotFoundError:  # deleted or forgotten since: say so
            return conflict(
                f"the run went on to checkpoint {where!r}, which this store no longer has."
            )
        if stored.status == "cancelled":
            return conflict(
                f"the run was cancelled at checkpoint {where!r}, so it can no longer be answered."
            )
        resolution = stored.resolution
        if stored.status != "resolved" or resolution is None:  # pending or claimed
            requests = stored.checkpoint.open_requests
            request = next((r for r in requests if r.id == request_id), None)
            if request is None:
                break  # not a request of this run's: a wrong id
            late = _past_deadline(request, stored.records, loop.clock(), checkpoint_id, where)
            if late is not None:
                return late
            return conflict(
                f"it is still open at checkpoint {where!r}. Resume that checkpoint with this "
                "response.",
                where,
            )
        decided = next((d for d in resolution.decisions if d.request_id == request_id), None)
        if decided is not None and decided.action == "expire":
            return _expired_before(checkpoint_id, request_id)
        if decided is not None and decided.answers_like(response):
            return conflict(
                f"this same response was accepted at checkpoint {where!r}. Resume that "
                "checkpoint with it to get its result again.",
                where,
                decided,
            )
        if decided is not None:
            return conflict(
                f"it was answered {_by(decided)} at checkpoint {where!r}, and the first "
                "accepted answer is final.",
                decision=decided,
            )
        next_id = resolution.result.checkpoint_id
        if next_id is None:
            break  # the run completed without it: a wrong id
        where = next_id
    return HumanResponseConflictError(
        f"Checkpoint {checkpoint_id!r} was already resolved with other answers (the first "
        f"accepted answer is final); the run went on to checkpoint {later!r}. Repeat the "
        "original response to get its result again.",
        checkpoint_id=checkpoint_id,
        request_id=request_id,
    )


def _expired_before(checkpoint_id: str, request_id: str) -> HumanRequestExpiredError:
    return HumanRequestExpiredError(
        f"Request {request_id!r} expired and the run went on without an answer; this "
        "response can no longer be applied.",
        checkpoint_id=checkpoint_id,
        request_id=request_id,
    )


def _check_agent(agent: Agent, checkpoint: Checkpoint) -> None:
    if agent.name != checkpoint.agent_name:
        raise MissingToolError(
            f"Checkpoint {checkpoint.id!r} belongs to agent {checkpoint.agent_name!r}, but "
            f"resume() was given agent {agent.name!r}. Resume with the agent that was "
            "interrupted.",
            checkpoint_id=checkpoint.id,
            tool_name=None,
        )
    for index, request in enumerate(checkpoint.open_requests):
        call = request.tool_call
        tool = agent._by_name.get(call.name)
        if tool is None:
            raise MissingToolError(
                f"Checkpoint {checkpoint.id!r} has a pending call of tool {call.name!r}, but "
                f"the agent given to resume() has no such tool. Add the tool to agent "
                f"{agent.name!r}.",
                checkpoint_id=checkpoint.id,
                tool_name=call.name,
            )
        if (request.kind == "approval") is is_ask_human(tool):
            # The call's tool asks a question but the request wants a yes, or the other
            # way round: answering it would not mean what the person was asked.
            path = "request" if index == 0 else f"more_requests[{index - 1}]"
            raise CheckpointSerializationError(
                f"This checkpoint does not hang together: {path} is a {request.kind!r} "
                f"request for a call of tool {call.name!r}, which "
                f"{'asks a question' if is_ask_human(tool) else 'needs an approval'}. It "
                "was altered or written by a broken store; it cannot be resumed safely.",
                path=f"{path}.kind",
            )
