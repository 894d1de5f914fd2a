"""AnthropicModel against a real HTTP server on 127.0.0.1 that checks the wire format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from _http_server import ModelServer, Reply, sse
from _wire import anthropic_event, anthropic_message, anthropic_stream, check_anthropic

from runlet import (
    Agent,
    ConfigurationError,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    ModelAPIError,
    ModelConnectionError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ReasoningDelta,
    ReasoningPart,
    Runtime,
    StreamingModel,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    ToolResult,
    ToolSpec,
    Usage,
    structure_checkpoint,
    unstructure_checkpoint,
)
from runlet.providers.anthropic import AnthropicModel

pytestmark = pytest.mark.anyio

WEATHER = ToolDefinition(
    "weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer.running(check_anthropic) as running:
        yield running
    assert running.problems == []


def make(server: ModelServer, **kwargs: Any) -> AnthropicModel:
    settings: dict[str, Any] = {
        "api_key": "sk-ant-test",
        "base_url": server.url,
        "retry_base_delay": 0.001,
        "retry_max_delay": 0.005,
        **kwargs,
    }
    return AnthropicModel("test-model", **settings)


def ask(
    text: str = "Hi", *, tools: tuple[ToolDefinition, ...] = (), **options: Any
) -> ModelRequest:
    return ModelRequest("Be brief.", (Message.user(text),), tools, options)


async def collect(model: AnthropicModel, request: ModelRequest) -> list[Any]:
    async with model.stream(request) as items:
        return [item async for item in items]


async def collect_into(seen: list[Any], model: AnthropicModel, request: ModelRequest) -> None:
    async with model.stream(request) as items:
        async for item in items:
            seen.append(item)  # noqa: PERF401 - keep what came before an error


class TestComplete:
    async def test_plain_answer(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("Hello!", usage=(12, 3))))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response == ModelResponse(Message.assistant("Hello!"), Usage(12, 3, 1))
        (seen,) = server.requests
        assert seen.headers["x-api-key"] == "sk-ant-test"
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.body == {
            "model": "test-model",
            "max_tokens": 4096,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        }

    async def test_options(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("ok")), Reply(json=anthropic_message("ok")))
        async with make(
            server, max_tokens=100, extra_body={"metadata": {"user_id": "u1"}}
        ) as model:
            await model.complete(
                ask(temperature=0.1, max_tokens=20, top_k=5, stop="END", seed=3, app_data=1)
            )
            await model.complete(ask(stop_sequences=["A", "B"]))
        first, second = server.bodies
        assert (first["temperature"], first["max_tokens"], first["top_k"]) == (0.1, 20, 5)
        assert first["stop_sequences"] == ["END"]
        assert first["metadata"] == {"user_id": "u1"}
        assert "seed" not in first
        assert "app_data" not in first
        assert (second["max_tokens"], second["stop_sequences"]) == (100, ["A", "B"])

    async def test_tool_call_keeps_id(self, server: ModelServer) -> None:
        server.reply(
            Reply(json=anthropic_message(None, [("toolu_01", "weather", {"city": "Oslo"})]))
        )
        async with make(server) as model:
            response = await model.complete(ask("Weather?", tools=(WEATHER,)))
        assert response.message == Message.assistant(
            "", [ToolCall("toolu_01", "weather", {"city": "Oslo"})]
        )
        assert server.bodies[0]["tools"] == [
            {
                "name": "weather",
                "description": "Current weather for a city.",
                "input_schema": dict(WEATHER.input_schema),
            }
        ]

    async def test_parallel_tool_calls(self, server: ModelServer) -> None:
        calls = [("t1", "weather", {"city": "Oslo"}), ("t2", "weather", {"city": "Rome"})]
        server.reply(Reply(json=anthropic_message("Checking.", calls)))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,)))
        assert response.message.content == "Checking."
        assert [c.id for c in response.message.tool_calls] == ["t1", "t2"]

    async def test_transcript_with_tool_results(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("Done.")))
        calls = (ToolCall("t1", "weather", {"city": "Oslo"}), ToolCall("t2", "weather", {}))
        transcript = (
            Message.system("Extra rule."),
            Message.user("Weather?"),
            Message.assistant("Checking.", calls),
            Message.tool(ToolResult("t1", "Sunny")),
            Message.tool(ToolResult("t2", "city is required", is_error=True)),
            Message.user("And tomorrow?"),
            Message.user(""),  # empty text is dropped: the API refuses empty blocks
        )
        async with make(server) as model:
            await model.complete(ModelRequest("Be brief.", transcript, (WEATHER,), {}))
        body = server.bodies[0]
        assert body["system"] == "Be brief.\n\nExtra rule."
        assert body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}},
                    {"type": "tool_use", "id": "t2", "name": "weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "city is required",
                        "is_error": True,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ]

    async def test_tool_message_without_result_is_refused(self, server: ModelServer) -> None:
        async with make(server) as model:
            with pytest.raises(Exception, match="tool_result"):
                await model.complete(ModelRequest("", (Message("tool", "x"),), (), {}))
        assert server.requests == []

    async def test_cache_tokens_count_as_input_and_separately(self, server: ModelServer) -> None:
        answer = anthropic_message("ok")
        answer["usage"] = {
            "input_tokens": 5,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 1000,
            "output_tokens": 4,
        }
        server.reply(Reply(json=answer))
        async with make(server) as model:
            usage = (await model.complete(ask())).usage
        assert usage == Usage(1105, 4, 1, cache_read_tokens=1000, cache_write_tokens=100)

    async def test_key_from_environment(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
        server.reply(Reply(json=anthropic_message("ok")))
        async with make(server, api_key=None) as model:
            await model.complete(ask())
        assert server.requests[0].headers["x-api-key"] == "sk-ant-env"
        assert "sk-ant-env" not in repr(model)

    async def test_missing_key_is_a_clear_error(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
        async with make(server, api_key=None) as model:
            with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
                await model.complete(ask())
        assert server.requests == []

    async def test_empty_key_sends_none(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("ok")))
        async with make(server, api_key="") as model:
            await model.complete(ask())
        assert "x-api-key" not in server.requests[0].headers

    @pytest.mark.parametrize("bad", [0, -1, 1.5])
    def test_bad_max_tokens(self, bad: Any) -> None:
        with pytest.raises(ConfigurationError, match="max_tokens"):
            AnthropicModel("m", api_key="k", max_tokens=bad)


class TestMalformedAnswers:
    @pytest.mark.parametrize(
        ("reply", "match"),
        [
            (Reply(raw=b"{"), "not valid JSON"),
            (Reply(json={"type": "message"}), "documented shape"),
            (Reply(json=anthropic_message(None, [("t", "weather", [1])])), "not a JSON object"),
        ],
    )
    async def test_malformed(self, server: ModelServer, reply: Reply, match: str) -> None:
        server.reply(reply)
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match=match):
                await model.complete(ask())

    async def test_unknown_blocks_and_missing_input(self, server: ModelServer) -> None:
        answer = anthropic_message("Hi")
        answer["content"] += [
            {"type": "thinking", "thinking": "hm", "signature": "x"},
            {"type": "tool_use", "id": "t", "name": "weather"},
        ]
        answer.pop("usage")
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.tool_calls == (ToolCall("t", "weather", {}),)
        assert response.usage == Usage(requests=1)

    async def test_error_in_success_body(self, server: ModelServer) -> None:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        server.reply(Reply(json=error))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Overloaded") as info:
                await model.complete(ask())
        assert info.value.status_code == 529


class TestErrorsAndRetries:
    async def test_400_carries_the_api_message(self, server: ModelServer) -> None:
        error = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: too large"},
        }
        server.reply(Reply(400, error))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="max_tokens: too large") as info:
                await model.complete(ask())
        assert (info.value.status_code, info.value.body) == (400, "max_tokens: too large")
        assert len(server.requests) == 1

    async def test_429_with_retry_after_then_success(self, server: ModelServer) -> None:
        error = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
        server.reply(
            Reply(429, error, headers={"retry-after": "0"}), Reply(json=anthropic_message("ok"))
        )
        async with make(server) as model:
            assert (await model.complete(ask())).message.content == "ok"
        assert len(server.requests) == 2

    async def test_529_then_500_then_success(self, server: ModelServer) -> None:
        overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
        server.reply(
            Reply(529, overloaded),
            Reply(500, {"type": "error", "error": {"type": "api_error", "message": "oops"}}),
            Reply(json=anthropic_message("ok")),
        )
        async with make(server) as model:
            assert (await model.complete(ask())).message.content == "ok"
        assert len(server.requests) == 3

    async def test_no_retries(self, server: ModelServer) -> None:
        server.reply(Reply(500, {"type": "error", "error": {"type": "api_error", "message": "x"}}))
        async with make(server, max_retries=0) as model:
            with pytest.raises(ModelAPIError) as info:
                await model.complete(ask())
        assert info.value.status_code == 500
        assert len(server.requests) == 1

    async def test_cancelled_during_request(self, server: ModelServer) -> None:
        server.reply(Reply(hang=True))
        outcome: list[str] = []

        async def call(model: AnthropicModel) -> None:
            try:
                await collect(model, ask())
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

        async with make(server) as model:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as group:
                    group.start_soon(call, model)
                    await anyio.to_thread.run_sync(server.arrived.wait, 5)
                    group.cancel_scope.cancel()
        assert outcome == ["cancelled"]


class TestStreaming:
    async def test_is_a_streaming_model(self, server: ModelServer) -> None:
        async with make(server) as model:
            assert isinstance(model, StreamingModel)

    async def test_streamed_text(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("Hello there, friend.", usage=(30, 8))))
        async with make(server) as model:
            items = await collect(model, ask())
        *deltas, final = items
        assert all(isinstance(item, TextDelta) for item in deltas)
        assert "".join(item.text for item in deltas) == "Hello there, friend."
        assert final == ModelResponse(Message.assistant("Hello there, friend."), Usage(30, 8, 1))
        assert server.bodies[0]["stream"] is True

    async def test_streamed_parallel_tool_calls_in_many_chunks(self, server: ModelServer) -> None:
        calls = [
            ("toolu_1", "weather", json.dumps({"city": "Oslo", "unit": "celsius"})),
            ("toolu_2", "weather", json.dumps({"city": "Rome"})),
        ]
        server.reply(Reply(events=anthropic_stream("Let me check.", calls, piece=1)))
        async with make(server) as model:
            items = await collect(model, ask(tools=(WEATHER,)))
        call_deltas = [item for item in items if isinstance(item, ToolCallDelta)]
        assert len(call_deltas) > 40
        assert [(d.index, d.id, d.name) for d in call_deltas if d.id] == [
            (0, "toolu_1", "weather"),
            (1, "toolu_2", "weather"),
        ]
        for index, (_, _, arguments) in enumerate(calls):
            assert "".join(d.arguments for d in call_deltas if d.index == index) == arguments
        assert items[-1].message == Message.assistant(
            "Let me check.",
            [
                ToolCall("toolu_1", "weather", {"city": "Oslo", "unit": "celsius"}),
                ToolCall("toolu_2", "weather", {"city": "Rome"}),
            ],
        )

    async def test_tool_without_input_deltas_and_other_blocks(self, server: ModelServer) -> None:
        events = (
            anthropic_event({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
            anthropic_event(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""},
                }
            ),
            anthropic_event(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": "hm"},
                }
            ),
            anthropic_event(
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "text", "text": "Hi"},
                }
            ),
            anthropic_event(
                {
                    "type": "content_block_start",
                    "index": 2,
                    "content_block": {"type": "tool_use", "id": "t", "name": "now", "input": {}},
                }
            ),
            anthropic_event({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 2}}),
            anthropic_event({"type": "message_delta", "delta": {}, "usage": {}}),
            anthropic_event({"type": "future_event"}),
            anthropic_event({"type": "message_stop"}),
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[:2] == [ReasoningDelta("hm"), TextDelta("Hi")]
        unsigned = ReasoningPart("hm", provider="anthropic")  # kept, but never sent back
        assert items[-1] == ModelResponse(
            Message.assistant("Hi", [ToolCall("t", "now", {})], reasoning=[unsigned]),
            Usage(3, 2, 1),
        )

    async def test_stream_cut_off_midway(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("A long answer that never ends."), cut_after=6))
        seen: list[Any] = []
        async with make(server) as model:
            with pytest.raises(ModelConnectionError, match="cut off"):
                await collect_into(seen, model, ask())
        assert len(seen) == 3

    async def test_stream_that_ends_before_message_stop(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("Hello")[:-1]))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="message_stop"):
                await collect(model, ask())

    async def test_error_event(self, server: ModelServer) -> None:
        events = (
            *anthropic_stream("Hello")[:3],
            sse(
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                "error",
            ),
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Overloaded") as info:
                await collect(model, ask())
        assert info.value.status_code == 529

    @pytest.mark.parametrize(
        ("event", "match"),
        [
            (sse("not json", "ping"), "not valid JSON"),
            (anthropic_event({"type": "content_block_start", "index": 0}), "documented shape"),
        ],
    )
    async def test_malformed_events(self, server: ModelServer, event: str, match: str) -> None:
        server.reply(Reply(events=(event,)))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match=match):
                await collect(model, ask())

    async def test_bad_tool_input_json(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("", [("t", "weather", '{"city"')])))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="not valid JSON"):
                await collect(model, ask())

    async def test_runtime_stream_through_the_adapter(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("Streamed through the runtime.")))
        async with make(server) as model:
            agent = Agent("a", "Be brief.", model)
            async with Runtime().stream(agent, "Hi") as stream:
                events = [event async for event in stream]
        texts = [event.text for event in events if isinstance(event, TextDelta)]
        assert "".join(texts) == "Streamed through the runtime."
        assert stream.result.output == "Streamed through the runtime."


async def refund(arguments: Any, context: Any) -> str:
    return f"Refunded order {arguments['order_id']}."


REFUND = ToolSpec(
    name="refund",
    description="Refund an order.",
    input_schema={
        "type": "object",
        "required": ["order_id"],
        "properties": {"order_id": {"type": "string"}},
    },
    handler=refund,
    requires_approval=True,
)


async def test_human_in_the_loop_through_checkpoint_json(server: ModelServer) -> None:
    server.reply(
        Reply(
            json=anthropic_message("I'll refund it.", [("toolu_r7", "refund", {"order_id": "123"})])
        ),
        Reply(json=anthropic_message("Order 123 is refunded.", usage=(50, 6))),
    )
    async with make(server) as model:
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        agent = Agent("support", "Ask for approval before refunds.", model, (REFUND,))
        result = await runtime.run(agent, "Refund order 123.")
    assert result.status == "interrupted"
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    store = runtime.checkpoint_store
    assert store is not None
    saved = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))

    fresh_store = InMemoryCheckpointStore()
    await fresh_store.save(structure_checkpoint(json.loads(saved)))
    async with make(server) as fresh_model:
        fresh_agent = Agent("support", "Ask for approval before refunds.", fresh_model, (REFUND,))
        resumed = await Runtime(checkpoint_store=fresh_store).resume(
            fresh_agent,
            checkpoint_id=result.checkpoint_id,
            response=HumanResponse(request_id=result.interruption.id, action="approve"),
        )
    assert resumed.status == "completed"
    assert resumed.output == "Order 123 is refunded."
    assert resumed.usage == Usage(21 + 50, 9 + 6, 2)
    messages = server.bodies[1]["messages"]
    assert messages[-2]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_r7",
        "name": "refund",
        "input": {"order_id": "123"},
    }
    assert messages[-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_r7", "content": "Refunded order 123."}
        ],
    }
