"""OpenTelemetry spans for runs, model requests, tool calls and human decisions.

The spans follow the OpenTelemetry GenAI semantic conventions (``invoke_agent {agent}``,
``chat {model}``, ``execute_tool {tool}``) plus ``runlet.*`` attributes for what the
conventions do not cover: run and checkpoint ids, interruptions, human decisions.

Tracing costs nothing when it is off. ``opentelemetry-api`` is imported the first time a
run asks, never at ``import runlet``; without it, tracing is off. With it, each run
(``run()``, ``stream()``, ``resume()``) decides once whether it is traced: yes if the
:class:`~runlet.Runtime` was given a tracer provider, or if the application has set a
global one; no while the global provider is still OpenTelemetry's default (the proxy or
the no-op provider). An untraced run has ``RunState.trace is None``, and the loop pays one
``is None`` test per model request and per tool call.

Entry points: :func:`run_span` (run, stream), :func:`resume_span` (resume, stream_resume,
expire) with :meth:`RunTrace.resumed` once the checkpoint and the decisions are known,
:func:`cancel_span`, and :func:`span_reference` to keep the interrupted run span's ids in
a checkpoint field named :data:`TRACE_LINK_FIELD` so the resume span can link to it.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from ._tools import edited_content
from ._util import is_cancellation

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from ._agent import Agent
    from ._checkpoint import Checkpoint
    from ._human import Decision, HumanRequest, HumanResponse
    from ._loop import RunState
    from ._messages import Message, ToolCall
    from ._model import Model, ModelRequest, ModelResponse
    from ._result import RunResult
    from ._tools import ToolContext, ToolSpec

__all__ = [
    "CONTENT_ENV",
    "TRACE_LINK_FIELD",
    "RunTrace",
    "Tracing",
    "cancel_span",
    "resume_span",
    "run_span",
    "span_reference",
]

CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""Set to ``true`` to record message contents when ``Runtime(trace_content=None)``."""

TRACE_LINK_FIELD = "trace_link"
"""The checkpoint attribute :func:`resume_span` reads for a link to the interrupted run
span: ``None`` or the JSON-compatible dict :func:`span_reference` returns."""

INSTRUMENTATION_NAME = "runlet"

# Attribute names: the GenAI conventions where they have one, runlet.* otherwise.
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
ERROR_TYPE = "error.type"
RUN_ID = "runlet.run_id"
CHECKPOINT_ID = "runlet.checkpoint_id"
RUN_STATUS = "runlet.run.status"
RESUME_REASON = "runlet.resume.reason"
RESUME_REPEATED = "runlet.resume.repeated"
INTERRUPT_KIND = "runlet.interrupt.kind"
INTERRUPT_REQUEST_ID = "runlet.interrupt.request_id"
INTERRUPT_CHECKPOINT_ID = "runlet.interrupt.checkpoint_id"
INTERRUPT_TOOL_NAME = "runlet.interrupt.tool_name"
INTERRUPT_TOOL_CALL_ID = "runlet.interrupt.tool_call_id"
INTERRUPT_REQUEST_COUNT = "runlet.interrupt.request_count"
HUMAN_DECISION_COUNT = "runlet.human.decision_count"
HUMAN_DECISION_EVENT = "runlet.human_decision"
HUMAN_TOOL_CALL_ID = "runlet.human.tool_call_id"
HUMAN_REQUEST_ID = "runlet.human.request_id"
HUMAN_REQUEST_KIND = "runlet.human.request_kind"
HUMAN_ACTION = "runlet.human.action"
HUMAN_RESPONDED_BY = "runlet.human.responded_by"
HUMAN_EDITED = "runlet.human.edited_arguments"
HUMAN_VALUE = "runlet.human.value"
HUMAN_ARGUMENTS = "runlet.human.arguments"

_REQUEST_OPTIONS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",  # OpenAI's newer name
    "seed": "gen_ai.request.seed",
}
_KNOWN_PROVIDERS = {
    "runlet.providers.openai": "openai",
    "runlet.providers.anthropic": "anthropic",
}
_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"
_TRUE = frozenset({"true", "1", "yes", "on"})


