"""The workloads, each for Runlet and for the floor, measured the same way.

Both sides get a model that answers instantly and builds a fresh response each turn,
as a real adapter does (Runlet: ``ModelResponse(Message(...))``; the floor: a dict). The
model is stateless (it reads the turn number off the transcript's length), so one agent
serves every run. Both sides use the same tool handlers and the same argument schema.

Each ``bench_*`` coroutine runs inside one event loop and returns :class:`Figure`
objects plus a ``checks`` dict of facts about the last run (for the smoke test).
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from runlet import (
    Agent,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    ModelRequest,
    ModelResponse,
    RunResult,
    Runtime,
    ToolCall,
    ToolSpec,
    structure_checkpoint,
    unstructure_checkpoint,
)

from . import floor

ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
INSTRUCTIONS = "You add numbers with the add tool."
PROMPT = "Add some numbers for me."
FINAL = "All sums are done."


async def add(arguments: Any, context: Any) -> Any:
    return arguments["a"] + arguments["b"]


def sleeping_add(seconds: float) -> Callable[[Any, Any], Awaitable[Any]]:
    async def add_later(arguments: Any, context: Any) -> Any:
        await anyio.sleep(seconds)
        return arguments["a"] + arguments["b"]

    return add_later


@dataclass(frozen=True)
class Counts:
    """How much work each workload does; ``SMOKE`` is tiny, for CI."""

    reps: int = 7
    w1_runs: int = 300
    w2_runs: int = 20
    w3_round_trips: int = 300
    w4_runs: int = 2_000
    w4_reps: int = 5
    w4_memory_reps: int = 3
    checkpoints: int = 10_000


FULL = Counts()
SMOKE = Counts(
    reps=2,
    w1_runs=3,
    w2_runs=2,
    w3_round_trips=3,
    w4_runs=20,
    w4_reps=1,
    w4_memory_reps=1,
    checkpoints=50,
)


@dataclass
class Figure:
    """One measured figure: samples for Runlet and for its baseline, and the target.

    ``target`` is ``("floor", x)`` (median Runlet <= x times the median floor), ``("ideal", x)``
    (median Runlet <= x times ``ideal``) or ``("max", x)`` (median Runlet <= x), or ``None``
    for a figure that is reported only.
    """

    key: str
    label: str
    unit: str
    runlet: list[float]
    floor: list[float]
    target: tuple[str, float] | None = None
    ideal: float | None = None
    higher_is_better: bool = False


@dataclass
class Outcome:
    figures: list[Figure] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)


# -- scripted models ---------------------------------------------------------------------


def runlet_model(plan: list[str], calls: int = 1) -> Any:
    """A Runlet model: turn *i* calls tool ``plan[i]`` *calls* times, then a final answer."""
    step = 1 + calls

    class InstantModel:
        async def complete(self, request: ModelRequest) -> ModelResponse:
            turn = (len(request.messages) - 1) // step
            if turn < len(plan):
                name = plan[turn]
                return ModelResponse(
                    Message(
                        "assistant",
                        "",
                        tuple(
                            ToolCall(f"call_{turn}_{k}", name, {"a": turn, "b": k + 1})
                            for k in range(calls)
                        ),
                    )
                )
            return ModelResponse(Message("assistant", FINAL))

    return InstantModel()


def floor_model(plan: list[str], calls: int = 1) -> floor.FloorModel:
    """The floor's model: the same script, as dicts."""
    step = 1 + calls

    async def complete(
        instructions: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        turn = (len(messages) - 1) // step
        if turn < len(plan):
            name = plan[turn]
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": f"call_{turn}_{k}", "name": name, "arguments": {"a": turn, "b": k + 1}}
                    for k in range(calls)
                ],
            }
        return {"role": "assistant", "content": FINAL}

    return complete


def runlet_agent(plan: list[str], handler: Any, calls: int = 1) -> Agent:
    tools = [ToolSpec("add", "Add two numbers.", ADD_SCHEMA, handler)]
    if "approve_add" in plan:
        tools.append(
            ToolSpec("approve_add", "Add, once a person allows it.", ADD_SCHEMA, add, True)
        )
    return Agent("adder", INSTRUCTIONS, runlet_model(plan, calls), tools)


