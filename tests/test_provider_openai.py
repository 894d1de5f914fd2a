"""OpenAIChatModel against a real HTTP server on 127.0.0.1 that checks the wire format."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from _http_server import ModelServer, Reply, sse
from _wire import (
    OPENAI_DONE,
    check_openai,
    openai_chunk,
    openai_completion,
    openai_stream,
    openai_usage_chunk,
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
from runlet.providers import _http
from runlet.providers.openai import OpenAIChatModel

pytestmark = pytest.mark.anyio

WEATHER = ToolDefinition(
    "weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer.running(check_openai) as running:
        yield running
    assert running.problems == []


def make(server: ModelServer, **kwargs: Any) -> OpenAIChatModel:
    settings: dict[str, Any] = {
        "api_key": "sk-test",
        "base_url": server.url + "/v1/",
        "retry_base_delay": 0.001,
        "retry_max_delay": 0.005,
        **kwargs,
    }
    return OpenAIChatModel("test-model", **settings)


def ask(
    text: str = "Hi", *, tools: tuple[ToolDefinition, ...] = (), **options: Any
) -> ModelRequest:
    return ModelRequest("Be brief.", (Message.user(text),), tools, options)


async def collect(model: OpenAIChatModel, request: ModelRequest) -> list[Any]:
    async with model.stream(request) as items:
        return [item async for item in items]


async def streamed(server: ModelServer, events: tuple[str, ...]) -> list[Any]:
    """What the adapter makes of a stream of *events* for a plain request."""
    server.reply(Reply(events=events))
    async with make(server) as model:
        return await collect(model, ask())


async def collect_into(seen: list[Any], model: OpenAIChatModel, request: ModelRequest) -> None:
    async with model.stream(request) as items:
        async for item in items:
            seen.append(item)  # noqa: PERF401 - keep what came before an error


class TestComplete:
    async def test_a_lone_surrogate_goes_as_the_replacement_character(
        self, server: ModelServer
    ) -> None:
        # A file name from os.listdir() that was not UTF-8 holds one; UTF-8 cannot carry
        # it, and failing would fail every later request of the run.
        server.reply(Reply(json=openai_completion("Found it.")))
        turn = Message.assistant("", (ToolCall("c1", "ls", {}),))
        result = Message.tool(ToolResult("c1", "caf\udce9.txt \ud83d\ude00 \U0001f600"))
        async with make(server) as model:
            response = await model.complete(
                ModelRequest("", (ask().messages[0], turn, result), (), {})
            )
        assert "Found it." == response.message.content
        assert "caf\ufffd.txt \ufffd\ufffd \U0001f600" == server.bodies[0]["messages"][2]["content"]

    async def test_plain_answer(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("Hello!", usage=(12, 3))))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response == ModelResponse(Message.assistant("Hello!"), Usage(12, 3, 1))
        (seen,) = server.requests
        assert seen.headers["authorization"] == "Bearer sk-test"
        assert seen.body == {
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ],
        }

    async def test_options_known_keys_pass_others_do_not(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("ok")))
        async with make(server, extra_body={"seed": 7}) as model:
            await model.complete(
                ask(temperature=0.2, max_tokens=50, stop=["\n"], top_k=3, app_data="x", seed=1)
            )
        body = server.bodies[0]
        assert (body["temperature"], body["max_tokens"], body["stop"]) == (0.2, 50, ["\n"])
        assert body["seed"] == 7  # extra_body wins over options
        assert "top_k" not in body
        assert "app_data" not in body

    async def test_tool_call_keeps_id_and_parses_arguments(self, server: ModelServer) -> None:
        server.reply(
            Reply(json=openai_completion(None, [("call_abc", "weather", '{"city": "Oslo"}')]))
        )
        async with make(server) as model:
            response = await model.complete(ask("Weather?", tools=(WEATHER,)))
        assert response.message == Message.assistant(
            "", [ToolCall("call_abc", "weather", {"city": "Oslo"})]
        )
        assert server.bodies[0]["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Current weather for a city.",
                    "parameters": dict(WEATHER.input_schema),
                },
            }
        ]

    async def test_parallel_tool_calls(self, server: ModelServer) -> None:
        calls = [("c1", "weather", '{"city":"Oslo"}'), ("c2", "weather", '{"city":"Rome"}')]
        server.reply(Reply(json=openai_completion("Checking.", calls)))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,)))
        assert response.message.content == "Checking."
        assert response.message.tool_calls == (
            ToolCall("c1", "weather", {"city": "Oslo"}),
            ToolCall("c2", "weather", {"city": "Rome"}),
        )

    async def test_transcript_with_tool_results(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("Done.")))
        calls = (ToolCall("c1", "weather", {"city": "Oslo"}), ToolCall("c2", "weather", {}))
        transcript = (
            Message.system("Extra rule."),
            Message.user("Weather?"),
            Message.assistant("", calls),
            Message.tool(ToolResult("c1", "Sunny")),
            Message.tool(ToolResult("c2", "city is required", is_error=True)),
        )
        async with make(server) as model:
            await model.complete(ModelRequest("", transcript, (WEATHER,), {}))
        assert server.bodies[0]["messages"] == [
            {"role": "system", "content": "Extra rule."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "Error: city is required"},
        ]

    async def test_tool_options_are_left_out_without_tools(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("Hi.")), Reply(json=openai_completion("Hi.")))
        options = {"tool_choice": "auto", "parallel_tool_calls": False, "temperature": 0.5}
        async with make(server) as model:
            await model.complete(ModelRequest("", (Message.user("a"),), (), options))
            await model.complete(ModelRequest("", (Message.user("a"),), (WEATHER,), options))
        without, with_tools = server.bodies
        assert {"temperature": 0.5} == {k: without[k] for k in options if k in without}
        assert options == {k: with_tools[k] for k in options}

    async def test_an_empty_answer_goes_back_as_empty_text(self, server: ModelServer) -> None:
        # The API allows a null content only beside tool_calls.
        server.reply(Reply(json=openai_completion("Done.")))
        transcript = (Message.user("a"), Message.assistant(""), Message.user("b"))
        async with make(server) as model:
            await model.complete(ModelRequest("", transcript, (), {}))
        assert server.bodies[0]["messages"][1] == {"role": "assistant", "content": ""}

    async def test_tool_message_without_result_is_refused(self, server: ModelServer) -> None:
        async with make(server) as model:
            with pytest.raises(Exception, match="tool_result"):
                await model.complete(ModelRequest("", (Message("tool", "x"),), (), {}))
        assert server.requests == []

    async def test_refusal_missing_usage_and_missing_ids(self, server: ModelServer) -> None:
        answer = openai_completion(None, usage=None)
        answer["choices"][0]["message"] = {
            "role": "assistant",
            "content": None,
            "refusal": "I can't help with that.",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": ""}},
                {"id": "", "type": "function", "function": {"name": "weather", "arguments": " \n"}},
            ],
        }
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.content == "I can't help with that."
        first, second = response.message.tool_calls
        assert first.id.startswith("call_0_")
        assert second.id.startswith("call_1_")
        assert first.arguments == second.arguments == {}  # blank text: no arguments
        assert response.usage == Usage(requests=1)

    async def test_only_the_first_choice_is_the_answer(self, server: ModelServer) -> None:
        answer = openai_completion("First.", [("c1", "weather", '{"city": "Oslo"}')])
        second = {
            "index": 1,
            "message": {"role": "assistant", "content": "Second."},
            "finish_reason": "stop",
        }
        answer["choices"].append(second)
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,)))
        assert response.message == Message.assistant(
            "First.", [ToolCall("c1", "weather", {"city": "Oslo"})]
        )

    async def test_no_key_sends_no_authorization(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        server.reply(Reply(json=openai_completion("local")))
        async with make(server, api_key=None) as model:
            await model.complete(ask())
        assert "authorization" not in server.requests[0].headers

    async def test_an_empty_key_sends_none_even_with_one_in_the_environment(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        server.reply(Reply(json=openai_completion("local")))
        async with make(server, api_key="") as model:
            await model.complete(ask())
        assert "authorization" not in server.requests[0].headers

    async def test_an_answer_with_choices_is_an_answer_whatever_else_it_has(
        self, server: ModelServer
    ) -> None:
        answer = openai_completion("Fine.")
        answer["error"] = {"message": "a warning some servers add", "code": 500}
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.content == "Fine."

    async def test_key_from_environment(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        server.reply(Reply(json=openai_completion("ok")))
        async with make(server, api_key=None) as model:
            await model.complete(ask())
        assert server.requests[0].headers["authorization"] == "Bearer sk-env"
        assert "sk-env" not in repr(model)


@pytest.mark.parametrize("thinking", ["Two and two.", [{"type": "text", "text": "Two and two."}]])
async def test_answer_content_as_chunks(server: ModelServer, thinking: Any) -> None:
    # Mistral's reasoning models (Magistral) answer with content as typed chunks.
    answer = openai_completion("x")
    answer["choices"][0]["message"]["content"] = [
        {"type": "thinking", "thinking": thinking},
        {"type": "text", "text": "Four."},
        {"type": "image_url", "image_url": "data:..."},
    ]
    server.reply(Reply(json=answer))
    async with make(server) as model:
        response = await model.complete(ask())
    assert response.message == Message.assistant(
        "Four.", reasoning=[ReasoningPart("Two and two.", provider="openai")]
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_custom_tool_call_is_refused_with_a_reason(
    server: ModelServer, streamed: bool
) -> None:
    call_ = {"id": "c1", "type": "custom", "custom": {"name": "grep", "input": "x"}}
    if streamed:
        server.reply(
            Reply(
                events=(
                    openai_chunk({"tool_calls": [{"index": 0, **call_}]}),
                    openai_chunk({}, "tool_calls"),
                    OPENAI_DONE,
                )
            )
        )
    else:
        answer = openai_completion(None)
        answer["choices"][0]["message"]["tool_calls"] = [call_]
        server.reply(Reply(json=answer))
    async with make(server) as model:
        with pytest.raises(ModelResponseError, match="of type 'custom'; Runlet runs function"):
            await (collect(model, ask()) if streamed else model.complete(ask()))


class TestMalformedAnswers:
    @pytest.mark.parametrize(
        ("reply", "match"),
        [
            (Reply(raw=b"<html>not json"), "not valid JSON"),
            (Reply(json={"choices": []}), "documented shape"),
            (Reply(json={"choices": [{"message": {"content": 5}}]}), "not text"),
            (Reply(json={"choices": [{"message": {"content": ["a"]}}]}), "not content chunks"),
            (Reply(json={"choices": [{"message": ["a"]}]}), "documented shape"),
            (
                Reply(json=openai_completion(None, [("c1", "weather", '{"city": "Os')])),
                "not valid JSON",
            ),
            (Reply(json=openai_completion(None, [("c1", "weather", "[1, 2]")])), "not an object"),
            # Python reads these, JSON has none: NaN would pass a schema's bounds and a
            # policy's `amount > 100` (it compares false with everything).
            (
                Reply(json=openai_completion(None, [("c1", "weather", '{"amount": NaN}')])),
                r"not valid JSON \(NaN is not a JSON value\)",
            ),
            (
                Reply(json=openai_completion(None, [("c1", "weather", '{"a": -Infinity}')])),
                r"not valid JSON \(-Infinity is not a JSON value\)",
            ),
            (
                Reply(json=openai_completion(None, [("c1", "weather", "[" * 100_000)])),
                "not valid JSON \\(nested deeper than Python can read\\)",
            ),
            (Reply(raw=b'{"choices": [], "x": Infinity}'), "not valid JSON"),
            (Reply(raw=b"[" * 100_000), "nested deeper than Python can read"),
            (
                Reply(json=openai_completion(None, [("c1", 5, "{}")])),  # type: ignore[list-item]
                "tool call whose name is 5, not a non-empty string",
            ),
            (Reply(json=openai_completion(None, [("c1", "", "{}")])), "whose name is ''"),
        ],
    )
    async def test_malformed(self, server: ModelServer, reply: Reply, match: str) -> None:
        server.reply(reply)
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match=match):
                await model.complete(ask())

    async def test_error_in_success_body(self, server: ModelServer) -> None:
        # A 503 as an HTTP status would be retried; reported in a 200 answer, it is not.
        server.reply(
            Reply(json={"error": {"message": "model not loaded", "code": 503}}),
            Reply(json=openai_completion("ok")),
        )
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="model not loaded") as info:
                await model.complete(ask())
        assert info.value.status_code == 503
        assert len(server.requests) == 1


class TestErrorsAndRetries:
    async def test_400_carries_the_api_message_and_is_not_retried(
        self, server: ModelServer
    ) -> None:
        error = {"error": {"message": "Unknown model 'x'.", "type": "invalid_request_error"}}
        server.reply(Reply(400, error))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Unknown model 'x'") as info:
                await model.complete(ask())
        assert (info.value.status_code, info.value.body) == (400, "Unknown model 'x'.")
        assert len(server.requests) == 1

    async def test_an_error_names_the_request_id_the_api_gave(self, server: ModelServer) -> None:
        error = {"error": {"message": "Unknown model 'x'.", "type": "invalid_request_error"}}
        server.reply(Reply(400, error, headers={"x-request-id": "req_8d2c6f0e1a"}))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=r"\(request id req_8d2c6f0e1a\)") as info:
                await model.complete(ask())
        assert info.value.api_request_id == "req_8d2c6f0e1a"

    async def test_an_error_in_a_stream_names_the_request_id(self, server: ModelServer) -> None:
        events = (openai_chunk({"content": "Hi"}), sse({"error": {"message": "server_error"}}))
        server.reply(Reply(events=events, headers={"x-request-id": "req_8d2c6f0e1a"}))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=r"\(request id req_8d2c6f0e1a\)") as info:
                await collect(model, ask())
        assert info.value.api_request_id == "req_8d2c6f0e1a"

    async def test_an_error_in_a_success_body_names_the_request_id(
        self, server: ModelServer
    ) -> None:
        error = {"error": {"message": "model not loaded", "code": 503}}
        server.reply(Reply(json=error, headers={"x-request-id": "req_8d2c6f0e1a"}))
        async with make(server, max_retries=0) as model:
            with pytest.raises(ModelAPIError) as info:
                await model.complete(ask())
        assert (info.value.status_code, info.value.api_request_id) == (503, "req_8d2c6f0e1a")

    @pytest.mark.parametrize(
        ("status", "body", "message", "hint"),
        [
            (401, {"error": "bad key"}, "bad key", "Check the API key"),
            (403, {"error": {"message": "not yours"}}, "not yours", "Check the API key"),
            (404, {"detail": "no such model"}, "no such model", "Check base_url"),
            (422, {"message": "bad field", "detail": "x"}, "bad field", ""),
            (400, {"error": "", "detail": "empty error"}, "empty error", ""),
            (403, "plain text", "plain text", "Check the API key"),
            (  # Gemini's OpenAI-compatible endpoint
                400,
                [{"error": {"code": 400, "message": "Bad payload.", "status": "INVALID_ARGUMENT"}}],
                "Bad payload.",
                "",
            ),
        ],
    )
    async def test_error_bodies_of_compatible_servers(
        self, server: ModelServer, status: int, body: Any, message: str, hint: str
    ) -> None:
        raw = body.encode() if isinstance(body, str) else None
        server.reply(Reply(status, body, raw=raw))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=hint or None) as info:
                await model.complete(ask())
        assert (info.value.status_code, info.value.body) == (status, message)

    async def test_429_with_retry_after_then_success(self, server: ModelServer) -> None:
        limited = {"error": {"message": "Rate limit reached"}}
        server.reply(
            Reply(429, limited, headers={"retry-after": "0"}), Reply(json=openai_completion("ok"))
        )
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.content == "ok"
        assert len(server.requests) == 2

    async def test_retry_after_beyond_the_deadline_gives_up_at_once(
        self, server: ModelServer
    ) -> None:
        server.reply(Reply(429, {"error": {"message": "slow down"}}, headers={"retry-after": "30"}))
        async with make(server, retry_deadline=1.0) as model:
            with anyio.fail_after(5):
                with pytest.raises(ModelAPIError, match="slow down") as info:
                    await model.complete(ask())
        assert info.value.status_code == 429
        assert len(server.requests) == 1

    async def test_500_then_success(self, server: ModelServer) -> None:
        server.reply(
            Reply(500, {"error": {"message": "boom"}}), Reply(json=openai_completion("ok"))
        )
        async with make(server) as model:
            assert (await model.complete(ask())).message.content == "ok"
        assert len(server.requests) == 2

    async def test_retries_are_bounded(self, server: ModelServer) -> None:
        server.reply(*[Reply(503, {"error": {"message": "overloaded"}})] * 3)
        async with make(server, max_retries=2) as model:
            with pytest.raises(ModelAPIError, match="after 3 attempts") as info:
                await model.complete(ask())
        assert info.value.status_code == 503
        assert len(server.requests) == 3

    async def test_connection_refused_is_retried_then_reported(self) -> None:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        model = OpenAIChatModel(
            "m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, retry_base_delay=0.001
        )
        async with model:
            with pytest.raises(ModelConnectionError, match="after 3 attempts"):
                await model.complete(ask())

    async def test_cancelled_during_request(self, server: ModelServer) -> None:
        server.reply(Reply(hang=True))
        outcome: list[str] = []

        async def call(model: OpenAIChatModel) -> None:
            try:
                await model.complete(ask())
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

    async def test_cancelled_during_backoff(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        server.reply(Reply(429, {"error": {"message": "wait"}}, headers={"retry-after": "30"}))
        backing_off = anyio.Event()
        real_sleep = anyio.sleep
        delays: list[float] = []

        async def sleep(delay: float) -> None:
            delays.append(delay)
            backing_off.set()
            await real_sleep(delay)

        monkeypatch.setattr(anyio, "sleep", sleep)
        outcome: list[str] = []

        async def call(model: OpenAIChatModel) -> None:
            try:
                await model.complete(ask())
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

        async with make(server, retry_deadline=300) as model:
            with anyio.fail_after(5):  # far less than the 30 s the server asked for
                async with anyio.create_task_group() as group:
                    group.start_soon(call, model)
                    await backing_off.wait()
                    group.cancel_scope.cancel()
        assert delays == [30.0]  # Retry-After honoured
        assert outcome == ["cancelled"]
        assert len(server.requests) == 1


class TestStreaming:
    async def test_is_a_streaming_model(self, server: ModelServer) -> None:
        async with make(server) as model:
            assert isinstance(model, StreamingModel)

    async def test_streamed_text(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("Hello there, friend.", usage=(5, 4))))
        async with make(server) as model:
            items = await collect(model, ask())
        *deltas, final = items
        assert all(isinstance(item, TextDelta) for item in deltas)
        assert len(deltas) == 7
        assert "".join(item.text for item in deltas) == "Hello there, friend."
        assert final == ModelResponse(Message.assistant("Hello there, friend."), Usage(5, 4, 1))
        body = server.bodies[0]
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}

    async def test_streamed_text_with_characters_other_splitters_break_lines_at(
        self, server: ModelServer
    ) -> None:
        # A server that writes JSON with ensure_ascii=False (or serde_json, JSON.stringify)
        # sends these as they are; only CR and LF end a line of an event stream.
        text = "One\u2028two\u2029three\x85four\x0bfive\x0csix\x1cseven."
        server.reply(Reply(events=openai_stream(text, usage=(5, 4))))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1] == ModelResponse(Message.assistant(text), Usage(5, 4, 1))

    async def test_streamed_parallel_tool_calls_in_many_chunks(self, server: ModelServer) -> None:
        calls = [
            ("call_1", "weather", json.dumps({"city": "Oslo", "unit": "celsius"})),
            ("call_2", "weather", json.dumps({"city": "Rome"})),
        ]
        server.reply(Reply(events=openai_stream("Let me check.", calls, piece=1)))
        async with make(server) as model:
            items = await collect(model, ask(tools=(WEATHER,)))
        call_deltas = [item for item in items if isinstance(item, ToolCallDelta)]
        assert len(call_deltas) > 40
        firsts = [delta for delta in call_deltas if delta.id is not None]
        assert [(d.index, d.id, d.name) for d in firsts] == [
            (0, "call_1", "weather"),
            (1, "call_2", "weather"),
        ]
        for index, (_, _, arguments) in enumerate(calls):
            joined = "".join(d.arguments for d in call_deltas if d.index == index)
            assert joined == arguments
        final = items[-1]
        assert isinstance(final, ModelResponse)
        assert final.message == Message.assistant(
            "Let me check.",
            [
                ToolCall("call_1", "weather", {"city": "Oslo", "unit": "celsius"}),
                ToolCall("call_2", "weather", {"city": "Rome"}),
            ],
        )

    async def test_stream_without_usage_or_indexes(self, server: ModelServer) -> None:
        events = (
            ": keep-alive comment\n\n",
            openai_chunk({"tool_calls": [{"id": "a", "function": {"name": "weather"}}]}),
            openai_chunk({"tool_calls": [{"function": {"arguments": '{"city":'}}]}),
            openai_chunk({"tool_calls": [{"function": {"arguments": '"Oslo"}'}}]}),
            # A new id starts the next call; pieces without one continue it.
            openai_chunk({"tool_calls": [{"id": "b", "function": {"name": "weather"}}]}),
            openai_chunk({"tool_calls": [{"function": {"arguments": '{"city": "Rome"}'}}]}),
            openai_chunk({}, "tool_calls"),
        )  # no usage, no [DONE]: the finish_reason ends the answer
        server.reply(Reply(events=events))
        async with make(server, stream_usage=False) as model:
            items = await collect(model, ask())
        assert "stream_options" not in server.bodies[0]
        calls = [
            ToolCall("a", "weather", {"city": "Oslo"}),
            ToolCall("b", "weather", {"city": "Rome"}),
        ]
        assert items[-1] == ModelResponse(Message.assistant("", calls), Usage(requests=1))

    async def test_stream_without_indexes_repeating_the_id_on_every_piece(
        self, server: ModelServer
    ) -> None:
        def piece(call_id: str, **function: str) -> str:
            return openai_chunk({"tool_calls": [{"id": call_id, "function": function}]})

        events = (
            piece("a", name="weather", arguments='{"city":'),
            piece("a", arguments=' "Oslo"}'),
            piece("b", name="weather", arguments='{"city": "Rome"}'),
            piece("b", arguments=""),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        items = await streamed(server, events)
        calls = [
            ToolCall("a", "weather", {"city": "Oslo"}),
            ToolCall("b", "weather", {"city": "Rome"}),
        ]
        assert calls == list(items[-1].message.tool_calls)
        assert [0, 0, 1, 1] == [i.index for i in items if isinstance(i, ToolCallDelta)]

    async def test_stream_whose_indexes_do_not_start_at_zero(self, server: ModelServer) -> None:
        # Some servers number the calls from 1, or leave gaps; a ToolCallDelta's index is
        # the call's place in the message, so a consumer can key its partial calls on it.
        def piece(index: int, call_id: str | None = None, **function: str) -> str:
            call: dict[str, Any] = {"index": index, "function": function}
            if call_id is not None:
                call["id"] = call_id
            return openai_chunk({"tool_calls": [call]})

        events = (
            piece(3, "a", name="weather", arguments='{"city":'),
            piece(7, "b", name="weather", arguments='{"city": "Rome"}'),
            piece(3, arguments=' "Oslo"}'),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        items = await streamed(server, events)
        assert [0, 1, 0] == [i.index for i in items if isinstance(i, ToolCallDelta)]
        assert list(items[-1].message.tool_calls) == [
            ToolCall("a", "weather", {"city": "Oslo"}),
            ToolCall("b", "weather", {"city": "Rome"}),
        ]

    async def test_stream_that_gives_every_call_index_zero(self, server: ModelServer) -> None:
        # Ollama sends each call whole in a chunk of its own, all at index 0: a new id at
        # an index is a new call, while pieces without an id (or with the same one) go on
        # with the call there.
        def piece(call_id: str | None = None, **function: str) -> str:
            call: dict[str, Any] = {"index": 0, "function": function}
            if call_id is not None:
                call["id"] = call_id
            return openai_chunk({"tool_calls": [call]})

        events = (
            piece("call_a1", name="get_weather", arguments='{"location": "Paris"}'),
            piece("call_b2", name="get_time", arguments='{"tz":'),
            piece(arguments=' "Asia/Tokyo"}'),
            piece("call_b2", arguments=""),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        items = await streamed(server, events)
        assert [0, 1, 1, 1] == [i.index for i in items if isinstance(i, ToolCallDelta)]
        assert list(items[-1].message.tool_calls) == [
            ToolCall("call_a1", "get_weather", {"location": "Paris"}),
            ToolCall("call_b2", "get_time", {"tz": "Asia/Tokyo"}),
        ]

    async def test_stream_that_varies_the_id_between_pieces_of_one_call(
        self, server: ModelServer
    ) -> None:
        # A new id at an index starts a new call only once the call there is whole.
        def piece(call_id: str, **function: str) -> str:
            return openai_chunk({"tool_calls": [{"index": 0, "id": call_id, "function": function}]})

        events = (
            piece("x1", name="get_time", arguments=""),
            piece("x2", arguments='{"tz":'),
            piece("x3", arguments=' "UTC"}'),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        items = await streamed(server, events)
        assert [0, 0, 0] == [i.index for i in items if isinstance(i, ToolCallDelta)]
        assert list(items[-1].message.tool_calls) == [ToolCall("x3", "get_time", {"tz": "UTC"})]

    async def test_stream_arguments_that_are_not_a_string(self, server: ModelServer) -> None:
        # complete() refuses the same answer; the stream must not hand out a delta whose
        # arguments are a dict and then fail with a TypeError.
        function = {"name": "weather", "arguments": {"city": "Oslo"}}
        events = (
            openai_chunk({"tool_calls": [{"index": 0, "id": "a", "function": function}]}),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        server.reply(Reply(events=events))
        seen: list[Any] = []
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="as dict, not as a string"):
                await collect_into(seen, model, ask())
        assert [] == seen

    async def test_stream_ended_by_done_without_a_finish_reason(self, server: ModelServer) -> None:
        events = (
            openai_chunk({"refusal": "I can't help"}),
            openai_chunk({"refusal": " with that."}),
            sse(" [DONE]"),  # "data:  [DONE]": the second space stays in the data
        )
        server.reply(Reply(events=events))
        async with make(server, stream_usage=False) as model:
            items = await collect(model, ask())
        assert items == [
            TextDelta("I can't help"),
            TextDelta(" with that."),
            ModelResponse(Message.assistant("I can't help with that."), Usage(requests=1)),
        ]

    async def test_stream_cut_off_midway(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("A long answer that never ends."), cut_after=4))
        seen: list[Any] = []
        async with make(server) as model:
            with pytest.raises(ModelConnectionError, match="cut off"):
                await collect_into(seen, model, ask())
        assert len(seen) == 3
        assert all(isinstance(item, TextDelta) for item in seen)

    @pytest.mark.parametrize("drop", ["reset", "close"])
    async def test_a_connection_dropped_right_after_done_keeps_the_answer(
        self, server: ModelServer, drop: str
    ) -> None:
        # The answer is complete at [DONE]: losing the rest of the body (the closing
        # chunk) to a reset or an abrupt close is no reason to drop it, nor to retry.
        events = openai_stream("All of it.", usage=(3, 2))
        if drop == "reset":
            server.reply(Reply(events=events, reset=True))
        else:
            server.reply(Reply(events=events, cut_after=len(events)))
        async with make(server) as model:
            items = await collect(model, ask())
            assert items[-1] == ModelResponse(Message.assistant("All of it."), Usage(3, 2, 1))
            assert len(server.requests) == 1
            server.reply(Reply(json=openai_completion("Again.")))
            assert (await model.complete(ask())).message.content == "Again."

    async def test_a_finished_stream_leaves_its_connection_for_the_next_request(
        self, server: ModelServer
    ) -> None:
        server.reply(Reply(events=openai_stream("One.")), Reply(events=openai_stream("Two.")))
        async with make(server) as model:
            for text in ("One.", "Two."):
                items = await collect(model, ask())
                assert items[-1].message.content == text
        first, second = server.requests
        assert first.client == second.client  # one connection, read to its end and reused

    async def test_a_stream_held_open_after_done_still_ends(
        self, server: ModelServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_http, "_TAIL_SECONDS", 0.01)  # instead of waiting 1 s
        server.reply(Reply(events=openai_stream("Done."), hold=True))
        async with make(server) as model:
            with anyio.fail_after(5):  # a guard: the answer comes after the tail wait
                items = await collect(model, ask())
        assert items[-1] == ModelResponse(Message.assistant("Done."), Usage(11, 7, 1))

    async def test_a_stream_reset_before_done_is_cut_off(self, server: ModelServer) -> None:
        events = openai_stream("Most of it.")[:-1]  # everything but [DONE], then a reset
        server.reply(Reply(events=events, reset=True))
        async with make(server) as model:
            with pytest.raises(ModelConnectionError, match="cut off"):
                await collect(model, ask())
        assert len(server.requests) == 1

    async def test_only_the_first_choice_is_streamed(self, server: ModelServer) -> None:
        def other(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 1, "delta": delta, "finish_reason": finish}
            return sse({"object": "chat.completion.chunk", "choices": [choice]})

        call = {"index": 0, "id": "c2", "function": {"name": "weather", "arguments": "{}"}}
        events = (
            sse({"choices": [{"delta": {"content": "One"}}]}),  # no index: the first choice
            other({"content": "Two"}),
            other({"reasoning_content": "Thinking twice."}),
            other({"tool_calls": [call]}),
            openai_chunk({"content": " answer."}),
            other({}, "tool_calls"),
            openai_chunk({}, "stop"),
            OPENAI_DONE,
        )
        server.reply(Reply(events=events))
        async with make(server, stream_usage=False) as model:
            items = await collect(model, ask())
        assert items == [
            TextDelta("One"),
            TextDelta(" answer."),
            ModelResponse(Message.assistant("One answer."), Usage(requests=1)),
        ]

    async def test_stream_that_ends_early_is_malformed(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("Hello")[:2]))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="ended before"):
                await collect(model, ask())

    async def test_stream_with_bad_tool_arguments(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("", [("c", "weather", '{"city": ')])))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="not valid JSON"):
                await collect(model, ask())

    async def test_stream_with_nan_in_tool_arguments(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("", [("c", "weather", '{"amount": NaN}')])))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="NaN is not a JSON value"):
                await collect(model, ask())

    async def test_stream_with_arguments_nested_too_deep_for_python(
        self, server: ModelServer
    ) -> None:
        # Ollama-style: each call whole in its own chunk at index 0. Deciding whether the
        # first is whole reads its arguments, which Python cannot: still a clear error.
        def piece(call_id: str, arguments: str) -> str:
            function = {"name": "weather", "arguments": arguments}
            return openai_chunk({"tool_calls": [{"index": 0, "id": call_id, "function": function}]})

        events = (
            piece("c1", "[" * 100_000),
            piece("c2", "{}"),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="nested deeper than Python can read"):
                await collect(model, ask())

    async def test_stream_call_without_a_name(self, server: ModelServer) -> None:
        events = (
            openai_chunk(
                {"tool_calls": [{"index": 0, "id": "a", "function": {"arguments": "{}"}}]}
            ),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="without a function name"):
                await collect(model, ask())

    async def test_stream_call_whose_name_is_not_a_string(self, server: ModelServer) -> None:
        function = {"name": 5, "arguments": "{}"}
        events = (
            openai_chunk({"tool_calls": [{"index": 0, "id": "a", "function": function}]}),
            openai_chunk({}, "tool_calls"),
            OPENAI_DONE,
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="whose name is 5"):
                await collect(model, ask())

    async def test_stream_with_bad_json_chunk(self, server: ModelServer) -> None:
        server.reply(Reply(events=(sse("{oops"),)))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="not valid JSON"):
                await collect(model, ask())

    async def test_error_event_in_stream(self, server: ModelServer) -> None:
        events = (openai_chunk({"content": "Hi"}), sse({"error": {"message": "context too long"}}))
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="context too long") as info:
                await collect(model, ask())
        assert info.value.status_code == 500

    async def test_choice_that_ended_in_an_error_is_the_error(self, server: ModelServer) -> None:
        # OpenRouter: a provider failing mid-answer ends the choice with "error" and puts
        # the error beside it, in a 200 stream. The partial text is not an answer.
        failed = {
            "id": "gen-1",
            "object": "chat.completion.chunk",
            "error": {"code": 502, "message": "Provider disconnected unexpectedly"},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
        }
        server.reply(Reply(events=(openai_chunk({"content": "The first half"}), sse(failed))))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Provider disconnected") as info:
                await collect(model, ask())
        assert info.value.status_code == 502
        answer = openai_completion("The first half")
        answer["error"] = failed["error"]
        answer["choices"][0]["finish_reason"] = "error"
        server.reply(Reply(json=answer))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="Provider disconnected"):
                await model.complete(ask())

    async def test_an_error_on_the_failed_choice_itself_is_the_error(
        self, server: ModelServer
    ) -> None:
        # OpenRouter's schema also lets the failed choice carry its own error.
        error = {"code": 502, "message": "Upstream provider returned an invalid response"}
        failed = {"index": 0, "delta": {}, "finish_reason": "error", "error": error}
        chunk = {"id": "gen-1", "object": "chat.completion.chunk", "choices": [failed]}
        server.reply(Reply(events=(openai_chunk({"content": "Partial"}), sse(chunk))))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="invalid response") as info:
                await collect(model, ask())
        assert info.value.status_code == 502
        answer = openai_completion("Partial")
        answer["choices"][0].update(finish_reason="error", error=error)
        bare = openai_completion("Partial")
        bare["choices"][0]["finish_reason"] = "error"  # and no word on what failed
        server.reply(Reply(json=answer), Reply(json=bare))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="invalid response"):
                await model.complete(ask())
            with pytest.raises(ModelAPIError, match='ended with finish_reason "error"'):
                await model.complete(ask())

    async def test_an_older_llama_server_error_field_is_the_error(
        self, server: ModelServer
    ) -> None:
        # llama-server before September 2025 wrote a failure as an "error:" field, not
        # "data:", then ended the stream as usual.
        failure = {"code": 400, "message": "the request exceeds the context size", "type": "x"}
        events = (
            openai_chunk({"content": "Hi"}),
            f"error: {json.dumps(failure)}\n\n",
            "data: [DONE]\n\n",
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="exceeds the context size") as info:
                await collect(model, ask())
        assert info.value.status_code == 400

    async def test_arguments_sent_as_an_object_are_refused_clearly(
        self, server: ModelServer
    ) -> None:
        answer = openai_completion(None, [("call_1", "weather", '{"city": "Oslo"}')])
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo"}
        server.reply(Reply(json=answer))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="as dict, not as a string of JSON"):
                await model.complete(ask(tools=(WEATHER,)))

    @pytest.mark.parametrize(
        "base_url",
        [
            "https://res.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-10-21",
            "http://localhost:8000/v1#frag",
        ],
    )
    def test_a_base_url_with_a_query_string_is_refused(self, base_url: str) -> None:
        with pytest.raises(ConfigurationError, match="query string or a fragment"):
            OpenAIChatModel("gpt-4o", base_url=base_url, api_key="k")

    async def test_stream_content_that_is_not_text(self, server: ModelServer) -> None:
        server.reply(Reply(events=(openai_chunk({"content": ["Hi"]}, "stop"), sse("[DONE]"))))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="list holding a str, not content"):
                await collect(model, ask())

    async def test_stream_content_as_chunks(self, server: ModelServer) -> None:
        # Mistral's reasoning models (Magistral) stream content as typed chunks.
        thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "Two and two."}]}
        events = (
            openai_chunk({"role": "assistant", "content": [thinking]}),
            openai_chunk({"content": [{"type": "text", "text": "Fo"}]}),
            openai_chunk({"content": [{"type": "reference", "reference_ids": [1]}]}),
            openai_chunk({"content": "ur."}, "stop"),
            sse("[DONE]"),
        )
        server.reply(Reply(events=events))
        async with make(server) as model:
            items = await collect(model, ask())
        assert [type(item).__name__ for item in items[:-1]] == [
            "ReasoningDelta",
            "TextDelta",
            "TextDelta",
        ]
        final = items[-1].message
        assert (final.content, final.reasoning) == (
            "Four.",
            (ReasoningPart("Two and two.", provider="openai"),),
        )

    async def test_stream_retries_before_the_first_byte(self, server: ModelServer) -> None:
        server.reply(
            Reply(502, {"error": {"message": "bad gateway"}}), Reply(events=openai_stream("ok"))
        )
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].message.content == "ok"
        assert len(server.requests) == 2

    async def test_stream_refused_with_400(self, server: ModelServer) -> None:
        server.reply(Reply(400, {"error": {"message": "stream not supported"}}))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="stream not supported"):
                await collect(model, ask())

    async def test_consumer_stops_early(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("one two three four")))
        async with make(server) as model:
            async with model.stream(ask()) as items:
                async for item in items:
                    assert isinstance(item, TextDelta)
                    break
            # the connection was closed, so a new request works on the same model
            server.reply(Reply(json=openai_completion("again")))
            assert (await model.complete(ask())).message.content == "again"

    async def test_a_stream_left_early_does_not_wait_for_the_rest(
        self, server: ModelServer
    ) -> None:
        server.reply(Reply(events=openai_stream("one two three four"), hold=True))
        async with make(server) as model:
            with anyio.fail_after(5):  # a guard: the server never ends this body
                async with model.stream(ask()) as items:
                    async for item in items:
                        assert item == TextDelta("one")
                        break

    async def test_a_stream_left_unread_frees_its_connection(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("Unread.")), Reply(json=openai_completion("ok")))
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(limits=limits) as client:
            model = make(server, http_client=client, max_retries=0)
            with anyio.fail_after(5):  # a guard: a leaked connection blocks the next request
                async with model.stream(ask()):
                    pass
                assert (await model.complete(ask())).message.content == "ok"

    async def test_usage_chunk_alone(self, server: ModelServer) -> None:
        server.reply(
            Reply(
                events=(
                    openai_chunk({"content": "x"}, "stop"),
                    openai_usage_chunk(1, 2),
                    OPENAI_DONE,
                )
            )
        )
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].usage == Usage(1, 2, 1)

    async def test_runtime_stream_through_the_adapter(self, server: ModelServer) -> None:
        server.reply(Reply(events=openai_stream("Streamed through the runtime.")))
        async with make(server) as model:
            agent = Agent("a", "Be brief.", model)
            async with Runtime().stream(agent, "Hi") as stream:
                events = [event async for event in stream]
        texts = [event.text for event in events if isinstance(event, TextDelta)]
        assert "".join(texts) == "Streamed through the runtime."
        assert stream.result.output == "Streamed through the runtime."


class TestClientOwnership:
    async def test_given_client_is_never_closed(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("1")), Reply(json=openai_completion("2")))
        async with httpx.AsyncClient() as client:
            async with make(server, http_client=client) as model:
                await model.complete(ask())
            assert not client.is_closed
            assert (await model.complete(ask())).message.content == "2"

    async def test_own_client_is_closed_and_recreated(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("1")), Reply(json=openai_completion("2")))
        model = make(server)
        await model.complete(ask())
        [first] = model._own_clients.values()
        await model.aclose()
        assert first.is_closed
        await model.complete(ask())
        [second] = model._own_clients.values()
        assert second is not first
        await model.aclose()
        await model.aclose()  # closing twice is harmless


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
        Reply(json=openai_completion(None, [("call_refund_7", "refund", '{"order_id": "123"}')])),
        Reply(json=openai_completion("Order 123 is refunded.", usage=(40, 6))),
    )
    async with make(server) as model:
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        agent = Agent("support", "Ask for approval before refunds.", model, (REFUND,))
        result = await runtime.run(agent, "Refund order 123.")
    assert result.status == "interrupted"
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    assert result.interruption.tool_call == ToolCall("call_refund_7", "refund", {"order_id": "123"})
    store = runtime.checkpoint_store
    assert store is not None
    saved = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))

    # Another "process": a fresh store, runtime, model and agent.
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
    assert resumed.usage == Usage(11 + 40, 7 + 6, 2)
    messages = server.bodies[1]["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == "call_refund_7"
    assert messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_refund_7",
        "content": "Refunded order 123.",
    }


# -- reasoning text from compatible servers -------------------------------------------------


class TestReasoning:
    @pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
    async def test_kept_on_the_message(self, server: ModelServer, field: str) -> None:
        answer = openai_completion(
            "Paris.", reasoning="France's capital is Paris.", reasoning_field=field
        )
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask("Capital of France?"))
        assert response.message == Message.assistant(
            "Paris.", reasoning=[ReasoningPart("France's capital is Paris.", provider="openai")]
        )

    @pytest.mark.parametrize(
        ("content", "reasoning", "kept"),
        [("Think.", "Think.", "Think."), ("First.", "Second.", "First."), ("", "Only.", "Only.")],
    )
    async def test_both_fields_filled_count_once(
        self, server: ModelServer, content: str, reasoning: str, kept: str
    ) -> None:
        # reasoning_content first; an empty field is no reasoning.
        answer = openai_completion("Paris.", reasoning=content)
        answer["choices"][0]["message"]["reasoning"] = reasoning
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.reasoning == (ReasoningPart(kept, provider="openai"),)

    async def test_none_without_reasoning(self, server: ModelServer) -> None:
        answer = openai_completion("Paris.", reasoning=None)
        answer["choices"][0]["message"]["reasoning_content"] = None
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.reasoning == ()

    @pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
    async def test_streamed_as_reasoning_deltas(self, server: ModelServer, field: str) -> None:
        events = openai_stream("Paris.", reasoning="France's capital...", reasoning_field=field)
        items = await streamed(server, events)
        *deltas, final = items
        reasoning = [item for item in deltas if isinstance(item, ReasoningDelta)]
        assert len(reasoning) > 1
        assert "".join(item.text for item in reasoning) == "France's capital..."
        assert "".join(item.text for item in deltas if isinstance(item, TextDelta)) == "Paris."
        assert final.message.reasoning == (ReasoningPart("France's capital...", provider="openai"),)

    async def test_not_sent_back_by_default(self, server: ModelServer) -> None:
        # Groq refuses a message field it does not know: a run whose reasoning came from
        # Groq failed on its second request when the field went back.
        server.reply(Reply(json=openai_completion("ok")))
        call = ToolCall("c1", "weather", {"city": "Oslo"})
        reasoning = [ReasoningPart("Look it up.", provider="openai")]
        transcript = (
            Message.user("Weather?"),
            Message.assistant("", [call], reasoning=reasoning),
            Message.tool(ToolResult("c1", "Sunny")),
        )
        async with make(server) as model:
            assert model.send_reasoning is False
            await model.complete(ModelRequest("", transcript, (WEATHER,), {}))
        assert "reasoning" not in json.dumps(server.bodies[0]["messages"])

    @pytest.mark.parametrize(
        ("base_url", "send", "sent"),
        [
            ("https://api.deepseek.com", None, True),
            ("https://api.deepseek.com/v1", None, True),
            ("https://api.deepseek.com", False, False),
            ("https://api.groq.com/openai/v1", None, False),
            ("https://notdeepseek.com/v1", None, False),
            ("http://127.0.0.1:8000/v1", True, True),
        ],
    )
    async def test_sent_back_where_the_server_needs_it(
        self, base_url: str, send: bool | None, sent: bool
    ) -> None:
        bodies: list[Any] = []

        def api(request: httpx.Request) -> httpx.Response:
            bodies.append(json.loads(request.content))
            return httpx.Response(200, json=openai_completion("ok"))

        call = ToolCall("c1", "weather", {"city": "Oslo"})
        transcript = (
            Message.user("Weather?"),
            Message.assistant("", [call], reasoning=[ReasoningPart("Look.", provider="openai")]),
            Message.tool(ToolResult("c1", "Sunny")),
        )
        async with httpx.AsyncClient(transport=httpx.MockTransport(api)) as client:
            model = OpenAIChatModel("m", base_url=base_url, http_client=client, send_reasoning=send)
            await model.complete(ModelRequest("", transcript, (WEATHER,), {}))
        assert sent == ("reasoning_content" in bodies[0]["messages"][1])

    def test_send_reasoning_must_be_a_bool_or_none(self) -> None:
        with pytest.raises(ConfigurationError, match="send_reasoning"):
            OpenAIChatModel("m", send_reasoning="yes")  # type: ignore[arg-type]

    async def test_sent_back_with_the_turns_that_called_tools(self, server: ModelServer) -> None:
        # DeepSeek's thinking mode answers 400 when a tool-calling turn comes back without
        # its reasoning_content. Only this adapter's own parts go, and never with a plain
        # answer.
        server.reply(Reply(json=openai_completion("ok")))
        call = ToolCall("c1", "weather", {"city": "Oslo"})
        reasoning = [
            ReasoningPart("Look it up. ", provider="openai"),
            ReasoningPart("Claude's", signature="sig", provider="anthropic"),
            ReasoningPart(redacted_data="E==", provider="anthropic"),
            ReasoningPart("Then answer.", provider="openai"),
        ]
        transcript = (
            Message.user("Weather?"),
            Message.assistant("Checking.", [call], reasoning=reasoning),
            Message.tool(ToolResult("c1", "Sunny")),
            Message.assistant("Sunny in Oslo.", reasoning=reasoning),
            Message.user("And tomorrow?"),
            Message.assistant("", [ToolCall("c2", "weather", {"city": "Oslo"})]),
            Message.tool(ToolResult("c2", "Rain")),
        )
        async with make(server, send_reasoning=True) as model:
            await model.complete(ModelRequest("", transcript, (WEATHER,), {}))
        sent = server.bodies[0]["messages"]
        assert sent[1] == {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Look it up. Then answer.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        }
        assert {"role": "assistant", "content": "Sunny in Oslo."} == sent[3]
        assert "reasoning_content" not in sent[5]  # no reasoning of its own


# -- cached prompt tokens -------------------------------------------------------------------


class TestCachedTokens:
    async def test_prompt_tokens_details(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("ok", usage=(2006, 300), cached=1920)))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.usage == Usage(2006, 300, 1, cache_read_tokens=1920)

    async def test_deepseek_cache_hit_tokens(self, server: ModelServer) -> None:
        answer = openai_completion("ok", usage=(100, 5))
        answer["usage"] |= {"prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36}
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.usage == Usage(100, 5, 1, cache_read_tokens=64)

    async def test_streamed(self, server: ModelServer) -> None:
        events = (*openai_stream("ok")[:-2], openai_usage_chunk(500, 3, cached=384), OPENAI_DONE)
        items = await streamed(server, events)
        assert items[-1].usage == Usage(500, 3, 1, cache_read_tokens=384)

    async def test_odd_counts_are_zero(self, server: ModelServer) -> None:
        answer = openai_completion("ok")
        answer["usage"] = {
            "prompt_tokens": -1,
            "completion_tokens": "7",
            "prompt_tokens_details": {"cached_tokens": True},
        }
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.usage == Usage(requests=1)


# -- errors inside a stream ----------------------------------------------------------------


class TestInStreamErrors:
    @pytest.mark.parametrize(
        ("error", "status"),
        [
            ({"message": "Server overloaded", "type": "server_error", "code": None}, 500),
            ({"message": "Slow down", "type": "requests", "code": "rate_limit_exceeded"}, 429),
            ({"message": "Too long", "type": "invalid_request_error", "code": None}, 400),
            ({"message": "No quota", "type": "insufficient_quota"}, 429),
            ({"message": "Bad key", "code": "invalid_api_key"}, 401),
            ({"message": "vLLM says no", "type": "BadRequestError", "code": 400}, 400),
            ({"message": "Busy", "code": 503}, 503),
            ({"message": "Last 5xx", "code": 599}, 599),
            ({"message": "Code first", "type": "invalid_request_error", "code": 503}, 503),
            ({"message": "Then status", "type": "invalid_request_error", "status": 502}, 502),
            ({"message": "Unknown", "type": "mystery_error"}, 500),
            ({"message": "Odd code", "code": 1234}, 500),
            ({"message": "Not an error code", "code": 200}, 500),
        ],
    )
    async def test_the_status_openai_would_answer(
        self, server: ModelServer, error: dict[str, Any], status: int
    ) -> None:
        events = (openai_chunk({"content": "Hi"}), sse({"error": error}))
        server.reply(Reply(events=events))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=error["message"]) as streamed:
                await collect(model, ask())
        assert streamed.value.status_code == status
        assert streamed.value.body == error["message"]
        assert len(server.requests) == 1  # the stream had opened: never retried

    async def test_same_error_as_the_http_answer(self, server: ModelServer) -> None:
        error = {"error": {"message": "Rate limit reached", "type": "requests"}}
        server.reply(Reply(429, error), Reply(events=(sse(error),)))
        async with make(server, max_retries=0) as model:
            with pytest.raises(ModelAPIError) as answered:
                await model.complete(ask())
            with pytest.raises(ModelAPIError) as streamed:
                await collect(model, ask())
        assert streamed.value.status_code == answered.value.status_code == 429
        assert streamed.value.body == answered.value.body == "Rate limit reached"
        assert str(streamed.value).endswith("This is usually temporary: try again later.")

    async def test_error_that_is_not_an_object(self, server: ModelServer) -> None:
        server.reply(Reply(events=(sse({"error": ["odd"]}),)))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match=r'\["odd"\]') as info:
                await collect(model, ask())
        assert info.value.status_code == 500


class TestServerThatDoesNotStream:
    async def test_a_plain_answer_is_refused_with_a_reason(self, server: ModelServer) -> None:
        server.reply(Reply(json=openai_completion("Not streamed.")))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="does not stream") as info:
                await collect(model, ask())
        assert "application/json, not text/event-stream" in str(info.value)

    async def test_no_content_type(self, server: ModelServer) -> None:
        server.reply(Reply(raw=b"", headers={"content-type": ""}))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="no content type"):
                await collect(model, ask())

    async def test_an_error_body_is_the_api_error(self, server: ModelServer) -> None:
        server.reply(Reply(json={"error": {"message": "model not loaded", "code": 503}}))
        async with make(server) as model:
            with pytest.raises(ModelAPIError, match="model not loaded") as info:
                await collect(model, ask())
        assert info.value.status_code == 503

    async def test_event_stream_with_parameters_is_a_stream(self, server: ModelServer) -> None:
        # Content types are compared without their parameters and case.
        content_type = {"content-type": "Text/Event-Stream; charset=utf-8"}
        server.reply(Reply(events=openai_stream("ok"), headers=content_type))
        async with make(server) as model:
            items = await collect(model, ask())
        assert items[-1].message.content == "ok"


async def test_reasoning_and_cached_tokens_through_checkpoint_json(server: ModelServer) -> None:
    server.reply(
        Reply(
            json=openai_completion(
                None,
                [("call_refund_7", "refund", '{"order_id": "123"}')],
                usage=(1200, 30),
                cached=1024,
                reasoning="Refunds need approval.",
            )
        ),
        Reply(json=openai_completion("Order 123 is refunded.", usage=(1300, 6), cached=1152)),
    )
    async with make(server) as model:
        runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
        agent = Agent("support", "Ask for approval before refunds.", model, (REFUND,))
        result = await runtime.run(agent, "Refund order 123.")
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    store = runtime.checkpoint_store
    assert store is not None
    saved = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))
    fresh_store = InMemoryCheckpointStore()
    checkpoint = structure_checkpoint(json.loads(saved))
    assert checkpoint.transcript[-1].reasoning == (
        ReasoningPart("Refunds need approval.", provider="openai"),
    )
    await fresh_store.save(checkpoint)
    async with make(server, send_reasoning=True) as fresh_model:  # as DeepSeek needs it
        fresh_agent = Agent("support", "Ask for approval before refunds.", fresh_model, (REFUND,))
        resumed = await Runtime(checkpoint_store=fresh_store).resume(
            fresh_agent,
            checkpoint_id=result.checkpoint_id,
            response=HumanResponse(request_id=result.interruption.id, action="approve"),
        )
    assert resumed.output == "Order 123 is refunded."
    assert resumed.usage == Usage(2500, 36, 2, cache_read_tokens=2176)
    # The reasoning came back from the checkpoint with the turn that called the tool, as
    # DeepSeek's thinking mode needs it after an approval.
    (calling,) = [m for m in server.bodies[1]["messages"] if m.get("tool_calls")]
    assert "Refunds need approval." == calling["reasoning_content"]


# -- Gemini's thought signatures ------------------------------------------------------------


def _signed(answer: dict[str, Any], signatures: dict[int, str]) -> dict[str, Any]:
    """*answer* with Gemini's ``extra_content`` on the tool calls at the given indexes."""
    calls = answer["choices"][0]["message"]["tool_calls"]
    for index, signature in signatures.items():
        calls[index]["extra_content"] = {"google": {"thought_signature": signature}}
    return answer