class TracerProviderLike(Protocol):
    """What Runlet needs of an OpenTelemetry ``TracerProvider``: its ``get_tracer()``.
    Typed without OpenTelemetry, so the signature of ``Runtime`` is fully known also
    where it is not installed."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any: ...


class _Api:
    """The OpenTelemetry API modules, imported on first use."""

    __slots__ = (
        "Link",
        "SpanContext",
        "SpanKind",
        "Status",
        "StatusCode",
        "TraceFlags",
        "context",
        "direct",
        "trace",
    )

    def __init__(self) -> None:
        from opentelemetry import context, trace

        self.context = context
        self.trace = trace
        # get_tracer_provider() looks the environment up on every call while no provider
        # is set (about 1.3 µs, 2 % of a W1 run that is not traced), so runs read the
        # provider it keeps instead. The public call stays the fallback: for another
        # layout of the API, and for a provider named by the environment variable, which
        # only that call loads.
        self.direct = hasattr(trace, "_TRACER_PROVIDER") and _PROVIDER_ENV not in os.environ
        self.Link = trace.Link
        self.SpanContext = trace.SpanContext
        self.SpanKind = trace.SpanKind
        self.Status = trace.Status
        self.StatusCode = trace.StatusCode
        self.TraceFlags = trace.TraceFlags


_api: _Api | None = None
_api_missing = False


def _load_api() -> _Api | None:
    global _api, _api_missing
    if _api is None and not _api_missing:
        try:
            _api = _Api()
        except ImportError:
            _api_missing = True
    return _api


class Tracing:
    """A runtime's tracing settings; :meth:`tracer` decides, once per run, whether the
    run is traced."""

    __slots__ = ("_provider_seen", "_tracer", "content", "provider")

    def __init__(self, provider: TracerProviderLike | None, content: bool | None) -> None:
        self.provider = provider
        self.content = content
        self._provider_seen: object = None
        self._tracer: Tracer | None = None

    def tracer(self) -> Tracer | None:
        """The tracer for a new run, or ``None`` when the run is not traced."""
        api = _api or _load_api()
        if api is None:
            return None
        provider = self.provider
        if provider is None:
            trace = api.trace
            if api.direct:
                provider = trace._TRACER_PROVIDER
                if provider is None:
                    return None
            else:
                provider = trace.get_tracer_provider()
            if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
                return None
        if provider is not self._provider_seen:
            from . import __version__

            self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, __version__)
            self._provider_seen = provider
        return self._tracer

    def capture_content(self) -> bool:
        """Whether a traced run records message contents."""
        if self.content is not None:
            return self.content
        return os.environ.get(CONTENT_ENV, "").strip().lower() in _TRUE


class _Off:
    """The context manager of an untraced run: does nothing, yields ``None``."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_OFF = _Off()


def _interrupt(request: HumanRequest, checkpoint_id: str, count: int) -> dict[str, Any]:
    """The ``runlet.interrupt.*`` attributes of a run that waits at *checkpoint_id*."""
    return {
        RUN_STATUS: "interrupted",
        INTERRUPT_KIND: request.kind,
        INTERRUPT_REQUEST_ID: request.id,
        INTERRUPT_CHECKPOINT_ID: checkpoint_id,
        INTERRUPT_TOOL_NAME: request.tool_call.name,
        INTERRUPT_TOOL_CALL_ID: request.tool_call.id,
        INTERRUPT_REQUEST_COUNT: count,
    }


