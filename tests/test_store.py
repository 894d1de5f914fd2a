"""Checkpoint stores: the protocol, InMemoryCheckpointStore and its atomic claim, and
exactly-once resume on top of it."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import runlet
import runlet._store
import runlet.testing._conformance
from runlet import (
    Agent,
    Checkpoint,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointStore,
    DurableCheckpointStore,
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


# --- InMemoryCheckpointStore (the conformance suite covers the protocol) -----------------


class TestInMemoryCheckpointStore:
    def test_is_a_durable_checkpoint_store(self) -> None:
        store = InMemoryCheckpointStore()
        assert isinstance(store, CheckpointStore)
        assert isinstance(store, DurableCheckpointStore)
        assert store.lease is None
        assert "InMemoryCheckpointStore(lease=None)" == repr(store)

    @pytest.mark.parametrize("lease", [-1, "5", float("inf"), True, 1e9 + 1, 2**63])
    def test_a_bad_lease_is_refused(self, lease: object) -> None:
        with pytest.raises(runlet.ConfigurationError, match="lease"):
            InMemoryCheckpointStore(lease=lease)  # type: ignore[arg-type]

    @pytest.mark.parametrize("kind", ["sqlite", "postgres"])
    @pytest.mark.parametrize("lease", [1e9 + 1, 1e13, 2**63])
    def test_a_lease_beyond_the_databases_date_arithmetic_is_refused(
        self, kind: str, lease: float
    ) -> None:
        # PostgreSQL's interval overflowed at the first claim (1e13 s); SQLite's integers
        # at 2**63. About 31 years is the longest; None never runs out.
        if kind == "sqlite":
            from runlet.stores.sqlite import SQLiteCheckpointStore as Store
        else:
            from runlet.stores.postgres import PostgresCheckpointStore as Store
        where = "never-opened.db" if kind == "sqlite" else "host=127.0.0.1 dbname=never"
        words = r"non-negative number of seconds \(or None\), at most 1e\+09 \(about 31"
        with pytest.raises(runlet.ConfigurationError, match=words):
            Store(where, lease=lease)
        assert Store(where, lease=1e9).lease == 1e9

    async def test_len_and_in_count_only_open_checkpoints(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        await store.save(golden("cp_2"))
        assert 2 == len(store)
        await store.cancel("cp_2")
        assert 1 == len(store)
        assert "cp_1" in store
        assert "cp_2" not in store
        assert 3 not in store

    async def test_len_and_in_count_a_claimed_checkpoint_as_open(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        await store.claim("cp_1")
        assert (1, True) == (len(store), "cp_1" in store)

    async def test_renew_extends_the_lease_from_now(self, monkeypatch: pytest.MonkeyPatch) -> None:
        now = [100.0]
        clock = types.SimpleNamespace(monotonic=lambda: now[0])
        monkeypatch.setattr(runlet._store, "time", clock)  # the store's clock only
        store = InMemoryCheckpointStore(lease=10)
        await store.save(golden("cp_1"))
        claim = await store.claim("cp_1")
        now[0] = 108.0
        await store.renew("cp_1", claim.token)
        now[0] = 115.0  # past the first lease, within the renewed one
        with pytest.raises(CheckpointClaimedError):
            await store.claim("cp_1")
        now[0] = 118.0  # the renewed lease runs out
        assert claim.token != (await store.claim("cp_1")).token

    async def test_save_replaces_the_data_of_a_checkpoint_with_the_same_id(self) -> None:
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        newer = attrs.evolve(golden("cp_1"), turns=9)

        await store.save(newer)

        assert newer == await store.load("cp_1")
        assert 1 == len(store)

    async def test_only_the_latest_finished_checkpoints_are_kept(self) -> None:
        store = InMemoryCheckpointStore(keep_finished=2)
        for name in ("cp_1", "cp_2", "cp_3", "cp_4"):
            await store.save(golden(name))
        for name in ("cp_1", "cp_2"):
            claim = await store.claim(name)
            await store.release(name, claim.token)
            await store.cancel(name)
        await store.cancel("cp_2")  # cancelling twice does not count twice
        claim = await store.claim("cp_3")
        await store.resolve(
            "cp_3", claim.token, runlet.testing._conformance.sample_resolution(golden("cp_3"))
        )

        with pytest.raises(CheckpointNotFoundError):
            await store.get("cp_1")  # the oldest finished one is forgotten
        assert "cancelled" == (await store.get("cp_2")).status
        assert "resolved" == (await store.get("cp_3")).status
        assert "pending" == (await store.get("cp_4")).status  # open ones are never dropped

    async def test_by_default_the_latest_thousand_finished_checkpoints_are_kept(self) -> None:
        store = InMemoryCheckpointStore()
        for index in range(1_001):
            await store.save(golden(f"cp_{index}"))
            await store.cancel(f"cp_{index}")
        with pytest.raises(CheckpointNotFoundError):
            await store.get("cp_0")
        assert "cancelled" == (await store.get("cp_1")).status

    async def test_keep_finished_zero_forgets_each_finished_checkpoint_at_once(self) -> None:
        store = InMemoryCheckpointStore(keep_finished=0)
        await store.save(golden("cp_1"))
        await store.save(golden("cp_2"))
        await store.cancel("cp_1")
        with pytest.raises(CheckpointNotFoundError):
            await store.get("cp_1")
        assert "pending" == (await store.get("cp_2")).status

    async def test_a_checkpoint_saved_again_after_delete_is_not_forgotten_as_finished(
        self,
    ) -> None:
        store = InMemoryCheckpointStore(keep_finished=1)
        await store.save(golden("cp_1"))
        await store.cancel("cp_1")
        await store.delete("cp_1")
        await store.save(golden("cp_1"))  # the same id, waiting again
        await store.save(golden("cp_2"))
        await store.cancel("cp_2")  # pushes the old cp_1 out of the kept ones
        assert "pending" == (await store.get("cp_1")).status
        assert "cancelled" == (await store.get("cp_2")).status

    async def test_a_finished_checkpoint_deleted_before_it_is_dropped_is_skipped(self) -> None:
        store = InMemoryCheckpointStore(keep_finished=1)
        for name in ("cp_1", "cp_2", "cp_3"):
            await store.save(golden(name))
        await store.cancel("cp_1")
        await store.delete("cp_1")
        await store.cancel("cp_2")  # pushes out cp_1, which is gone already
        await store.cancel("cp_3")
        with pytest.raises(CheckpointNotFoundError):
            await store.get("cp_2")
        assert "cancelled" == (await store.get("cp_3")).status

    async def test_without_a_lease_a_claim_is_held_until_given_back(self) -> None:
        # The default: no lease, so no other claim or cancel takes it however long it
        # is held; release() gives it back.
        store = InMemoryCheckpointStore()
        await store.save(golden("cp_1"))
        claim = await store.claim("cp_1")
        with pytest.raises(CheckpointClaimedError):
            await store.claim("cp_1")
        with pytest.raises(CheckpointClaimedError):
            await store.cancel("cp_1")
        await store.release("cp_1", claim.token)
        assert claim.token != (await store.claim("cp_1")).token

    async def test_keep_finished_none_keeps_everything(self) -> None:
        store = InMemoryCheckpointStore(keep_finished=None)
        for index in range(5):
            await store.save(golden(f"cp_{index}"))
            await store.cancel(f"cp_{index}")
        assert ["cancelled"] * 5 == [(await store.get(f"cp_{i}")).status for i in range(5)]

    @pytest.mark.parametrize("keep", [-1, 1.5, "10"])
    def test_a_bad_keep_finished_is_refused(self, keep: object) -> None:
        with pytest.raises(runlet.ConfigurationError, match="keep_finished"):
            InMemoryCheckpointStore(keep_finished=keep)  # type: ignore[arg-type]

    async def test_list_pending_refuses_a_bad_limit_and_an_unknown_after(self) -> None:
        store = InMemoryCheckpointStore()
        with pytest.raises(runlet.ConfigurationError, match="limit"):
            await store.list_pending(limit=0)
        with pytest.raises(CheckpointNotFoundError):
            await store.list_pending(after="cp_missing")

    async def test_a_metadata_array_held_as_a_tuple_matches_a_list(self) -> None:
        # A run's metadata keeps the caller's tuple in memory; JSON knows only arrays.
        store = InMemoryCheckpointStore()
        rt = Runtime(checkpoint_store=store)
        tool = ToolSpec("refund", "Refund.", ORDER_SCHEMA, Refund(), requires_approval=True)
        agent = Agent("a", "", ScriptedModel([call("refund", order_id="1")]), (tool,))
        result = await rt.run(agent, "go", metadata={"tags": ("a", ("b", True))})
        listed = await store.list_pending(metadata={"tags": ["a", ["b", True]]})
        assert [result.checkpoint_id] == [found.checkpoint_id for found in listed]
        assert [] == await store.list_pending(metadata={"tags": ["a", ["b", 1]]})


# --- Claim tokens ------------------------------------------------------------------------

_FORK_TOKENS = """
import os
from runlet._store import new_token

