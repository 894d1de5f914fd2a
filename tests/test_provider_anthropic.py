"""AnthropicModel against a real HTTP server on 127.0.0.1 that checks the wire format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from _http_server import ModelServer, Reply, sse
from _wire import (
    anthropic_event,
    anthropic_message,
    anthropic_stream,
    check_anthropic,
    redacted_block,
    thinking_block,
)

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
from runlet.providers._http import should_retry
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
    async def test_a_lone_surrogate_goes_as_the_replacement_character(
        self, server: ModelServer
    ) -> None:
        server.reply(Reply(json=anthropic_message("Found it.")))
        turn = Message.assistant("", (ToolCall("toolu_1", "ls", {}),))
        result = Message.tool(ToolResult("toolu_1", "caf\udce9.txt"))
        async with make(server) as model:
            response = await model.complete(
                ModelRequest("", (Message.user("Ls."), turn, result), (), {})
            )
        assert "Found it." == response.message.content
        (block,) = server.requests[0].body["messages"][2]["content"]
        assert "caf\ufffd.txt" == block["content"]

    async def test_whitespace_only_text_is_not_sent_back(self, server: ModelServer) -> None:
        # A model may answer "\n\n" beside its tool calls; the API refuses a text block
        # of whitespace, so the next request of the tool loop leaves it out.
        server.reply(Reply(json=anthropic_message("Done.")))
        turn = Message.assistant("\n\n", (ToolCall("toolu_1", "add", {"a": 1}),))
        messages = (Message.user("Add."), turn, Message.tool(ToolResult("toolu_1", "2")))
        async with make(server) as model:
            await model.complete(ModelRequest("", messages, (), {}))
        sent = server.requests[0].body["messages"][1]
        assert [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}}] == (
            sent["content"]
        )

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

    async def test_tool_choice_is_left_out_without_tools(self, server: ModelServer) -> None:
        # "tool_choice may only be specified while providing tools": one options mapping
        # shared by agents with and without tools must not fail for those without.
        server.reply(Reply(json=anthropic_message("ok")), Reply(json=anthropic_message("ok")))
        choice = {"type": "any"}
        async with make(server) as model:
            await model.complete(ask(tool_choice=choice, temperature=0.5))
            await model.complete(ask(tools=(WEATHER,), tool_choice=choice, temperature=0.5))
        without, with_tools = server.bodies
        assert ("tool_choice" not in without, without["temperature"]) == (True, 0.5)
        assert (with_tools["tool_choice"], with_tools["temperature"]) == (choice, 0.5)

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
            Message.assistant(""),  # empty messages are dropped: the API refuses empty
            Message.user(""),  # blocks and empty turns
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

    async def test_a_tool_result_with_no_text_says_so(self, server: ModelServer) -> None:
        # The API refuses an empty tool_result (400), as a tool with no output makes one.
        server.reply(Reply(json=anthropic_message("Done.")))
        calls = tuple(ToolCall(f"t{n}", "weather", {}) for n in range(3))
        transcript = (
            Message.user("Go."),
            Message.assistant("", calls),
            Message.tool(ToolResult("t0", "")),
            Message.tool(ToolResult("t1", " \n", is_error=True)),
            Message.tool(ToolResult("t2", "")),
        )
        async with make(server) as model:
            await model.complete(ModelRequest("", transcript, (WEATHER,), {}))
        results = server.bodies[0]["messages"][2]["content"]
        assert results == [
            {"type": "tool_result", "tool_use_id": "t0", "content": "(no output)"},
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": "(the tool failed without a message)",
                "is_error": True,
            },
            {"type": "tool_result", "tool_use_id": "t2", "content": "(no output)"},
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
            (
                Reply(
                    raw=json.dumps(anthropic_message(None, [("t", "weather", {"a": 1})]))
                    .replace('{"a": 1}', '{"a": NaN}')
                    .encode()
                ),
                r"not valid JSON \(NaN is not a JSON value\)",
            ),
            (Reply(json={"type": "message"}), "documented shape"),
            (Reply(json=anthropic_message(None, [("t", "weather", [1])])), "not a JSON object"),
            (
                Reply(json=anthropic_message(None, [("t", 5, {})])),  # type: ignore[list-item]
                "tool call whose name is 5, not a non-empty string",
            ),
            (
                Reply(json=anthropic_message(None, [(7, "weather", {})])),  # type: ignore[list-item]
                "tool call whose id is 7",
            ),
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
        assert info.value.api_request_id is None
        assert len(server.requests) == 1

    async def test_an_error_names_the_request_id_the_api_gave(self, server: ModelServer) -> None:
        error = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
        server.reply(Reply(400, error, headers={"request-id": "req_011CSHoEeqs5C"}))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=r"\(request id req_011CSHoEeqs5C\)") as info:
                await model.complete(ask())
        assert info.value.api_request_id == "req_011CSHoEeqs5C"

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

    async def test_streamed_text_with_characters_other_splitters_break_lines_at(
        self, server: ModelServer
    ) -> None:
        # A server that writes JSON with ensure_ascii=False (or serde_json, JSON.stringify)
        # sends these as they are; only CR and LF end a line of an event stream.
        text = "One\u2028two\u2029three\x85four\x0bfive\x0csix\x1cseven."
        server.reply(Reply(events=anthropic_stream(text, usage=(30, 8))))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1] == ModelResponse(Message.assistant(text), Usage(30, 8, 1))

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
                    "content_block": {
                        "type": "tool_use",
                        "id": "t",
                        "name": "now",
                        "input": {"zone": "UTC"},  # the whole input: no deltas follow
                    },
                }
            ),
            anthropic_event({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 2}}),
            anthropic_event({"type": "message_delta", "delta": {}, "usage": {}}),
            anthropic_event({"type": "future_event"}),
            sse({}, "message_stop"),  # a type only in the event name is enough
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[:2] == [ReasoningDelta("hm"), TextDelta("Hi")]
        unsigned = ReasoningPart("hm", provider="anthropic")  # kept, but never sent back
        assert items[-1] == ModelResponse(
            Message.assistant("Hi", [ToolCall("t", "now", {"zone": "UTC"})], reasoning=[unsigned]),
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
            (
                anthropic_event(
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "tool_use", "id": "t", "name": None},
                    }
                ),
                "whose name is None",
            ),
            (
                anthropic_event(
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "tool_use", "id": 7, "name": "weather"},
                    }
                ),
                "whose id is 7",
            ),
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

    async def test_tool_input_with_infinity(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("", [("t", "weather", '{"a": Infinity}')])))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="Infinity is not a JSON value"):
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


# -- extended thinking ---------------------------------------------------------------------

THINKING = {"type": "enabled", "budget_tokens": 2048}
SIGNED = ReasoningPart("The user wants Oslo.", signature="sig-Eq8x", provider="anthropic")
REDACTED = ReasoningPart(redacted_data="ENCRYPTED==", provider="anthropic")


class TestThinking:
    async def test_blocks_become_reasoning(self, server: ModelServer) -> None:
        answer = anthropic_message(
            "Checking.",
            [("toolu_1", "weather", {"city": "Oslo"})],
            thinking=[
                thinking_block("The user wants Oslo.", "sig-Eq8x"),
                redacted_block("ENCRYPTED=="),
            ],
        )
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,), thinking=THINKING))
        assert response.message == Message.assistant(
            "Checking.",
            [ToolCall("toolu_1", "weather", {"city": "Oslo"})],
            reasoning=[SIGNED, REDACTED],
        )
        assert server.bodies[0]["thinking"] == THINKING

    async def test_sent_back_unchanged_before_the_tool_calls(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("Sunny in Oslo.")))
        reasoning = [
            SIGNED,
            ReasoningPart("unsigned", provider="anthropic"),  # the API would refuse it
            ReasoningPart("from DeepSeek", provider="openai"),
            ReasoningPart("from who knows", signature="x"),
            REDACTED,
        ]
        call = ToolCall("toolu_1", "weather", {"city": "Oslo"})
        transcript = (
            Message.user("Weather in Oslo?"),
            Message.assistant("Checking.", [call], reasoning=reasoning),
            Message.tool(ToolResult("toolu_1", "Sunny")),
        )
        async with make(server) as model:
            await model.complete(ModelRequest("", transcript, (WEATHER,), {"thinking": THINKING}))
        assert server.bodies[0]["messages"][1] == {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The user wants Oslo.", "signature": "sig-Eq8x"},
                {"type": "redacted_thinking", "data": "ENCRYPTED=="},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
            ],
        }

    async def test_streamed_as_reasoning_deltas(self, server: ModelServer) -> None:
        events = anthropic_stream(
            "Hello!",
            thinking=[thinking_block("Say hello politely.", "sig-stream"), redacted_block("E==")],
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            items = await collect(model, ask(thinking=THINKING))
        *deltas, final = items
        reasoning = [item.text for item in deltas if isinstance(item, ReasoningDelta)]
        texts = [item.text for item in deltas if isinstance(item, TextDelta)]
        assert len(reasoning) > 1
        assert "".join(reasoning) == "Say hello politely."
        assert "".join(texts) == "Hello!"
        assert all(isinstance(item, ReasoningDelta) for item in deltas[: len(reasoning)])
        assert final.message == Message.assistant(
            "Hello!",
            reasoning=[
                ReasoningPart("Say hello politely.", signature="sig-stream", provider="anthropic"),
                ReasoningPart(redacted_data="E==", provider="anthropic"),
            ],
        )

    async def test_signature_in_the_start_block(self, server: ModelServer) -> None:
        events = (
            anthropic_event({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
            anthropic_event(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking", "thinking": "Hm.", "signature": "s"},
                }
            ),
            anthropic_event({"type": "message_stop"}),
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[0] == ReasoningDelta("Hm.")
        assert items[-1].message.reasoning == (
            ReasoningPart("Hm.", signature="s", provider="anthropic"),
        )

    async def test_an_empty_signature_is_none(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("Hi", thinking=[thinking_block("Hm.", "")])))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.reasoning == (ReasoningPart("Hm.", provider="anthropic"),)

    @pytest.mark.parametrize(
        ("block", "words"),
        [
            ({"type": "redacted_thinking", "data": 7}, "redacted_thinking data is a int"),
            ({"type": "thinking", "thinking": ["x"], "signature": "s"}, "thinking is a list"),
        ],
    )
    async def test_malformed_thinking(
        self, server: ModelServer, block: dict[str, Any], words: str
    ) -> None:
        server.reply(Reply(json=anthropic_message("Hi", thinking=[block])))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match=words):
                await model.complete(ask())

    async def test_delta_types_added_later_are_skipped(self, server: ModelServer) -> None:
        citation = {"type": "citations_delta", "citation": {"cited_text": "x"}}
        events = list(anthropic_stream("Hi"))
        events.insert(
            -3, anthropic_event({"type": "content_block_delta", "index": 0, "delta": citation})
        )
        server.reply(Reply(events=tuple(events)))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].message == Message.assistant("Hi")

    async def test_a_block_the_server_runs_is_skipped_with_its_input(
        self, server: ModelServer
    ) -> None:
        # A server tool (web search, an MCP server) streams its own input deltas; like
        # complete(), the stream leaves the block out of the message.
        search = {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}}
        query = {"type": "input_json_delta", "partial_json": '{"query": "oslo"}'}
        events = list(anthropic_stream("Hi"))  # the text is block 0
        events[-2:-2] = [
            anthropic_event({"type": "content_block_start", "index": 1, "content_block": search}),
            anthropic_event({"type": "content_block_delta", "index": 1, "delta": query}),
            anthropic_event({"type": "content_block_stop", "index": 1}),
        ]
        server.reply(Reply(events=tuple(events)))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].message == Message.assistant("Hi")

    async def test_runtime_stream_hands_out_reasoning_deltas(self, server: ModelServer) -> None:
        events = anthropic_stream("Hi there.", thinking=[thinking_block("Greet back.", "s1")])
        server.reply(Reply(events=events))
        async with make(server) as model:
            agent = Agent("a", "Be brief.", model)
            async with Runtime().stream(agent, "Hi", options={"thinking": THINKING}) as stream:
                events_seen = [event async for event in stream]
        reasoning = "".join(e.text for e in events_seen if isinstance(e, ReasoningDelta))
        text = "".join(e.text for e in events_seen if isinstance(e, TextDelta))
        assert (reasoning, text) == ("Greet back.", "Hi there.")
        assert stream.result.output == "Hi there."
        assert stream.result.transcript[-1].reasoning[0].signature == "s1"


# -- prompt caching ------------------------------------------------------------------------

TIME = ToolDefinition("time", "The time now.", {"type": "object", "properties": {}})


class TestPromptCaching:
    async def test_off_by_default(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("ok")))
        async with make(server) as model:
            await model.complete(ask(tools=(WEATHER, TIME)))
        assert "cache_control" not in json.dumps(server.bodies[0])

    async def test_system_prompt_and_tools(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("ok")))
        async with make(server, prompt_caching=True) as model:
            await model.complete(ask(tools=(WEATHER, TIME)))
        body = server.bodies[0]
        ephemeral = {"type": "ephemeral"}
        assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}]
        assert "cache_control" not in body["tools"][0]
        assert body["tools"][1]["cache_control"] == ephemeral
        assert "cache_control" not in json.dumps(body["messages"])

    async def test_transcript_and_ttl(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("ok")))
        call = ToolCall("t1", "time", {})
        transcript = (
            Message.user("What time is it?"),
            Message.assistant("", [call], reasoning=[SIGNED]),
            Message.tool(ToolResult("t1", "noon")),
            Message.user("Thanks."),
        )
        async with make(
            server, prompt_caching=True, cache_transcript=True, cache_ttl="1h"
        ) as model:
            await model.complete(ModelRequest("Be brief.", transcript, (TIME,), {}))
        body = server.bodies[0]
        marked = {"type": "ephemeral", "ttl": "1h"}
        assert body["system"][0]["cache_control"] == marked
        assert body["tools"][0]["cache_control"] == marked
        assert body["messages"][-1]["content"] == [
            {"type": "tool_result", "tool_use_id": "t1", "content": "noon"},
            {"type": "text", "text": "Thanks.", "cache_control": marked},
        ]
        assert json.dumps(body["messages"]).count("cache_control") == 1

    @pytest.mark.parametrize(
        ("last", "blocks"),
        [
            (
                Message.assistant("Hello", reasoning=[SIGNED]),  # a prefilled answer
                [
                    {"type": "thinking", "thinking": SIGNED.text, "signature": SIGNED.signature},
                    {"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}},
                ],
            ),
            (
                Message.assistant("", reasoning=[SIGNED]),  # nothing but thinking
                [{"type": "thinking", "thinking": SIGNED.text, "signature": SIGNED.signature}],
            ),
        ],
        ids=["text-after-thinking", "thinking-only"],
    )
    async def test_transcript_breakpoint_skips_thinking(
        self, server: ModelServer, last: Message, blocks: list[dict[str, Any]]
    ) -> None:
        server.reply(Reply(json=anthropic_message("ok")))
        async with make(server, cache_transcript=True) as model:
            await model.complete(ModelRequest("", (Message.user("Hi"), last), (), {}))
        assert server.bodies[0]["messages"][-1]["content"] == blocks
        assert "system" not in server.bodies[0]

    def test_no_transcript_to_mark(self) -> None:
        # Only system text: no turn to put a breakpoint on (the API will say what is wrong).
        model = AnthropicModel("m", api_key="k", cache_transcript=True)
        request = ModelRequest("Be brief.", (Message.system("Rule."),), (), {})
        assert model._body(request, stream=False)["messages"] == []

    @pytest.mark.parametrize("bad", ["", 60, b"1h"])
    def test_bad_ttl(self, bad: Any) -> None:
        with pytest.raises(ConfigurationError, match="cache_ttl"):
            AnthropicModel("m", api_key="k", cache_ttl=bad)

    async def test_streamed_cache_counts(self, server: ModelServer) -> None:
        server.reply(Reply(events=anthropic_stream("ok", usage=(5, 2), cache=(700, 30))))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].usage == Usage(735, 2, 1, cache_read_tokens=700, cache_write_tokens=30)

    async def test_later_stream_counts_replace_earlier_ones(self, server: ModelServer) -> None:
        start = {"input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 1}
        final = {"input_tokens": 5, "cache_read_input_tokens": 40, "output_tokens": 9}
        events = (
            anthropic_event({"type": "message_start", "message": {"usage": start}}),
            anthropic_event({"type": "message_delta", "delta": {}, "usage": final}),
            anthropic_event({"type": "message_delta", "delta": {}, "usage": {"input_tokens": 0}}),
            anthropic_event(  # a count that is not an int changes nothing
                {
                    "type": "message_delta",
                    "delta": {},
                    "usage": {"cache_creation_input_tokens": True},
                }
            ),
            anthropic_event({"type": "message_stop"}),
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].usage == Usage(45, 9, 1, cache_read_tokens=40)
        assert type(items[-1].usage.cache_write_tokens) is int


# -- errors inside a stream ----------------------------------------------------------------


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class TestInStreamErrors:
    @pytest.mark.parametrize(
        ("kind", "status"),
        [
            ("overloaded_error", 529),
            ("rate_limit_error", 429),
            ("api_error", 500),
            ("invalid_request_error", 400),
            ("permission_error", 403),
            ("some_new_error", 500),
        ],
    )
    async def test_same_error_as_the_http_answer(
        self, server: ModelServer, kind: str, status: int
    ) -> None:
        message = f"{kind} happened"
        events = (*anthropic_stream("Hello")[:3], sse(error_body(kind, message), "error"))
        server.reply(Reply(status, error_body(kind, message)), Reply(events=events))
        async with make(server, max_retries=0) as model:
            with pytest.raises(ModelAPIError) as answered:
                await model.complete(ask())
            with pytest.raises(ModelAPIError, match=message) as streamed:
                await collect(model, ask())
        assert streamed.value.status_code == answered.value.status_code == status
        assert streamed.value.body == answered.value.body == message
        assert "(HTTP" in str(streamed.value)
        assert should_retry(streamed.value.status_code) == (status >= 500 or status == 429)

    async def test_error_event_first_is_not_retried(self, server: ModelServer) -> None:
        events = (sse(error_body("overloaded_error", "Overloaded"), "error"),)
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Overloaded") as info:
                await collect(model, ask())
        assert str(info.value) == (
            "The Anthropic Messages API reported overloaded_error (HTTP 529): Overloaded. "
            "This is usually temporary: try again later."
        )
        assert len(server.requests) == 1

    async def test_error_event_without_details(self, server: ModelServer) -> None:
        server.reply(Reply(events=(sse({"type": "error"}, "error"),)))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="reported error") as info:
                await collect(model, ask())
        assert info.value.status_code == 500


class TestServerThatDoesNotStream:
    async def test_a_plain_answer_is_refused_with_a_reason(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("Not streamed.")))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="not text/event-stream") as info:
                await collect(model, ask())
        assert "application/json" in str(info.value)
        assert "ended before" not in str(info.value)

    async def test_an_error_body_is_the_api_error(self, server: ModelServer) -> None:
        server.reply(Reply(json=error_body("overloaded_error", "Overloaded")))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Overloaded") as info:
                await collect(model, ask())
        assert info.value.status_code == 529


# -- thinking + tool use + approval + checkpoint JSON + resume -----------------------------


async def first_turn(
    runtime: Runtime, agent: Agent, options: dict[str, Any], *, streaming: bool
) -> tuple[Any, list[Any]]:
    if not streaming:
        return await runtime.run(agent, "Refund order 123.", options=options), []
    async with runtime.stream(agent, "Refund order 123.", options=options) as stream:
        events = [event async for event in stream]
    return stream.result, events


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
async def test_thinking_survives_approval_checkpoint_json_and_resume(
    server: ModelServer, streaming: bool
) -> None:
    thinking = [thinking_block("A refund needs approval; call the tool.", "sig-R7a==")]
    call = ("toolu_r7", "refund", {"order_id": "123"})
    if streaming:
        first = Reply(
            events=anthropic_stream(
                "", [(call[0], call[1], json.dumps(call[2]))], thinking=thinking, cache=(0, 80)
            )
        )
    else:
        first = Reply(json=anthropic_message(None, [call], thinking=thinking, cache=(0, 80)))
    server.reply(
        first,
        Reply(json=anthropic_message("Order 123 is refunded.", usage=(50, 6), cache=(80, 0))),
    )
    options = {"thinking": THINKING}
    async with make(server, prompt_caching=True) as model:
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        agent = Agent("support", "Ask for approval before refunds.", model, (REFUND,))
        # The options (thinking on) are saved in the checkpoint and used again on resume.
        result, events = await first_turn(runtime, agent, options, streaming=streaming)
    assert result.status == "interrupted"
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    if streaming:
        assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == (
            "A refund needs approval; call the tool."
        )
    store = runtime.checkpoint_store
    assert store is not None
    saved = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))
    assert "sig-R7a==" in saved

    fresh_store = InMemoryCheckpointStore()
    await fresh_store.save(structure_checkpoint(json.loads(saved)))
    async with make(server, prompt_caching=True) as fresh_model:
        fresh_agent = Agent("support", "Ask for approval before refunds.", fresh_model, (REFUND,))
        resumed = await Runtime(checkpoint_store=fresh_store).resume(
            fresh_agent,
            checkpoint_id=result.checkpoint_id,
            response=HumanResponse(request_id=result.interruption.id, action="approve"),
        )
    assert resumed.status == "completed"
    assert resumed.output == "Order 123 is refunded."
    input_first = 21 + 80
    assert resumed.usage == Usage(
        input_first + 50 + 80, 9 + 6, 2, cache_read_tokens=80, cache_write_tokens=80
    )
    second = server.bodies[1]
    assert second["thinking"] == THINKING
    assert second["messages"][-2] == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "A refund needs approval; call the tool.",
                "signature": "sig-R7a==",
            },
            {"type": "tool_use", "id": "toolu_r7", "name": "refund", "input": {"order_id": "123"}},
        ],
    }
    assert second["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_r7", "content": "Refunded order 123."}
        ],
    }


# -- interleaved thinking ------------------------------------------------------------------

INTERLEAVED = [
    thinking_block("Look up A first.", "sig-one"),
    {"type": "text", "text": "Looking them up."},
    {"type": "tool_use", "id": "toolu_A", "name": "weather", "input": {"city": "Oslo"}},
    thinking_block("Now B.", "sig-two"),
    redacted_block("E2=="),
    {"type": "tool_use", "id": "toolu_B", "name": "weather", "input": {"city": "Bergen"}},
]
"""A Claude 4 turn with interleaved thinking: reasoning between its tool calls."""


class TestInterleavedThinking:
    """Thinking that came between tool calls goes back between them: the API wants the
    turn echoed as it came."""

    def interleaved_message(self) -> Message:
        return Message.assistant(
            "Looking them up.",
            [
                ToolCall("toolu_A", "weather", {"city": "Oslo"}),
                ToolCall("toolu_B", "weather", {"city": "Bergen"}),
            ],
            reasoning=[
                ReasoningPart("Look up A first.", signature="sig-one", provider="anthropic"),
                ReasoningPart("Now B.", signature="sig-two", provider="anthropic", calls_before=1),
                ReasoningPart(redacted_data="E2==", provider="anthropic", calls_before=1),
            ],
        )

    async def test_an_answer_notes_where_each_part_came(self, server: ModelServer) -> None:
        answer = {**anthropic_message(), "content": INTERLEAVED, "stop_reason": "tool_use"}
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,), thinking=THINKING))
        assert response.message == self.interleaved_message()

    async def test_a_stream_notes_where_each_part_came(self, server: ModelServer) -> None:
        start = anthropic_message(usage=(21, 1))
        events = [anthropic_event({"type": "message_start", "message": {**start, "content": []}})]
        for index, block in enumerate(INTERLEAVED):
            if block["type"] == "tool_use":
                block = {**block, "input": {}}
                events.append(
                    anthropic_event(
                        {"type": "content_block_start", "index": index, "content_block": block}
                    )
                )
                delta = {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(INTERLEAVED[index]["input"]),
                }
                events.append(
                    anthropic_event({"type": "content_block_delta", "index": index, "delta": delta})
                )
            else:
                events.append(
                    anthropic_event(
                        {"type": "content_block_start", "index": index, "content_block": block}
                    )
                )
            events.append(anthropic_event({"type": "content_block_stop", "index": index}))
        events.append(anthropic_event({"type": "message_stop"}))
        server.reply(Reply(events=tuple(events)))
        async with make(server) as model:
            *_, final = await collect(model, ask(tools=(WEATHER,), thinking=THINKING))
        assert final.message == self.interleaved_message()

    async def test_sent_back_in_the_order_it_came(self, server: ModelServer) -> None:
        server.reply(Reply(json=anthropic_message("Sunny in both.")))
        transcript = (
            Message.user("Weather in Oslo and Bergen?"),
            self.interleaved_message(),
            Message.tool(ToolResult("toolu_A", "Sunny")),
            Message.tool(ToolResult("toolu_B", "Sunny")),
        )
        async with make(server) as model:
            await model.complete(ModelRequest("", transcript, (WEATHER,), {"thinking": THINKING}))
        assert server.bodies[0]["messages"][1] == {"role": "assistant", "content": INTERLEAVED}

    def test_a_count_past_the_calls_puts_the_part_last(self) -> None:
        from runlet.providers.anthropic import _blocks

        late = ReasoningPart("After all.", signature="s", provider="anthropic", calls_before=7)
        message = Message.assistant("", [ToolCall("t1", "weather", {})], reasoning=[late])
        assert [block["type"] for block in _blocks(message)] == ["tool_use", "thinking"]

    @pytest.mark.parametrize("count", [-1, 1.0, "1", None, True])
    def test_calls_before_must_be_a_count(self, count: Any) -> None:
        with pytest.raises(ConfigurationError, match="calls_before"):
            ReasoningPart("x", calls_before=count)


def test_a_base_url_with_a_query_string_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="query string or a fragment"):
        AnthropicModel("claude-sonnet-4-5", base_url="https://proxy.example?key=1", api_key="k")


# -- the request id of errors reported in a successful answer -------------------------------


_REQUEST_ID = {"request-id": "req_011CSHoEeqs5C"}


class TestRequestIdOfErrorsInAnswers:
    async def test_in_a_body(self, server: ModelServer) -> None:
        server.reply(Reply(json=error_body("overloaded_error", "Overloaded"), headers=_REQUEST_ID))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=r"\(request id req_011CSHoEeqs5C\)") as info:
                await model.complete(ask())
        assert (info.value.status_code, info.value.api_request_id) == (529, "req_011CSHoEeqs5C")
        assert info.value.body == "Overloaded"

    async def test_in_a_stream(self, server: ModelServer) -> None:
        events = (
            *anthropic_stream("Hello")[:3],
            sse(error_body("overloaded_error", "Overloaded"), "error"),
        )
        server.reply(Reply(events=events, headers=_REQUEST_ID))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=r"\(request id req_011CSHoEeqs5C\)") as info:
                await collect(model, ask())
        assert (info.value.status_code, info.value.api_request_id) == (529, "req_011CSHoEeqs5C")

    async def test_in_a_body_answering_a_stream(self, server: ModelServer) -> None:
        server.reply(Reply(json=error_body("overloaded_error", "Overloaded"), headers=_REQUEST_ID))
        async with make(server) as model:
            with pytest.raises(ModelAPIError) as info:
                await collect(model, ask())
        assert info.value.api_request_id == "req_011CSHoEeqs5C"
        assert str(info.value).count("req_011CSHoEeqs5C") == 1


# -- an answer cut off while it called tools -------------------------------------------------


def _with_stop(events: tuple[str, ...], reason: str) -> tuple[str, ...]:
    """*events* with the message_delta's stop_reason replaced."""
    out = []
    for event in events:
        if '"message_delta"' in event:
            event = event.replace('"tool_use"', json.dumps(reason)).replace(
                '"end_turn"', json.dumps(reason)
            )
        out.append(event)
    return tuple(out)


