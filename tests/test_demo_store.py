"""The demo with a SQLite file: a run interrupted in one process, answered in another."""

from __future__ import annotations

import shlex
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from runlet import demo
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
    """The README's two commands; the second as the first says to give it."""
    command = [sys.executable, "-m", "runlet.demo", "--store", str(tmp_path / "demo.db")]
    run = partial(subprocess.run, capture_output=True, text=True, check=True, cwd=tmp_path)
    first = run([*command, "--no-answer"])
    assert "[interrupted: choice]" in first.stdout
    told = first.stdout.split("Answer it from another process: ")[1].splitlines()[0]
    assert shlex.split(told)[:2] == [sys.executable, "-m"]  # the interpreter that has Runlet
    second = run(shlex.split(told))
    assert "agent: Done: order 123 refunded as card." in second.stdout
    third = run(shlex.split(told))
    told = third.stdout.split("Start one: ")[1].splitlines()[0]
    assert shlex.split(told) == [*command, "--no-answer"]


@pytest.mark.parametrize(
    ("directory", "shown"),
    [("project", ".venv/bin/python"), ("elsewhere", "{executable}"), ("bin", "{executable}")],
)
def test_the_demo_names_the_interpreter_that_runs_it(
    directory: str, shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From the project's directory, as the README runs it: the venv's python, short.
    executable = tmp_path / "project" / ".venv" / "bin" / "python"
    executable.parent.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setattr(sys, "executable", str(executable))
    monkeypatch.chdir(tmp_path / directory if directory != "bin" else executable.parent)
    assert shown.format(executable=executable) == demo._python()
