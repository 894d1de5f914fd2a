"""W1 with OpenTelemetry tracing off and on: what the spans cost. Not part of run.py.

Usage::

    python benchmarks/tracing.py                   # asyncio and trio
    python benchmarks/tracing.py --backend trio --reps 15

Both sides run Runlet's W1 workload (one run = 11 model turns and 10 tool calls) in the
same process, alternating. "off" is a plain ``Runtime()`` with no tracer provider
configured (OpenTelemetry installed, the global provider left at its default); "on" is
``Runtime(tracer_provider=...)`` with the OpenTelemetry SDK, every span sampled and handed
to an exporter that drops it, so the figure is Runlet's instrumentation plus the SDK's
own span bookkeeping, without any I/O. It needs ``opentelemetry-sdk``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.workloads import (
    FULL,
    PROMPT,
    W1_PLAN,
    W1_TURNS,
    add,
    alternate,
    runlet_agent,
    timed,
)
from runlet import Runtime


class DropExporter(SpanExporter):
    """Takes every span and keeps none."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def compare(reps: int, runs: int) -> tuple[list[float], list[float]]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(DropExporter()))
    off, on = Runtime(), Runtime(tracer_provider=provider)
    agent = runlet_agent(W1_PLAN, add)

    def rep(runtime: Runtime) -> Callable[[], Awaitable[float]]:
        async def measure() -> float:
            async def work() -> None:
                for _ in range(runs):
                    await runtime.run(agent, PROMPT)

            return await timed(work)

        return measure

    try:
        return await alternate(reps, rep(off), rep(on))
    finally:
        provider.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=("asyncio", "trio"))
    parser.add_argument("--reps", type=int, default=FULL.reps)
    parser.add_argument("--runs", type=int, default=FULL.w1_runs)
    args = parser.parse_args(argv)
    per_turn = 1e6 / (args.runs * W1_TURNS)
    print(
        "| backend | W1 µs per model turn, tracing off | tracing on (SDK, spans dropped) | on/off |"
    )
    print("| --- | --- | --- | --- |")
    for backend in args.backend or ["asyncio", "trio"]:
        off, on = anyio.run(compare, args.reps, args.runs, backend=backend)
        off_us = statistics.median(off) * per_turn
        on_us = statistics.median(on) * per_turn
        print(f"| {backend} | {off_us:.1f} | {on_us:.1f} | {on_us / off_us:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
