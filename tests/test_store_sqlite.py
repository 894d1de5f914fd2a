"""SQLiteCheckpointStore: the conformance suite, plus what is specific to SQLite."""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
import pytest
from _store_semantics import (
    checkpoint,
    execute,
    record,
    resolution,
    semantics_tests,
    sql_store_tests,
)
from conftest import BACKENDS

import runlet
from runlet import (
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    ConfigurationError,
    InMemoryCheckpointStore,
    StoreSchemaError,
)
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call, store_conformance_tests

_tmp: list[Path] = []


@pytest.fixture(autouse=True)
def _tmp_dir(tmp_path: Path) -> None:
    _tmp[:] = [tmp_path]


@asynccontextmanager
async def sqlite_store(lease: float | None) -> AsyncIterator[SQLiteCheckpointStore]:
    """A fresh store in a new file of its own."""
    with tempfile.TemporaryDirectory(prefix="runlet-sqlite-") as root:
        async with SQLiteCheckpointStore(Path(root) / "store.db", lease=lease) as store:
            yield store


@asynccontextmanager
async def memory_store(lease: float | None) -> AsyncIterator[InMemoryCheckpointStore]:
    yield InMemoryCheckpointStore(lease=lease)


def same_file(store: Any) -> SQLiteCheckpointStore:
    """Another store on *store*'s file, as another process opens it."""
    return SQLiteCheckpointStore(store.path, lease=store.lease)


async def age_leases(store: Any, seconds: float) -> None:
    """Move every live lease *seconds* nearer its end."""
    await execute(
        store,
        f"UPDATE runlet_checkpoints SET lease_until = lease_until - {float(seconds)!r} "
        "WHERE status = 'claimed'",
    )


TestConformance = store_conformance_tests(
    sqlite_store, backends=BACKENDS, second_handle=same_file, age_leases=age_leases
)


class TestSemantics(semantics_tests(sqlite_store)):  # type: ignore[misc]
    pass


class TestReferenceSemantics(semantics_tests(memory_store)):  # type: ignore[misc]
    """The same edge cases on the in-memory reference store."""


class TestSQLStore(
    sql_store_tests(  # type: ignore[misc]
        sqlite_store, rewind="UPDATE runlet_checkpoints SET {column} = {column} - 7200"
    )
):
    pass


pytestmark = pytest.mark.anyio


def db_path() -> Path:
    return _tmp[0] / "store.db"


async def test_names_and_ids_with_a_nul_character_are_stored_and_found() -> None:
    # SQLite text holds U+0000 (PostgreSQL's does not, and refuses such a checkpoint).
    async with sqlite_store(60.0) as store:
        saved = checkpoint("cp\x001", run_id="run\x001", agent_name="agent\x00a")
        await store.save(saved)
        claim = await store.claim("cp\x001")
        await store.release("cp\x001", claim.token)
        (pending,) = await store.list_pending(agent_name="agent\x00a")
        assert (pending.checkpoint_id, pending.run_id) == ("cp\x001", "run\x001")
        assert saved == await store.load("cp\x001")


async def test_data_survives_closing_and_reopening() -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        await store.save(checkpoint())
        claim = await store.claim("cp_1")
    async with SQLiteCheckpointStore(db_path()) as store:
        with pytest.raises(CheckpointClaimedError):
            await store.claim("cp_1")
        await store.release("cp_1", claim.token)
        assert "pending" == (await store.get("cp_1")).status


async def test_a_file_of_an_unknown_schema_version_is_refused() -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        await store.save(checkpoint())
    raw = sqlite3.connect(db_path(), isolation_level=None)
    raw.execute("UPDATE runlet_schema SET version = 99")
    raw.close()
    refusing = SQLiteCheckpointStore(db_path())
    with pytest.raises(StoreSchemaError, match="schema version 99") as caught:
        async with refusing:
            pass  # pragma: no cover
    assert (99, 1) == (caught.value.found, caught.value.expected)
    assert [] == refusing._idle  # its connection was closed
    raw = sqlite3.connect(db_path(), isolation_level=None)
    assert [(99,)] == raw.execute("SELECT version FROM runlet_schema").fetchall()
    raw.close()


