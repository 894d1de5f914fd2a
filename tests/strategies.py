"""Hypothesis strategies for Runlet's plain data: JSON values, messages, checkpoints."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from runlet import (
    Checkpoint,
    HumanOption,
    HumanRequest,
    HumanRequestKind,
    Message,
    ReasoningPart,
    ToolCall,
    ToolResult,
    Usage,
)

__all__ = [
    "checkpoints",
    "human_options",
    "json_objects",
    "json_values",
    "messages",
    "not_json",
    "reasoning_parts",
    "tool_calls",
    "transcripts",
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


@st.composite
def checkpoints(
    draw: st.DrawFn,
    *,
    metadata: st.SearchStrategy[dict[str, Any]] = json_objects,
    options: st.SearchStrategy[dict[str, Any]] = json_objects,
) -> Checkpoint:
    """Checkpoints with arbitrary JSON metadata, options, transcripts and requests."""
    pending = draw(st.lists(tool_calls, min_size=1, max_size=3).map(tuple))
    return Checkpoint(
        id=draw(ids),
        run_id=draw(ids),
        agent_name=draw(texts),
        messages=draw(transcripts),
        options=draw(options),
        metadata=draw(metadata),
        transcript=draw(transcripts),
        results=draw(st.lists(tool_results, max_size=3).map(tuple)),
        pending_tool_calls=pending,
        request=HumanRequest(
            draw(ids),
            draw(st.sampled_from(_KINDS)),
            draw(texts),
            draw(human_options),
            tool_call=pending[0],
        ),
        usage=draw(
            st.builds(
                Usage,
                _counts,
                _counts,
                _counts,
                cache_read_tokens=_counts,
                cache_write_tokens=_counts,
            )
        ),
        turns=draw(_counts),
    )
