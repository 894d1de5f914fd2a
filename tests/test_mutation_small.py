"""From a mutation review of the small modules (_messages, _agent, _model, _errors,
_result, _events, _json, providers/_retry, testing/_scripted): behaviour the documentation
promises that no other test pinned down."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from runlet import (
    Agent,
    ConfigurationError,
    HumanRequest,
    Interrupted,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    RunResult,
    StreamingModel,
    ToolCall,
    ToolResult,
    Usage,
    structure,
    unstructure,
)
from runlet.providers import RetryPolicy
from runlet.providers.anthropic import AnthropicModel
from runlet.providers.openai import OpenAIChatModel
from runlet.testing import ScriptedModel, call


class TestAgent:
    def test_a_model_without_complete_is_refused_saying_what_to_use(self) -> None:
        with pytest.raises(ConfigurationError) as info:
            Agent("a", "i", object())  # type: ignore[arg-type]
        message = str(info.value)
        assert "runlet.providers" in message
        assert "runlet.testing.ScriptedModel" in message


class PlainModel:
    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(Message.assistant("Hi."))


class TestModelProtocols:
    def test_a_model_adapter_is_an_instance_of_model(self) -> None:
        assert isinstance(PlainModel(), Model)
        assert isinstance(ScriptedModel([]), Model)
        assert not isinstance(object(), Model)

    def test_only_a_model_with_stream_is_a_streaming_model(self) -> None:
        assert isinstance(ScriptedModel([]), StreamingModel)
        assert not isinstance(PlainModel(), StreamingModel)


class TestRunResult:
    def test_an_interrupted_result_built_without_output_has_none(self) -> None:
        result = RunResult(status="interrupted", transcript=(), usage=Usage(), run_id="r")
        assert (None, None, None) == (result.output, result.interruption, result.checkpoint_id)

    def test_a_stored_result_without_output_reads_back_as_none(self) -> None:
        # The JSON form leaves out fields at their default; data written that way (by any
        # release) must read back as it was written.
        data: dict[str, Any] = {
            "status": "interrupted",
            "transcript": [],
            "usage": {},
            "run_id": "r",
        }
        result = structure(data, RunResult)
        assert result.output is None
        assert data == unstructure(result)


class TestScriptedCalls:
    def test_tuples_nested_in_an_object_argument_become_lists(self) -> None:
        # As a real model's JSON gives them, so the call survives a JSON round trip equal.
        made = call("ship", id="c1", order={"ids": (1, 2), "lines": [{"sku": ("a", "b")}]})
        assert {"order": {"ids": [1, 2], "lines": [{"sku": ["a", "b"]}]}} == made.arguments
        assert made == structure(unstructure(made), ToolCall)


OK_COMPLETION: dict[str, Any] = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]
}


class Highest(random.Random):
    """Always draws the top of the range: the backoff cap itself."""

    def uniform(self, a: float, b: float) -> float:
        return b


class TestRetryPolicyWithManyRetries:
    """The backoff cap was computed as ``base_delay * 2.0**retry`` before it was capped,
    and ``2.0**1024`` raises OverflowError, so retry number 1024 and every later one
    crashed instead of waiting ``max_delay``. ``max_retries`` has no upper bound, and a
    policy that retries "for as long as the deadline allows" reaches that many retries."""

    @pytest.mark.parametrize("retry", [1023, 1024, 5000])
    def test_the_cap_stays_at_max_delay_however_many_retries(self, retry: int) -> None:
        policy = RetryPolicy(max_retries=10_000, base_delay=0.5, max_delay=8.0, deadline=1e9)
        assert 8.0 == policy.delay(retry, None, Highest())

    @pytest.mark.anyio
    async def test_an_adapter_keeps_retrying_past_a_thousand_retries(self) -> None:
        attempts: list[httpx.Request] = []

        def answer(request: httpx.Request) -> httpx.Response:
            attempts.append(request)
            if len(attempts) <= 1100:
                return httpx.Response(503)
            return httpx.Response(200, json=OK_COMPLETION)

        async def no_wait(seconds: float) -> None:
            return None

        policy = RetryPolicy(max_retries=2000, base_delay=0.0, max_delay=0.0, deadline=1e9)
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            model = OpenAIChatModel(
                "m", base_url="http://api.test/v1", http_client=client, retry=policy
            )
            model._sleep = no_wait
            response = await model.complete(ModelRequest("", (Message.user("Hi"),), (), {}))
        assert ("ok", 1101) == (response.message.content, len(attempts))


class TestRetryKeywords:
    @pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
    @pytest.mark.parametrize(
        ("keyword", "setting"),
        [
            ("max_retries", "max_retries"),
            ("retry_base_delay", "base_delay"),
            ("retry_max_delay", "max_delay"),
            ("retry_deadline", "deadline"),
        ],
    )
    def test_each_keyword_alone_sets_its_own_setting(
        self, adapter: Callable[..., Any], keyword: str, setting: str
    ) -> None:
        model = adapter("m", api_key="k", **{keyword: 7})
        assert RetryPolicy(**{setting: 7}) == model.retry


class TestInterruptedEvent:
    def test_events_for_different_checkpoints_differ(self) -> None:
        request = HumanRequest("r1", "input", "Name?", tool_call=ToolCall("c1", "ask_human"))
        first = Interrupted(request, "cp1")
        assert Interrupted(request, "cp1") == first
        assert Interrupted(request, "cp2") != first


class TestToolResult:
    def test_an_error_result_differs_from_a_success_with_the_same_text(self) -> None:
        # A stored result compared with a fresh one must not take a failure for a success.
        assert ToolResult("c1", "Refunded.", is_error=True) != ToolResult("c1", "Refunded.")
        assert ToolResult("c1", "Refunded.") == ToolResult("c1", "Refunded.", is_error=False)