@pytest.mark.parametrize("text", ['{"id": "cp_1", "vers', "", "not json"])
async def test_a_row_that_is_not_json_is_a_serialization_error(text: str) -> None:
    # A row cut short (a disk full, a hand edit): the error a web handler maps to 500,
    # not a JSONDecodeError, on every read.
    async with SQLiteCheckpointStore(db_path()) as store:
        await store.save(checkpoint())
        raw = sqlite3.connect(db_path(), isolation_level=None)
        raw.execute("UPDATE runlet_checkpoints SET data = ?", (text,))
        raw.close()
        for read in (store.load("cp_1"), store.get("cp_1"), store.list_pending()):
            with pytest.raises(CheckpointSerializationError, match="stored checkpoint is not JSON"):
                await read


async def test_a_new_file_gets_wal_and_the_tables() -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        assert str(db_path()) == store.path
        assert "SQLiteCheckpointStore(" in repr(store)
        with store._connection(write=False, atomic=False) as conn:
            assert (2,) == conn.execute("PRAGMA synchronous").fetchone()  # FULL: durable
    raw = sqlite3.connect(db_path(), isolation_level=None)
    assert [("wal",)] == raw.execute("PRAGMA journal_mode").fetchall()
    tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    raw.close()
    assert {"runlet_schema", "runlet_checkpoints", "runlet_records"} <= tables


@pytest.mark.parametrize("path", [":memory:", ""], ids=["memory", "temporary"])
async def test_calls_on_a_private_database_take_turns_on_its_one_connection(path: str) -> None:
    # Every connection to such a path opens a database of its own, so a second call must
    # wait for the connection the first one holds rather than open another.
    async with SQLiteCheckpointStore(path) as store:
        await store.save(checkpoint())
        taken, go = threading.Event(), threading.Event()
        take = store._take

        def held() -> sqlite3.Connection:
            conn = take()
            taken.set()
            go.wait()
            return conn

        store._take = held  # type: ignore[method-assign]
        statuses: list[str] = []

        async def get() -> None:
            statuses.append((await store.get("cp_1")).status)

        async with anyio.create_task_group() as group:
            group.start_soon(get)
            await anyio.to_thread.run_sync(taken.wait)  # the first call holds the connection
            group.start_soon(get)
            try:
                await anyio.wait_all_tasks_blocked()
                limiter = store._limiters[anyio.lowlevel.current_token()]
                waiting = limiter.statistics().tasks_waiting
            finally:
                go.set()
        assert (1, ["pending"] * 2) == (waiting, statuses)


async def test_in_memory() -> None:
    async with SQLiteCheckpointStore(":memory:", lease=None) as store:
        assert store.lease is None
        await store.save(checkpoint())
        claim = await store.claim("cp_1")
        await store.renew("cp_1", claim.token)
        with pytest.raises(CheckpointClaimedError):  # no lease: held until released
            await store.cancel("cp_1")
        assert ["cp_1"] == [found.checkpoint_id for found in await store.list_pending()]