TWO_CALLS = [
    ("call_a", "weather", '{"city": "Oslo"}'),
    ("call_b", "weather", '{"city": "Rome"}'),
]


class TestThoughtSignatures:
    async def test_kept_before_the_call_they_came_with(self, server: ModelServer) -> None:
        answer = _signed(openai_completion(None, TWO_CALLS, reasoning="Two cities."), {1: "S1"})
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,)))
        assert response.message.reasoning == (
            ReasoningPart("Two cities.", provider="openai"),
            ReasoningPart(signature="S1", provider="openai", calls_before=1),
        )

    @pytest.mark.parametrize(
        "extra",
        [
            None,
            {},
            {"google": None},
            {"google": {}},
            {"google": {"thought_signature": ""}},
            "x",
            {"google": "x"},
            {"google": ["S"]},
            {"google": {"thought_signature": 5}},
        ],
    )
    async def test_none_without_a_signature(self, server: ModelServer, extra: Any) -> None:
        answer = openai_completion(None, TWO_CALLS)
        answer["choices"][0]["message"]["tool_calls"][0]["extra_content"] = extra
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask(tools=(WEATHER,)))
        assert response.message.reasoning == ()

    @pytest.mark.parametrize(("call_id", "index"), [("call_a", 0), ("call_b", 1)])
    async def test_streamed(self, server: ModelServer, call_id: str, index: int) -> None:
        events = list(openai_stream("", TWO_CALLS))
        # Gemini sends each call whole in one chunk, its signature beside it.
        at = next(i for i, event in enumerate(events) if f'"{call_id}"' in event)
        chunk = json.loads(events[at].removeprefix("data: ").strip())
        chunk["choices"][0]["delta"]["tool_calls"][0]["extra_content"] = {
            "google": {"thought_signature": "S"}
        }
        events[at] = f"data: {json.dumps(chunk)}\n\n"
        final = (await streamed(server, tuple(events)))[-1]
        assert [call.id for call in final.message.tool_calls] == ["call_a", "call_b"]
        assert final.message.reasoning == (
            ReasoningPart(signature="S", provider="openai", calls_before=index),
        )

    async def test_sent_back_on_their_calls(self, server: ModelServer) -> None:
        # Gemini 3 answers 400 to a tool-calling turn that comes back without them, so
        # they go back even where reasoning text does not (send_reasoning=False).
        server.reply(Reply(json=openai_completion("ok")))
        calls = [ToolCall("a", "weather", {"city": "Oslo"}), ToolCall("b", "weather", {})]
        reasoning = [
            ReasoningPart("Not sent.", provider="openai"),
            ReasoningPart(signature="S-b", provider="openai", calls_before=1),
            ReasoningPart("Claude's", signature="not ours", provider="anthropic"),
            ReasoningPart(signature="past the calls", provider="openai", calls_before=2),
        ]
        transcript = (
            Message.user("Weather?"),
            Message.assistant("", calls, reasoning=reasoning),
            Message.tool(ToolResult("a", "Sunny")),
            Message.tool(ToolResult("b", "Rain")),
        )
        async with make(server) as model:
            assert model.send_reasoning is False
            await model.complete(ModelRequest("", transcript, (WEATHER,), {}))
        sent = server.bodies[0]["messages"][1]
        assert "reasoning_content" not in sent
        assert "extra_content" not in sent["tool_calls"][0]
        assert sent["tool_calls"][1]["extra_content"] == {"google": {"thought_signature": "S-b"}}

    async def test_through_an_approval_and_checkpoint_json(self, server: ModelServer) -> None:
        server.reply(
            Reply(
                json=_signed(
                    openai_completion(None, [("call_refund_7", "refund", '{"order_id": "123"}')]),
                    {0: "CrICAdHt=="},
                )
            ),
            Reply(json=openai_completion("Order 123 is refunded.")),
        )
        async with make(server) as model:
            runtime = Runtime(checkpoint_store=InMemoryCheckpointStore())
            agent = Agent("support", "Ask for approval before refunds.", model, (REFUND,))
            result = await runtime.run(agent, "Refund order 123.")
            assert result.interruption is not None
            assert result.checkpoint_id is not None
            store = runtime.checkpoint_store
            assert store is not None
            saved = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))
            fresh_store = InMemoryCheckpointStore()
            await fresh_store.save(structure_checkpoint(json.loads(saved)))
            resumed = await Runtime(checkpoint_store=fresh_store).resume(
                agent,
                checkpoint_id=result.checkpoint_id,
                response=HumanResponse(request_id=result.interruption.id, action="approve"),
            )
        assert resumed.output == "Order 123 is refunded."
        (calling,) = [m for m in server.bodies[1]["messages"] if m.get("tool_calls")]
        assert calling["tool_calls"][0]["extra_content"] == {
            "google": {"thought_signature": "CrICAdHt=="}
        }


