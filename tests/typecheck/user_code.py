"""Application code as a type-checking user writes it: ``nox -s types`` runs
``mypy --strict`` on this file. Lines that must be refused carry a ``type: ignore`` with
their error code; with ``warn_unused_ignores`` (part of strict), a refusal that goes
away fails the check too. Never run, only checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from runlet import (
    Agent,
    CallRecord,
    Checkpoint,
    Claim,
    Decision,
    DurableCheckpointStore,
    HumanRequest,
    HumanResponse,
    Interrupted,
    Message,
    ModelRequest,
    ModelResponse,
    PendingRequest,
    Resolution,
    RunResult,
    Runtime,
    StoredCheckpoint,
    ToolCall,
    ToolContext,
    ToolSpec,
    unstructure,
)
from runlet.testing import call, store_conformance_tests


async def answer_one(runtime: Runtime, agent: Agent, result: RunResult) -> RunResult:
    assert result.checkpoint_id is not None
    assert result.interruption is not None
    response = HumanResponse(result.interruption.id, "approve")
    return await runtime.resume(agent, checkpoint_id=result.checkpoint_id, response=response)


async def answer_all(
    runtime: Runtime, agent: Agent, checkpoint_id: str, answers: Sequence[HumanResponse]
) -> RunResult:
    async with runtime.stream_resume(agent, checkpoint_id=checkpoint_id, responses=answers) as s:
        async for _ in s:
            pass
    return await runtime.resume(agent, checkpoint_id=checkpoint_id, responses=answers)


async def answer_wrongly(runtime: Runtime, agent: Agent, answer: HumanResponse) -> None:
    # Neither answer, or both: refused by the type checker, not only at run time.
    await runtime.resume(agent, checkpoint_id="cp_1")  # type: ignore[call-overload]
    await runtime.resume(  # type: ignore[call-overload]
        agent, checkpoint_id="cp_1", response=answer, responses=[answer]
    )
    runtime.stream_resume(agent, checkpoint_id="cp_1")  # type: ignore[call-overload]


def script_a_call(made: ToolCall, arguments: Mapping[str, Any]) -> list[ToolCall]:
    # Runlet hands out arguments as a Mapping; the scripted model takes them back.
    return [call(made.name, made.arguments), call("add", arguments, id="c2")]


def context_for_a_handler_test() -> ToolContext:
    return ToolContext(run_id="run_1", tool_call_id="c1", agent_name="a", metadata={})


def first_of(page: Sequence[PendingRequest]) -> str:
    return page[0].requests[0].id


class EchoModel:
    """A model whose parameter has a name of its own: the protocol takes it positionally."""

    async def complete(self, req: ModelRequest) -> ModelResponse:
        return ModelResponse(Message.assistant(req.messages[-1].content))


def echo_agent() -> Agent:
    return Agent("echo", "Repeat.", EchoModel())


def interrupted_and_pending(pending: PendingRequest) -> tuple[Interrupted, PendingRequest]:
    # The fields the docs show are enough; the lists of requests default to the one.
    event = Interrupted(pending.request, pending.checkpoint_id)
    again = PendingRequest(
        pending.checkpoint_id,
        pending.run_id,
        pending.agent_name,
        pending.request,
        pending.metadata,
        pending.created_at,
    )
    return event, again


def result_as_json(result: RunResult) -> dict[str, Any]:
    # A data class comes out as a dict (not Any, which --strict would refuse to return).
    return unstructure(result)


def reconfigure(runtime: Runtime) -> None:
    # Read-only: runs would go on using what the runtime was built with.
    runtime.max_turns = 3  # type: ignore[misc]
    runtime.checkpoint_store = None  # type: ignore[misc]


# -- handlers may take their arguments as the dict they get ----------------------------------


async def normalise(arguments: dict[str, Any], context: ToolContext) -> str:
    arguments.setdefault("currency", "EUR")  # the handler's own copy
    return str(arguments)


def over_100(arguments: dict[str, Any], context: ToolContext) -> bool:
    return float(arguments["amount"]) > 100


def read_only(arguments: Mapping[str, Any], context: ToolContext) -> str:
    return str(arguments)


def tools_with_dict_handlers() -> list[ToolSpec]:
    schema: dict[str, Any] = {"type": "object"}
    return [
        ToolSpec("pay", "Pay.", schema, normalise, requires_approval=over_100),
        ToolSpec("look", "Look.", schema, read_only, approval_prompt=lambda a: str(a.pop("x"))),
    ]


# -- the shapes of a response ----------------------------------------------------------------


def responses(request_id: str) -> list[HumanResponse]:
    return [
        HumanResponse.approve(request_id, {"amount": 5}, responded_by="ops"),
        HumanResponse.reject(request_id, "Too much."),
        HumanResponse.select(request_id, "express"),
        HumanResponse.submit(request_id, "Leave it at the door."),
        HumanResponse.select(request_id),  # type: ignore[call-arg]
        HumanResponse.submit(request_id, None),  # type: ignore[arg-type]
    ]


# -- a store written as the store docs show it -----------------------------------------------


class DocStore:
    """The durable protocol with resolve(checkpoint_id, token, resolution, next_checkpoint),
    no default: Runlet always passes all four."""

    lease: float | None = 60.0

    async def save(self, checkpoint: Checkpoint, /) -> None: ...
    async def load(self, checkpoint_id: str, /) -> Checkpoint:
        raise NotImplementedError

    async def delete(self, checkpoint_id: str, /) -> None: ...
    async def get(self, checkpoint_id: str, /) -> StoredCheckpoint:
        raise NotImplementedError

    async def claim(self, checkpoint_id: str, /) -> Claim:
        raise NotImplementedError

    async def renew(self, checkpoint_id: str, token: str, /) -> None: ...
    async def record(
        self, checkpoint_id: str, token: str, records: Sequence[CallRecord], /
    ) -> None: ...
    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None,
        /,
    ) -> None: ...
    async def release(self, checkpoint_id: str, token: str, /) -> None: ...
    async def cancel(self, checkpoint_id: str, /) -> None: ...
    async def list_pending(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        agent_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Sequence[PendingRequest]:
        raise NotImplementedError

    async def decisions(self, run_id: str, /) -> Sequence[Decision]:
        raise NotImplementedError


def durable(store: DocStore) -> DurableCheckpointStore:
    return store


# -- what unstructure gives back -------------------------------------------------------------


def stored_rows(record: CallRecord, resolution: Resolution) -> list[dict[str, Any]]:
    return [unstructure(record), unstructure(resolution)]


def fresh_store(lease: float) -> AbstractAsyncContextManager[DurableCheckpointStore]:
    raise NotImplementedError


def conformance_on_a_typo() -> None:
    store_conformance_tests(fresh_store, backends=("asyncio", "trio"))
    store_conformance_tests(fresh_store, backends=("asynco",))  # type: ignore[arg-type]


async def age_leases(store: DurableCheckpointStore, seconds: float) -> None:
    raise NotImplementedError


def conformance_with_lease_times() -> None:
    store_conformance_tests(fresh_store, age_leases=age_leases)
    store_conformance_tests(fresh_store, age_leases=fresh_store)  # type: ignore[arg-type]


class HandMadeTracerProvider:
    """An OpenTelemetry-like provider (OpenTelemetry's own passes the same way, and the
    signature of Runtime is fully typed without OpenTelemetry installed)."""

    def get_tracer(
        self, instrumenting_module_name: str, instrumenting_library_version: str | None = None
    ) -> Any:
        return None


def tracer_providers() -> None:
    Runtime(tracer_provider=HandMadeTracerProvider())
    Runtime(tracer_provider=None)
    Runtime(tracer_provider=5)  # type: ignore[arg-type]


def every_public_data_class_unstructures(
    request: ModelRequest, response: ModelResponse, stored: StoredCheckpoint, claim: Claim
) -> list[dict[str, Any]]:
    definition = request.tools[0] if request.tools else None
    shown = [unstructure(request), unstructure(response), unstructure(stored), unstructure(claim)]
    if definition is not None:
        shown.append(unstructure(definition))
    return shown


class TestMyStore(store_conformance_tests(fresh_store)):  # type: ignore[misc]  # mypy refuses any computed base class; pyright takes it
    async def test_extra(self) -> None: ...


def requests_for_a_store_test(made: ToolCall) -> list[HumanRequest]:
    # tool_call by position after options, or by name; never left out.
    HumanRequest("r0", "approval", "Pay?")  # type: ignore[call-overload]
    return [
        HumanRequest("r1", "approval", "Pay?", (), made),
        HumanRequest("r2", "approval", "Pay?", tool_call=made, outcome_unknown=True),
    ]