@pytest.mark.parametrize(
    "arguments",
    [{"lease": -1}, {"lease": "60"}, {"busy_timeout": -1}, {"connections": 0}],
)
def test_arguments_are_checked(arguments: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteCheckpointStore("x.db", **arguments)


def announce_taking(store: SQLiteCheckpointStore) -> threading.Event:
    """An event set when one of the store's threads has taken a connection."""
    started = threading.Event()
    take = store._take

    def spy() -> sqlite3.Connection:
        conn = take()
        started.set()
        return conn

    store._take = spy  # type: ignore[method-assign]
    return started


@contextmanager
def write_locked() -> Iterator[sqlite3.Connection]:
    """A connection holding the database's write lock, which the store's writes wait
    for until it commits."""
    blocker = sqlite3.connect(db_path(), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        yield blocker
    finally:
        blocker.close()


async def test_a_cancelled_claim_leaves_the_checkpoint_claimable() -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        await store.save(checkpoint())
        started = announce_taking(store)
        with write_locked() as blocker, anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(store.claim, "cp_1")
                await anyio.to_thread.run_sync(started.wait)
                scope.cancel()  # takes effect once the thread has claimed
                blocker.execute("COMMIT")
        assert scope.cancelled_caught
        assert "pending" == (await store.get("cp_1")).status
        await store.claim("cp_1")


async def test_a_cancelled_claim_that_cannot_be_given_back_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        await store.save(checkpoint())
        started = announce_taking(store)

        async def release_fails(checkpoint_id: str, token: str) -> None:
            raise OSError("disk I/O error")

        store.release = release_fails  # type: ignore[method-assign]
        with (
            caplog.at_level("WARNING", logger="runlet"),
            write_locked() as blocker,
            anyio.CancelScope() as scope,
        ):
            async with anyio.create_task_group() as group:
                group.start_soon(store.claim, "cp_1")
                await anyio.to_thread.run_sync(started.wait)
                scope.cancel()  # takes effect once the thread has claimed
                blocker.execute("COMMIT")
        assert scope.cancelled_caught  # the cancellation, not the release's error
        assert "claimed" == (await store.get("cp_1")).status  # until the lease runs out
        [warning] = [r for r in caplog.records if r.name == "runlet"]
        assert "'cp_1'" in warning.getMessage()
        assert "OSError: disk I/O error" in warning.getMessage()


async def test_a_resume_cancelled_while_it_writes_its_decisions_starts_no_handler() -> None:
    """The decisions are written in a worker thread, which finishes the write after the
    cancellation came; the approved handler must not start for the caller who left."""
    started: list[str] = []

    async def pay(arguments: Any, context: runlet.ToolContext) -> str:
        started.append(context.idempotency_key)  # a side effect before the first await
        await anyio.lowlevel.checkpoint()
        return "paid"

    tool = runlet.ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
    model = ScriptedModel([call("pay", id="c1"), "Done.", "Done."])
    agent = runlet.Agent("payer", "Pay when approved.", model, (tool,))
    async with SQLiteCheckpointStore(db_path()) as store:
        rt = runlet.Runtime(checkpoint_store=store)
        first = await rt.run(agent, "Pay.")
        assert first.interruption is not None
        assert first.checkpoint_id is not None
        response = runlet.HumanResponse(first.interruption.id, "approve")
        record = store.record
        taking: list[threading.Event] = []

        async def spy(checkpoint_id: str, token: str, records: Any) -> None:
            if all(r.result is None for r in records):  # the decisions: made to wait
                blocker.execute("BEGIN IMMEDIATE")
                taking.append(announce_taking(store))
            await record(checkpoint_id, token, records)

        store.record = spy  # type: ignore[method-assign]
        blocker = sqlite3.connect(db_path(), isolation_level=None)
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(
                        partial(
                            rt.resume, agent, checkpoint_id=first.checkpoint_id, response=response
                        )
                    )
                    while not taking:
                        await anyio.lowlevel.checkpoint()
                    await anyio.to_thread.run_sync(taking[0].wait)
                    scope.cancel()  # lands while the thread waits for the write lock
                    blocker.execute("COMMIT")
        finally:
            blocker.close()
        assert scope.cancelled_caught
        assert [] == started
        store.record = record  # type: ignore[method-assign]
        # The decision was stored, so the retry cannot tell this from a handler cut off
        # inside: it asks again, on the safe side, and only then the call runs.
        again = await rt.resume(agent, checkpoint_id=first.checkpoint_id, response=response)
        assert again.interruption is not None
        assert again.interruption.outcome_unknown
        assert [] == started


async def test_a_claim_cancelled_natively_twice_still_gives_the_checkpoint_back(
    anyio_backend: str,
) -> None:
    """The backend's own cancellation (on asyncio ``Task.cancel()``, which goes through
    anyio's shields) lands while the claim's thread runs, and again as the store starts
    to give the claim back: the release still runs to its end."""
    from test_exactly_once import _NativeCancel

    async with SQLiteCheckpointStore(db_path()) as store:
        await store.save(checkpoint())
        started = announce_taking(store)
        native = _NativeCancel(anyio_backend)
        release = store.release
        released: list[str] = []

        async def release_cancelled_again(checkpoint_id: str, token: str) -> None:
            native.cancel()  # a second cancellation, before the release's thread starts
            await release(checkpoint_id, token)
            released.append(checkpoint_id)

        store.release = release_cancelled_again  # type: ignore[method-assign]
        with write_locked() as blocker:
            async with anyio.create_task_group() as group:
                group.start_soon(native.run, partial(store.claim, "cp_1"))
                await anyio.to_thread.run_sync(started.wait)
                native.cancel()  # takes effect once the thread has claimed
                blocker.execute("COMMIT")
        assert native.cancelled
        assert ["cp_1"] == released
        assert "pending" == (await store.get("cp_1")).status
        await store.claim("cp_1")


async def test_the_stores_page_example_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from test_docs import run_page

    monkeypatch.chdir(tmp_path)
    namespace = await run_page("stores.md")
    assert 1 == len(namespace["paid"])
    assert "Invoice A-1 is paid." == namespace["again"].output
    assert (tmp_path / "checkpoints.db").exists()


async def test_a_purge_goes_in_batches_that_let_other_writers_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A backlog is purged a batch per transaction, oldest first, with a pause between
    # batches in which another writer's save gets the lock; all of it is purged in the
    # end, records included.
    import runlet.stores._sql as sql_module

    old = [f"cp_{n}" for n in range(5)]
    left: list[list[str]] = []  # the old checkpoints left at each pause

    async def pause() -> None:
        rows = await execute(store, "SELECT id FROM runlet_checkpoints ORDER BY id")
        left.append([found for (found,) in rows if found in old])
        if len(left) == 1:  # another process's writes, while the purge pauses
            await store.save(checkpoint("cp_new"))
            await store.cancel("cp_new")

    monkeypatch.setattr(sql_module, "_between_batches", pause)
    async with SQLiteCheckpointStore(":memory:") as store:
        store._sql = attrs.evolve(store._sql, purge_batch=2)
        for n, checkpoint_id in enumerate(old):
            cp = checkpoint(checkpoint_id, calls=1)
            await store.save(cp)
            claim = await store.claim(checkpoint_id)
            await store.record(checkpoint_id, claim.token, [record(cp)])
            await store.resolve(checkpoint_id, claim.token, resolution(cp))
            # Finished a minute or more ago, cp_0 first: the clock's resolution (SQLite
            # keeps milliseconds) decides nothing.
            await execute(
                store,
                f"UPDATE runlet_checkpoints SET finished_at = finished_at - {70 - n} "
                f"WHERE id = '{checkpoint_id}'",
            )
        await store.save(checkpoint("cp_open"))
        assert 5 == await store.purge_resolved(older_than=30)
        # 2 + 2 + 1, oldest first, and a pause after each full batch.
        assert [["cp_2", "cp_3", "cp_4"], ["cp_4"]] == left
        assert [] == await execute(store, "SELECT checkpoint_id FROM runlet_records")
        for checkpoint_id in old:
            with pytest.raises(CheckpointNotFoundError):
                await store.get(checkpoint_id)
        assert "cancelled" == (await store.get("cp_new")).status  # written between
        assert "pending" == (await store.get("cp_open")).status
        assert 1 == await store.purge_resolved(older_than=0)  # now cp_new too


async def test_a_file_that_is_not_a_database_is_refused() -> None:
    db_path().write_bytes(b"not a database, just some bytes " * 100)
    with pytest.raises(ConfigurationError, match="not a database") as caught:
        async with SQLiteCheckpointStore(db_path()):
            pass  # pragma: no cover
    assert str(db_path()) in str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


async def test_a_connection_left_inside_a_transaction_is_never_reused() -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        conn = store._take()
        conn.execute("BEGIN")
        store._give(conn)
        assert conn not in store._idle
        with pytest.raises(sqlite3.ProgrammingError):  # closed
            conn.execute("SELECT 1")
        await store.save(checkpoint())  # the store opens a new one


async def test_reads_are_a_transaction_only_when_asked() -> None:
    async with SQLiteCheckpointStore(db_path()) as store:
        with store._connection(write=False, atomic=True) as conn:
            assert conn.in_transaction
        with store._connection(write=False, atomic=False) as conn:
            assert not conn.in_transaction
        with store._connection(write=True, atomic=False) as conn:
            assert conn.in_transaction  # every write takes the write lock first


async def test_entering_cancelled_leaves_no_connection_open() -> None:
    store = SQLiteCheckpointStore(db_path())
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with store:
            pass  # pragma: no cover
    assert scope.cancelled_caught
    assert [] == store._idle
    with pytest.raises(ConfigurationError, match="not open"):
        await store.get("cp_1")


class _LockedAtFirst:
    """A connection whose first answers to the journal-mode pragma are "database is
    locked", as SQLite gives while other processes open a new file at the same time."""

    def __init__(self, locked: int, error: str = "database is locked") -> None:
        self.locked = locked
        self.error = error
        self.calls: list[str] = []

    def execute(self, sql: str) -> Any:
        self.calls.append(sql)
        if len(self.calls) <= self.locked:
            raise sqlite3.OperationalError(self.error)
        return _Row(("delete",))


class _Row:
    def __init__(self, row: tuple[str, ...]) -> None:
        self.row = row

    def fetchone(self) -> tuple[str, ...]:
        return self.row


def test_a_sqlite_without_json_functions_is_refused_up_front(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # list_pending needs json_each(), an option of SQLite builds before 3.38: a build
    # without it is refused when the store is made, not at the first metadata filter.
    import runlet.stores.sqlite as module

    monkeypatch.setattr(module, "_checked_sqlite", [])
    monkeypatch.setattr(module, "_JSON_PROBE", "SELECT count(*) FROM no_such_json_each('[1]')")
    for _ in range(2):  # a failed check is not remembered as passed
        with pytest.raises(ConfigurationError, match="SQLite's JSON functions") as info:
            SQLiteCheckpointStore(":memory:")
        assert "no such table: no_such_json_each" in str(info.value)
        assert info.value.__cause__ is None
    monkeypatch.setattr(module, "_JSON_PROBE", "SELECT count(*) FROM json_each('[1]')")
    SQLiteCheckpointStore(":memory:")  # the real probe passes: checked once, then known
    assert module._checked_sqlite == [True]
    monkeypatch.setattr(module, "_JSON_PROBE", "SELECT count(*) FROM no_such_json_each('[1]')")
    SQLiteCheckpointStore(":memory:")  # not probed again
    assert module._checked_sqlite == [True]


def test_switching_to_wal_is_retried_while_the_file_is_locked() -> None:
    store = SQLiteCheckpointStore(":memory:", busy_timeout=5)
    conn = _LockedAtFirst(locked=2)

    store._use_wal(conn)  # type: ignore[arg-type]

    # Two refusals, then the mode is read and switched.
    assert ["PRAGMA journal_mode"] * 3 + ["PRAGMA journal_mode = WAL"] == conn.calls


def test_switching_to_wal_gives_up_after_the_busy_timeout() -> None:
    store = SQLiteCheckpointStore(":memory:", busy_timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store._use_wal(_LockedAtFirst(locked=1))  # type: ignore[arg-type]


def test_other_errors_while_switching_to_wal_are_not_retried() -> None:
    store = SQLiteCheckpointStore(":memory:", busy_timeout=5)
    conn = _LockedAtFirst(locked=1, error="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        store._use_wal(conn)  # type: ignore[arg-type]
    assert 1 == len(conn.calls)


@pytest.mark.parametrize("path", [None, 5])
def test_a_path_that_is_not_a_path_is_refused(path: Any) -> None:
    with pytest.raises(ConfigurationError, match="path must be the database file's path"):
        SQLiteCheckpointStore(path)


async def test_a_file_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    for where in (tmp_path / "missing" / "store.db", tmp_path):  # no directory; a directory
        with pytest.raises(ConfigurationError, match="unable to open") as caught:
            async with SQLiteCheckpointStore(where):
                pass  # pragma: no cover
        assert str(where) in str(caught.value)


async def test_a_file_locked_by_another_connection_stays_sqlites_error(tmp_path: Path) -> None:
    # Only a path that cannot be opened is the path's fault; a lock held past the busy
    # timeout is SQLite's own "database is locked", for the caller to retry.
    where = tmp_path / "store.db"
    holder = sqlite3.connect(where, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError, match="locked") as caught:
            async with SQLiteCheckpointStore(where, busy_timeout=0.05):
                pass  # pragma: no cover
        assert not isinstance(caught.value, ConfigurationError)
    finally:
        holder.close()
