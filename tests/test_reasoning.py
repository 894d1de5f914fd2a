"""Reasoning on messages, prompt-cache counts in usage, and how both survive checkpoints
and streams (the adapters' side is in the provider tests)."""

from __future__ import annotations

import json
import typing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from strategies import reasoning_parts

from runlet import (
    CHECKPOINT_VERSION,
    Agent,
    Checkpoint,
    ConfigurationError,
    HumanRequest,
    Message,
    ModelRequest,
    ModelResponse,
    ModelStreamItem,
    ReasoningDelta,
    ReasoningPart,
    Runtime,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
    structure_checkpoint,
    unstructure_checkpoint,
)

DATA = Path(__file__).parent / "data"
SIGNED = ReasoningPart("Think first.", signature="sig==", provider="anthropic")


class TestReasoningPart:
    def test_defaults(self) -> None:
        part = ReasoningPart()
        assert (part.text, part.signature, part.redacted_data, part.provider) == (
            "",
            None,
            None,
            None,
        )
        assert not part.redacted

    def test_redacted(self) -> None:
        assert ReasoningPart(redacted_data="E==", provider="anthropic").redacted

    def test_empty_redacted_data_is_still_redacted(self) -> None:
        # A redacted_thinking block whose data is empty is still a redacted block: it
        # has no readable text, and the Anthropic adapter sends it back as one.
        part = ReasoningPart(redacted_data="", provider="anthropic")
        assert part.redacted
        message = Message.assistant("", [ToolCall("c", "t", {})], reasoning=[part])
        data = json.loads(json.dumps(unstructure_checkpoint(checkpoint_with(message, Usage()))))
        assert structure_checkpoint(data).transcript[1].reasoning[0].redacted

    def test_only_the_text_is_positional(self) -> None:
        with pytest.raises(TypeError):
            ReasoningPart("text", "signature")  # type: ignore[call-arg]

    @pytest.mark.parametrize(
        "kwargs", [{"text": None}, {"signature": b"sig"}, {"redacted_data": 1}, {"provider": 2}]
    )
    def test_fields_are_text(self, kwargs: dict[str, Any]) -> None:
        (name,) = kwargs
        with pytest.raises(ConfigurationError, match=f"ReasoningPart.{name} must be a str"):
            ReasoningPart(**kwargs)

    def test_frozen(self) -> None:
        with pytest.raises(AttributeError):
            SIGNED.text = "changed"  # type: ignore[misc]


class TestMessageReasoning:
    def test_empty_by_default(self) -> None:
        assert Message.assistant("Hi").reasoning == ()
        assert Message.user("Hi").reasoning == ()

    def test_assistant_takes_reasoning_and_keeps_its_old_signature(self) -> None:
        call = ToolCall("c1", "t", {})
        message = Message.assistant("Hi", [call], reasoning=[SIGNED])
        assert message.reasoning == (SIGNED,)
        assert message.tool_calls == (call,)
        assert Message.assistant("Hi", [call]) == Message("assistant", "Hi", (call,))

    def test_reasoning_is_keyword_only_and_a_tuple(self) -> None:
        message = Message("assistant", "", reasoning=[SIGNED])
        assert type(message.reasoning) is tuple
        assert message != Message.assistant("")

    def test_reasoning_is_not_content(self) -> None:
        assert Message.assistant("Answer.", reasoning=[SIGNED]).content == "Answer."


class TestUsage:
    def test_cache_counts_add_up(self) -> None:
        total = Usage(10, 2, 1, cache_read_tokens=8) + Usage(
            20, 3, 1, cache_read_tokens=5, cache_write_tokens=7
        )
        assert total == Usage(30, 5, 2, cache_read_tokens=13, cache_write_tokens=7)

    def test_adds_only_usage(self) -> None:
        with pytest.raises(TypeError):
            Usage() + 1  # type: ignore[operator]

    def test_cache_counts_default_to_zero_and_are_keyword_only(self) -> None:
        assert (Usage().cache_read_tokens, Usage().cache_write_tokens) == (0, 0)
        with pytest.raises(TypeError):
            Usage(1, 2, 3, 4)  # type: ignore[call-arg]


def checkpoint_with(message: Message, usage: Usage) -> Checkpoint:
    call = message.tool_calls[0]
    return Checkpoint(
        id="cp",
        run_id="run",
        agent_name="a",
        messages=(Message.user("Hi"),),
        options={},
        metadata={},
        transcript=(Message.user("Hi"), message),
        pending_tool_calls=(call,),
        request=HumanRequest("r1", "approval", "Allow?", tool_call=call),
        usage=usage,
    )


