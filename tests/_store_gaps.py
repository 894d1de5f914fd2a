"""Store tests a mutation review of the SQL stores found missing, shared by the SQLite
and PostgreSQL test modules."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from _store_semantics import Factory, checkpoint, execute

from runlet import CheckpointSerializationError


class _Hooked:
    """A store connection that calls *before(statement)* and *after(conn, statement)*
    around each statement: a concurrent writer, or a cancellation, at an exact point."""

    def __init__(self, conn: Any, before: Any, after: Any) -> None:
        self._conn, self._before, self._after = conn, before, after

    def execute(self, statement: Any, params: Any = None) -> Any:
        if self._before is not None:
            self._before(statement)
        cursor = self._conn.execute(statement, params if params is not None else {})
        if self._after is not None:
            self._after(self._conn, statement)
        return cursor


def hook(
    store: Any, *, before: Any = None, after: Any = None, ended_with: str | None = None
) -> threading.Event:
    """Wrap the connections of *store*'s units of work from now on. The event returned
    is set when a unit of work that ran the statement *ended_with* has ended (committed
    or rolled back), in whichever thread ran it: a test waits on it for a thread a bug
    would have left running."""
    connection = store._connection
    ended = threading.Event()

    @contextmanager
    def hooked(*, write: bool, atomic: bool) -> Iterator[Any]:
        ran: list[str] = []

        def noting(statement: str) -> None:
            ran.append(statement)
            if before is not None:
                before(statement)

        try:
            with connection(write=write, atomic=atomic) as conn:
                yield _Hooked(conn, noting, after)
        finally:
            if ended_with in ran:
                ended.set()

    store._connection = hooked
    return ended


def hold_the_thread() -> None:
    """Keep a store's worker thread a moment, so a cancellation sent from it lands in the
    event loop while the thread's work is still to come: the interleaving a store must
    handle (it forces the order of two events; nothing waits for a result)."""
    time.sleep(0.3)


def sql_gap_tests(factory: Factory, *, rewind: str, indexes: str) -> type:
    """*rewind* as in sql_store_tests; *indexes* lists the index names of the schema."""

    @pytest.mark.anyio
    class SQLGaps:
        async def test_the_schema_has_its_indexes_and_refuses_an_unknown_status(self) -> None:
            async with factory(60.0) as store:
                names = {name for (name,) in await execute(store, indexes)}
                assert {
                    "runlet_checkpoints_open",
                    "runlet_checkpoints_finished",
                    "runlet_records_run",
                } <= names
                await store.save(checkpoint())
                with pytest.raises(Exception, match=r"(?i)check constraint"):
                    await execute(store, "UPDATE runlet_checkpoints SET status = 'paused'")

        async def test_the_metadata_filter_runs_in_sql(self) -> None:
            # A row the filter excludes is never read: another tenant's bad row does not
            # break this tenant's inbox (and a filtered listing parses only its rows).
            async with factory(60.0) as store:
                await store.save(checkpoint("cp_a", metadata={"tenant": "a"}))
                await store.save(checkpoint("cp_b", metadata={"tenant": "b"}))
                await store.save(checkpoint("cp_c", metadata={"other": "a"}))
                await store.save(checkpoint("cp_d", metadata={"tags": ["x"]}))
                await execute(
                    store,
                    "UPDATE runlet_checkpoints SET data = 'not json' WHERE id IN ('cp_b', 'cp_c')",
                )
                listed = await store.list_pending(metadata={"tenant": "a"})
                assert ["cp_a"] == [found.checkpoint_id for found in listed]
                # A value SQL does not compare (an array) still needs the key.
                listed = await store.list_pending(metadata={"tags": ["x"]})
                assert ["cp_d"] == [found.checkpoint_id for found in listed]
                with pytest.raises(CheckpointSerializationError):
                    await store.list_pending()

        @pytest.mark.parametrize("meanwhile", ["released", "lease ran out"])
        async def test_a_claim_that_lost_a_race_to_a_writer_tries_again(
            self, meanwhile: str
        ) -> None:
            # On PostgreSQL the claim's UPDATE and the SELECT that explains its failure
            # are two statements: the holder may release (or its lease run out) in
            # between. The claim then takes the checkpoint.
            change = (
                "UPDATE runlet_checkpoints SET status = 'pending', token = NULL, lease_until = NULL"
                if meanwhile == "released"
                else rewind.format(column="lease_until")
            )
            async with factory(60.0) as store:
                await store.save(checkpoint())
                first = await store.claim("cp_1")
                pending = [change]

                def after(conn: Any, statement: str) -> None:
                    if statement == store._sql.claim and pending:
                        conn.execute(pending.pop())

                hook(store, after=after)
                second = await store.claim("cp_1")
                assert second.token != first.token
                assert "claimed" == (await store.get("cp_1")).status

        async def test_a_claim_cancelled_natively_before_its_update_is_given_back(
            self, anyio_backend: str
        ) -> None:
            # asyncio's own Task.cancel() (asyncio.timeout, wait_for) goes through
            # anyio's shield and lands while the claim's thread is still running.
            from test_exactly_once import _NativeCancel

            native = _NativeCancel(anyio_backend)
            async with factory(60.0) as store:
                await store.save(checkpoint())

                def before(statement: str) -> None:
                    if statement == store._sql.claim:
                        anyio.from_thread.run_sync(native.cancel)
                        hold_the_thread()  # the cancellation lands before the UPDATE

                ended = hook(store, before=before, ended_with=store._sql.claim)
                await native.run(lambda: store.claim("cp_1"))
                await anyio.to_thread.run_sync(ended.wait)  # the claim's thread, done
                assert "pending" == (await store.get("cp_1")).status

    return SQLGaps