class TestCutOffCalls:
    @pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
    async def test_an_answer_is_refused(self, server: ModelServer, reason: str) -> None:
        # The API still sends an object for the cut block's input, maybe {}: run as is,
        # the call would have run with arguments the model never finished.
        answer = anthropic_message("Refunding.", [("t1", "refund", {})])
        answer["stop_reason"] = reason
        server.reply(Reply(json=answer))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match=f"stop_reason '{reason}'") as info:
                await model.complete(ask())
        assert "'refund'" in str(info.value)

    async def test_a_stream_is_refused(self, server: ModelServer) -> None:
        events = _with_stop(anthropic_stream("", [("t1", "refund", "")]), "max_tokens")
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="cut off by the token limit"):
                await collect(model, ask())

    @pytest.mark.parametrize("streamed", [False, True])
    async def test_cut_off_text_still_completes(self, server: ModelServer, streamed: bool) -> None:
        if streamed:
            server.reply(Reply(events=_with_stop(anthropic_stream("Half an ans"), "max_tokens")))
        else:
            answer = anthropic_message("Half an ans")
            answer["stop_reason"] = "max_tokens"
            server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await (collect(model, ask()) if streamed else model.complete(ask()))
        final = response[-1] if streamed else response
        assert final.message.content == "Half an ans"

    async def test_no_tool_runs_and_the_run_fails(self, server: ModelServer) -> None:
        answer = anthropic_message(None, [("t1", "refund", {})])
        answer["stop_reason"] = "max_tokens"
        server.reply(Reply(json=answer))
        ran: list[Any] = []

        async def refund(arguments: Any, context: Any) -> str:
            ran.append(arguments)
            return "refunded"

        tool = ToolSpec("refund", "Refund.", {"type": "object"}, refund)
        async with make(server) as model:
            with pytest.raises(ModelResponseError):
                await Runtime().run(Agent("a", "", model, (tool,)), "Refund it.")
        assert ran == []