class RunTrace:
    """The spans of one traced run segment (a run, a stream, a resume, an expiry).

    Used as a context manager, it opens the ``invoke_agent`` span and makes it current;
    the loop calls :meth:`chat`, :meth:`tool`, :meth:`refused_call` and
    :meth:`interrupted` on it; leaving it ends the span, with an error status if an
    exception (cancellation included) passes through. It never suppresses one.
    """

    __slots__ = (
        "_api",
        "_common",
        "_completed_with",
        "_input_tokens",
        "_output_tokens",
        "_parent",
        "_token",
        "agent",
        "content",
        "model_name",
        "provider_name",
        "span",
        "start_attributes",
        "start_links",
        "tracer",
    )

    def __init__(
        self,
        api: _Api,
        tracer: Tracer,
        agent: Agent,
        run_id: str | None,
        content: bool,
        checkpoint_id: str | None = None,
    ) -> None:
        self._api = api
        self.tracer = tracer
        self.agent = agent
        self.content = content
        model = agent.model
        self.model_name = _model_name(model)
        self.provider_name = _provider_name(model)
        common: dict[str, Any] = {}
        if run_id is not None:
            common[CONVERSATION] = common[RUN_ID] = run_id
        if checkpoint_id is not None:
            common[CHECKPOINT_ID] = checkpoint_id
        self._common = common
        self.start_attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            PROVIDER: self.provider_name,
            AGENT_NAME: agent.name,
            **common,
        }
        if self.model_name is not None:
            self.start_attributes[REQUEST_MODEL] = self.model_name
        self.start_links: list[Any] = []
        self._input_tokens = 0
        self._output_tokens = 0
        self._completed_with: Message | None = None
        self.span: Span | None = None
        self._parent: Context | None = None
        self._token: Token[Context] | None = None

    # -- the run span ---------------------------------------------------------------------

    def __enter__(self) -> RunTrace:
        context, trace = self._api.context, self._api.trace
        span = self.tracer.start_span(
            f"invoke_agent {self.agent.name}",
            kind=self._api.SpanKind.INTERNAL,
            attributes=self.start_attributes,
            links=self.start_links,
        )
        self.span = span
        self._parent = trace.set_span_in_context(span)
        self._token = context.attach(self._parent)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span, token = self.span, self._token
        assert span is not None
        assert token is not None  # __enter__ set it with the span
        span.set_attribute(INPUT_TOKENS, self._input_tokens)
        span.set_attribute(OUTPUT_TOKENS, self._output_tokens)
        final = self._completed_with
        if final is not None and exc is None:
            # Only now: a resume that fails after the model's final answer (storing its
            # outcome, say) did not complete the run, and its checkpoint stays resumable.
            span.set_attribute(RUN_STATUS, "completed")
            if self.content:
                span.set_attribute(OUTPUT_MESSAGES, _output_json(final, "stop"))
        self._close(span, token, exc)

    def reference(self) -> dict[str, str] | None:
        """The run span's ids as JSON-compatible data (see :func:`span_reference`)."""
        if self.span is None:
            return None
        return _reference(self.span)

    def interrupted(self, checkpoint: Checkpoint) -> None:
        """Record on the run span that the run stopped and saved *checkpoint*: its id,
        and its first open request (kind, id, call), with the number of open requests."""
        span = self.span
        if span is None:  # pragma: no cover - the loop runs inside the span
            return
        span.set_attributes(
            _interrupt(checkpoint.request, checkpoint.id, 1 + len(checkpoint.more_requests))
        )

    def found(self, checkpoint: Checkpoint) -> None:
        """Record the run a resume works on as soon as its checkpoint is read, so even a
        resume that is refused carries the run's id."""
        span = self.span
        if span is None:  # pragma: no cover - called inside the span
            return
        run_id = checkpoint.run_id
        self._common[RUN_ID] = self._common[CONVERSATION] = run_id
        span.set_attributes({RUN_ID: run_id, CONVERSATION: run_id})

    def repeated(self, result: RunResult) -> None:
        """Record that a resume returned the stored outcome of an earlier one (nothing
        ran): ``runlet.resume.repeated``, the stored result's status and, when it
        interrupted, where the run waits (``runlet.interrupt.*``)."""
        span = self.span
        if span is None:  # pragma: no cover - called inside the span
            return
        span.set_attributes({RESUME_REPEATED: True, RUN_STATUS: result.status})
        request = result.interruption
        if request is not None and result.checkpoint_id is not None:
            count = len(result.pending_requests) or 1
            span.set_attributes(_interrupt(request, result.checkpoint_id, count))

    def resumed(self, checkpoint: Checkpoint, decisions: Sequence[Decision]) -> None:
        """Record what a resume continues: the run (its id now joins every span), a link
        to the interrupted span when the checkpoint keeps one, and the decisions taken
        (one ``runlet.human_decision`` event each; with a single decision, also as span
        attributes)."""
        span = self.span
        if span is None:  # pragma: no cover - called inside the span
            return
        self.found(checkpoint)
        for link in _links(self._api, checkpoint):
            span.add_link(link.context, link.attributes)
        span.set_attribute(HUMAN_DECISION_COUNT, len(decisions))
        for decision in decisions:
            attributes = self._decision(decision)
            span.add_event(HUMAN_DECISION_EVENT, attributes)
            if len(decisions) == 1:
                span.set_attributes(attributes)

    def _decision(self, decision: Decision) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            HUMAN_REQUEST_ID: decision.request_id,
            HUMAN_REQUEST_KIND: decision.kind,
            HUMAN_TOOL_CALL_ID: decision.tool_call_id,
            HUMAN_ACTION: decision.action,
            HUMAN_EDITED: decision.edited,
        }
        if decision.responded_by is not None:
            attributes[HUMAN_RESPONDED_BY] = decision.responded_by
        if self.content:
            if decision.value is not None:
                attributes[HUMAN_VALUE] = decision.value
            if decision.edited and decision.arguments is not None:
                attributes[HUMAN_ARGUMENTS] = _dumps(decision.arguments)
        return attributes

    # -- child spans ----------------------------------------------------------------------

    async def chat(
        self,
        ask: Callable[[Model, ModelRequest, Any], Awaitable[ModelResponse]],
        model: Model,
        request: ModelRequest,
        emit: Any,
    ) -> ModelResponse:
        """Run ``ask(model, request, emit)`` inside a ``chat`` span."""
        api = self._api
        attributes: dict[str, Any] = {OPERATION: "chat", PROVIDER: self.provider_name}
        name = "chat"
        if self.model_name is not None:
            attributes[REQUEST_MODEL] = self.model_name
            name = f"chat {self.model_name}"
        for option, key in _REQUEST_OPTIONS.items():
            value = request.options.get(option)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attributes[key] = value
        attributes.update(self._common)
        if self.content:
            attributes[SYSTEM_INSTRUCTIONS] = _dumps([_text(request.instructions)])
            attributes[INPUT_MESSAGES] = _dumps([_message(m) for m in request.messages])
        span = self.tracer.start_span(
            name, self._parent, kind=api.SpanKind.CLIENT, attributes=attributes
        )
        context, trace = api.context, api.trace
        token = context.attach(trace.set_span_in_context(span, self._parent))
        try:
            response = await ask(model, request, emit)
        except BaseException as exc:
            self._close(span, token, exc)
            raise
        message = response.message
        finish = "tool_calls" if message.tool_calls else "stop"
        usage = response.usage
        self._input_tokens += usage.input_tokens
        self._output_tokens += usage.output_tokens
        span.set_attribute(FINISH_REASONS, (finish,))
        span.set_attribute(INPUT_TOKENS, usage.input_tokens)
        span.set_attribute(OUTPUT_TOKENS, usage.output_tokens)
        if self.content:
            span.set_attribute(OUTPUT_MESSAGES, _output_json(message, finish))
        self._close(span, token, None)
        if finish == "stop":
            self._completed_with = message  # recorded on the run span if nothing fails
        return response

    async def tool(
        self,
        tool: ToolSpec,
        call: ToolCall,
        arguments: Mapping[str, Any],
        context: ToolContext,
        edited: bool = False,
    ) -> tuple[str, bool]:
        """Run *tool*'s handler inside an ``execute_tool`` span that is current while it
        runs, so the handler's own spans nest under it. With *edited* (a person changed
        the arguments), the content notes so, as the model gets it."""
        span = self._tool_span(call, tool.description)
        if self.content:
            span.set_attribute(TOOL_ARGUMENTS, _dumps(arguments))
        otel_context, trace = self._api.context, self._api.trace
        token = otel_context.attach(trace.set_span_in_context(span, self._parent))
        try:
            content, is_error = await tool._invoke(arguments, context)
        except BaseException as exc:
            self._close(span, token, exc)
            raise
        if edited:
            content = edited_content(content, arguments)
        if self.content:
            span.set_attribute(TOOL_RESULT, content)
        if is_error:
            self._error(span, "tool_error", content if self.content else None)
        self._close(span, token, None)
        return content, is_error

    def refused_call(self, call: ToolCall, problem: str, known_tool: bool) -> None:
        """Record a call that never ran (an unknown tool, or arguments that fail its
        schema) as an ``execute_tool`` span that failed."""
        span = self._tool_span(call, None)
        if self.content:
            span.set_attribute(TOOL_ARGUMENTS, _dumps(call.arguments))
            span.set_attribute(TOOL_RESULT, problem)
        error = "invalid_arguments" if known_tool else "unknown_tool"
        self._error(span, error, problem if self.content else None)
        span.end()

    def _tool_span(self, call: ToolCall, description: str | None) -> Span:
        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: call.name,
            TOOL_CALL_ID: call.id,
            TOOL_TYPE: "function",
            **self._common,
        }
        if description:
            attributes[TOOL_DESCRIPTION] = description
        return self.tracer.start_span(
            f"execute_tool {call.name}",
            self._parent,
            kind=self._api.SpanKind.INTERNAL,
            attributes=attributes,
        )

    # -- endings --------------------------------------------------------------------------

    def _error(self, span: Span, error_type: str, description: str | None) -> None:
        _set_error(self._api, span, error_type, description)

    def _close(self, span: Span, token: Token[Context], exc: BaseException | None) -> None:
        _end(self._api, span, token, exc, self.content)


