"""Real processes against real databases: the durable stores' exactly-once promises.

Every test runs for SQLite (a file) and PostgreSQL (the throwaway server of
tests/_postgres.py), with workers on asyncio and on trio. The workers are
tests/_worker.py; the ``pay`` tool logs each real run to an effects file, which the tests
count. The tests never sleep: they read the workers' stdout; only a worker waiting for a
killed worker's lease to run out polls, within a bound.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from _postgres import fresh_schema

# Starting Python processes on a busy machine is slow; none of these waits on a clock.
pytestmark = pytest.mark.timeout(180)

WORKER = str(Path(__file__).with_name("_worker.py"))
SHORT_LEASE = "0.6"


@pytest.fixture(params=["sqlite", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store, as the worker's --store argument."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'store.db'}"
    conninfo = request.getfixturevalue("postgres_server")
    return f"postgres:{fresh_schema(conninfo)}"


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


class Workers:
    """Start workers; read their reports; never leave one running."""

    def __init__(self, spec: str, backend: str, effects: Path) -> None:
        self.base = [
            sys.executable,
            WORKER,
            "--store",
            spec,
            "--backend",
            backend,
            "--effects",
            str(effects),
        ]
        self.started: list[subprocess.Popen[str]] = []

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*self.base, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    def run(self, *args: str) -> dict[str, Any]:
        """Run one worker to the end; return its last report."""
        return self.finish(self.spawn(*args))

    @staticmethod
    def report(process: subprocess.Popen[str]) -> dict[str, Any]:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else "no output"
        found: dict[str, Any] = json.loads(line)
        return found

    @staticmethod
    def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
        out, err = process.communicate(timeout=120)
        assert 0 == process.returncode, err
        found: dict[str, Any] = json.loads(out.splitlines()[-1])
        return found

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.communicate()


@pytest.fixture
def workers(store_spec: str, anyio_backend: str, effects: Path) -> Iterator[Workers]:
    started = Workers(store_spec, anyio_backend, effects)
    try:
        yield started
    finally:
        started.close()


def ran(effects: Path) -> list[str]:
    """The idempotency keys of every real run of the tool, in order."""
    if not effects.exists():
        return []
    return [line.split()[0] for line in effects.read_text().splitlines()]


def setup(workers: Workers, count: int, *options: str) -> list[str]:
    ids: list[str] = workers.run(*options, "setup", "--count", str(count))["checkpoint_ids"]
    assert count == len(set(ids))
    return ids


def schema_versions(spec: str) -> list[int]:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        with sqlite3.connect(where) as conn:
            rows = conn.execute("SELECT version FROM runlet_schema").fetchall()
        conn.close()
        return [row[0] for row in rows]
    import psycopg

    with psycopg.connect(where) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM runlet_schema")]


def test_eight_processes_create_the_tables_at_once(workers: Workers, store_spec: str) -> None:
    started = [workers.spawn("open") for _ in range(8)]
    assert [{"event": "open"}] * 8 == [workers.finish(process) for process in started]
    assert [1] == schema_versions(store_spec)


def test_eight_processes_resume_one_checkpoint(workers: Workers, effects: Path) -> None:
    (checkpoint_id,) = setup(workers, 1)
    started = [
        workers.spawn("resume", "--checkpoint", checkpoint_id, "--barrier") for _ in range(8)
    ]
    assert [{"event": "ready"}] * 8 == [workers.report(process) for process in started]
    for process in started:  # all eight go at once
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    reports = [workers.finish(process) for process in started]

    done = [report for report in reports if report["event"] == "done"]
    refused = [report for report in reports if report["event"] == "refused"]
    assert 8 == len(done) + len(refused)
    assert done  # one of them ran it; others may have got the stored result
    assert {("completed", "done: paid 0")} == {(r["status"], r["output"]) for r in done}
    assert {"CheckpointClaimedError"} >= {report["error"] for report in refused}
    assert 1 == len(ran(effects))  # the tool ran exactly once


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_killed_inside_the_handler(workers: Workers, effects: Path, idempotent: bool) -> None:
    flags = ("--idempotent",) if idempotent else ()
    (checkpoint_id,) = setup(workers, 1, *flags)
    first = workers.spawn(
        "--lease", SHORT_LEASE, *flags, "--hang-in-tool", "resume", "--checkpoint", checkpoint_id
    )
    assert {"event": "started"} == workers.report(first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert 1 == len(ran(effects))

    # The lease runs out; another process takes the checkpoint over.
    second = workers.run(
        "--lease", SHORT_LEASE, *flags, "resume", "--checkpoint", checkpoint_id, "--wait-lease"
    )
    keys = ran(effects)
    if idempotent:  # run again, with the same idempotency key
        assert ("done", "completed", "done: paid 0") == (
            second["event"],
            second["status"],
            second["output"],
        )
        assert 2 == len(keys)
        assert keys[0] == keys[1]
    else:  # the outcome is unknown: a person decides, nothing runs by itself
        assert ("done", "interrupted", True) == (
            second["event"],
            second["status"],
            second["outcome_unknown"],
        )
        assert 1 == len(keys)


def test_killed_after_the_result_was_recorded(workers: Workers, effects: Path) -> None:
    (checkpoint_id,) = setup(workers, 1)
    first = workers.spawn(
        "--lease", SHORT_LEASE, "--hang-after-result", "resume", "--checkpoint", checkpoint_id
    )
    assert {"event": "recorded"} == workers.report(first)
    first.send_signal(signal.SIGKILL)
    first.wait()

    second = workers.run(
        "--lease", SHORT_LEASE, "resume", "--checkpoint", checkpoint_id, "--wait-lease"
    )
    assert ("done", "completed", "done: paid 0") == (
        second["event"],
        second["status"],
        second["output"],
    )
    assert 1 == len(ran(effects))  # the recorded result was used: no second run


async def _listed(spec: str) -> dict[str, list[int]]:
    """Page through list_pending, with and without metadata filters."""
    kind, _, where = spec.partition(":")
    store: Any
    if kind == "sqlite":
        from runlet.stores.sqlite import SQLiteCheckpointStore

        store = SQLiteCheckpointStore(where)
    else:
        from runlet.stores.postgres import PostgresCheckpointStore

        store = PostgresCheckpointStore(where)
    listed: dict[str, list[int]] = {}
    async with store:
        for name, metadata in (
            ("all", None),
            ("g1", {"group": "g1"}),
            ("g2-even", {"group": "g2", "even": True}),
            ("odd", {"even": False}),
            ("none", {"group": "g1", "even": True}),
        ):
            numbers: list[int] = []
            after = None
            while page := await store.list_pending(limit=64, after=after, metadata=metadata):
                numbers.extend(found.metadata["n"] for found in page)
                after = page[-1].checkpoint_id
            listed[name] = numbers
    return listed


@pytest.mark.timeout(300)
def test_a_thousand_runs_listed_and_resumed_by_four_processes(
    workers: Workers, store_spec: str, effects: Path, anyio_backend: str
) -> None:
    count = 1000
    setup(workers, count)
    listed = anyio.run(_listed, store_spec, backend=anyio_backend)
    numbers = list(range(count))
    assert numbers == listed["all"]  # oldest first, every one, once
    assert [n for n in numbers if n % 4 == 1] == listed["g1"]
    assert [n for n in numbers if n % 4 == 2] == listed["g2-even"]
    assert [n for n in numbers if n % 2 == 1] == listed["odd"]
    assert [] == listed["none"]

    drains = [workers.spawn("drain") for _ in range(4)]
    reports = [workers.finish(process) for process in drains]
    assert all(report["event"] == "drained" for report in reports)

    keys = ran(effects)
    assert count == len(keys) == len(set(keys))  # each exactly once, none lost
    run_ids = {key.split("/")[0] for key in keys}
    assert count == len(run_ids)
    assert [] == anyio.run(_listed, store_spec, backend=anyio_backend)["all"]
