"""OpenTelemetry spans: run, chat, execute_tool and the human-in-the-loop records.

Each test builds its own SDK tracer provider with an in-memory exporter and hands it to
``Runtime(tracer_provider=...)``, so no test depends on OpenTelemetry's global provider
(which can be set only once per process). Tests of the global-provider path replace
``opentelemetry.trace.get_tracer_provider`` for their duration instead.

A span shows up in the exporter only once it has ended, so finding a span there also
proves it was closed. Nothing here sleeps: tests rendezvous on ``anyio.Event`` objects.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import opentelemetry.trace
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from runlet import (
    Agent,
    Checkpoint,
    CheckpointNotFoundError,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ModelStreamItem,
    Runtime,
    TextDelta,
    ToolContext,
    ToolSpec,
    Usage,
    _tracing,
    structure_checkpoint,
    unstructure_checkpoint,
)
from runlet._tracing import (
    CONTENT_ENV,
    TRACE_LINK_FIELD,
    Tracing,
    cancel_span,
    resume_span,
    run_span,
    span_reference,
)
from runlet.providers.anthropic import AnthropicModel
from runlet.providers.openai import OpenAIChatModel
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

GUARD = 5  # seconds; only a guard against hangs, never something a test waits for
USAGE = Usage(input_tokens=10, output_tokens=4, requests=1)
CITY: dict[str, Any] = {
    "type": "object",
    "required": ["city"],
    "properties": {"city": {"type": "string"}},
}


class NamedModel(ScriptedModel):
    """A scripted model that names its model and provider, as adapters do."""

    model = "scripted-1"
    provider_name = "scripted"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


async def weather(arguments: Mapping[str, Any], context: ToolContext) -> Any:
    return {"city": arguments["city"], "sky": "sunny"}


def weather_tool(*, approval: bool = False) -> ToolSpec:
    return ToolSpec("get_weather", "Current weather.", CITY, weather, requires_approval=approval)


def weather_agent(model: Any, *tools: ToolSpec) -> Agent:
    return Agent("weather", "Answer with the tools.", model, tools or (weather_tool(),))


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = by_name(spans, name)
    return span


def tree(spans: tuple[ReadableSpan, ...]) -> list[Any]:
    """The spans as nested ``(name, [children])`` pairs, children in start order."""
    ids = {span.context.span_id for span in spans if span.context is not None}

    def children(parent: int | None) -> list[Any]:
        found = [
            span
            for span in spans
            if (span.parent.span_id if span.parent and span.parent.span_id in ids else None)
            == parent
        ]
        found.sort(key=lambda span: span.start_time or 0)
        return [(span.name, children(span.context.span_id)) for span in found if span.context]

    return children(None)


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


# --- a plain run -------------------------------------------------------------------------

# Settings the conventions name become request attributes; others (and non-numbers, a
# bool included) do not.
OPTIONS = {
    "temperature": 0.5,
    "top_p": 0.9,
    "max_tokens": 100,
    "max_output_tokens": True,
    "seed": 7,
    "logprobs": True,
}


@pytest.mark.parametrize("mode", ["run", "stream"])
async def test_plain_run_makes_one_span_per_run_model_request_and_tool_call(
    mode: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = NamedModel([call("get_weather", city="Paris", id="call_w"), "Sunny."], usage=USAGE)
    runtime = Runtime(tracer_provider=provider)
    agent = weather_agent(model)
    if mode == "run":
        result = await runtime.run(agent, "Weather in Paris?", options=OPTIONS)
    else:
        async with runtime.stream(agent, "Weather in Paris?", options=OPTIONS) as s:
            async for _ in s:
                pass
        result = s.result
    spans = exporter.get_finished_spans()

    assert tree(spans) == [
        (
            "invoke_agent weather",
            [
                ("chat scripted-1", []),
                ("execute_tool get_weather", []),
                ("chat scripted-1", []),
            ],
        )
    ]
    assert len({trace_id(span) for span in spans}) == 1
    run = one(spans, "invoke_agent weather")
    assert run.kind == SpanKind.INTERNAL
    assert run.status.status_code == StatusCode.UNSET
    assert attrs_of(run) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "scripted",
        "gen_ai.agent.name": "weather",
        "gen_ai.request.model": "scripted-1",
        "gen_ai.conversation.id": result.run_id,
        "runlet.run_id": result.run_id,
        "runlet.run.status": "completed",
        "gen_ai.usage.input_tokens": 20,
        "gen_ai.usage.output_tokens": 8,
    }
    first, last = by_name(spans, "chat scripted-1")
    assert first.kind == SpanKind.CLIENT
    assert attrs_of(first) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted-1",
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 100,
        "gen_ai.request.seed": 7,
        "gen_ai.conversation.id": result.run_id,
        "runlet.run_id": result.run_id,
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 4,
    }
    assert attrs_of(last)["gen_ai.response.finish_reasons"] == ("stop",)
    tool = one(spans, "execute_tool get_weather")
    assert tool.kind == SpanKind.INTERNAL
    assert tool.status.status_code == StatusCode.UNSET
    assert attrs_of(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "call_w",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Current weather.",
        "gen_ai.conversation.id": result.run_id,
        "runlet.run_id": result.run_id,
    }


async def test_run_span_is_a_child_of_the_callers_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    runtime = Runtime(tracer_provider=provider)
    with provider.get_tracer("app").start_as_current_span("request"):
        await runtime.run(weather_agent(NamedModel(["Hi."])), "Hello")
    spans = exporter.get_finished_spans()
    assert tree(spans) == [("request", [("invoke_agent weather", [("chat scripted-1", [])])])]


async def test_a_model_without_a_name_gives_plain_chat_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await Runtime(tracer_provider=provider).run(weather_agent(ScriptedModel(["Hi."])), "Hello")
    spans = exporter.get_finished_spans()
    assert tree(spans) == [("invoke_agent weather", [("chat", [])])]
    for span in spans:
        assert span.attributes is not None
        assert span.attributes["gen_ai.provider.name"] == "_OTHER"
        assert "gen_ai.request.model" not in span.attributes

    # Empty names count as none.
    class Blank(ScriptedModel):
        model = ""
        provider_name = ""

    exporter.clear()
    await Runtime(tracer_provider=provider).run(weather_agent(Blank(["Hi."])), "Hello")
    spans = exporter.get_finished_spans()
    assert tree(spans) == [("invoke_agent weather", [("chat", [])])]
    for span in spans:
        assert attrs_of(span)["gen_ai.provider.name"] == "_OTHER"
        assert "gen_ai.request.model" not in attrs_of(span)


async def test_the_http_adapters_name_their_provider_and_model(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing = Tracing(provider, None)
    async with httpx.AsyncClient() as client:
        for model in (
            OpenAIChatModel("gpt-4o", api_key="key", http_client=client),
            AnthropicModel("claude-x", api_key="key", http_client=client),
        ):
            run = Runtime()._start(Agent("helper", "Help.", model), "Hi", None, None, None)
            with run_span(tracing, run):
                pass
    openai, anthropic = exporter.get_finished_spans()
    assert attrs_of(openai)["gen_ai.provider.name"] == "openai"
    assert attrs_of(openai)["gen_ai.request.model"] == "gpt-4o"
    assert attrs_of(anthropic)["gen_ai.provider.name"] == "anthropic"
    assert attrs_of(anthropic)["gen_ai.request.model"] == "claude-x"


# --- message contents --------------------------------------------------------------------


def content_keys(spans: tuple[ReadableSpan, ...]) -> set[str]:
    keys = set()
    for span in spans:
        keys |= {key for key in attrs_of(span) if "messages" in key or ".call.a" in key}
        keys |= {key for key in attrs_of(span) if key.endswith((".call.result", "instructions"))}
    return keys


async def test_contents_are_recorded_only_when_the_application_opts_in(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    def script() -> NamedModel:
        return NamedModel([call("get_weather", city="Paris", id="call_w"), "Sunny."])

    monkeypatch.delenv(CONTENT_ENV, raising=False)
    await Runtime(tracer_provider=provider).run(weather_agent(script()), "Weather?")
    assert content_keys(exporter.get_finished_spans()) == set()

    exporter.clear()
    result = await Runtime(tracer_provider=provider, trace_content=True).run(
        weather_agent(script()), "Weather?"
    )
    spans = exporter.get_finished_spans()
    assert content_keys(spans) == {
        "gen_ai.system_instructions",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
    run = attrs_of(one(spans, "invoke_agent weather"))
    assert json.loads(run["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "Answer with the tools."}
    ]
    assert json.loads(run["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]}
    ]
    assert json.loads(run["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Sunny."}],
            "finish_reason": "stop",
        }
    ]
    first, last = by_name(spans, "chat scripted-1")
    assert json.loads(attrs_of(first)["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_w",
                    "name": "get_weather",
                    "arguments": {"city": "Paris"},
                }
            ],
            "finish_reason": "tool_calls",
        }
    ]
    assert json.loads(attrs_of(last)["gen_ai.input.messages"])[2] == {
        "role": "tool",
        "parts": [
            {"type": "tool_call_response", "id": "call_w", "response": result.transcript[2].content}
        ],
    }
    tool = attrs_of(one(spans, "execute_tool get_weather"))
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"city": "Paris"}
    assert tool["gen_ai.tool.call.result"] == '{"city": "Paris", "sky": "sunny"}'

    # The conventions' environment variable switches it on when the runtime leaves it
    # open; an explicit trace_content=False wins over it.
    monkeypatch.setenv(CONTENT_ENV, "True")
    exporter.clear()
    await Runtime(tracer_provider=provider).run(weather_agent(script()), "Weather?")
    assert "gen_ai.tool.call.arguments" in content_keys(exporter.get_finished_spans())
    exporter.clear()
    await Runtime(tracer_provider=provider, trace_content=False).run(
        weather_agent(script()), "Weather?"
    )
    assert content_keys(exporter.get_finished_spans()) == set()


# --- tools ----------------------------------------------------------------------------------


async def test_parallel_tool_spans_are_children_of_the_run_and_parents_of_handler_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = provider.get_tracer("app")
    arrived = 0
    both = anyio.Event()

    async def lookup(arguments: Mapping[str, Any], context: ToolContext) -> str:
        nonlocal arrived
        with app.start_as_current_span(f"fetch {arguments['city']}"):
            arrived += 1
            if arrived == 2:
                both.set()
            await both.wait()  # both handlers are inside their spans at once
            return str(arguments["city"])

    tool = ToolSpec("lookup", "Look a city up.", CITY, lookup)
    model = NamedModel(
        [[call("lookup", city="Paris", id="c1"), call("lookup", city="Oslo", id="c2")], "Done."]
    )
    with anyio.fail_after(GUARD):
        await Runtime(tracer_provider=provider).run(weather_agent(model, tool), "Two cities")
    spans = exporter.get_finished_spans()

    run = one(spans, "invoke_agent weather")
    tools = by_name(spans, "execute_tool lookup")
    assert len(tools) == 2
    for span in tools:
        assert parent_of(span) == span_id(run)
    for city, call_id in [("Paris", "c1"), ("Oslo", "c2")]:
        [tool_span] = [s for s in tools if attrs_of(s)["gen_ai.tool.call.id"] == call_id]
        assert parent_of(one(spans, f"fetch {city}")) == span_id(tool_span)
    for span in by_name(spans, "chat scripted-1"):
        assert parent_of(span) == span_id(run)


async def test_a_sync_handler_in_a_worker_thread_nests_its_spans_under_its_call(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = provider.get_tracer("app")

    def lookup(arguments: Mapping[str, Any], context: ToolContext) -> str:
        with app.start_as_current_span("query"):
            return "found"

    tool = ToolSpec("lookup", "Look a city up.", CITY, lookup)
    model = NamedModel([call("lookup", city="Paris"), "Done."])
    await Runtime(tracer_provider=provider).run(weather_agent(model, tool), "Go")
    assert tree(exporter.get_finished_spans()) == [
        (
            "invoke_agent weather",
            [
                ("chat scripted-1", []),
                ("execute_tool lookup", [("query", [])]),
                ("chat scripted-1", []),
            ],
        )
    ]


async def test_failed_tool_calls_end_their_spans_with_an_error_type(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def broken(arguments: Mapping[str, Any], context: ToolContext) -> str:
        raise ValueError("no such city")

    tools = (ToolSpec("broken", "Fails.", CITY, broken), weather_tool())
    model = NamedModel(
        [
            [
                call("broken", city="Paris", id="c1"),
                call("get_weather", city=3, id="c2"),
                call("teleport", id="c3"),
            ],
            "Sorry.",
        ]
    )
    result = await Runtime(tracer_provider=provider).run(weather_agent(model, *tools), "Go")
    assert result.status == "completed"  # failed calls are results for the model
    spans = exporter.get_finished_spans()
    run = one(spans, "invoke_agent weather")
    assert run.status.status_code == StatusCode.UNSET
    for name, call_id, error in [
        ("execute_tool broken", "c1", "tool_error"),
        ("execute_tool get_weather", "c2", "invalid_arguments"),
        ("execute_tool teleport", "c3", "unknown_tool"),
    ]:
        span = one(spans, name)
        assert parent_of(span) == span_id(run)
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description is None  # the error text is content: opt-in only
        assert attrs_of(span)["error.type"] == error
        assert attrs_of(span)["gen_ai.tool.call.id"] == call_id

    exporter.clear()
    model = NamedModel(
        [[call("broken", city="Paris", id="c1"), call("get_weather", id="c2")], "Sorry."]
    )
    runtime = Runtime(tracer_provider=provider, trace_content=True)
    await runtime.run(weather_agent(model, *tools), "Go")
    spans = exporter.get_finished_spans()
    span = one(spans, "execute_tool broken")
    assert span.status.description == "Tool 'broken' failed: ValueError: no such city"
    refused = one(spans, "execute_tool get_weather")
    assert attrs_of(refused)["gen_ai.tool.call.arguments"] == "{}"
    assert refused.status.description == attrs_of(refused)["gen_ai.tool.call.result"]
    assert "Invalid arguments for tool 'get_weather'" in str(refused.status.description)


async def test_a_no_op_tracer_provider_given_explicitly_is_harmless() -> None:
    runtime = Runtime(tracer_provider=opentelemetry.trace.NoOpTracerProvider())
    agent = weather_agent(NamedModel([call("get_weather", city="Paris"), "Sunny."]))
    run = runtime._start(agent, "Weather?", None, None, None)
    with run_span(runtime._loop.tracing, run):
        assert run.trace is not None
        assert span_reference(run.trace) is None  # no ids worth keeping
    assert (await runtime.run(agent, "Weather?")).output == "Sunny."


# --- failures and cancellation ----------------------------------------------------------


async def test_a_failing_model_ends_its_spans_with_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    def explode(request: ModelRequest) -> Any:
        raise RuntimeError("upstream is down")

    for content in (False, True):
        exporter.clear()
        runtime = Runtime(tracer_provider=provider, trace_content=content)
        with pytest.raises(ModelError, match="upstream is down"):
            await runtime.run(weather_agent(NamedModel([explode])), "Hello")
        spans = exporter.get_finished_spans()
        assert tree(spans) == [("invoke_agent weather", [("chat scripted-1", [])])]
        for span in spans:
            assert span.status.status_code == StatusCode.ERROR
            assert attrs_of(span)["error.type"] == "ModelError"
            assert [event.name for event in span.events] == ["exception"]
            (event,) = span.events
            recorded = [span.status.description, *dict(event.attributes or {}).values()]
            # A message may quote content (arguments, what a person typed): it is
            # recorded only with content capture on; the class always is.
            assert content == any("upstream is down" in str(value) for value in recorded)
            assert "runlet.ModelError" == dict(event.attributes or {})["exception.type"]
            if not content:
                assert "ModelError" == span.status.description
                assert "_loop.py" in str(dict(event.attributes or {})["exception.stacktrace"])
        assert "runlet.run.status" not in attrs_of(one(spans, "invoke_agent weather"))


async def test_a_response_without_usable_usage_is_refused_and_its_span_ended(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class NoCounts:
        model = "scripted-1"
        provider_name = "scripted"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            return ModelResponse(Message.assistant("Hi."), Usage(None, None, 1))  # type: ignore[arg-type]

    runtime = Runtime(tracer_provider=provider)
    with pytest.raises(ModelResponseError, match="input_tokens=None"):
        await runtime.run(weather_agent(NoCounts()), "Hello")
    spans = exporter.get_finished_spans()  # both ended: none is left open
    assert tree(spans) == [("invoke_agent weather", [("chat scripted-1", [])])]
    assert {attrs_of(span)["error.type"] for span in spans} == {"ModelResponseError"}


async def test_a_cancelled_run_ends_every_span_with_an_error_and_stays_cancelled(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    started = anyio.Event()

    async def stuck(arguments: Mapping[str, Any], context: ToolContext) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    tool = ToolSpec("stuck", "Never returns.", CITY, stuck)
    model = NamedModel([call("stuck", city="Paris", id="c1"), "never"])
    runtime = Runtime(tracer_provider=provider)
    finished = False

    async def run() -> None:
        nonlocal finished
        await runtime.run(weather_agent(model, tool), "Go")
        finished = True

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await started.wait()
            group.cancel_scope.cancel()
    assert not finished
    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        ("invoke_agent weather", [("chat scripted-1", []), ("execute_tool stuck", [])])
    ]
    for name in ("invoke_agent weather", "execute_tool stuck"):
        span = one(spans, name)
        assert span.status.status_code == StatusCode.ERROR
        assert attrs_of(span)["error.type"] == "cancelled"
        assert span.events == ()  # a cancellation is not recorded as an exception
    assert one(spans, "chat scripted-1").status.status_code == StatusCode.UNSET


class HangingModel:
    """A streaming model that sends one delta, then waits until it is cancelled."""

    model = "scripted-1"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("the runtime streams")

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelStreamItem]]:
        async def items() -> AsyncIterator[ModelStreamItem]:
            yield TextDelta("Hel")
            await anyio.sleep_forever()

        async with aclosing(items()) as chunks:  # type: ignore[type-var]
            yield chunks


async def test_a_cancelled_stream_ends_its_spans_with_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    runtime = Runtime(tracer_provider=provider)
    seen = []
    with anyio.fail_after(GUARD), provider.get_tracer("app").start_as_current_span("request"):
        async with runtime.stream(weather_agent(HangingModel()), "Hello") as stream:
            async for event in stream:
                seen.append(event)
                break  # the consumer leaves: the stream cancels the run
    assert seen == [TextDelta("Hel")]
    spans = exporter.get_finished_spans()
    # The run span starts inside the stream's task, yet under the consumer's span.
    assert tree(spans) == [("request", [("invoke_agent weather", [("chat scripted-1", [])])])]
    for name in ("invoke_agent weather", "chat scripted-1"):
        span = one(spans, name)
        assert span.status.status_code == StatusCode.ERROR
        assert attrs_of(span)["error.type"] == "cancelled"
    assert one(spans, "request").status.status_code == StatusCode.UNSET


# --- human in the loop ------------------------------------------------------------------


async def test_an_approval_round_trip_across_a_json_checkpoint(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = NamedModel([call("get_weather", city="Pariss", id="call_w"), "Sunny."], usage=USAGE)
    agent = weather_agent(model, weather_tool(approval=True))
    first = Runtime(InMemoryCheckpointStore(), tracer_provider=provider)
    interrupted = await first.run(agent, "Weather in Paris?")
    assert interrupted.interruption is not None
    assert interrupted.checkpoint_id is not None
    checkpoint = await first.checkpoint_store.load(interrupted.checkpoint_id)  # type: ignore[union-attr]

    paused = exporter.get_finished_spans()
    assert tree(paused) == [("invoke_agent weather", [("chat scripted-1", [])])]
    run = one(paused, "invoke_agent weather")
    assert run.status.status_code == StatusCode.UNSET
    assert attrs_of(run)["runlet.run.status"] == "interrupted"
    assert attrs_of(run)["runlet.interrupt.kind"] == "approval"
    assert attrs_of(run)["runlet.interrupt.checkpoint_id"] == interrupted.checkpoint_id
    assert attrs_of(run)["runlet.interrupt.request_id"] == interrupted.interruption.id
    assert attrs_of(run)["runlet.interrupt.tool_name"] == "get_weather"
    assert attrs_of(run)["runlet.interrupt.tool_call_id"] == "call_w"
    assert attrs_of(run)["gen_ai.usage.input_tokens"] == 10

    # Another process: the checkpoint travels as JSON into a fresh store.
    data = json.loads(json.dumps(unstructure_checkpoint(checkpoint)))
    store = InMemoryCheckpointStore()
    await store.save(structure_checkpoint(data))
    exporter.clear()
    second = Runtime(store, tracer_provider=provider, trace_content=True)
    response = HumanResponse(
        interrupted.interruption.id,
        "approve",
        edited_arguments={"city": "Paris"},
        responded_by="alice",
    )
    result = await second.resume(agent, checkpoint_id=interrupted.checkpoint_id, response=response)
    assert result.status == "completed"

    resumed = exporter.get_finished_spans()
    assert tree(resumed) == [
        ("invoke_agent weather", [("execute_tool get_weather", []), ("chat scripted-1", [])])
    ]
    span = one(resumed, "invoke_agent weather")
    assert trace_id(span) != trace_id(run)  # a new trace, joined by the ids below
    assert attrs_of(span) | {"gen_ai.input.messages": None} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "scripted",
        "gen_ai.agent.name": "weather",
        "gen_ai.request.model": "scripted-1",
        "gen_ai.conversation.id": interrupted.run_id,
        "runlet.run_id": interrupted.run_id,
        "runlet.checkpoint_id": interrupted.checkpoint_id,
        "runlet.resume.reason": "human_response",
        "gen_ai.system_instructions": '[{"type": "text", "content": "Answer with the tools."}]',
        "runlet.human.request_id": interrupted.interruption.id,
        "runlet.human.request_kind": "approval",
        "runlet.human.tool_call_id": "call_w",
        "runlet.human.action": "approve",
        "runlet.human.edited_arguments": True,
        "runlet.human.responded_by": "alice",
        "runlet.human.arguments": '{"city": "Paris"}',
        "runlet.human.decision_count": 1,
        "runlet.run.status": "completed",
        "gen_ai.output.messages": (
            '[{"role": "assistant", "parts": [{"type": "text", "content": "Sunny."}], '
            '"finish_reason": "stop"}]'
        ),
        "gen_ai.usage.input_tokens": 10,  # this resume's own request only
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.input.messages": None,
    }
    assert span.links == ()  # the checkpoint keeps no trace_link yet
    [event] = span.events
    assert event.name == "runlet.human_decision"
    assert dict(event.attributes or {})["runlet.human.action"] == "approve"
    for child in resumed:
        assert attrs_of(child)["runlet.run_id"] == interrupted.run_id
        assert attrs_of(child)["runlet.checkpoint_id"] == interrupted.checkpoint_id
    tool = attrs_of(one(resumed, "execute_tool get_weather"))
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"city": "Paris"}
    # The result as the model gets it: with the note that a person edited the call.
    [tool_message] = [m for m in result.transcript if m.role == "tool"]
    assert tool_message.content.startswith("A human edited the arguments")
    assert 1 == tool_message.content.count("A human edited the arguments")  # noted once
    assert tool["gen_ai.tool.call.result"] == tool_message.content


async def test_a_rejected_call_gets_no_tool_span_and_its_decision_names_it(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = weather_agent(
        NamedModel([call("get_weather", city="Paris", id="call_w"), "Fine."]),
        weather_tool(approval=True),
    )
    runtime = Runtime(InMemoryCheckpointStore(), tracer_provider=provider)
    interrupted = await runtime.run(agent, "Weather?")
    assert interrupted.checkpoint_id is not None
    assert interrupted.interruption is not None
    exporter.clear()
    await runtime.resume(
        agent,
        checkpoint_id=interrupted.checkpoint_id,
        response=HumanResponse(interrupted.interruption.id, "reject"),
    )
    resumed = exporter.get_finished_spans()
    assert tree(resumed) == [("invoke_agent weather", [("chat scripted-1", [])])]
    span = attrs_of(one(resumed, "invoke_agent weather"))
    assert (span["runlet.human.tool_call_id"], span["runlet.human.action"]) == ("call_w", "reject")


@pytest.mark.parametrize("plain", [False, True], ids=["durable store", "plain store"])
async def test_a_resume_that_stops_again_records_the_next_interruption(
    provider: TracerProvider, exporter: InMemorySpanExporter, plain: bool
) -> None:
    calls = [call("get_weather", city="Paris", id="c1"), call("get_weather", city="Oslo", id="c2")]
    agent = weather_agent(NamedModel([calls, "Both sunny."]), weather_tool(approval=True))
    store = PlainStore() if plain else InMemoryCheckpointStore()
    runtime = Runtime(store, tracer_provider=provider)
    first = await runtime.run(agent, "Two cities")
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    exporter.clear()
    second = await runtime.resume(
        agent,
        checkpoint_id=first.checkpoint_id,
        response=HumanResponse(first.interruption.id, "reject"),
    )
    assert second.status == "interrupted"
    spans = exporter.get_finished_spans()
    assert tree(spans) == [("invoke_agent weather", [])]  # rejected: nothing ran
    span = one(spans, "invoke_agent weather")
    assert attrs_of(span)["runlet.checkpoint_id"] == first.checkpoint_id
    assert attrs_of(span)["runlet.human.action"] == "reject"
    assert attrs_of(span)["runlet.run.status"] == "interrupted"
    assert attrs_of(span)["runlet.interrupt.checkpoint_id"] == second.checkpoint_id
    assert attrs_of(span)["runlet.interrupt.tool_call_id"] == "c2"
    assert attrs_of(span)["runlet.interrupt.request_count"] == 1


class PlainStore:
    """The three-method store of the spec: at-least-once resume."""

    def __init__(self) -> None:
        self.saved: dict[str, Checkpoint] = {}

    async def save(self, checkpoint: Checkpoint) -> None:
        self.saved[checkpoint.id] = checkpoint

    async def load(self, checkpoint_id: str) -> Checkpoint:
        return self.saved[checkpoint_id]

    async def delete(self, checkpoint_id: str) -> None:
        del self.saved[checkpoint_id]


async def test_a_resume_from_a_plain_store_is_traced_the_same_way(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = NamedModel([call("get_weather", city="Paris", id="c1"), "Sunny."])
    agent = weather_agent(model, weather_tool(approval=True))
    runtime = Runtime(PlainStore(), tracer_provider=provider)
    first = await runtime.run(agent, "Weather?")
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    exporter.clear()
    await runtime.resume(
        agent,
        checkpoint_id=first.checkpoint_id,
        response=HumanResponse(first.interruption.id, "approve"),
    )
    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        ("invoke_agent weather", [("execute_tool get_weather", []), ("chat scripted-1", [])])
    ]
    span = one(spans, "invoke_agent weather")
    assert attrs_of(span)["runlet.run_id"] == first.run_id
    assert attrs_of(span)["runlet.checkpoint_id"] == first.checkpoint_id
    assert attrs_of(span)["runlet.human.action"] == "approve"
    assert attrs_of(span)["runlet.human.edited_arguments"] is False
    assert attrs_of(span)["runlet.run.status"] == "completed"


async def test_a_resume_that_fails_after_the_final_answer_is_not_called_completed(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class DownAtTheEnd(InMemoryCheckpointStore):
        async def resolve(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("db down")

    model = NamedModel([call("get_weather", city="Paris", id="c1"), "Sunny."])
    agent = weather_agent(model, weather_tool(approval=True))
    runtime = Runtime(DownAtTheEnd(), tracer_provider=provider, trace_content=True)
    first = await runtime.run(agent, "Weather?")
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    exporter.clear()
    with pytest.raises(RuntimeError, match="db down"):
        await runtime.resume(
            agent,
            checkpoint_id=first.checkpoint_id,
            response=HumanResponse(first.interruption.id, "approve"),
        )
    span = one(exporter.get_finished_spans(), "invoke_agent weather")
    assert span.status.status_code == StatusCode.ERROR
    assert attrs_of(span)["error.type"] == "RuntimeError"
    # The checkpoint stays resumable: the run did not complete, whatever the model said.
    assert "runlet.run.status" not in attrs_of(span)
    assert "gen_ai.output.messages" not in attrs_of(span)


async def test_several_decisions_become_one_event_each(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    calls = [call("get_weather", city="Paris", id="c1"), call("get_weather", city="Oslo", id="c2")]
    agent = weather_agent(NamedModel([calls, "Done."]), weather_tool(approval=True))
    runtime = Runtime(InMemoryCheckpointStore(), tracer_provider=provider)
    first = await runtime.run(agent, "Two cities")
    assert first.checkpoint_id is not None
    run = one(exporter.get_finished_spans(), "invoke_agent weather")
    assert attrs_of(run)["runlet.interrupt.request_count"] == 2
    exporter.clear()
    requests = first.pending_requests
    await runtime.resume(
        agent,
        checkpoint_id=first.checkpoint_id,
        responses=[
            HumanResponse(requests[0].id, "approve", responded_by="alice"),
            HumanResponse(requests[1].id, "reject", responded_by="bob"),
        ],
    )
    span = one(exporter.get_finished_spans(), "invoke_agent weather")
    assert attrs_of(span)["runlet.human.decision_count"] == 2
    assert "runlet.human.action" not in attrs_of(span)  # only one decision goes there
    assert [
        (event.name, dict(event.attributes or {})["runlet.human.action"]) for event in span.events
    ] == [("runlet.human_decision", "approve"), ("runlet.human_decision", "reject")]
    assert [dict(e.attributes or {})["runlet.human.responded_by"] for e in span.events] == [
        "alice",
        "bob",
    ]


@pytest.mark.parametrize(
    ("content", "changes", "recorded"),
    [
        # The arguments the model sent are on the tool call's span already.
        (True, {}, {}),
        (True, {"arguments": {"city": "Oslo"}, "edited": True}, {"arguments": '{"city": "Oslo"}'}),
        (False, {"arguments": {"city": "Oslo"}, "edited": True}, {}),
        (True, {"action": "select", "value": "b", "arguments": None}, {"value": "b"}),
        (False, {"action": "select", "value": "b", "arguments": None}, {}),
    ],
)
async def test_a_decision_s_value_and_edited_arguments_are_contents(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    content: bool,
    changes: dict[str, Any],
    recorded: dict[str, Any],
) -> None:
    decision = SimpleNamespace(
        **{
            "request_id": "req_1",
            "kind": "approval",
            "tool_call_id": "call_1",
            "action": "approve",
            "value": None,
            "arguments": {"city": "Paris"},
            "edited": False,
            "responded_by": None,
            **changes,
        }
    )
    agent = weather_agent(NamedModel([]))
    with resume_span(Tracing(provider, content), agent, "cp_1", []) as trace:
        assert trace is not None
        trace.resumed(SimpleNamespace(run_id="run_1"), [decision])  # type: ignore[arg-type,list-item]
    [span] = exporter.get_finished_spans()
    [event] = span.events
    for attributes in (attrs_of(span), dict(event.attributes or {})):
        assert attributes["runlet.human.action"] == decision.action
        found = {
            key.removeprefix("runlet.human."): value
            for key, value in attributes.items()
            if key in ("runlet.human.value", "runlet.human.arguments")
        }
        assert found == recorded


@pytest.mark.parametrize("store", [InMemoryCheckpointStore, PlainStore], ids=["durable", "plain"])
async def test_a_refused_response_ends_the_resume_span_with_an_error(
    provider: TracerProvider, exporter: InMemorySpanExporter, store: Any
) -> None:
    model = NamedModel([call("get_weather", city="Paris", id="call_w"), "Sunny."])
    agent = weather_agent(model, weather_tool(approval=True))
    runtime = Runtime(store(), tracer_provider=provider)
    interrupted = await runtime.run(agent, "Weather?")
    assert interrupted.checkpoint_id is not None
    exporter.clear()
    with pytest.raises(Exception, match="request"):
        await runtime.resume(
            agent,
            checkpoint_id=interrupted.checkpoint_id,
            response=HumanResponse("req_wrong", "reject"),
        )
    span = one(exporter.get_finished_spans(), "invoke_agent weather")
    assert span.status.status_code == StatusCode.ERROR
    assert attrs_of(span)["error.type"] == "HumanResponseError"
    assert attrs_of(span)["runlet.checkpoint_id"] == interrupted.checkpoint_id
    assert "runlet.human.action" not in attrs_of(span)  # refused before it was a decision
    # The run is known from the checkpoint read before the refusal: searching by run id
    # finds the refused attempt too.
    assert attrs_of(span)["runlet.run_id"] == interrupted.run_id
    assert attrs_of(span)["gen_ai.conversation.id"] == interrupted.run_id


async def test_a_repeated_resume_is_traced_as_served_from_the_stored_outcome(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = NamedModel([call("get_weather", city="Paris", id="call_w"), "Sunny."])
    agent = weather_agent(model, weather_tool(approval=True))
    runtime = Runtime(InMemoryCheckpointStore(), tracer_provider=provider)
    interrupted = await runtime.run(agent, "Weather?")
    assert interrupted.checkpoint_id is not None
    assert interrupted.interruption is not None
    answer = HumanResponse(interrupted.interruption.id, "approve")
    await runtime.resume(agent, checkpoint_id=interrupted.checkpoint_id, response=answer)
    exporter.clear()

    await runtime.resume(agent, checkpoint_id=interrupted.checkpoint_id, response=answer)

    [span] = exporter.get_finished_spans()  # nothing ran: no chat, no tool span
    assert attrs_of(span)["runlet.resume.repeated"] is True
    assert attrs_of(span)["runlet.run.status"] == "completed"
    assert attrs_of(span)["runlet.run_id"] == interrupted.run_id


async def test_a_repeated_resume_that_interrupted_says_where_the_run_waits(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # A retried webhook: its span must name the checkpoint the run waits at now.
    model = NamedModel(
        [
            call("get_weather", city="Paris", id="call_1"),
            [
                call("get_weather", city="Rome", id="call_2"),
                call("get_weather", city="Oslo", id="call_3"),
            ],
        ]
    )
    agent = weather_agent(model, weather_tool(approval=True))
    runtime = Runtime(InMemoryCheckpointStore(), tracer_provider=provider)
    interrupted = await runtime.run(agent, "Weather?")
    assert interrupted.checkpoint_id is not None
    assert interrupted.interruption is not None
    answer = HumanResponse(interrupted.interruption.id, "approve")
    first = await runtime.resume(agent, checkpoint_id=interrupted.checkpoint_id, response=answer)
    assert first.interruption is not None
    exporter.clear()

    again = await runtime.resume(agent, checkpoint_id=interrupted.checkpoint_id, response=answer)

    assert again.checkpoint_id == first.checkpoint_id
    [span] = exporter.get_finished_spans()
    attributes = attrs_of(span)
    assert attributes["runlet.resume.repeated"] is True
    assert {
        key: value for key, value in attributes.items() if key.startswith("runlet.interrupt.")
    } == {
        "runlet.interrupt.checkpoint_id": first.checkpoint_id,
        "runlet.interrupt.request_count": 2,
        "runlet.interrupt.kind": "approval",
        "runlet.interrupt.request_id": first.interruption.id,
        "runlet.interrupt.tool_name": "get_weather",
        "runlet.interrupt.tool_call_id": "call_2",
    }
    assert attributes["runlet.run.status"] == "interrupted"


async def test_a_run_whose_checkpoint_is_not_saved_is_not_traced_as_interrupted(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class Full(InMemoryCheckpointStore):
        async def save(self, checkpoint: Checkpoint) -> None:
            raise OSError("disk full")

    model = NamedModel([call("get_weather", city="Paris", id="call_w")])
    agent = weather_agent(model, weather_tool(approval=True))
    runtime = Runtime(Full(), tracer_provider=provider)
    with pytest.raises(OSError, match="disk full"):
        await runtime.run(agent, "Weather?")
    span = one(exporter.get_finished_spans(), "invoke_agent weather")
    assert "runlet.run.status" not in attrs_of(span)
    assert "runlet.interrupt.checkpoint_id" not in attrs_of(span)
    assert attrs_of(span)["error.type"] == "OSError"


async def interrupted_checkpoint(agent: Agent) -> tuple[Runtime, Checkpoint]:
    runtime = Runtime(InMemoryCheckpointStore())  # untraced: no provider set
    result = await runtime.run(agent, "Weather?")
    assert result.checkpoint_id is not None
    store = runtime.checkpoint_store
    assert store is not None
    return runtime, await store.load(result.checkpoint_id)


async def test_span_reference_keeps_the_run_span_ids_as_json_for_a_linked_resume(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = weather_agent(
        NamedModel([call("get_weather", city="Paris")]), weather_tool(approval=True)
    )
    runtime, checkpoint = await interrupted_checkpoint(agent)
    tracing = Tracing(provider, True)

    run = runtime._start(agent, "Weather?", None, None, None)
    assert span_reference(run.trace) is None  # untraced
    tracing_context = run_span(tracing, run)
    assert span_reference(run.trace) is None  # not started yet
    with tracing_context:
        reference = span_reference(run.trace)
    assert reference is not None
    assert json.loads(json.dumps(reference)) == reference
    [interrupted_span] = exporter.get_finished_spans()
    assert reference == {
        "trace_id": f"{trace_id(interrupted_span):032x}",
        "span_id": f"{span_id(interrupted_span):016x}",
    }

    # A checkpoint that keeps it (the field the resume path reads); read by name, so a
    # plain object stands in for it.
    kept = SimpleNamespace(run_id=checkpoint.run_id, **{TRACE_LINK_FIELD: reference})
    decision = SimpleNamespace(
        request_id="req_1",
        kind="choice",
        tool_call_id="call_1",
        action="select",
        value="b",
        arguments=None,
        edited=False,
        responded_by=None,
    )
    exporter.clear()
    with resume_span(tracing, agent, checkpoint.id, []) as trace:
        assert trace is not None
        assert opentelemetry.trace.get_current_span() is trace.span
        trace.resumed(kept, [decision])  # type: ignore[arg-type,list-item]
    [span] = exporter.get_finished_spans()
    [link] = span.links
    assert (link.context.trace_id, link.context.span_id) == (
        trace_id(interrupted_span),
        span_id(interrupted_span),
    )
    assert dict(link.attributes or {}) == {"runlet.run.status": "interrupted"}
    assert attrs_of(span)["runlet.run_id"] == checkpoint.run_id
    assert "runlet.human.responded_by" not in attrs_of(span)  # not known
    assert attrs_of(span)["runlet.human.action"] == "select"
    assert attrs_of(span)["runlet.human.value"] == "b"  # content: opted in above

    # A damaged or foreign reference costs the link, never the resume.
    for bad in (
        {"trace_id": "zz", "span_id": "1"},
        {"span_id": "1"},
        {"trace_id": 5, "span_id": 1},
        {"trace_id": "0", "span_id": "0"},
        "x",
    ):
        exporter.clear()
        kept = SimpleNamespace(run_id="run", **{TRACE_LINK_FIELD: bad})
        with resume_span(tracing, agent, "cp", []) as trace:
            assert trace is not None
            trace.resumed(kept, [])  # type: ignore[arg-type]
        assert one(exporter.get_finished_spans(), "invoke_agent weather").links == ()


async def test_expiry_and_cancel_helpers_record_the_checkpoint_and_run(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = weather_agent(
        NamedModel([call("get_weather", city="Paris")]), weather_tool(approval=True)
    )
    _, checkpoint = await interrupted_checkpoint(agent)
    tracing = Tracing(provider, None)

    store = InMemoryCheckpointStore()
    await store.save(checkpoint)
    runtime = Runtime(store, tracer_provider=provider)
    result = await runtime.expire(
        weather_agent(NamedModel(["Nobody answered."]), weather_tool(approval=True)),
        checkpoint_id=checkpoint.id,
    )
    assert result.output == "Nobody answered."
    span = one(exporter.get_finished_spans(), "invoke_agent weather")
    assert attrs_of(span)["runlet.resume.reason"] == "expired"
    assert attrs_of(span)["runlet.checkpoint_id"] == checkpoint.id
    assert attrs_of(span)["runlet.run_id"] == checkpoint.run_id
    assert attrs_of(span)["runlet.human.request_kind"] == "approval"
    assert attrs_of(span)["runlet.human.action"] == "expire"

    exporter.clear()
    _, other = await interrupted_checkpoint(
        weather_agent(NamedModel([call("get_weather", city="Oslo")]), weather_tool(approval=True))
    )
    await store.save(other)
    await runtime.cancel(other.id)
    [cancelled] = exporter.get_finished_spans()
    # The store shows the run, so the span names it, as every span of a run does.
    assert cancelled.name == "cancel_checkpoint weather"
    assert attrs_of(cancelled) == {
        "runlet.checkpoint_id": other.id,
        "runlet.run.status": "cancelled",
        "runlet.run_id": other.run_id,
        "gen_ai.conversation.id": other.run_id,
        "gen_ai.agent.name": "weather",
    }

    exporter.clear()
    with cancel_span(tracing, checkpoint.id, checkpoint):
        pass
    with pytest.raises(KeyError), cancel_span(tracing, "cp_gone"):
        raise KeyError("cp_gone")
    known, unknown = exporter.get_finished_spans()
    assert known.name == "cancel_checkpoint weather"
    assert attrs_of(known) == {
        "runlet.checkpoint_id": checkpoint.id,
        "runlet.run.status": "cancelled",
        "runlet.run_id": checkpoint.run_id,
        "gen_ai.conversation.id": checkpoint.run_id,
        "gen_ai.agent.name": "weather",
    }
    assert known.status.status_code == StatusCode.UNSET
    assert unknown.name == "cancel_checkpoint"
    assert attrs_of(unknown)["runlet.checkpoint_id"] == "cp_gone"
    assert attrs_of(unknown)["error.type"] == "KeyError"
    assert "runlet.run.status" not in attrs_of(unknown)  # it was not cancelled
    assert unknown.status.status_code == StatusCode.ERROR


class StuckCancelStore(InMemoryCheckpointStore):
    """A store whose cancel() waits until it is cancelled itself."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelling = anyio.Event()

    async def cancel(self, checkpoint_id: str) -> None:
        self.cancelling.set()
        await anyio.sleep_forever()


