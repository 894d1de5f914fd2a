"""The demo with a SQLite file: a run interrupted in one process, answered in another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runlet.demo import main


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_interrupted_here_answered_there(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "demo.db")
    assert 0 == main(["--store", path, "--no-answer", "--backend", backend])
    shown = capsys.readouterr().out
    assert "[interrupted: choice]" in shown
    assert "--answer-pending" in shown
    assert "agent:" not in shown

    assert 0 == main(["--store", path, "--answer-pending", "--backend", backend])
    shown = capsys.readouterr().out
    assert "[interrupted: approval]" in shown
    assert "agent: Done: order 123 refunded as card." in shown

    assert 0 == main(["--store", path, "--answer-pending", "--backend", backend])
    assert "No run is waiting" in capsys.readouterr().out


def test_store_in_one_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert 0 == main(["--store", str(tmp_path / "demo.db"), "--yes"])
    assert "agent: Done: order 123 refunded as card." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--no-answer"], "need --store FILE"),
        (["--answer-pending"], "need --store FILE"),
        (["--store", "x.db", "--no-answer", "--answer-pending"], "in another"),
    ],
)
def test_store_options_are_checked(
    argv: list[str],
    problem: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # should the check fail, x.db is made here
    with pytest.raises(SystemExit):
        main(argv)
    assert problem in capsys.readouterr().err
    assert [] == list(tmp_path.iterdir())


def test_two_real_processes(tmp_path: Path) -> None:
    """The README's two commands."""
    command = [sys.executable, "-m", "runlet.demo", "--store", str(tmp_path / "demo.db")]
    first = subprocess.run([*command, "--no-answer"], capture_output=True, text=True, check=True)
    assert "[interrupted: choice]" in first.stdout
    second = subprocess.run(
        [*command, "--answer-pending"], capture_output=True, text=True, check=True
    )
    assert "agent: Done: order 123 refunded as card." in second.stdout
