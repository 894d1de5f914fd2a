"""Runlet's side of the peer comparison: the agents of ``benchmarks/workloads.py``, timed
by the shared harness so that every framework is measured the same way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.common import (
    PROMPT,
    W1_PLAN,
    W2_CALLS,
    W2_SLEEP,
    W3_PLAN,
    W4_PLAN,
    W4_SLEEP,
    Workloads,
    main,
)


def build() -> Workloads:
    from benchmarks.workloads import add, runlet_agent, sleeping_add
    from runlet import (
        HumanResponse,
        InMemoryCheckpointStore,
        RunResult,
        Runtime,
        structure_checkpoint,
        unstructure_checkpoint,
    )

    def tool_results(result: RunResult) -> list[str]:
        return [m.content for m in result.transcript if m.role == "tool"]

    runtime = Runtime()
    w1_agent = runlet_agent(W1_PLAN, add)
    w2_agent = runlet_agent(["add"], sleeping_add(W2_SLEEP), W2_CALLS)
    w4_agent = runlet_agent(W4_PLAN, sleeping_add(W4_SLEEP))
    store = InMemoryCheckpointStore()
    w3_runtime = Runtime(checkpoint_store=store)
    w3_agent = runlet_agent(W3_PLAN, add)

    async def w1_run() -> tuple[str, list[str]]:
        result = await runtime.run(w1_agent, PROMPT)
        return str(result.output), tool_results(result)

    async def w2_run() -> tuple[str, list[str]]:
        result = await runtime.run(w2_agent, PROMPT)
        return str(result.output), tool_results(result)

    async def w3_trip() -> tuple[str, list[str], str]:
        interrupted = await w3_runtime.run(w3_agent, PROMPT)
        checkpoint_id = interrupted.checkpoint_id
        assert checkpoint_id is not None
        assert interrupted.interruption is not None
        # What another process would do: the checkpoint leaves as JSON text and comes back.
        text = json.dumps(unstructure_checkpoint(await store.load(checkpoint_id)))
        await store.save(structure_checkpoint(json.loads(text)))
        response = HumanResponse(interrupted.interruption.id, "approve")
        result = await w3_runtime.resume(w3_agent, checkpoint_id=checkpoint_id, response=response)
        return str(result.output), tool_results(result), text

    async def w4_run() -> str:
        return str((await runtime.run(w4_agent, PROMPT)).output)

    return Workloads(
        framework="Runlet",
        packages=["runlet", "anyio", "attrs", "cattrs", "jsonschema-rs"],
        w1_run=w1_run,
        w2_run=w2_run,
        w3_trip=w3_trip,
        w4_run=w4_run,
        notes=[
            "Scripted model: a Model whose complete() builds a fresh ModelResponse per turn "
            "(benchmarks/workloads.py); tool arguments checked against the JSON Schema.",
            "W3: unstructure_checkpoint -> json.dumps -> json.loads -> structure_checkpoint "
            "-> InMemoryCheckpointStore, then Runtime.resume(); the store is left empty.",
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main(build))