# -- entry points for the runtime ---------------------------------------------------------


def run_span(tracing: Tracing, run: RunState) -> RunTrace | _Off:
    """The context manager that traces a fresh run (``run()`` or ``stream()``); when the
    run is traced it also sets ``run.trace``. Enter it where the run executes (for a
    stream: inside the task that drives it)."""
    tracer = tracing.tracer()
    if tracer is None:
        return _OFF
    api = _load_api()
    assert api is not None
    content = tracing.capture_content()
    trace = RunTrace(api, tracer, run.agent, run.run_id, content)
    if content:
        trace.start_attributes[SYSTEM_INSTRUCTIONS] = _dumps([_text(run.agent.instructions)])
        trace.start_attributes[INPUT_MESSAGES] = _dumps([_message(m) for m in run.messages])
    run.trace = trace
    return trace


def resume_span(
    tracing: Tracing,
    agent: Agent,
    checkpoint_id: str,
    responses: Sequence[HumanResponse] | None,
) -> RunTrace | _Off:
    """The context manager that traces a resume of *checkpoint_id* (``resume()``,
    ``stream_resume()``; ``expire()`` when *responses* is ``None``): an ``invoke_agent``
    span with ``runlet.checkpoint_id`` and ``runlet.resume.reason`` (``human_response``
    or ``expired``). It yields the :class:`RunTrace` (``None`` when not traced): call
    :meth:`RunTrace.resumed` once the checkpoint and the decisions are known, and set it
    as ``trace`` on the ``RunState`` the resume builds. Enter it where the resume runs
    (for a stream: inside the stream's task)."""
    tracer = tracing.tracer()
    if tracer is None:
        return _OFF
    api = _load_api()
    assert api is not None
    content = tracing.capture_content()
    trace = RunTrace(api, tracer, agent, None, content, checkpoint_id)
    reason = "expired" if responses is None else "human_response"
    trace.start_attributes[RESUME_REASON] = reason
    if content:  # as on the run's span: the instructions the resumed run works under
        trace.start_attributes[SYSTEM_INSTRUCTIONS] = _dumps([_text(agent.instructions)])
    return trace


