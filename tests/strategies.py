"""Hypothesis strategies for Runlet's plain data: JSON values, messages, checkpoints."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import strategies as st

from runlet import (
    Checkpoint,
    Decision,
    HumanOption,
    HumanRequest,
    HumanRequestKind,
    HumanResponse,
    Interrupted,
    Message,
    MessageCompleted,
    PendingRequest,
    ReasoningDelta,
    ReasoningPart,
    RunFinished,
    RunResult,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolResult,
    Usage,
)

__all__ = [
    "checkpoints",
    "decisions",
    "event_strategies",
    "human_options",
    "human_requests",
    "human_responses",
    "json_objects",
    "json_values",
    "messages",
    "not_json",
    "reasoning_parts",
    "pending_requests",
    "run_results",
    "stream_events",
    "times",
    "tool_calls",
    "tool_results",
    "transcripts",
    "usages",
]

texts = st.text(max_size=20)
ids = st.text(min_size=1, max_size=12)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)

json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)
"""Any value ``json.dumps`` writes and ``json.loads`` reads back equal."""

json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(texts, json_values, max_size=5)
"""JSON objects: what metadata, options and tool arguments hold."""


class Opaque:
    """A value no JSON encoder knows."""


not_json: st.SearchStrategy[Any] = st.sampled_from(
    [float("nan"), float("inf"), {1, 2}, b"bytes", 1j, Opaque()]
)
"""Values that are not JSON-compatible (each refused wherever it appears)."""

tool_calls = st.builds(ToolCall, id=ids, name=ids, arguments=json_objects)
tool_results = st.builds(ToolResult, tool_call_id=ids, content=texts, is_error=st.booleans())

reasoning_parts = st.builds(
    ReasoningPart,
    texts,
    signature=st.none() | texts,
    redacted_data=st.none() | texts,
    provider=st.none() | st.sampled_from(["anthropic", "openai"]) | texts,
    calls_before=st.integers(min_value=0, max_value=3),
)
"""Reasoning as any adapter might keep it."""

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Message.system, texts),
    st.builds(Message.user, texts),
    st.builds(
        Message.assistant,
        texts,
        st.lists(tool_calls, max_size=3),
        reasoning=st.lists(reasoning_parts, max_size=2),
    ),
    st.builds(Message.tool, tool_results),
)

transcripts = st.lists(messages, max_size=6).map(tuple)

human_options = st.lists(
    st.builds(HumanOption, id=ids, label=texts, description=st.none() | texts), max_size=4
).map(tuple)

_KINDS: tuple[HumanRequestKind, ...] = ("approval", "choice", "input")
_counts = st.integers(min_value=0, max_value=2**40)
usages = st.builds(
    Usage,
    _counts,
    _counts,
    _counts,
    cache_read_tokens=_counts,
    cache_write_tokens=_counts,
)


times = st.datetimes(
    min_value=datetime.datetime(2000, 1, 1),
    max_value=datetime.datetime(2100, 1, 1),
    timezones=st.just(datetime.timezone.utc),
)
"""Aware UTC times, as Runlet records them."""

decisions = st.builds(
    Decision,
    request_id=ids,
    checkpoint_id=ids,
    tool_call_id=ids,
    tool_name=ids,
    kind=st.sampled_from(_KINDS),
    action=st.sampled_from(["approve", "reject", "select", "submit", "expire"]),
    value=st.none() | texts,
    arguments=st.none() | json_objects,
    edited=st.booleans(),
    responded_by=st.none() | texts,
    metadata=st.none() | json_objects,
    decided_at=times,
)


@st.composite
def checkpoints(
    draw: st.DrawFn,
    *,
    metadata: st.SearchStrategy[dict[str, Any]] = json_objects,
    options: st.SearchStrategy[dict[str, Any]] = json_objects,
) -> Checkpoint:
    """Checkpoints that hang together (the last assistant message's calls are each either
    answered or pending with one open request), with arbitrary JSON metadata, options,
    earlier transcript, requests and decisions."""
    calls = draw(st.lists(tool_calls, min_size=1, max_size=4, unique_by=lambda c: c.id))
    waiting = draw(st.lists(st.booleans(), min_size=len(calls), max_size=len(calls)))
    waiting[draw(st.integers(0, len(calls) - 1))] = True
    # A request asks what its call asks: an approval offers no options; a question is an
    # ask_human call whose arguments hold its kind, prompt and options.
    asked: dict[str, tuple[str, str, tuple[HumanOption, ...]]] = {}
    for index, (c, wait) in enumerate(zip(calls, waiting, strict=True)):
        kind = draw(st.sampled_from(_KINDS))
        if not wait or kind == "approval":
            asked[c.id] = ("approval", draw(texts), ())
            continue
        prompt = draw(texts)
        offered = draw(human_options) if kind == "choice" else ()
        arguments: dict[str, Any] = {"kind": kind, "prompt": prompt}
        if offered:
            arguments["options"] = [
                {"id": o.id, "label": o.label}
                | ({} if o.description is None else {"description": o.description})
                for o in offered
            ]
        calls[index] = ToolCall(c.id, "ask_human", arguments)
        asked[c.id] = (kind, prompt, offered)
    pending = tuple(c for c, wait in zip(calls, waiting, strict=True) if wait)
    results = tuple(
        ToolResult(c.id, draw(texts), draw(st.booleans()))
        for c, wait in zip(calls, waiting, strict=True)
        if not wait
    )
    request_ids = draw(st.lists(ids, min_size=len(pending), max_size=len(pending), unique=True))
    requests = [
        HumanRequest(
            request_id,
            *asked[c.id],
            tool_call=c,
            created_at=draw(times),
            expires_at=draw(st.none() | times),
            outcome_unknown=draw(st.booleans()),
        )
        for request_id, c in zip(request_ids, pending, strict=True)
    ]
    transcript = (*draw(transcripts), Message.assistant(draw(texts), calls))
    return Checkpoint(
        id=draw(ids),
        run_id=draw(ids),
        agent_name=draw(texts),
        messages=draw(transcripts),
        options=draw(options),
        metadata=draw(metadata),
        transcript=transcript,
        results=results,
        pending_tool_calls=pending,
        request=requests[0],
        more_requests=tuple(requests[1:]),
        decisions=tuple(draw(st.lists(decisions, max_size=2))),
        usage=draw(usages),
        turns=draw(_counts),
    )


human_requests: st.SearchStrategy[HumanRequest] = st.builds(
    HumanRequest,
    ids,
    st.sampled_from(_KINDS),
    texts,
    human_options,
    tool_call=tool_calls,
    created_at=times,
    expires_at=st.none() | times,
    outcome_unknown=st.booleans(),
)
"""Requests of every kind, with arbitrary times and tool calls."""

_who = {"responded_by": st.none() | texts, "metadata": st.none() | json_objects}

human_responses: st.SearchStrategy[HumanResponse] = st.one_of(
    st.builds(HumanResponse, ids, st.just("approve"), st.none(), st.none() | json_objects, **_who),
    st.builds(HumanResponse, ids, st.just("reject"), st.none() | texts, **_who),
    st.builds(HumanResponse, ids, st.sampled_from(["select", "submit"]), texts, **_who),
)
"""Every valid shape of response: approve (edited or not), reject (with or without a
reason), select and submit, each with or without responder and metadata."""

pending_requests: st.SearchStrategy[PendingRequest] = st.builds(
    PendingRequest,
    ids,
    ids,
    texts,
    human_requests,
    json_objects,
    times,
    st.lists(human_requests, max_size=2).map(tuple),
)


@st.composite
def run_results(draw: st.DrawFn) -> RunResult:
    """Completed and interrupted results, with transcripts, usage and decisions."""
    common: dict[str, Any] = {
        "transcript": draw(transcripts),
        "usage": draw(usages),
        "run_id": draw(ids),
        "decisions": tuple(draw(st.lists(decisions, max_size=2))),
    }
    if draw(st.booleans()):
        return RunResult(status="completed", output=draw(texts), **common)
    pending = tuple(draw(st.lists(human_requests, min_size=1, max_size=3)))
    return RunResult(
        status="interrupted",
        interruption=pending[0],
        checkpoint_id=draw(ids),
        pending_requests=pending,
        **common,
    )


event_strategies: dict[type[Any], st.SearchStrategy[Any]] = {
    TextDelta: st.builds(TextDelta, texts),
    ReasoningDelta: st.builds(ReasoningDelta, texts),
    ToolCallDelta: st.builds(
        ToolCallDelta, st.integers(0, 64), st.none() | ids, st.none() | ids, st.text(max_size=20)
    ),
    MessageCompleted: st.builds(MessageCompleted, messages),
    ToolCallStarted: st.builds(ToolCallStarted, tool_calls),
    ToolCallFinished: st.builds(ToolCallFinished, tool_calls, tool_results),
    Interrupted: st.builds(Interrupted, human_requests, ids),
    RunFinished: st.builds(RunFinished, run_results()),
}
"""One strategy per member of :data:`runlet.StreamEvent` (a test checks none is missing)."""

stream_events: st.SearchStrategy[StreamEvent] = st.one_of(*event_strategies.values())
"""Any stream event."""