def floor_agent(plan: list[str], handler: Any, calls: int = 1) -> floor.FloorAgent:
    tools = [floor.FloorTool("add", "Add two numbers.", ADD_SCHEMA, handler)]
    if "approve_add" in plan:
        tools.append(
            floor.FloorTool(
                "approve_add", "Add, once a person allows it.", ADD_SCHEMA, add, approval=True
            )
        )
    return floor.FloorAgent(INSTRUCTIONS, floor_model(plan, calls), tools)


# -- helpers -----------------------------------------------------------------------------


async def timed(work: Callable[[], Awaitable[Any]]) -> float:
    """Seconds *work* takes, after a full collection so earlier garbage is not billed."""
    gc.collect()
    start = time.perf_counter()
    await work()
    return time.perf_counter() - start


async def traced_peak(work: Callable[[], Awaitable[Any]]) -> int:
    """Peak bytes allocated (tracemalloc) while *work* runs, above what was live before."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        await work()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


async def traced_retained(build: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """Bytes still allocated (tracemalloc) after *build* returns, held by what it returns."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = await build()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base, kept
    finally:
        tracemalloc.stop()


async def alternate(
    reps: int, runlet: Callable[[], Awaitable[float]], base: Callable[[], Awaitable[float]]
) -> tuple[list[float], list[float]]:
    """Run one warm-up of each, then *reps* samples of each, alternating so drift in the
    machine's speed hits both sides alike."""
    await runlet()
    await base()
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(reps):
        ours.append(await runlet())
        theirs.append(await base())
    return ours, theirs


# -- W1: tool loop -----------------------------------------------------------------------

W1_PLAN = ["add"] * 10
W1_TURNS = len(W1_PLAN) + 1


async def bench_w1(counts: Counts) -> Outcome:
    runtime = Runtime()
    agent = runlet_agent(W1_PLAN, add)
    floor_runtime = floor.FloorRuntime()
    fagent = floor_agent(W1_PLAN, add)
    last: dict[str, Any] = {}

    async def runlet_rep() -> float:
        async def work() -> None:
            for _ in range(counts.w1_runs):
                last["runlet"] = await runtime.run(agent, PROMPT)

        return await timed(work)

    async def floor_rep() -> float:
        async def work() -> None:
            for _ in range(counts.w1_runs):
                last["floor"] = await floor_runtime.run(fagent, PROMPT)

        return await timed(work)

    ours, theirs = await alternate(counts.reps, runlet_rep, floor_rep)
    per_turn = 1e6 / (counts.w1_runs * W1_TURNS)
    result: RunResult = last["runlet"]
    return Outcome(
        figures=[
            Figure(
                "w1_us_per_turn",
                "W1 tool loop: time per model turn",
                "µs",
                [t * per_turn for t in ours],
                [t * per_turn for t in theirs],
                target=("floor", 5.0),
            ),
            Figure(
                "w1_runs_per_s",
                "W1 tool loop: runs per second",
                "runs/s",
                [counts.w1_runs / t for t in ours],
                [counts.w1_runs / t for t in theirs],
                higher_is_better=True,
            ),
        ],
        checks={
            "runlet_output": result.output,
            "runlet_status": result.status,
            "runlet_model_turns": sum(m.role == "assistant" for m in result.transcript),
            "runlet_tool_results": [m.content for m in result.transcript if m.role == "tool"],
            "floor_output": last["floor"]["output"],
            "floor_model_turns": sum(m["role"] == "assistant" for m in last["floor"]["messages"]),
            "floor_tool_results": [
                m["content"] for m in last["floor"]["messages"] if m["role"] == "tool"
            ],
        },
    )


# -- W2: parallel tools ------------------------------------------------------------------

W2_CALLS = 8
W2_SLEEP = 0.010


async def bench_w2(counts: Counts) -> Outcome:
    handler = sleeping_add(W2_SLEEP)
    runtime = Runtime()
    agent = runlet_agent(["add"], handler, W2_CALLS)
    floor_runtime = floor.FloorRuntime()
    fagent = floor_agent(["add"], handler, W2_CALLS)
    last: dict[str, Any] = {}

    async def runlet_rep() -> float:
        async def work() -> None:
            for _ in range(counts.w2_runs):
                last["runlet"] = await runtime.run(agent, PROMPT)

        return await timed(work)

    async def floor_rep() -> float:
        async def work() -> None:
            for _ in range(counts.w2_runs):
                last["floor"] = await floor_runtime.run(fagent, PROMPT)

        return await timed(work)

    ours, theirs = await alternate(counts.reps, runlet_rep, floor_rep)
    per_run = 1e3 / counts.w2_runs
    ours_ms = [t * per_run for t in ours]
    theirs_ms = [t * per_run for t in theirs]
    result: RunResult = last["runlet"]
    return Outcome(
        figures=[
            Figure(
                "w2_ms_per_run_vs_ideal",
                "W2 parallel tools: time per run vs ideal 10 ms",
                "ms",
                ours_ms,
                [W2_SLEEP * 1e3],
                target=("ideal", 1.2),
                ideal=W2_SLEEP * 1e3,
            ),
            Figure("w2_ms_per_run", "W2 parallel tools: time per run", "ms", ours_ms, theirs_ms),
        ],
        checks={
            "runlet_output": result.output,
            "runlet_tool_results": [m.content for m in result.transcript if m.role == "tool"],
            "floor_output": last["floor"]["output"],
        },
    )


