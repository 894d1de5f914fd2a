"""The benchmarks run, on both backends, and do the work they claim to measure.

Smoke counts only; nothing here looks at how long anything took.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` lives beside `tests`, outside the package
    sys.path.insert(0, str(ROOT))

from benchmarks import run, workloads  # noqa: E402
from benchmarks.workloads import SMOKE, Outcome  # noqa: E402

pytestmark = pytest.mark.anyio

W1_RESULTS = [str(turn + 1) for turn in range(10)]  # add(a=turn, b=1)


def figures(outcome: Outcome) -> dict[str, workloads.Figure]:
    found = {figure.key: figure for figure in outcome.figures}
    for figure in found.values():
        assert figure.runlet, figure.key
        assert figure.floor, figure.key
        assert all(value > 0 for value in [*figure.runlet, *figure.floor]), figure.key
    return found


async def test_w1_tool_loop() -> None:
    outcome = await workloads.bench_w1(SMOKE)

    checks = outcome.checks
    assert "completed" == checks["runlet_status"]
    assert workloads.FINAL == checks["runlet_output"] == checks["floor_output"]
    assert 11 == checks["runlet_model_turns"] == checks["floor_model_turns"]
    assert W1_RESULTS == checks["runlet_tool_results"] == checks["floor_tool_results"]
    assert {"w1_us_per_turn", "w1_runs_per_s"} == set(figures(outcome))


async def test_w2_parallel_tools() -> None:
    outcome = await workloads.bench_w2(SMOKE)

    checks = outcome.checks
    assert workloads.FINAL == checks["runlet_output"] == checks["floor_output"]
    assert [str(k + 1) for k in range(8)] == checks["runlet_tool_results"]
    found = figures(outcome)
    assert 10.0 == found["w2_ms_per_run_vs_ideal"].ideal
    assert {"w2_ms_per_run_vs_ideal", "w2_ms_per_run"} == set(found)
    # That the calls overlap is tested without a clock in test_loop.py
    # (test_calls_in_one_message_overlap_in_time); tests never assert on time.


async def test_w3_human_round_trip() -> None:
    outcome = await workloads.bench_w3(SMOKE)

    checks = outcome.checks
    assert "completed" == checks["runlet_status"]
    assert workloads.FINAL == checks["runlet_output"] == checks["floor_output"]
    assert ["1"] == checks["runlet_tool_results"]  # the approved add(a=0, b=1) ran
    assert 0 == checks["runlet_store_size"] == checks["floor_store_size"]
    # The floor keeps the same exactly-once records: one decision and one outcome a trip.
    records, outcomes = checks["floor_journal"]
    assert records == outcomes > 0
    data = json.loads(checks["runlet_checkpoint_json"])
    assert 2 == data["version"]
    assert "approve_add" == data["pending_tool_calls"][0]["name"]
    assert json.loads(checks["floor_checkpoint_json"])["pending"]["name"] == "approve_add"
    # The lean floor does the same work without the journal: its checkpoint holds only
    # the messages and the pending call, and nothing is left in its store.
    assert workloads.FINAL == checks["lean_output"]
    assert {"id", "messages", "pending"} == set(json.loads(checks["lean_checkpoint_json"]))
    assert 0 == checks["lean_store_size"]
    size = figures(outcome)["w3_checkpoint_json_bytes"].runlet
    assert [float(len(checks["runlet_checkpoint_json"].encode()))] == size


async def test_w4_scale() -> None:
    outcome = await workloads.bench_w4(SMOKE)

    checks = outcome.checks
    assert [workloads.FINAL] * SMOKE.w4_runs == checks["runlet_outputs"]
    assert [workloads.FINAL] * SMOKE.w4_runs == checks["floor_outputs"]
    assert SMOKE.checkpoints == checks["runlet_checkpoints"] == checks["floor_checkpoints"]
    data = json.loads(checks["runlet_checkpoint_json"])
    assert 4 == data["turns"]
    assert "approve_add" == data["request"]["tool_call"]["name"]
    assert {"w4_wall_ms", "w4_bytes_per_run", "w4_bytes_per_checkpoint"} == set(figures(outcome))


def test_command_line_smoke(  # a plain test: the command line starts its own loops
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"

    assert 0 == run.main(
        ["--smoke", "--backend", "asyncio", "--backend", "trio", "--json", str(out)]
    )

    table = capsys.readouterr().out
    assert "| asyncio |" in table
    assert "| trio    |" in table
    data = json.loads(out.read_text())
    assert {"asyncio", "trio"} == set(data["results"])
    for figures_ in data["results"].values():
        assert {"runlet", "floor", "ratio", "target", "pass"} <= set(figures_["w1_us_per_turn"])
    assert data["machine"]["python"]
