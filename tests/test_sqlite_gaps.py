"""SQLite store: what a mutation review of the SQL stores found untested (the schema's
indexes and checks, the purge's fixed cutoff, the write lock taken up front, durable
syncs, and asyncio's own cancellation while the store opens)."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from _store_gaps import hold_the_thread, sql_gap_tests
from test_store_sqlite import _tmp_dir, db_path, sqlite_store  # noqa: F401

from runlet.stores import sqlite as sqlite_module
from runlet.stores.sqlite import SQLiteCheckpointStore

pytestmark = pytest.mark.anyio


class TestSQLGaps(
    sql_gap_tests(  # type: ignore[misc]
        sqlite_store,
        rewind="UPDATE runlet_checkpoints SET {column} = {column} - 7200",
        indexes="SELECT name FROM sqlite_master WHERE type = 'index'",
    )
):
    pass


async def test_a_write_takes_the_write_lock_before_its_first_statement() -> None:
    # BEGIN IMMEDIATE: another process's writer waits at BEGIN, before this write has
    # read anything, instead of failing half-way (SQLITE_BUSY on the lock upgrade).
    async with SQLiteCheckpointStore(db_path()) as store:
        other = sqlite3.connect(store.path, timeout=0, isolation_level=None)
        try:
            with (
                store._connection(write=True, atomic=False),
                pytest.raises(sqlite3.OperationalError, match="locked"),
            ):
                other.execute("BEGIN IMMEDIATE")
            other.execute("BEGIN IMMEDIATE")  # free once the write is done
            other.execute("ROLLBACK")
        finally:
            other.close()


async def test_every_connection_is_synchronous_full_whatever_the_build_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Most builds default to FULL, which hides a missing PRAGMA: start from OFF.
    connect = sqlite3.connect

    def connect_off(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.execute("PRAGMA synchronous = OFF")
        return conn

    monkeypatch.setattr(sqlite_module.sqlite3, "connect", connect_off)
    async with SQLiteCheckpointStore(db_path()) as store:
        with store._connection(write=False, atomic=False) as conn:
            assert (2,) == conn.execute("PRAGMA synchronous").fetchone()


async def test_entering_cancelled_natively_while_opening_closes_the_connection(
    anyio_backend: str,
) -> None:
    from test_exactly_once import _NativeCancel

    native = _NativeCancel(anyio_backend)
    opened: list[sqlite3.Connection] = []

    done = threading.Event()

    class Store(SQLiteCheckpointStore):
        def _connect(self) -> None:
            super()._connect()
            opened.extend(self._idle)
            anyio.from_thread.run_sync(native.cancel)
            hold_the_thread()  # the cancellation lands while the thread still opens

        def _open(self) -> None:
            try:
                super()._open()
            finally:
                done.set()

    store = Store(db_path())

    async def enter() -> None:
        async with store:
            pass

    await native.run(enter)
    await anyio.to_thread.run_sync(done.wait)  # the opening thread, done
    assert [] == store._idle
    for conn in opened:
        with pytest.raises(sqlite3.ProgrammingError):  # closed
            conn.execute("SELECT 1")
