"""Profile Runlet's side of one workload, to see where its time goes.

Usage::

    python benchmarks/profiling.py w1                  # pyinstrument, asyncio
    python benchmarks/profiling.py w3 --backend trio
    python benchmarks/profiling.py w1 --cprofile       # cProfile, sorted by own time
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import workloads as w
from runlet import (
    HumanResponse,
    InMemoryCheckpointStore,
    Runtime,
    structure_checkpoint,
    unstructure_checkpoint,
)


def runlet_work(workload: str) -> Callable[[], Awaitable[Any]]:
    """One unit of Runlet's work in *workload* (a run, a round trip, a batch)."""
    if workload == "w1":
        runtime, agent = Runtime(), w.runlet_agent(w.W1_PLAN, w.add)
        return lambda: runtime.run(agent, w.PROMPT)
    if workload == "w2":
        agent = w.runlet_agent(["add"], w.sleeping_add(w.W2_SLEEP), w.W2_CALLS)
        runtime = Runtime()
        return lambda: runtime.run(agent, w.PROMPT)
    if workload == "w3":
        store = InMemoryCheckpointStore()
        runtime, agent = Runtime(checkpoint_store=store), w.runlet_agent(w.W3_PLAN, w.add)

        async def trip() -> Any:
            result = await runtime.run(agent, w.PROMPT)
            assert result.checkpoint_id is not None
            assert result.interruption is not None
            text = json.dumps(unstructure_checkpoint(await store.load(result.checkpoint_id)))
            await store.save(structure_checkpoint(json.loads(text)))
            response = HumanResponse(result.interruption.id, "approve")
            return await runtime.resume(
                agent, checkpoint_id=result.checkpoint_id, response=response
            )

        return trip
    runtime, agent = Runtime(), w.runlet_agent(w.W4_PLAN, w.sleeping_add(w.W4_SLEEP))

    async def batch() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(200):
                group.start_soon(runtime.run, agent, w.PROMPT)

    return batch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["w1", "w2", "w3", "w4"])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("-n", type=int, default=2_000, help="units of work to profile")
    parser.add_argument("--cprofile", action="store_true", help="use cProfile")
    args = parser.parse_args(argv)
    work = runlet_work(args.workload)
    count = min(args.n, 50) if args.workload in ("w2", "w4") else args.n

    async def loop() -> None:
        for _ in range(count):
            await work()

    async def profiled() -> None:
        await loop()  # warm up: imports, generated code, caches
        if args.cprofile:
            profiler = cProfile.Profile()
            profiler.enable()
            await loop()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            return
        try:
            from pyinstrument import Profiler
        except ImportError:
            sys.exit("pip install pyinstrument for the call tree, or use --cprofile.")

        with Profiler(interval=0.0001, async_mode="disabled") as sampler:
            await loop()
        print(sampler.output_text(unicode=True, show_all=False))

    anyio.run(profiled, backend=args.backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
