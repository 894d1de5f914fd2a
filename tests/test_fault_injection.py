"""Fault injection: a cancellation or a failure at every await point of ``resume()`` and
of ``stream_resume()``.

Each await point of an undisturbed resume (every store call, every model call, every
tool handler) is found first by counting. Then, for each point, before and after the
operation, a fresh run is interrupted and resumed with a fault injected exactly there,
and the resume is retried until it finishes. The faults: a cancellation delivered there;
a deadline that runs out there (the cancellation lands at the next await that yields,
wherever that is: a stream's events add such awaits); an error. Every case must end with:
the approved refund paid once (distinct idempotency keys), no checkpoint left open, and
the same final transcript as the undisturbed run; under a deadline, which fails no store
call, a refund handler that returned never runs again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import runlet
from runlet import (
    Agent,
    CallRecord,
    Checkpoint,
    HumanResponse,
    InMemoryCheckpointStore,
    ModelRequest,
    ModelResponse,
    Resolution,
    Runtime,
    StoredCheckpoint,
    ToolContext,
    ToolSpec,
)
from runlet.testing import call

pytestmark = pytest.mark.anyio

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"order_id": {"type": "string"}}}


class Injected(Exception):
    """The failure the tests inject."""


class Faults:
    """Counts await points; at the chosen one, cancels the resume or raises."""

    def __init__(self, target: int | None = None, when: str = "", kind: str = "") -> None:
        self.points: list[str] = []
        self.target, self.when, self.kind = target, when, kind
        self.scope: anyio.CancelScope | None = None

    async def point(self, name: str, when: str) -> None:
        if when == "before":
            self.points.append(name)
        if self.target is None or when != self.when or len(self.points) - 1 != self.target:
            return
        self.target = None  # once
        if self.kind == "deadline":
            # A deadline that runs out here: the cancellation is delivered at the next
            # await that yields, wherever that is (the operation itself goes on).
            assert self.scope is not None
            self.scope.cancel()
            return
        if self.kind == "cancel":
            assert self.scope is not None
            self.scope.cancel()
            await anyio.lowlevel.checkpoint()  # the cancellation is delivered right here
        raise Injected(f"injected {self.when} {name}")

    async def around(self, name: str, operation: Any, *args: Any) -> Any:
        await self.point(name, "before")
        value = await operation(*args)
        await self.point(name, "after")
        return value


class FaultyStore(InMemoryCheckpointStore):
    def __init__(self, faults: Faults) -> None:
        super().__init__(lease=0)  # a claim left behind by a failed release is taken over
        self.faults = faults

    async def get(self, checkpoint_id: str) -> StoredCheckpoint:
        return await self.faults.around("get", super().get, checkpoint_id)  # type: ignore[no-any-return]

    async def claim(self, checkpoint_id: str) -> runlet.Claim:
        return await self.faults.around("claim", super().claim, checkpoint_id)  # type: ignore[no-any-return]

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        await self.faults.around("record", super().record, checkpoint_id, token, records)

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        await self.faults.around(
            "resolve", super().resolve, checkpoint_id, token, resolution, next_checkpoint
        )

    async def release(self, checkpoint_id: str, token: str) -> None:
        await self.faults.around("release", super().release, checkpoint_id, token)


class Model:
    """Stateless: answers from the transcript, so a retried turn gets the same answer."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self.faults.around("model", self._answer, request)  # type: ignore[no-any-return]

    async def _answer(self, request: ModelRequest) -> ModelResponse:
        tools_done = sum(1 for m in request.messages if m.role == "tool")
        if tools_done == 0:
            calls = [call("lookup", id="a", order_id="7"), call("refund", id="b", order_id="7")]
            return ModelResponse(runlet.Message.assistant("", calls))
        if tools_done == 2:
            return ModelResponse(runlet.Message.assistant("", [call("notify", id="c")]))
        return ModelResponse(runlet.Message.assistant("Refunded and notified."))


