"""What every side of the peer comparison shares: the script, the counts, the timing.

Each framework's module (``runlet_side``, ``pydantic_ai``, ``openai_agents``,
``langgraph``) builds the same four workloads with that framework's own API and hands
them to :func:`main`, which times them the same way for everyone and prints one JSON
document. The driver (``benchmarks/peers/run.py``) starts each module in a process of
its own, so no framework's imports, caches or event-loop policy touch another's.

The script is the one ``benchmarks/workloads.py`` uses: turn *i* calls ``add(a=i, b=k+1)``
(``k`` counts the calls in the turn), and the model answers :data:`FINAL` once the plan is
used up. The model reads the turn number off the conversation, so it is stateless and one
agent serves every run.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

PROMPT = "Add some numbers for me."
INSTRUCTIONS = "You add numbers with the add tool."
FINAL = "All sums are done."

W1_PLAN = ["add"] * 10
W1_TURNS = len(W1_PLAN) + 1
W2_CALLS = 8
W2_SLEEP = 0.010
W3_PLAN = ["approve_add"]
W4_PLAN = ["add"] * 3
W4_SLEEP = 0.001

#: What each workload's last run must have produced, on every side.
W1_RESULTS = [str(turn + 1) for turn in range(len(W1_PLAN))]
W2_RESULTS = [str(k + 1) for k in range(W2_CALLS)]
W3_RESULTS = ["1"]

#: Environment that keeps every framework off the network: no tracing exporters, no
#: LangSmith, no Logfire, no OpenTelemetry SDK. The driver sets it for each process.
OFFLINE_ENV = {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "OPENAI_API_KEY": "sk-offline-benchmark",  # never sent: nothing connects
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_API_KEY": "",
    "LOGFIRE_SEND_TO_LOGFIRE": "false",
    "LOGFIRE_IGNORE_NO_CONFIG": "1",
    "OTEL_SDK_DISABLED": "true",
    "DO_NOT_TRACK": "1",
}

#: Exit status of a side whose framework is not installed.
MISSING = 3


@dataclass(frozen=True)
class Counts:
    """How much work each workload does. The peers are 100-200 times slower per turn than
    Runlet, so these are smaller than ``benchmarks/workloads.FULL``; every side uses the
    same counts so the figures compare like with like."""

    reps: int = 7
    w1_runs: int = 100
    w2_runs: int = 10
    w3_round_trips: int = 200
    w4_runs: int = 2_000
    w4_reps: int = 2
    w4_warmup_runs: int = 100


FULL = Counts()
SMOKE = Counts(
    reps=1, w1_runs=2, w2_runs=1, w3_round_trips=2, w4_runs=10, w4_reps=1, w4_warmup_runs=2
)


@dataclass
class Workloads:
    """One framework's side: a coroutine per workload, each doing one unit of work.

    ``w1_run``/``w2_run`` run one agent run and return its final output and the tool
    results, as strings; ``w3_trip`` does one human round trip (run, interrupt, checkpoint
    through JSON text, resume with approval) and returns the output, the tool results and
    the checkpoint's JSON text; ``w4_run`` runs one W4 run and returns its output.
    """

    framework: str
    packages: Sequence[str]
    w1_run: Callable[[], Awaitable[tuple[str, list[str]]]]
    w2_run: Callable[[], Awaitable[tuple[str, list[str]]]]
    w3_trip: Callable[[], Awaitable[tuple[str, list[str], str]]]
    w4_run: Callable[[], Awaitable[str]]
    notes: list[str] = field(default_factory=list)


class WrongWork(AssertionError):
    """A side did not do the work the workload asks for."""


def check(name: str, actual: Any, expected: Any) -> None:
    if actual != expected:
        raise WrongWork(f"{name}: expected {expected!r}, got {actual!r}")


def forbid_network() -> None:
    """Make any attempt to reach another host fail loudly instead of quietly skewing the
    figures (a telemetry exporter, a tokenizer download). Local socket pairs still work."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"network access during a benchmark: {args!r}")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse
    socket.getaddrinfo = refuse