def cancel_span(tracing: Tracing, checkpoint_id: str, checkpoint: Any = None) -> _Span | _Off:
    """The context manager that traces ``runtime.cancel(checkpoint_id)``: a
    ``cancel_checkpoint`` span (``runlet.run.status`` ``"cancelled"``), with the run id,
    agent name and link taken from *checkpoint* when the caller has it."""
    tracer = tracing.tracer()
    if tracer is None:
        return _OFF
    api = _load_api()
    assert api is not None
    attributes: dict[str, Any] = {CHECKPOINT_ID: checkpoint_id}
    span = _Span(api, tracer, "cancel_checkpoint", attributes, [], tracing.capture_content())
    span.on_success[RUN_STATUS] = "cancelled"  # only if it was cancelled
    if checkpoint is not None:
        span.attributes_of(checkpoint)
    return span


def span_reference(trace: RunTrace | None) -> dict[str, str] | None:
    """The ids of a traced run's span, as ``{"trace_id": ..., "span_id": ...}`` (lower
    hex), or ``None`` for an untraced run. Keep it in the checkpoint's
    :data:`TRACE_LINK_FIELD` field: it is plain JSON data, and :func:`resume_span` links
    the resume to that span."""
    return None if trace is None else trace.reference()


# -- helpers ------------------------------------------------------------------------------