@pytest.mark.parametrize("agent_tools", [True, False])
async def test_extra_body_tools_go_beside_the_agent_tools(agent_tools: bool) -> None:
    # Anthropic's web search is declared in the request; the agent's tools must stay.
    bodies: list[Any] = []

    def api(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=anthropic_message("ok"))

    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    tools = (ToolSpec("lookup", "Look up.", {"type": "object"}, _noop),) if agent_tools else ()
    async with httpx.AsyncClient(transport=httpx.MockTransport(api)) as client:
        model = AnthropicModel(
            "claude-x", api_key="k", http_client=client, extra_body={"tools": [search]}
        )
        await Runtime().run(Agent("a", "", model, tools), "Who won?")
    sent = bodies[0]["tools"]
    assert [tool.get("name") for tool in sent] == (
        ["lookup", "web_search"] if agent_tools else ["web_search"]
    )
    assert sent[-1] == search


async def _noop(arguments: Any, context: Any) -> str:
    return "nothing"  # pragma: no cover - never called


# -- text blocks that another block separated ----------------------------------------------

_SEARCHED = [
    {"type": "text", "text": "I'll search for it."},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    {"type": "text", "text": "Based on the results, "},
    {"type": "text", "text": "he was born in 1916", "citations": [{"type": "x"}]},
    {"type": "text", "text": "."},
    {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_search", "input": {"q": "y"}},
    {"type": "text", "text": "\nDone."},
]
_JOINED = "I'll search for it.\n\nBased on the results, he was born in 1916.\nDone."


async def test_text_blocks_a_server_tool_separated_are_paragraphs(server: ModelServer) -> None:
    answer = anthropic_message()
    answer["content"] = _SEARCHED
    server.reply(Reply(json=answer))
    async with make(server) as model:
        response = await model.complete(ask())
    assert response.message.content == _JOINED


async def test_streamed_text_blocks_a_server_tool_separated_are_paragraphs(
    server: ModelServer,
) -> None:
    events = [anthropic_stream("x")[0]]
    for index, block in enumerate(_SEARCHED):
        start = {**block, "text": ""} if block["type"] == "text" else block
        events.append(
            anthropic_event({"type": "content_block_start", "index": index, "content_block": start})
        )
        if block["type"] == "text":
            delta = {"type": "text_delta", "text": block["text"]}
            events.append(
                anthropic_event({"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(anthropic_event({"type": "content_block_stop", "index": index}))
    events += anthropic_stream("x")[-2:]
    server.reply(Reply(events=tuple(events)))
    async with make(server) as model:
        items = await collect(model, ask())
    assert "".join(item.text for item in items[:-1] if isinstance(item, TextDelta)) == _JOINED
    assert items[-1].message.content == _JOINED


async def test_an_empty_text_block_after_a_server_tool_keeps_the_break(
    server: ModelServer,
) -> None:
    answer = anthropic_message()
    answer["content"] = [*_SEARCHED[:3], {"type": "text", "text": ""}, *_SEARCHED[3:]]
    server.reply(Reply(json=answer))
    async with make(server) as model:
        response = await model.complete(ask())
    assert response.message.content == _JOINED