new_token()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, new_token().encode())
    os._exit(0)
os.waitpid(pid, 0)
print(new_token(), os.read(read, 100).decode())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
def test_a_forked_worker_does_not_repeat_its_parents_tokens() -> None:
    # A fresh interpreter: forking this (threaded) test process would warn.
    done = subprocess.run(
        [sys.executable, "-c", _FORK_TOKENS], capture_output=True, text=True, check=True
    )
    parent, child = done.stdout.split()
    assert parent.partition("-")[0] != child.partition("-")[0]


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
    # The loser can repeat its request once the winner finished: it gets the result.
    again = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert ("completed", ["1"]) == (again.status, handler.calls)


async def test_a_resolved_checkpoint_answers_a_repeat_with_the_stored_result() -> None:
    store = InMemoryCheckpointStore()
    rt, agent, handler, checkpoint_id, response = await interrupted(store)
    result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert "completed" == result.status

    assert result == await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)

    with pytest.raises(runlet.HumanResponseConflictError, match="already answered") as info:
        await rt.resume(
            agent,
            checkpoint_id=checkpoint_id,
            response=HumanResponse(response.request_id, "reject"),
        )
    assert (checkpoint_id, result.decisions[0]) == (info.value.checkpoint_id, info.value.decision)
    assert ["1"] == handler.calls


async def test_a_failed_resume_releases_its_claim() -> None:
    store = InMemoryCheckpointStore()
    rt, agent, handler, checkpoint_id, response = await interrupted(store)

    with pytest.raises(runlet.HumanResponseError):
        await rt.resume(
            agent, checkpoint_id=checkpoint_id, response=HumanResponse("req_wrong", "approve")
        )

    # A wrong answer never claimed anything.
    assert "pending" == (await store.get(checkpoint_id)).status
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
    assert "pending" == (await store.get(checkpoint_id)).status  # the claim was released
    handler.release = None
    # Cut off inside the handler: not run again on its own, but asked about again.
    result = await rt.resume(agent, checkpoint_id=checkpoint_id, response=response)
    assert result.interruption is not None
    assert result.interruption.outcome_unknown
    assert ["1"] == handler.calls


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
    assert not isinstance(store, DurableCheckpointStore)
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