async def test_a_failed_cancel_records_its_exception_like_the_run_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    runtime = Runtime(InMemoryCheckpointStore(), tracer_provider=provider)
    with provider.get_tracer("app").start_as_current_span("request") as outer:
        with pytest.raises(CheckpointNotFoundError) as caught:
            await runtime.cancel("cp_gone")
        # The cancel span is no longer current once cancel() returned.
        assert opentelemetry.trace.get_current_span() is outer
    failed = one(exporter.get_finished_spans(), "cancel_checkpoint")
    assert parent_of(failed) == span_id(one(exporter.get_finished_spans(), "request"))
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "CheckpointNotFoundError"  # content capture is off
    assert str(caught.value) not in str(failed.events[0].attributes)
    assert attrs_of(failed)["error.type"] == "CheckpointNotFoundError"
    [event] = failed.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "runlet.CheckpointNotFoundError"

    # A cancelled cancel() is marked as such, with no exception recorded.
    exporter.clear()
    store = StuckCancelStore()
    runtime = Runtime(store, tracer_provider=provider)
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as group:
            group.start_soon(runtime.cancel, "cp_1")
            await store.cancelling.wait()
            group.cancel_scope.cancel()
    [cancelled] = exporter.get_finished_spans()
    assert cancelled.status.status_code == StatusCode.ERROR
    assert cancelled.status.description == "cancelled"
    assert attrs_of(cancelled)["error.type"] == "cancelled"
    assert cancelled.events == ()