# -- an answer cut off while it called tools -------------------------------------------------


class TestCutOffCalls:
    async def test_an_answer_is_refused(self, server: ModelServer) -> None:
        # The call's arguments stop at the cut; "" would read as {} and run.
        answer = openai_completion(None, [("c1", "refund", "")])
        answer["choices"][0]["finish_reason"] = "length"
        server.reply(Reply(json=answer))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match='finish_reason "length"') as info:
                await model.complete(ask())
        assert "'refund'" in str(info.value)

    async def test_a_stream_is_refused(self, server: ModelServer) -> None:
        events = [
            openai_chunk({"role": "assistant", "content": None}),
            openai_chunk(
                {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "refund"}}]}
            ),
            openai_chunk({}, "length"),
            OPENAI_DONE,
        ]
        server.reply(Reply(events=tuple(events)))
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="cut off by the token limit"):
                await collect(model, ask())

    async def test_cut_off_text_still_completes(self, server: ModelServer) -> None:
        answer = openai_completion("Half an ans")
        answer["choices"][0]["finish_reason"] = "length"
        server.reply(Reply(json=answer))
        async with make(server) as model:
            response = await model.complete(ask())
        assert response.message.content == "Half an ans"

    async def test_no_tool_runs_and_the_run_fails(self, server: ModelServer) -> None:
        answer = openai_completion(None, [("c1", "refund", '{"order_id": "1')])
        answer["choices"][0]["finish_reason"] = "length"
        server.reply(Reply(json=answer))
        ran: list[Any] = []

        async def refund(arguments: Any, context: Any) -> str:
            ran.append(arguments)
            return "refunded"

        tool = ToolSpec("refund", "Refund.", {"type": "object"}, refund)
        async with make(server) as model:
            with pytest.raises(ModelResponseError, match="no tool of this turn ran"):
                await Runtime().run(Agent("a", "", model, (tool,)), "Refund it.")
        assert ran == []
