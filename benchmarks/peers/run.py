"""Run the workloads in Runlet and in the frameworks people compare it with, one process
per framework, and merge what they measured into one JSON document.

Usage::

    python benchmarks/peers/run.py                          # every side that is installed
    python benchmarks/peers/run.py --only runlet --only langgraph
    python benchmarks/peers/run.py --smoke                  # tiny counts: does it work?
    python benchmarks/peers/run.py --json benchmarks/results/peers.json

A framework that is not installed is skipped with a message (``pip install -e
".[peers]"`` or ``nox -s bench_peers`` installs them all). Every figure is a median over
repetitions, after a warm-up; ``python benchmarks/chart.py`` draws the chart.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.common import MISSING, OFFLINE_ENV
from benchmarks.run import machine

ROOT = Path(__file__).resolve().parents[2]

#: name on the command line -> module in benchmarks/peers/
SIDES = {
    "runlet": "runlet_side",
    "pydantic_ai": "pydantic_ai",
    "openai_agents": "openai_agents",
    "langgraph": "langgraph",
}

#: figure key -> (label, unit, higher is better). CPU time is the process's own, so other
#: work on a shared machine does not inflate it; the wall-clock rows show what it did.
FIGURES = {
    "w1_us_per_turn": ("W1 tool loop: CPU time per model turn", "µs", False),
    "w1_us_per_turn_wall": ("W1 tool loop: wall time per model turn", "µs", False),
    "w2_ms_per_run_wall": ("W2 parallel tools: wall time per run (ideal 10 ms)", "ms", False),
    "w3_us_per_round_trip": ("W3 human round trip: CPU time per round trip", "µs", False),
    "w3_us_per_round_trip_wall": ("W3 human round trip: wall time per round trip", "µs", False),
    "w3_round_trips_per_s": ("W3 human round trip: round trips per CPU second", "trips/s", True),
    "w3_checkpoint_json_bytes": ("W3 checkpoint JSON size", "B", False),
    "w4_ms": ("W4 scale: CPU time, {w4_runs:,} concurrent runs", "ms", False),
    "w4_ms_wall": ("W4 scale: wall time, {w4_runs:,} concurrent runs", "ms", False),
}


def run_side(name: str, smoke: bool, workloads: Sequence[str]) -> tuple[int, Any, str]:
    """Run one side in a fresh interpreter; its exit status, document and stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        command = [sys.executable, "-m", f"benchmarks.peers.{SIDES[name]}", "--json", str(out)]
        command += ["--smoke"] if smoke else []
        for workload in workloads:
            command += ["--workload", workload]
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, **OFFLINE_ENV},
            capture_output=True,
            text=True,
            check=False,
        )
        document = json.loads(out.read_text()) if done.returncode == 0 else None
    return done.returncode, document, done.stderr


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(data: dict[str, Any]) -> str:
    """The comparison as a Markdown table: a row per figure, a column per framework, each
    cell the median and, for the peers, how many times worse than Runlet it is."""
    sides = data["sides"]
    names = list(sides)
    header = ["figure", "unit", *(sides[n]["framework"] for n in names)]
    rows = [header, ["---"] * len(header)]
    for key, (label, unit, higher) in FIGURES.items():
        medians = {
            n: statistics.median(sides[n]["figures"][key])
            for n in names
            if key in sides[n]["figures"]
        }
        if not medians:
            continue
        ours = medians.get("runlet")
        counts = next(iter(sides.values()))["counts"]
        row = [label.format(**counts), unit]
        for n in names:
            if n not in medians:
                row.append("n/a")
                continue
            cell = _num(medians[n])
            if ours and n != "runlet":
                times = ours / medians[n] if higher else medians[n] / ours
                cell += f" ({times:.0f}x)" if times >= 10 else f" ({times:.1f}x)"
            row.append(cell)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        if row[0] == "---":
            row = ["-" * w for w in widths]
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def headline(data: dict[str, Any]) -> str | None:
    """How many times less time per model turn Runlet spends than the fastest peer."""
    sides = data["sides"]
    if "runlet" not in sides:
        return None
    per_turn = {
        n: statistics.median(s["figures"]["w1_us_per_turn"])
        for n, s in sides.items()
        if "w1_us_per_turn" in s["figures"]
    }
    peers = {n: v for n, v in per_turn.items() if n != "runlet"}
    if "runlet" not in per_turn or not peers:
        return None
    fastest = min(peers, key=peers.__getitem__)
    return (
        f"{peers[fastest] / per_turn['runlet']:.0f}x less time per model turn than the "
        f"fastest peer ({sides[fastest]['framework']}), measured {data['date']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=list(SIDES),
        help="run only this side (repeatable; default: all)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=["w1", "w2", "w3", "w4"],
        help="run only this workload (repeatable; default: all)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny counts; checks that every side works, not how fast",
    )
    parser.add_argument("--json", type=Path, help="write the merged document here")
    args = parser.parse_args(argv)

    data: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "machine": machine(),
        "smoke": args.smoke,
        "sides": {},
        "skipped": {},
    }
    failed = []
    for name in args.only or list(SIDES):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        status, document, stderr = run_side(name, args.smoke, args.workload or [])
        if status == MISSING:
            reason = stderr.strip().splitlines()[-1] if stderr.strip() else "not installed"
            print(f"skipping {name}: {reason}", file=sys.stderr)
            data["skipped"][name] = reason
        elif status != 0:
            print(f"{name} failed (exit status {status}):\n{stderr}", file=sys.stderr)
            failed.append(name)
        else:
            data["sides"][name] = document
            busiest = max(document["loadavg"]["before"][0], document["loadavg"]["after"][0])
            # The side itself keeps one CPU busy; more than the machine has is contention.
            if busiest > (os.cpu_count() or 1):
                print(
                    f"warning: load average {busiest:.1f} on {os.cpu_count()} CPUs while "
                    f"{name} ran; other work on this machine slows the figures down",
                    file=sys.stderr,
                )

    if data["sides"]:
        print(table(data))
        line = headline(data)
        if line:
            print(f"\nRunlet: {line}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print(f"\nwritten to {args.json}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