class Bank:
    """Side effects, keyed by idempotency key as a real payment API would."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.refunds: dict[str, str] = {}
        self.runs: list[str] = []
        self.finished = 0  # refund handlers that returned

    async def refund(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.runs.append(context.idempotency_key)
        await self.faults.around("refund", anyio.lowlevel.checkpoint)
        self.refunds.setdefault(context.idempotency_key, arguments["order_id"])
        self.finished += 1
        return f"Refunded order {arguments['order_id']}."

    async def lookup(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        return "Order 7: 30 EUR."

    async def notify(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        await self.faults.around("notify", anyio.lowlevel.checkpoint)
        return "Customer notified."


def setup(faults: Faults, *, idempotent: bool) -> tuple[Runtime, Agent, Bank, FaultyStore]:
    bank = Bank(faults)
    tools = (
        ToolSpec("lookup", "Look up.", SCHEMA, bank.lookup),
        ToolSpec(
            "refund", "Refund.", SCHEMA, bank.refund, requires_approval=True, idempotent=idempotent
        ),
        ToolSpec("notify", "Notify.", SCHEMA, bank.notify),
    )
    store = FaultyStore(faults)
    agent = Agent("support", "Refund, then notify.", Model(faults), tools)
    return Runtime(checkpoint_store=store), agent, bank, store


async def undisturbed(idempotent: bool) -> tuple[list[str], tuple[runlet.Message, ...]]:
    faults = Faults()
    rt, agent, _, _ = setup(faults, idempotent=idempotent)
    first = await rt.run(agent, "Refund order 7.")
    assert first.interruption is not None
    faults.points.clear()
    result = await rt.resume(
        agent,
        checkpoint_id=first.checkpoint_id or "",
        response=HumanResponse(first.interruption.id, "approve"),
    )
    assert "completed" == result.status
    return list(faults.points), result.transcript


async def disturbed(
    idempotent: bool, target: int, when: str, kind: str, streamed: bool = False
) -> tuple[runlet.RunResult, Bank, FaultyStore, Runtime, Agent]:
    faults = Faults()
    rt, agent, bank, store = setup(faults, idempotent=idempotent)
    first = await rt.run(agent, "Refund order 7.")
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    response = HumanResponse(first.interruption.id, "approve")
    faults.points.clear()
    faults.target, faults.when, faults.kind = target, when, kind
    result: runlet.RunResult | None = None
    causes: list[BaseException | None] = []
    with anyio.CancelScope() as scope:
        faults.scope = scope
        try:
            if streamed:  # the events add await points of their own
                async with rt.stream_resume(
                    agent, checkpoint_id=first.checkpoint_id, response=response
                ) as stream:
                    async for _ in stream:
                        pass
                result = stream.result
            else:
                result = await rt.resume(
                    agent, checkpoint_id=first.checkpoint_id, response=response
                )
        except (Injected, runlet.ModelError):
            result = None
        except runlet.ResultNotRecordedError as error:  # the store failed a result record
            causes.append(error.__cause__)
            result = None
    assert all(isinstance(cause, Injected) for cause in causes)
    assert faults.target is None, "the fault was injected"
    for _ in range(3):  # retries, undisturbed
        result = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=response)
        if result.status == "completed":
            break
        # A non-idempotent refund cut off inside its handler comes back to a person.
        assert result.interruption is not None
        assert result.interruption.outcome_unknown
        assert not idempotent
        assert result.checkpoint_id is not None
        first = result
        response = HumanResponse(result.interruption.id, "approve")
    assert result is not None
    return result, bank, store, rt, agent


def _targets(points: list[str], kind: str) -> list[int]:
    # An exception raised by a handler is the tool's own failure, which the model is told
    # about (a result, not a fault of the resume); a cancellation can land anywhere.
    handlers = ("refund", "notify")
    return [i for i, name in enumerate(points) if kind != "error" or name not in handlers]


KINDS = ["cancel", "deadline", "error"]
STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["resume", "stream_resume"])


@STREAMED
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("when", ["before", "after"])
async def test_every_await_point_of_resume(when: str, kind: str, streamed: bool) -> None:
    points, expected = await undisturbed(idempotent=True)
    # get, claim, record (decision), refund, record (result), model, notify, model, resolve
    assert [
        "get",
        "claim",
        "record",
        "refund",
        "record",
        "model",
        "notify",
        "model",
        "resolve",
    ] == (points)
    for target in _targets(points, kind):
        result, bank, store, _, _ = await disturbed(True, target, when, kind, streamed)
        label = f"{kind} {when} {points[target]} (#{target})"
        assert "completed" == result.status, label
        assert expected == result.transcript, label
        if kind == "deadline":  # no store call fails: a handler that returned, once
            assert 1 == bank.finished, label
        assert 1 == len(bank.refunds), label  # paid once, whatever the attempts
        assert 0 == len(store), label  # nothing left open
        states = {(await store.get(cid)).status for cid in list(store._entries)}
        assert {"resolved"} == states, label


@STREAMED
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_non_idempotent_tool_never_runs_twice_without_a_person(
    when: str, kind: str, streamed: bool
) -> None:
    points, expected = await undisturbed(idempotent=False)
    for target in _targets(points, kind):
        result, bank, store, _, _ = await disturbed(False, target, when, kind, streamed)
        label = f"{kind} {when} {points[target]} (#{target})"
        assert "completed" == result.status, label
        assert 0 == len(store), label
        if kind == "deadline":
            assert 1 == bank.finished, label
        asked_again = [d for d in result.decisions if d.action == "approve"]
        # The handler never runs more often than people approved it: a second run
        # happens only after a person approved the outcome-unknown request.
        assert 1 <= len(bank.runs) <= len(asked_again), label
        if len(asked_again) == 1:
            assert expected == result.transcript, label
