"""Checkpoint stores: the protocol, InMemoryCheckpointStore and its atomic claim, and
exactly-once resume on top of it."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import runlet
from runlet import (
    Agent,
    Checkpoint,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointStore,
    ClaimingCheckpointStore,
    HumanResponse,
    InMemoryCheckpointStore,
    Runtime,
    ToolContext,
    ToolSpec,
    structure_checkpoint,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).parent / "data" / "checkpoint-v1.json"

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
}


def golden(checkpoint_id: str = "cp_golden") -> Checkpoint:
    checkpoint = structure_checkpoint(json.loads(GOLDEN.read_text()))
    return attrs.evolve(checkpoint, id=checkpoint_id)


class Refund:
    """An approval-gated handler that can hold a resume inside it until released."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.started = anyio.Event()
        self.release: anyio.Event | None = None

    async def __call__(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.calls.append(arguments["order_id"])
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        return "Refunded."


async def interrupted(
    store: CheckpointStore,
) -> tuple[Runtime, Agent, Refund, str, HumanResponse]:
    handler = Refund()
    model = ScriptedModel([call("refund", id="c1", order_id="1"), "Ok.", "Ok again."])
    tool = ToolSpec("refund", "Refund.", ORDER_SCHEMA, handler, requires_approval=True)
    agent = Agent("support", "Ask first.", model, (tool,))
    rt = Runtime(checkpoint_store=store)
    result = await rt.run(agent, "Refund order 1.")
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    return (
        rt,
        agent,
        handler,
        result.checkpoint_id,
        HumanResponse(result.interruption.id, "approve"),
    )


# --- InMemoryCheckpointStore -------------------------------------------------------------


class TestInMemoryCheckpointStore:
    def test_is_a_claiming_checkpoint_store(self) -> None:
        store = InMemoryCheckpointStore()
        assert isinstance(store, CheckpointStore)
        assert isinstance(store, ClaimingCheckpointStore)

    async def test_save_load_delete(self) -> None:
        store = InMemoryCheckpointStore()
        checkpoint = golden("cp_1")

        await store.save(checkpoint)

        assert 1 == len(store)
        assert "cp_1" in store
        assert checkpoint == await store.load("cp_1")
        await store.delete("cp_1")
        assert 0 == len(store)
        assert "cp_1" not in store

    async def test_save_replaces_a_checkpoint_with_the_same_id(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        newer = attrs.evolve(golden("cp_1"), turns=9)

        await store.save(newer)

        assert newer == await store.load("cp_1")
        assert 1 == len(store)

    async def test_load_of_an_unknown_id_raises_not_found(self) -> None:
        with pytest.raises(CheckpointNotFoundError, match="No checkpoint 'cp_x'") as info:
            await InMemoryCheckpointStore().load("cp_x")
        assert "cp_x" == info.value.checkpoint_id
        assert isinstance(info.value, runlet.RunletError)

    async def test_delete_of_an_unknown_id_does_nothing(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))

        await store.delete("cp_x")

        assert 1 == len(store)

    async def test_claim_returns_the_checkpoint_once_until_released(self) -> None:
        store = InMemoryCheckpointStore()
        checkpoint = golden("cp_1")
        await store.save(checkpoint)

        assert checkpoint == await store.claim("cp_1")
        with pytest.raises(CheckpointClaimedError, match="being resumed") as info:
            await store.claim("cp_1")
        assert "cp_1" == info.value.checkpoint_id
        # A claimed checkpoint can still be loaded (to show it, say).
        assert checkpoint == await store.load("cp_1")

        await store.release("cp_1")
        assert checkpoint == await store.claim("cp_1")

    async def test_claims_are_per_checkpoint(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        await store.save(golden("cp_2"))

        await store.claim("cp_1")

        assert golden("cp_2") == await store.claim("cp_2")

    async def test_claim_of_an_unknown_id_raises_not_found(self) -> None:
        with pytest.raises(CheckpointNotFoundError):
            await InMemoryCheckpointStore().claim("cp_x")

    async def test_delete_drops_the_claim_too(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        await store.claim("cp_1")

        await store.delete("cp_1")
        await store.save(golden("cp_1"))

        assert golden("cp_1") == await store.claim("cp_1")

    async def test_release_of_an_unclaimed_id_does_nothing(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))

        await store.release("cp_1")
        await store.release("cp_x")

        assert golden("cp_1") == await store.claim("cp_1")


# --- Exactly-once resume -----------------------------------------------------------------


async def test_two_concurrent_resumes_run_the_tool_once() -> None:
    store = InMemoryCheckpointStore()
    rt, agent, handler, checkpoint_id, response = await interrupted(store)
    handler.release = anyio.Event()
    outcomes: list[str] = []

    async def first() -> None:
        result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
        outcomes.append(result.status)

    async def second() -> None:
        await handler.started.wait()  # the first resume holds the claim now
        try:
            await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
        except CheckpointClaimedError as exc:
            outcomes.append(f"claimed {exc.checkpoint_id}")
        assert handler.release is not None
        handler.release.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(first)
            group.start_soon(second)

    assert [f"claimed {checkpoint_id}", "completed"] == outcomes
    assert ["1"] == handler.calls
    assert 0 == len(store)


async def test_a_resolved_checkpoint_cannot_be_resumed_again() -> None:
    store = InMemoryCheckpointStore()
    rt, agent, handler, checkpoint_id, response = await interrupted(store)
    result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert "completed" == result.status

    with pytest.raises(CheckpointNotFoundError, match="already finished") as info:
        await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)

    assert isinstance(info.value, runlet.RunletError)
    assert ["1"] == handler.calls


async def test_a_failed_resume_releases_its_claim() -> None:
    store = InMemoryCheckpointStore()
    rt, agent, handler, checkpoint_id, response = await interrupted(store)

    with pytest.raises(runlet.HumanResponseError):
        await rt.resume(
            agent, checkpoint_id=checkpoint_id, response=HumanResponse("req_wrong", "approve")
        )

    # Nobody holds the claim any more.
    assert checkpoint_id == (await store.claim(checkpoint_id)).id
    await store.release(checkpoint_id)
    result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert "completed" == result.status
    assert ["1"] == handler.calls


async def test_a_cancelled_resume_releases_its_claim() -> None:
    store = InMemoryCheckpointStore()
    rt, agent, handler, checkpoint_id, response = await interrupted(store)
    handler.release = anyio.Event()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(rt.resume, agent, checkpoint_id=checkpoint_id, response=response)
            )
            await handler.started.wait()
            group.cancel_scope.cancel()

    assert group.cancel_scope.cancelled_caught
    handler.release = None
    result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert "completed" == result.status
    assert ["1", "1"] == handler.calls


async def test_a_store_without_claims_is_loaded_and_retired() -> None:
    log: list[str] = []

    class PlainStore:
        """Implements only the CheckpointStore protocol: no claim or release."""

        def __init__(self) -> None:
            self.inner = InMemoryCheckpointStore()

        async def save(self, checkpoint: Checkpoint) -> None:
            log.append("save")
            await self.inner.save(checkpoint)

        async def load(self, checkpoint_id: str) -> Checkpoint:
            log.append("load")
            return await self.inner.load(checkpoint_id)

        async def delete(self, checkpoint_id: str) -> None:
            log.append("delete")
            await self.inner.delete(checkpoint_id)

    store = PlainStore()
    assert not isinstance(store, ClaimingCheckpointStore)
    rt, agent, handler, checkpoint_id, response = await interrupted(store)

    with pytest.raises(runlet.HumanResponseError):
        await rt.resume(
            agent, checkpoint_id=checkpoint_id, response=HumanResponse("req_wrong", "approve")
        )
    result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)

    assert "completed" == result.status
    assert ["save", "load", "load", "delete"] == log
    assert 0 == len(store.inner)
    with pytest.raises(CheckpointNotFoundError):
        await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert ["1"] == handler.calls