async def _timed(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Wall-clock and CPU seconds *work* takes, after a full collection so earlier garbage
    is not billed. CPU time is this process's own: other work on a shared machine does
    not inflate it the way it inflates the wall clock."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    await work()
    return time.perf_counter() - wall, time.process_time() - cpu


async def _samples(
    reps: int, work: Callable[[], Awaitable[Any]]
) -> tuple[list[float], list[float]]:
    """One warm-up, then *reps* timed repetitions: wall-clock and CPU seconds of each."""
    await work()
    timings = [await _timed(work) for _ in range(reps)]
    return [wall for wall, _ in timings], [cpu for _, cpu in timings]


async def measure(side: Workloads, counts: Counts, workloads: Sequence[str]) -> dict[str, Any]:
    """Run the *workloads* of one side; figures (every sample) and what the last run did.

    Figures without a suffix are CPU time; ``_wall`` ones are the wall clock. W2 is timed
    by the wall clock only: its tools sleep, so the point is how close a run gets to the
    10 ms the slowest call takes.
    """
    figures: dict[str, Any] = {}
    checks: dict[str, Any] = {}

    if "w1" in workloads:
        last: list[Any] = []

        async def w1() -> None:
            for _ in range(counts.w1_runs):
                last[:] = [await side.w1_run()]

        wall, cpu = await _samples(counts.reps, w1)
        output, results = last[0]
        check("W1 output", output, FINAL)
        check("W1 tool results", results, W1_RESULTS)
        checks["w1"] = {"output": output, "tool_results": results}
        turns = counts.w1_runs * W1_TURNS
        figures["w1_us_per_turn"] = [t * 1e6 / turns for t in cpu]
        figures["w1_us_per_turn_wall"] = [t * 1e6 / turns for t in wall]
        figures["w1_runs_per_s"] = [counts.w1_runs / t for t in cpu]

    if "w2" in workloads:
        last = []

        async def w2() -> None:
            for _ in range(counts.w2_runs):
                last[:] = [await side.w2_run()]

        wall, _ = await _samples(counts.reps, w2)
        output, results = last[0]
        check("W2 output", output, FINAL)
        check("W2 tool results", results, W2_RESULTS)
        checks["w2"] = {"output": output, "tool_results": results}
        figures["w2_ms_per_run_wall"] = [t * 1e3 / counts.w2_runs for t in wall]

    if "w3" in workloads:
        last = []

        async def w3() -> None:
            for _ in range(counts.w3_round_trips):
                last[:] = [await side.w3_trip()]

        wall, cpu = await _samples(counts.reps, w3)
        output, results, text = last[0]
        check("W3 output", output, FINAL)
        check("W3 tool results", results, W3_RESULTS)
        checks["w3"] = {"output": output, "tool_results": results, "checkpoint_json": text}
        trips = counts.w3_round_trips
        figures["w3_us_per_round_trip"] = [t * 1e6 / trips for t in cpu]
        figures["w3_us_per_round_trip_wall"] = [t * 1e6 / trips for t in wall]
        figures["w3_round_trips_per_s"] = [trips / t for t in cpu]
        # Sized as ``json.dumps`` writes it, so indentation or compact separators in a
        # framework's own encoder do not count for or against it.
        figures["w3_checkpoint_json_bytes"] = [float(len(json.dumps(json.loads(text)).encode()))]

    if "w4" in workloads:
        outputs: list[str] = []

        async def w4(n: int) -> None:
            done = [""] * n

            async def one(index: int) -> None:
                done[index] = await side.w4_run()

            async with anyio.create_task_group() as group:
                for index in range(n):
                    group.start_soon(one, index)
            outputs[:] = done

        await w4(counts.w4_warmup_runs)  # warm-up at a smaller size: the real one is slow
        timings = [await _timed(lambda: w4(counts.w4_runs)) for _ in range(counts.w4_reps)]
        check("W4 outputs", outputs, [FINAL] * counts.w4_runs)
        checks["w4"] = {"runs": len(outputs), "outputs_ok": True}
        figures["w4_ms"] = [cpu * 1e3 for _, cpu in timings]
        figures["w4_ms_wall"] = [wall * 1e3 for wall, _ in timings]

    return {"figures": figures, "checks": checks}


def versions(packages: Sequence[str]) -> dict[str, str]:
    found = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def main(build: Callable[[], Workloads], argv: Sequence[str] | None = None) -> int:
    """Time one framework's side and print (or write) its JSON document."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--workload", action="append", choices=["w1", "w2", "w3", "w4"])
    parser.add_argument("--json", type=Path, help="write the document here instead of stdout")
    args = parser.parse_args(argv)
    os.environ.update(OFFLINE_ENV)
    forbid_network()
    counts = SMOKE if args.smoke else FULL
    try:
        side = build()
    except ModuleNotFoundError as exc:
        print(f"{exc.name} is not installed; pip install -e '.[peers]' adds it", file=sys.stderr)
        return MISSING
    # How busy the machine was (1, 5, 15-minute load averages): on a shared machine,
    # other work slows every figure down; the driver warns about it.
    load_before = os.getloadavg()
    measured = anyio.run(measure, side, counts, args.workload or ["w1", "w2", "w3", "w4"])
    document = {
        "framework": side.framework,
        "versions": versions(side.packages),
        "python": sys.version.split()[0],
        "counts": asdict(counts),
        "notes": side.notes,
        "loadavg": {"before": load_before, "after": os.getloadavg()},
        **measured,
    }
    text = json.dumps(document, indent=2) + "\n"
    if args.json:
        args.json.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)