# -- W3: human round trip ----------------------------------------------------------------

W3_PLAN = ["approve_add"]


async def bench_w3(counts: Counts) -> Outcome:
    store = InMemoryCheckpointStore()
    runtime = Runtime(checkpoint_store=store)
    agent = runlet_agent(W3_PLAN, add)
    floor_runtime = floor.FloorRuntime()
    fagent = floor_agent(W3_PLAN, add)
    last: dict[str, Any] = {}

    async def runlet_trip() -> RunResult:
        interrupted = await runtime.run(agent, PROMPT)
        checkpoint_id = interrupted.checkpoint_id
        assert checkpoint_id is not None
        assert interrupted.interruption is not None
        text = json.dumps(unstructure_checkpoint(await store.load(checkpoint_id)))
        await store.save(structure_checkpoint(json.loads(text)))
        last["runlet_json"] = text
        response = HumanResponse(interrupted.interruption.id, "approve")
        return await runtime.resume(agent, checkpoint_id=checkpoint_id, response=response)

    def floor_trip(
        runtime: floor.FloorRuntime, key: str, request: Callable[[dict[str, Any]], str]
    ) -> Callable[[], Awaitable[dict[str, Any]]]:
        async def trip() -> dict[str, Any]:
            interrupted = await runtime.run(fagent, PROMPT)
            checkpoint = interrupted["checkpoint"]
            text = json.dumps(checkpoint)
            runtime.store[checkpoint["id"]] = json.loads(text)
            last[f"{key}_json"] = text
            return await runtime.resume(fagent, checkpoint["id"], request(checkpoint), "approve")

        return trip

    def rep(key: str, trip: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[float]]:
        async def one() -> float:
            async def work() -> None:
                for _ in range(counts.w3_round_trips):
                    last[key] = await trip()

            return await timed(work)

        return one

    lean_runtime = floor.LeanFloorRuntime()
    runlet_rep = rep("runlet", runlet_trip)
    floor_rep = rep("floor", floor_trip(floor_runtime, "floor", lambda cp: cp["request"]["id"]))
    lean_rep = rep("lean", floor_trip(lean_runtime, "lean", lambda cp: cp["pending"]["id"]))
    ours, theirs = await alternate(counts.reps, runlet_rep, floor_rep)
    ours_again, lean = await alternate(counts.reps, runlet_rep, lean_rep)
    per_trip = 1e6 / counts.w3_round_trips
    runlet_bytes = len(last["runlet_json"].encode())
    floor_bytes = len(last["floor_json"].encode())
    result: RunResult = last["runlet"]
    return Outcome(
        figures=[
            Figure(
                "w3_us_per_round_trip",
                "W3 human round trip: time per round trip",
                "µs",
                [t * per_trip for t in ours],
                [t * per_trip for t in theirs],
                target=("floor", 4.0),
            ),
            Figure(
                "w3_round_trips_per_s",
                "W3 human round trip: round trips per second",
                "trips/s",
                [counts.w3_round_trips / t for t in ours],
                [counts.w3_round_trips / t for t in theirs],
                higher_is_better=True,
            ),
            Figure(
                "w3_us_per_round_trip_vs_lean",
                "W3 human round trip against a floor with no journal",
                "µs",
                [t * per_trip for t in ours_again],
                [t * per_trip for t in lean],
            ),
            Figure(
                "w3_checkpoint_json_bytes",
                "W3 checkpoint JSON size",
                "B",
                [float(runlet_bytes)],
                [float(floor_bytes)],
                target=("max", 1024.0),
            ),
        ],
        checks={
            "runlet_output": result.output,
            "runlet_status": result.status,
            "runlet_tool_results": [m.content for m in result.transcript if m.role == "tool"],
            "runlet_checkpoint_json": last["runlet_json"],
            "runlet_store_size": len(store),
            "floor_output": last["floor"]["output"],
            "floor_checkpoint_json": last["floor_json"],
            "floor_store_size": len(floor_runtime.store),
            "floor_journal": (len(floor_runtime.records), len(floor_runtime.outcomes)),
            "lean_output": last["lean"]["output"],
            "lean_checkpoint_json": last["lean_json"],
            "lean_store_size": len(lean_runtime.store),
        },
    )


