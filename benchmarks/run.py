"""Run the Runlet benchmarks against the hand-written floor and print the comparison.

Usage::

    python benchmarks/run.py                      # every workload on asyncio, uvloop, trio
    python benchmarks/run.py --backend trio       # one backend (repeat the flag for more)
    python benchmarks/run.py --workload w1        # one workload (repeatable)
    python benchmarks/run.py --smoke              # tiny counts, a few seconds, for CI
    python benchmarks/run.py --json benchmarks/results/latest.json

Every figure is a median over repetitions, with the min-max beside it. The claim is the
ratio Runlet / floor measured in the same process, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.durable import bench_w5
from benchmarks.workloads import FULL, SMOKE, WORKLOADS, Counts, Figure, Outcome

WORKLOADS = {**WORKLOADS, "w5": bench_w5}  # W5 needs a database: see benchmarks/durable.py

BACKENDS = ("asyncio", "uvloop", "trio")


def run_backend(backend: str, counts: Counts, workloads: Sequence[str]) -> dict[str, Outcome]:
    """Run *workloads* in one fresh event loop of *backend*."""

    async def main() -> dict[str, Outcome]:
        return {name: await WORKLOADS[name](counts) for name in workloads}

    if backend == "uvloop":
        return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    return anyio.run(main, backend=backend)


def ratio(figure: Figure) -> float:
    base = figure.ideal if figure.ideal is not None else statistics.median(figure.floor)
    return statistics.median(figure.runlet) / base


def verdict(figure: Figure) -> str:
    if figure.target is None:
        return ""
    kind, limit = figure.target
    value = statistics.median(figure.runlet) if kind == "max" else ratio(figure)
    return "pass" if value <= limit else "FAIL"


def target_text(figure: Figure) -> str:
    if figure.target is None:
        return "(info)"
    kind, limit = figure.target
    if kind == "floor":
        return f"≤ {limit:g}x floor"
    if kind == "ideal":
        return f"≤ {limit:g}x ideal"
    return f"≤ {limit:g} {figure.unit}"


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def spread(samples: Sequence[float]) -> str:
    median = _num(statistics.median(samples))
    if len(samples) == 1 or min(samples) == max(samples):
        return median
    return f"{median} [{_num(min(samples))}-{_num(max(samples))}]"


def table(results: dict[str, dict[str, Outcome]]) -> str:
    """The comparison as a Markdown table: one row per backend and figure."""
    header = ["backend", "figure", "unit", "Runlet", "floor", "ratio", "target", "result"]
    rows = [header, ["---"] * len(header)]
    for backend, outcomes in results.items():
        for outcome in outcomes.values():
            for figure in outcome.figures:
                base = f"ideal {_num(figure.ideal)}" if figure.ideal else spread(figure.floor)
                rows.append(
                    [
                        backend,
                        figure.label,
                        figure.unit,
                        spread(figure.runlet),
                        base,
                        f"{ratio(figure):.2f}x",
                        target_text(figure),
                        verdict(figure),
                    ]
                )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        if row[0] == "---":
            row = ["-" * w for w in widths]
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def as_json(results: dict[str, dict[str, Outcome]], counts: Counts) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine(), "counts": counts.__dict__, "results": {}}
    for backend, outcomes in results.items():
        figures = out["results"][backend] = {}
        for outcome in outcomes.values():
            for figure in outcome.figures:
                figures[figure.key] = {
                    "label": figure.label,
                    "unit": figure.unit,
                    "runlet": figure.runlet,
                    "floor": figure.floor,
                    "ideal": figure.ideal,
                    "ratio": ratio(figure),
                    "target": list(figure.target) if figure.target else None,
                    "pass": None if figure.target is None else verdict(figure) == "pass",
                }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="run only this backend (repeatable; default: all three)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=sorted(WORKLOADS),
        help="run only this workload (repeatable; default: all)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny counts; checks it runs, not how fast"
    )
    parser.add_argument("--reps", type=int, help="repetitions per timed figure")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args(argv)

    counts = SMOKE if args.smoke else FULL
    if args.reps:
        counts = Counts(**{**counts.__dict__, "reps": args.reps})
    backends = args.backend or list(BACKENDS)
    workloads = args.workload or list(WORKLOADS)
    if "uvloop" in backends:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            print("uvloop is not installed; skipping that backend", file=sys.stderr)
            backends.remove("uvloop")

    results: dict[str, dict[str, Outcome]] = {}
    for backend in backends:
        print(f"running {', '.join(workloads)} on {backend} ...", file=sys.stderr, flush=True)
        results[backend] = run_backend(backend, counts, workloads)

    info = machine()
    print(
        f"Runlet vs floor — {info['cpu']}, {info['nproc']} CPUs, "
        f"{info['implementation']} {info['python']}{' (smoke counts)' if args.smoke else ''}"
    )
    print()
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(as_json(results, counts), indent=2) + "\n")
        print(f"\nraw numbers written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