class _Span:
    """A plain span as a context manager (for cancel_span)."""

    __slots__ = (
        "_api",
        "_attributes",
        "_content",
        "_links",
        "_name",
        "_span",
        "_token",
        "_tracer",
        "on_success",
    )

    def __init__(
        self,
        api: _Api,
        tracer: Tracer,
        name: str,
        attributes: dict[str, Any],
        links: list[Any],
        content: bool,
    ) -> None:
        self._api = api
        self._content = content
        self._tracer = tracer
        self._name = name
        self._attributes = attributes
        self._links = links
        self._span: Span | None = None
        self._token: Token[Context] | None = None
        self.on_success: dict[str, Any] = {}

    def attributes_of(self, checkpoint: Any) -> None:
        """Name the run, the agent and the interrupted span of *checkpoint* (before the
        span starts, or on it once it has)."""
        found = {RUN_ID: checkpoint.run_id, CONVERSATION: checkpoint.run_id}
        found[AGENT_NAME] = checkpoint.agent_name
        self._name = f"cancel_checkpoint {checkpoint.agent_name}"
        links = _links(self._api, checkpoint)
        span = self._span
        if span is None:
            self._attributes.update(found)
            self._links.extend(links)
            return
        span.set_attributes(found)
        span.update_name(self._name)
        for link in links:
            span.add_link(link.context, link.attributes)

    def __enter__(self) -> _Span:
        context, trace = self._api.context, self._api.trace
        self._span = self._tracer.start_span(
            self._name, attributes=self._attributes, links=self._links
        )
        self._token = context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span, token = self._span, self._token
        assert span is not None
        assert token is not None  # __enter__ set it with the span
        if exc is None and self.on_success:
            span.set_attributes(self.on_success)
        _end(self._api, span, token, exc, self._content)


def _set_error(api: _Api, span: Span, error_type: str, description: str | None) -> None:
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(api.Status(api.StatusCode.ERROR, description))


def _end(
    api: _Api, span: Span, token: Token[Context], exc: BaseException | None, content: bool
) -> None:
    """End *span*, made current with *token*: when *exc* passes through, with an error
    status and type, and (unless it is a cancellation, which is no failure of its own)
    the exception recorded on the span. Without *content*, the exception's message is
    left out (Runlet's messages may quote arguments or what a person answered): the span
    keeps its class and the frames it came through."""
    try:
        if exc is not None:
            error_type = _error_type(exc)
            if error_type != "cancelled":
                span.record_exception(exc, None if content else _without_message(exc))
            _set_error(api, span, error_type, _describe(exc) if content else _kind(exc))
        span.end()
    finally:
        api.context.detach(token)


def _without_message(exc: BaseException) -> dict[str, Any]:
    frames = "".join(traceback.format_tb(exc.__traceback__))
    note = f"{_kind(exc)} (message not recorded: content capture is off)"
    return {
        "exception.message": note,
        "exception.stacktrace": f"Traceback (most recent call last):\n{frames}{note}",
    }


def _kind(exc: BaseException) -> str:
    return "cancelled" if is_cancellation(exc) else type(exc).__name__


def _links(api: _Api, checkpoint: Any) -> list[Any]:
    reference = getattr(checkpoint, TRACE_LINK_FIELD, None)
    if not isinstance(reference, Mapping):
        return []
    try:
        trace_id = int(reference["trace_id"], 16)
        span_id = int(reference["span_id"], 16)
    except (KeyError, TypeError, ValueError):
        return []  # not ours, or damaged: a missing link is better than a failed resume
    context = api.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED)
    )
    if not context.is_valid:
        return []
    return [api.Link(context, {RUN_STATUS: "interrupted"})]


def _reference(span: Span) -> dict[str, str] | None:
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def _error_type(exc: BaseException) -> str:
    if is_cancellation(exc):
        return "cancelled"
    return type(exc).__qualname__


def _describe(exc: BaseException) -> str:
    if is_cancellation(exc):
        return "cancelled"
    return f"{type(exc).__name__}: {exc}"


def _model_name(model: object) -> str | None:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


def _provider_name(model: object) -> str:
    name = getattr(model, "provider_name", None)
    if isinstance(name, str) and name:
        return name
    return _KNOWN_PROVIDERS.get(type(model).__module__, "_OTHER")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _text(content: str) -> dict[str, str]:
    return {"type": "text", "content": content}


def _message(message: Message) -> dict[str, Any]:
    """A message in the conventions' JSON shape: a role and a list of typed parts."""
    parts: list[dict[str, Any]] = []
    result = message.tool_result
    if result is not None:
        parts.append(
            {"type": "tool_call_response", "id": result.tool_call_id, "response": result.content}
        )
    elif message.content:
        parts.append(_text(message.content))
    parts.extend(
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": dict(call.arguments)}
        for call in message.tool_calls
    )
    return {"role": message.role, "parts": parts}


def _output_json(message: Message, finish: str) -> str:
    return _dumps([{**_message(message), "finish_reason": finish}])