# -- W4: scale ---------------------------------------------------------------------------

W4_PLAN = ["add"] * 3
W4_SLEEP = 0.001
W4_SUSPENDED_PLAN = ["add"] * 3 + ["approve_add"]


async def bench_w4(counts: Counts) -> Outcome:
    handler = sleeping_add(W4_SLEEP)
    runtime = Runtime()
    agent = runlet_agent(W4_PLAN, handler)
    floor_runtime = floor.FloorRuntime()
    fagent = floor_agent(W4_PLAN, handler)
    n = counts.w4_runs
    outputs: dict[str, list[Any]] = {}

    async def runlet_all() -> None:
        done: list[Any] = [None] * n

        async def one(index: int) -> None:
            done[index] = (await runtime.run(agent, PROMPT)).output

        async with anyio.create_task_group() as group:
            for index in range(n):
                group.start_soon(one, index)
        outputs["runlet"] = done

    async def floor_all() -> None:
        done: list[Any] = [None] * n

        async def one(index: int) -> None:
            done[index] = (await floor_runtime.run(fagent, PROMPT))["output"]

        async with anyio.create_task_group() as group:
            for index in range(n):
                group.start_soon(one, index)
        outputs["floor"] = done

    async def runlet_wall() -> float:
        return await timed(runlet_all)

    async def floor_wall() -> float:
        return await timed(floor_all)

    ours, theirs = await alternate(counts.w4_reps, runlet_wall, floor_wall)
    ours_mem: list[float] = []
    theirs_mem: list[float] = []
    for _ in range(counts.w4_memory_reps):
        ours_mem.append(await traced_peak(runlet_all) / n)
        theirs_mem.append(await traced_peak(floor_all) / n)

    # Suspended checkpoints: runs of the same shape that end in an approval-gated call.
    m = counts.checkpoints
    store = InMemoryCheckpointStore()
    suspended = Runtime(checkpoint_store=store)
    sagent = runlet_agent(W4_SUSPENDED_PLAN, add)
    fsuspended = floor.FloorRuntime()
    fsagent = floor_agent(W4_SUSPENDED_PLAN, add)

    async def runlet_checkpoints() -> InMemoryCheckpointStore:
        for _ in range(m):
            await suspended.run(sagent, PROMPT)
        return store

    async def floor_checkpoints() -> dict[str, Any]:
        for _ in range(m):
            await fsuspended.run(fsagent, PROMPT)
        return fsuspended.store

    runlet_held, _ = await traced_retained(runlet_checkpoints)
    floor_held, _ = await traced_retained(floor_checkpoints)
    sample = next(iter(store._entries.values())).checkpoint
    return Outcome(
        figures=[
            Figure(
                "w4_wall_ms",
                f"W4 scale: wall time, {n} concurrent runs",
                "ms",
                [t * 1e3 for t in ours],
                [t * 1e3 for t in theirs],
                target=("floor", 5.0),
            ),
            Figure(
                "w4_bytes_per_run",
                "W4 scale: peak memory per concurrent run",
                "B",
                ours_mem,
                theirs_mem,
                target=("floor", 2.0),
            ),
            Figure(
                "w4_bytes_per_checkpoint",
                f"W4 scale: memory per suspended checkpoint ({m} held)",
                "B",
                [runlet_held / m],
                [floor_held / m],
                target=("max", 8192.0),
            ),
        ],
        checks={
            "runlet_outputs": outputs["runlet"],
            "floor_outputs": outputs["floor"],
            "runlet_checkpoints": len(store),
            "floor_checkpoints": len(fsuspended.store),
            "runlet_checkpoint_json": json.dumps(unstructure_checkpoint(sample)),
        },
    )


WORKLOADS: dict[str, Callable[[Counts], Awaitable[Outcome]]] = {
    "w1": bench_w1,
    "w2": bench_w2,
    "w3": bench_w3,
    "w4": bench_w4,
}