# --- off, and deciding once per run -----------------------------------------------------


@pytest.fixture(params=["direct", "public"])
def global_provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Sets the global tracer provider for one test, through the slot the API keeps it in
    (read directly by runs) or through ``get_tracer_provider()`` (the fallback), without
    touching OpenTelemetry's set-once global."""
    api = _tracing._load_api()
    assert api is not None
    direct = request.param == "direct"
    monkeypatch.setattr(api, "direct", direct)
    asked: list[None] = []

    def set_provider(provider: Any) -> None:
        if direct:
            monkeypatch.setattr(opentelemetry.trace, "_TRACER_PROVIDER", provider)
        else:

            def get_tracer_provider() -> Any:
                asked.append(None)
                return opentelemetry.trace.ProxyTracerProvider() if provider is None else provider

            monkeypatch.setattr(opentelemetry.trace, "get_tracer_provider", get_tracer_provider)

    return SimpleNamespace(set=set_provider, asked=asked, direct=direct)


async def test_without_a_configured_provider_runs_are_not_traced(global_provider: Any) -> None:
    global_provider.set(None)
    agent = weather_agent(NamedModel(["Hi."]))
    runtime = Runtime()
    run = runtime._start(agent, "Hello", None, None, None)
    assert run_span(runtime._loop.tracing, run) is _tracing._OFF
    assert run.trace is None
    assert (await runtime.run(agent, "Hello")).output == "Hi."
    global_provider.set(opentelemetry.trace.NoOpTracerProvider())
    assert Tracing(None, None).tracer() is None
    with resume_span(Tracing(None, None), agent, "cp", None) as trace:
        assert trace is None
    with cancel_span(Tracing(None, None), "cp") as nothing:
        assert nothing is None


