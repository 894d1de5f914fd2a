"""A store written exactly as :class:`~runlet.DurableCheckpointStore` declares it passes the
conformance suite, and Runlet resumes through it.

The protocol's methods take their arguments by position only, and ``resolve()`` has no
default for ``next_checkpoint`` (Runlet always passes all four). The shipped stores are
more lenient than that, so neither the suite nor the runtime would notice a call that
leans on a keyword or a default; a store author following the protocol to the letter
would, with a ``TypeError`` from the suite. This store is that author's store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
from _exact_store import ExactStore
from conftest import BACKENDS

from runlet import Agent, HumanResponse, InMemoryCheckpointStore, Runtime, ToolContext, ToolSpec
from runlet.testing import ScriptedModel, call, store_conformance_tests


@asynccontextmanager
async def exact_store(lease: float) -> AsyncIterator[ExactStore]:
    yield ExactStore(InMemoryCheckpointStore(lease=lease))


@asynccontextmanager
async def same_storage(store: ExactStore) -> AsyncIterator[ExactStore]:
    yield ExactStore(store.inner)


async def age_leases(store: ExactStore, seconds: float) -> None:
    for entry in store.inner._entries.values():
        if entry.status == "claimed" and entry.lease_until is not None:
            entry.lease_until -= seconds


TestExactProtocolConformance = store_conformance_tests(
    exact_store, backends=BACKENDS, second_handle=same_storage, age_leases=age_leases
)


@pytest.mark.anyio
async def test_runlet_resumes_through_a_store_written_exactly_as_the_protocol() -> None:
    refunds: list[str] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> str:
        refunds.append(arguments["order_id"])
        return f"refunded {arguments['order_id']}"

    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    spec = ToolSpec("refund", "Refund an order.", schema, refund, requires_approval=True)
    model = ScriptedModel([call("refund", id="c1", order_id="7"), "Done."])
    agent = Agent("refunds", "Refund when approved.", model, [spec])
    store = ExactStore(InMemoryCheckpointStore())
    runtime = Runtime(checkpoint_store=store)
    first = await runtime.run(agent, "Refund order 7.")
    assert first.interruption is not None
    assert first.checkpoint_id is not None
    response = HumanResponse(first.interruption.id, "approve")
    result = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=response)
    assert (result.status, result.output, refunds) == ("completed", "Done.", ["7"])
    stored = await store.get(first.checkpoint_id)
    assert stored.status == "resolved"
    assert stored.resolution is not None
    assert stored.resolution.result == result
    again = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=response)
    assert (again, refunds) == (result, ["7"])
