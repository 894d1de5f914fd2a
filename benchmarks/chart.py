"""Draw the peer comparison chart from the JSON ``benchmarks/peers/run.py`` writes.

Usage::

    python benchmarks/chart.py                                   # the committed results
    python benchmarks/chart.py benchmarks/results/peers.json --out docs/_static/peers.svg
    python benchmarks/chart.py --table                           # also print the table

Three panels, each on a log scale because the frameworks differ by orders of magnitude:
CPU time per model turn (W1), human round trips per CPU second (W3) and the CPU time of
the concurrent runs (W4). CPU time is the framework process's own, so other work on a
shared machine does not inflate it; the wall-clock figures are in the JSON and the table.
Each bar is the median; the thin line across it spans the minimum and maximum of the
repetitions. Needs matplotlib (in the ``peers`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers.run import headline, table

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_JSON = ROOT / "benchmarks" / "results" / "peers.json"
DEFAULT_OUT = ROOT / "docs" / "_static" / "peers.svg"

#: (figure key, panel title, axis label, higher is better)
PANELS = [
    ("w1_us_per_turn", "W1: CPU time per model turn", "µs per turn (log scale)", False),
    (
        "w3_round_trips_per_s",
        "W3: human round trips per CPU second",
        "round trips per second (log scale)",
        True,
    ),
    ("w4_ms", "W4: CPU time for {w4_runs:,} concurrent runs", "ms (log scale)", False),
]
RUNLET = "#2a7ab0"
PEER = "#9a9a9a"


def draw(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The same JSON gives the same file: no timestamp, fixed ids.
    plt.rcParams["svg.hashsalt"] = "runlet-peers"
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, and it scales
    sides = data["sides"]
    names = list(sides)
    counts = next(iter(sides.values()))["counts"]
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(7.5, 2.0 + 1.9 * len(PANELS)))
    for ax, (key, title, xlabel, higher) in zip(axes, PANELS, strict=True):
        shown = [n for n in names if key in sides[n]["figures"]]
        samples = [sides[n]["figures"][key] for n in shown]
        medians = [statistics.median(s) for s in samples]
        ys = list(range(len(shown)))[::-1]
        colours = [RUNLET if n == "runlet" else PEER for n in shown]
        ax.barh(ys, medians, color=colours, height=0.6)
        for y, s in zip(ys, samples, strict=True):
            ax.plot([min(s), max(s)], [y, y], color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yticks(ys, [sides[n]["framework"] for n in shown])
        ax.set_title(
            title.format(**counts) + ("  (higher is better)" if higher else "  (lower is better)"),
            loc="left",
            fontsize=10,
        )
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_xlim(min(medians) / 3, max(max(s) for s in samples) * 8)
        for y, m, s_ in zip(ys, medians, samples, strict=True):
            ax.annotate(
                f"{m:,.0f}" if m >= 100 else f"{m:.3g}",
                (max(m, *s_), y),  # right of the min-max line
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        ax.spines[["top", "right"]].set_visible(False)
    machine = data["machine"]
    fig.suptitle(
        f"Runlet and its peers, scripted instant models, measured {data['date']}\n"
        f"{machine['cpu']}, {machine['nproc']} CPUs, "
        f"{machine['implementation']} {machine['python']}, asyncio",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None, "Creator": None})
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="SVG or PNG to write")
    parser.add_argument("--table", action="store_true", help="also print the Markdown table")
    args = parser.parse_args(argv)
    data = json.loads(args.json.read_text())
    if not data["sides"]:
        print(f"{args.json} holds no measurements; run benchmarks/peers/run.py", file=sys.stderr)
        return 1
    draw(data, args.out)
    print(f"chart written to {args.out}", file=sys.stderr)
    if args.table:
        print(table(data))
        line = headline(data)
        if line:
            print(f"\nRunlet: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