async def test_without_opentelemetry_installed_tracing_is_off(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    monkeypatch.setattr(_tracing, "_api", None)
    monkeypatch.setattr(_tracing, "_api_missing", False)
    monkeypatch.setitem(__import__("sys").modules, "opentelemetry", None)
    assert Tracing(provider, True).tracer() is None
    assert _tracing._api_missing
    runtime = Runtime(tracer_provider=provider)
    assert (await runtime.run(weather_agent(NamedModel(["Hi."])), "Hello")).output == "Hi."


async def test_the_global_provider_is_used_and_consulted_once_per_run(
    global_provider: Any, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    runtime = Runtime()  # made before the application sets its provider
    global_provider.set(provider)
    model = NamedModel([call("get_weather", city=c) for c in ("A", "B", "C")] + ["Done."])
    await runtime.run(weather_agent(model), "Go")
    names = [span.name for span in exporter.get_finished_spans()]
    assert names.count("chat scripted-1") == 4
    assert names.count("execute_tool get_weather") == 3
    assert names.count("invoke_agent weather") == 1
    await runtime.run(weather_agent(NamedModel(["Hi."])), "Hello")
    # Through the public call: one look per run, none per model request or tool call.
    assert len(global_provider.asked) == (0 if global_provider.direct else 2)


def test_a_provider_named_by_the_environment_is_loaded_through_the_public_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    assert not _tracing._Api().direct
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER")
    assert _tracing._Api().direct


# --- the documentation page -------------------------------------------------------------


async def test_the_tracing_page_examples_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from test_docs import example_source, run_page

    monkeypatch.delenv(CONTENT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    namespace = await run_page("tracing.md")
    assert namespace["result"].status == "completed"
    assert len(namespace["exporter"].get_finished_spans()) == 2
    assert example_source("tracing.md").count("assert ") >= 3


@pytest.mark.parametrize("kind", ["stream", "stream_resume"])
async def test_a_stream_entered_later_still_nests_under_the_span_where_it_was_made(
    kind: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # A web handler makes the stream under its own span and hands it to the response,
    # which enters it later, elsewhere: the run belongs under the handler's span.
    app = provider.get_tracer("app")
    model = ScriptedModel([call("get_weather", city="Paris", id="call_w"), "Sunny."])
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore(), tracer_provider=provider)
    agent = weather_agent(model, weather_tool(approval=True))
    with app.start_as_current_span("made"):
        if kind == "stream":
            stream = runtime.stream(agent, "Weather in Paris?")
        else:
            first = await runtime.run(agent, "Weather in Paris?")
            assert first.interruption is not None
            assert first.checkpoint_id is not None
            response = HumanResponse(first.interruption.id, "approve")
            stream = runtime.stream_resume(
                agent, checkpoint_id=first.checkpoint_id, response=response
            )
    with app.start_as_current_span("entered"):
        async with stream:
            async for _ in stream:
                pass
    spans = exporter.get_finished_spans()

    made = one(spans, "made")
    runs = by_name(spans, "invoke_agent weather")
    assert [span_id(made)] * len(runs) == [parent_of(run) for run in runs]
    assert {trace_id(made)} == {trace_id(run) for run in runs}
