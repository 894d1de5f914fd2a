"""Tests from a mutation review of runlet/providers/ and runlet/_tracing.py.

Each test pins down a behaviour that a mutant of the adapters, the shared HTTP layer or
the tracing module changed without any other test failing.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import opentelemetry.trace
import pytest
from _http_server import ModelServer, Reply, sse
from _wire import (
    OPENAI_DONE,
    anthropic_stream,
    check_anthropic,
    check_openai,
    openai_chunk,
    openai_completion,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runlet import (
    Agent,
    ConfigurationError,
    Message,
    ModelAPIError,
    ModelRequest,
    Runtime,
    ToolCall,
    ToolContext,
    ToolSpec,
    Usage,
    _tracing,
)
from runlet._tracing import CONTENT_ENV, Tracing, cancel_span, resume_span
from runlet.providers import RetryPolicy
from runlet.providers._http import HTTPModel
from runlet.providers.anthropic import AnthropicModel
from runlet.providers.openai import OpenAIChatModel
from runlet.testing import ScriptedModel, call

REQUEST = ModelRequest("", (Message.user("Hi"),), (), {})


@pytest.fixture
def openai_server() -> Iterator[ModelServer]:
    with ModelServer.running(check_openai) as running:
        yield running
    assert running.problems == []


@pytest.fixture
def anthropic_server() -> Iterator[ModelServer]:
    with ModelServer.running(check_anthropic) as running:
        yield running
    assert running.problems == []


def anthropic(server: ModelServer, **kwargs: Any) -> AnthropicModel:
    return AnthropicModel("test-model", api_key="sk-ant-test", base_url=server.url, **kwargs)


def openai(server: ModelServer, **kwargs: Any) -> OpenAIChatModel:
    return OpenAIChatModel("test-model", api_key="sk-test", base_url=server.url + "/v1", **kwargs)


# -- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
@pytest.mark.parametrize(
    "keyword", ["max_retries", "retry_base_delay", "retry_max_delay", "retry_deadline"]
)
def test_a_retry_policy_and_a_single_retry_keyword_are_refused(
    adapter: Callable[..., HTTPModel], keyword: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"the keywords {keyword}, not both"):
        adapter("m", api_key="k", retry=RetryPolicy(), **{keyword: 1})


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
async def test_the_default_timeouts_are_the_documented_ones(
    anyio_backend: str, adapter: Callable[..., HTTPModel]
) -> None:
    # docs/models.md: timeout 600 s, connect_timeout 10 s.
    async with adapter("m", api_key="k") as model:
        timeout = (await model._client()).timeout
    assert (10.0, 600.0, 600.0, 600.0) == (
        timeout.connect,
        timeout.read,
        timeout.write,
        timeout.pool,
    )


# -- the shared HTTP layer --------------------------------------------------------------


@pytest.mark.anyio
async def test_an_error_body_that_is_not_json_is_quoted_up_to_500_characters(
    anyio_backend: str, openai_server: ModelServer
) -> None:
    # A proxy's HTML error page can be long; the message quotes only its start.
    page = "<html>" + "x" * 2000 + "</html>"
    openai_server.reply(Reply(502, raw=page.encode(), headers={"content-type": "text/html"}))
    async with openai(openai_server, max_retries=0) as model:
        with pytest.raises(ModelAPIError) as info:
            await model.complete(REQUEST)
    assert page[:500] == info.value.body
    assert "</html>" not in str(info.value)


class EndsAfterDone(httpx.AsyncByteStream):
    """An event stream whose body ends a moment after its ``[DONE]`` event; records
    whether the adapter read it to its end (which lets the connection be reused)."""

    def __init__(self) -> None:
        self.read_to_the_end = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
        yield b"data: [DONE]\n\n"
        await anyio.lowlevel.checkpoint()  # the rest is not there at once
        yield b": end of body\n\n"
        self.read_to_the_end = True


@pytest.mark.anyio
async def test_the_rest_of_a_stream_after_its_end_event_is_read(anyio_backend: str) -> None:
    body = EndsAfterDone()

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body, headers={"content-type": "text/event-stream"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        model = OpenAIChatModel("m", base_url="http://api.test/v1", http_client=client)
        async with model.stream(REQUEST) as items:
            seen = [item async for item in items]
    assert "Hi" == seen[-1].message.content
    assert body.read_to_the_end


# The first loop's pooled connection is closed when collected; asyncio warns about it then.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize(
    "backends", [("asyncio", "asyncio"), ("asyncio", "trio"), ("trio", "asyncio"), ("trio", "trio")]
)
def test_aclose_in_another_event_loop_leaves_the_first_loops_client_alone(
    backends: tuple[str, str],
) -> None:
    # Its connections belong to the loop that made them: closing them from another loop
    # fails ("Event loop is closed"), so aclose() closes only the calling loop's client.
    with ModelServer.running(check_openai) as server:
        server.reply(Reply(json=openai_completion("hi")))
        model = openai(server)

        async def ask(model: OpenAIChatModel) -> None:
            await model.complete(REQUEST)

        anyio.run(ask, model, backend=backends[0])
        [client] = model._own_clients.values()
        anyio.run(model.aclose, backend=backends[1])
        assert not client.is_closed
        assert [client] == list(model._own_clients.values())
        del model, client
        gc.collect()
    assert [] == server.problems


# -- OpenAI Chat Completions ------------------------------------------------------------


async def openai_streamed(server: ModelServer, events: tuple[str, ...]) -> list[Any]:
    server.reply(Reply(events=events))
    async with openai(server) as model, model.stream(REQUEST) as items:
        return [item async for item in items]


@pytest.mark.anyio
async def test_a_nameless_call_at_an_index_is_not_whole_so_a_new_id_goes_on_with_it(
    anyio_backend: str, openai_server: ModelServer
) -> None:
    # docs/models.md: a new id at an index starts a new call "once the call there is
    # whole (its name and a complete JSON object of arguments)". Here the arguments
    # came first, complete, and the name after them under another id.
    def piece(call_id: str, **function: str) -> str:
        return openai_chunk({"tool_calls": [{"index": 0, "id": call_id, "function": function}]})

    events = (
        piece("y1", arguments="{}"),
        piece("y2", name="get_time"),
        openai_chunk({}, "tool_calls"),
        OPENAI_DONE,
    )
    items = await openai_streamed(openai_server, events)
    assert [ToolCall("y2", "get_time", {})] == list(items[-1].message.tool_calls)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["tokens", "requests"])
async def test_a_rate_limit_error_known_only_by_its_type_is_a_429(
    anyio_backend: str, openai_server: ModelServer, kind: str
) -> None:
    # OpenAI's rate-limit errors have the type "tokens" or "requests"; without a code
    # the type alone says what status the error stands for.
    error = {"message": "Rate limit reached", "type": kind}
    events = (openai_chunk({"content": "Hi"}), sse({"error": error}))
    with pytest.raises(ModelAPIError) as info:
        await openai_streamed(openai_server, events)
    assert 429 == info.value.status_code
    assert str(info.value).endswith("This is usually temporary: try again later.")


@pytest.mark.anyio
async def test_usage_on_the_chunk_that_finishes_the_choice_is_kept(
    anyio_backend: str, openai_server: ModelServer
) -> None:
    # Some compatible servers send usage with the last choice chunk rather than in a
    # chunk of its own with no choices.
    last = {
        "choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
    events = (openai_chunk({"content": "Hi"}), sse(last), OPENAI_DONE)
    items = await openai_streamed(openai_server, events)
    assert "Hi!" == items[-1].message.content
    assert Usage(12, 3, 1) == items[-1].usage


# -- Anthropic Messages -----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_stream_without_event_names_is_read_by_the_type_in_its_data(
    anyio_backend: str, anthropic_server: ModelServer
) -> None:
    # Each event's data names its own type; the "event:" line only repeats it, and a
    # proxy that rewrites the stream may leave it out.
    named = anthropic_stream("Hello there", [("toolu_1", "get_weather", '{"city": "Paris"}')])
    assert all(event.startswith("event: ") for event in named)
    anthropic_server.reply(Reply(events=tuple(event.split("\n", 1)[1] for event in named)))
    async with anthropic(anthropic_server) as model, model.stream(REQUEST) as items:
        seen = [item async for item in items]
    final = seen[-1]
    assert "Hello there" == final.message.content
    assert [ToolCall("toolu_1", "get_weather", {"city": "Paris"})] == list(final.message.tool_calls)
    assert (21, 9) == (final.usage.input_tokens, final.usage.output_tokens)


# -- tracing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "captured"),
    [
        ("true", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        (" TRUE\n", True),
        ("false", False),
        ("0", False),
        ("", False),
        ("truthy", False),
    ],
)
def test_the_content_variable_is_read_as_a_boolean_setting(
    monkeypatch: pytest.MonkeyPatch, value: str, captured: bool
) -> None:
    monkeypatch.setenv(CONTENT_ENV, value)
    assert captured is Tracing(None, None).capture_content()
    assert Tracing(None, False).capture_content() is False  # the runtime's word wins


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_global_provider_set_anew_is_the_one_the_next_run_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A test suite that installs a fresh global provider per test: a runtime made once
    # follows it, rather than tracing into the first provider it saw.
    api = _tracing._load_api()
    assert api is not None
    monkeypatch.setattr(api, "direct", True)
    tracing = Tracing(None, None)
    exporters = []
    for _ in range(2):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        monkeypatch.setattr(opentelemetry.trace, "_TRACER_PROVIDER", provider)
        tracer = tracing.tracer()
        assert tracer is not None
        tracer.start_span("a run").end()
        provider.shutdown()
        exporters.append(exporter)
    assert [1, 1] == [len(exporter.get_finished_spans()) for exporter in exporters]


@pytest.mark.anyio
@pytest.mark.parametrize("option", ["max_output_tokens", "max_completion_tokens"])
async def test_max_output_tokens_is_recorded_as_the_request_s_max_tokens(
    anyio_backend: str, provider: TracerProvider, exporter: InMemorySpanExporter, option: str
) -> None:
    agent = Agent("plain", "Answer.", ScriptedModel(["Hi."]))
    await Runtime(tracer_provider=provider).run(agent, "Hello", options={option: 64})
    [chat] = spans_named(exporter, "chat")
    assert 64 == (chat.attributes or {})["gen_ai.request.max_tokens"]


class Store:
    class Unavailable(Exception):
        """An error class nested in another, as libraries define them."""


@pytest.mark.anyio
async def test_error_type_names_a_nested_exception_class_with_its_outer_class(
    anyio_backend: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with pytest.raises(Store.Unavailable), cancel_span(Tracing(provider, False), "cp_1"):
        raise Store.Unavailable("the database is down")
    [span] = exporter.get_finished_spans()
    assert "Store.Unavailable" == (span.attributes or {})["error.type"]
    assert "Unavailable" == span.status.description  # content capture off: no message


@pytest.mark.anyio
async def test_without_content_capture_a_refused_call_s_span_holds_no_arguments(
    anyio_backend: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "paid"

    schema = {"type": "object", "properties": {"iban": {"type": "string"}}, "required": ["iban"]}
    model = ScriptedModel(
        [
            [
                call("pay", iban=123456789, id="c1"),  # fails the schema
                call("transfer", iban="DE89370400440532013000", id="c2"),  # no such tool
            ],
            "Sorry.",
        ]
    )
    agent = Agent("payer", "Pay.", model, (ToolSpec("pay", "Pay.", schema, pay),))
    await Runtime(tracer_provider=provider, trace_content=False).run(agent, "Pay")
    refused = spans_named(exporter, "execute_tool pay") + spans_named(
        exporter, "execute_tool transfer"
    )
    assert 2 == len(refused)
    for span in refused:
        attributes = dict(span.attributes or {})
        assert "gen_ai.tool.call.arguments" not in attributes
        assert "gen_ai.tool.call.result" not in attributes
        assert not any("123456789" in str(v) or "DE89" in str(v) for v in attributes.values())


@pytest.mark.anyio
@pytest.mark.parametrize("content", [False, True])
async def test_a_resume_span_holds_the_instructions_only_with_content_capture(
    anyio_backend: str, provider: TracerProvider, exporter: InMemorySpanExporter, content: bool
) -> None:
    agent = Agent("secretary", "The door code is 4711.", ScriptedModel([]))
    with resume_span(Tracing(provider, content), agent, "cp_1", None):
        pass
    [span] = spans_named(exporter, "invoke_agent secretary")
    attributes = dict(span.attributes or {})
    assert content == ("gen_ai.system_instructions" in attributes)
    assert content == any("4711" in str(value) for value in attributes.values())


@pytest.mark.parametrize(
    ("base_url", "said"),
    [
        ("http://bob:secret@[::1/v1", "is not a URL httpx can use"),
        ("http://localhost:99x/v1", "is not a URL httpx can use: Invalid port"),
        ("htp://api.example.com/v1", "must start with https://"),
        ("api.example.com/v1", "must start with https://"),
    ],
)
@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
def test_a_base_url_httpx_cannot_use_is_refused_when_the_model_is_made(
    adapter: str, base_url: str, said: str
) -> None:
    # Before: a raw ValueError from the constructor, or httpx.InvalidURL (or retries of
    # an unsupported scheme, "could not reach") at the first request.
    make = OpenAIChatModel if adapter == "openai" else AnthropicModel
    with pytest.raises(ConfigurationError, match=said) as info:
        make("m", base_url=base_url, api_key="k")
    assert "secret" not in str(info.value)
