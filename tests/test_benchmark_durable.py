"""Benchmark W5 (benchmarks/durable.py) runs on both backends and does the round trips it
claims to time, on SQLite and on PostgreSQL. Smoke counts; nothing here is timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` lives beside `tests`, outside the package
    sys.path.insert(0, str(ROOT))

from benchmarks import durable, run  # noqa: E402
from benchmarks.workloads import SMOKE  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_w5_round_trips_complete_on_both_databases(
    postgres_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNLET_BENCH_POSTGRES", postgres_server)
    outcome = await durable.bench_w5(SMOKE)
    for db in ("sqlite", "postgres"):
        assert "completed" == outcome.checks[f"{db}_runlet_status"]
        assert outcome.checks[f"{db}_runlet_output"] == outcome.checks[f"{db}_floor_output"]
    keys = {figure.key for figure in outcome.figures}
    assert {
        f"w5_{db}_{name}"
        for db in ("sqlite", "postgres")
        for name in ("us_per_round_trip", *(f"resumes_per_s_{n}" for n in durable.CONCURRENCY))
    } == keys
    assert all(figure.runlet and figure.floor for figure in outcome.figures)
    assert durable.bench_w5 is run.WORKLOADS["w5"]
