"""The peer comparison's driver runs, skips frameworks that are not installed with a
message, and checks that every side it did run did the same work.

Smoke counts only; nothing here looks at how long anything took. The frameworks are
optional (``pip install -e ".[peers]"``); without them only Runlet's side runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` lives beside `tests`, outside the package
    sys.path.insert(0, str(ROOT))

from benchmarks.peers import common, run  # noqa: E402

#: side -> the module whose absence makes the driver skip it
FRAMEWORK_MODULES = {
    "pydantic_ai": "pydantic_ai",
    "openai_agents": "agents",
    "langgraph": "langgraph",
}


def installed(side: str) -> bool:
    return importlib.util.find_spec(FRAMEWORK_MODULES[side]) is not None


def test_driver_runs_runlet_and_skips_missing_peers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "peers.json"

    assert 0 == run.main(["--smoke", "--json", str(out)])

    data = json.loads(out.read_text())
    assert data["smoke"] is True
    assert set(run.SIDES) == set(data["sides"]) | set(data["skipped"])
    assert set() == set(data["sides"]) & set(data["skipped"])
    runlet = data["sides"]["runlet"]
    assert "Runlet" == runlet["framework"]
    assert set(run.FIGURES) <= set(runlet["figures"])
    for side in FRAMEWORK_MODULES:
        if installed(side):
            assert side in data["sides"], side
        else:
            assert "is not installed" in data["skipped"][side]
    for side, document in data["sides"].items():
        checks = document["checks"]
        assert common.W1_RESULTS == checks["w1"]["tool_results"], side
        assert common.W2_RESULTS == checks["w2"]["tool_results"], side
        assert common.W3_RESULTS == checks["w3"]["tool_results"], side
        assert common.FINAL == checks["w3"]["output"], side
        assert json.loads(checks["w3"]["checkpoint_json"]), side
        assert common.SMOKE.w4_runs == checks["w4"]["runs"], side
    captured = capsys.readouterr()
    assert "| W1 tool loop: CPU time per model turn" in captured.out
    for side in data["skipped"]:
        assert f"skipping {side}:" in captured.err


def test_a_side_whose_framework_is_missing_exits_with_the_skip_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # main() turns the network off and sets the offline environment for good, which is
    # right in a side's own process; here, undo both after the test.
    monkeypatch.setattr(common, "forbid_network", lambda: None)
    for key, value in common.OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)

    def build() -> common.Workloads:
        raise ModuleNotFoundError("No module named 'nosuchframework'", name="nosuchframework")

    assert common.MISSING == common.main(build, ["--smoke"])

    assert "nosuchframework is not installed" in capsys.readouterr().err


def test_a_side_that_does_other_work_is_caught() -> None:
    with pytest.raises(common.WrongWork, match="W1 tool results"):
        common.check("W1 tool results", ["1"], common.W1_RESULTS)


def test_table_and_headline_compare_with_runlet() -> None:
    def side(name: str, per_turn: float, trips: float) -> dict[str, object]:
        return {
            "framework": name,
            "counts": {"w4_runs": 2000},
            "figures": {"w1_us_per_turn": [per_turn], "w3_round_trips_per_s": [trips]},
        }

    data = {
        "date": "2026-11-30",
        "sides": {
            "runlet": side("Runlet", 10.0, 10_000.0),
            "langgraph": side("LangGraph", 1_000.0, 200.0),
            "pydantic_ai": side("Pydantic AI", 2_000.0, 100.0),
        },
    }

    text = run.table(data)

    assert "| 1,000 (100x)" in text  # LangGraph per turn: 100 times Runlet's time
    assert "| 200 (50x)" in text  # LangGraph round trips: a fiftieth of Runlet's
    assert "100x less time per model turn than the fastest peer (LangGraph), " + (
        "measured 2026-11-30"
    ) == run.headline(data)


def test_the_docs_show_what_the_committed_results_say() -> None:
    # The table, the chart and the README's headline come from benchmarks/results/peers.json
    # (benchmarks/chart.py); none of them is edited by hand.
    data = json.loads((ROOT / "benchmarks" / "results" / "peers.json").read_text())
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    chart = (ROOT / "docs" / "_static" / "peers.svg").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")

    assert data["smoke"] is False
    assert {"runlet", "pydantic_ai", "openai_agents", "langgraph"} == set(data["sides"])
    assert run.table(data) in page
    assert "_static/peers.svg" in page
    for document in data["sides"].values():
        assert document["framework"] in chart
    line = run.headline(data)
    assert line is not None
    ratio = line.split("x less", 1)[0]
    assert f"about {ratio}\N{MULTIPLICATION SIGN} less" in readme
    assert f"measured {data['date']}" in readme