class TestCheckpoints:
    def test_reasoning_and_cache_counts_round_trip_through_json(self) -> None:
        message = Message.assistant(
            "",
            [ToolCall("c1", "refund", {"order_id": "1"})],
            reasoning=[SIGNED, ReasoningPart(redacted_data="E==", provider="anthropic")],
        )
        usage = Usage(100, 5, 1, cache_read_tokens=60, cache_write_tokens=30)
        checkpoint = checkpoint_with(message, usage)
        data = json.loads(json.dumps(unstructure_checkpoint(checkpoint)))
        assert data["transcript"][1]["reasoning"] == [
            {"text": "Think first.", "signature": "sig==", "provider": "anthropic"},
            {"redacted_data": "E==", "provider": "anthropic"},
        ]
        assert data["usage"] == {
            "input_tokens": 100,
            "output_tokens": 5,
            "requests": 1,
            "cache_read_tokens": 60,
            "cache_write_tokens": 30,
        }
        assert structure_checkpoint(data) == checkpoint

    def test_left_out_when_empty(self) -> None:
        message = Message.assistant("", [ToolCall("c1", "refund", {})])
        data = unstructure_checkpoint(checkpoint_with(message, Usage(1, 2, 1)))
        assert "reasoning" not in json.dumps(data)
        assert data["usage"] == {"input_tokens": 1, "output_tokens": 2, "requests": 1}

    def test_the_golden_checkpoint_is_unchanged(self) -> None:
        # Written before reasoning and cache counts existed: they add nothing to it.
        path = DATA / f"checkpoint-v{CHECKPOINT_VERSION}.json"
        golden = json.loads(path.read_text(encoding="utf-8"))
        assert unstructure_checkpoint(structure_checkpoint(golden)) == golden

    @pytest.mark.parametrize(
        "bad",
        [{"text": 1}, {"signature": False}, {"text": "x", "mood": "calm"}, "text"],
        ids=["text-not-str", "signature-not-str", "unknown-key", "not-an-object"],
    )
    def test_malformed_reasoning_is_refused(self, bad: Any) -> None:
        message = Message.assistant("", [ToolCall("c1", "refund", {})], reasoning=[SIGNED])
        data = unstructure_checkpoint(checkpoint_with(message, Usage()))
        data["transcript"][1]["reasoning"] = [bad]
        with pytest.raises(Exception, match=r"transcript.*reasoning") as info:
            structure_checkpoint(data)
        assert type(info.value).__name__ == "CheckpointSerializationError"

    @given(reasoning_parts)
    def test_any_part_round_trips(self, part: ReasoningPart) -> None:
        message = Message.assistant("", [ToolCall("c", "t", {})], reasoning=[part])
        checkpoint = checkpoint_with(message, Usage())
        data = json.loads(json.dumps(unstructure_checkpoint(checkpoint)))
        assert structure_checkpoint(data).transcript[1].reasoning == (part,)


def test_reasoning_delta_is_a_stream_event_and_item() -> None:
    assert ReasoningDelta in typing.get_args(StreamEvent)
    assert ReasoningDelta in typing.get_args(ModelStreamItem)
    assert ReasoningDelta("a") != TextDelta("a")  # type: ignore[comparison-overlap]


class ThinkingModel:
    """A streaming model that thinks aloud before it answers."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the runtime streams from a model that can")  # pragma: no cover

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelStreamItem]]:
        yield self._items()

    async def _items(self) -> AsyncIterator[ModelStreamItem]:
        yield ReasoningDelta("Think ")
        yield ReasoningDelta("first.")
        yield TextDelta("Answer.")
        reasoning = [ReasoningPart("Think first.", provider="mine")]
        yield ModelResponse(Message.assistant("Answer.", reasoning=reasoning), Usage(requests=1))


@pytest.mark.anyio
async def test_runtime_stream_hands_reasoning_deltas_to_the_consumer() -> None:
    agent = Agent("thinker", "Think.", ThinkingModel())
    async with Runtime().stream(agent, "Hi") as stream:
        events = [event async for event in stream]
    assert events[:3] == [ReasoningDelta("Think "), ReasoningDelta("first."), TextDelta("Answer.")]
    assert stream.result.output == "Answer."
    assert stream.result.transcript[-1].reasoning == (
        ReasoningPart("Think first.", provider="mine"),
    )
