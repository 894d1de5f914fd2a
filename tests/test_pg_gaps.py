"""PostgreSQL store: what a mutation review of the SQL stores found, and the bugs it
showed (a purge that left records behind, a delete racing a record, asyncio's own
cancellation getting through to a claim or an open that was still under way)."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from _store_gaps import hold_the_thread, hook, sql_gap_tests
from _store_semantics import checkpoint, execute, record, resolution
from test_store_postgres import _server_conninfo, pg_store, schema  # noqa: F401

from runlet import LeaseLostError
from runlet.stores.postgres import PostgresCheckpointStore

pytestmark = pytest.mark.anyio


class TestSQLGaps(
    sql_gap_tests(  # type: ignore[misc]
        pg_store,
        rewind="UPDATE runlet_checkpoints SET {column} = {column} - interval '2 hours'",
        indexes="SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()",
    )
):
    pass


async def test_a_purge_deletes_the_records_of_every_checkpoint_it_deletes() -> None:
    # A checkpoint that becomes old enough while the purge runs (a big backlog of
    # records takes a while to delete) goes with its records, or stays with them.
    conninfo = await schema()
    async with PostgresCheckpointStore(conninfo, max_size=2) as store:
        cp = checkpoint()
        await store.save(cp)
        claim = await store.claim("cp_1")
        await store.record("cp_1", claim.token, [record(cp)])
        await store.resolve("cp_1", claim.token, resolution(cp), None)
        await execute(store, "UPDATE runlet_checkpoints SET finished_at = now() - interval '1 h'")
        other = checkpoint("cp_2")
        await store.save(other)
        held = await store.claim("cp_2")
        await store.record("cp_2", held.token, [record(other)])

        def after(conn: Any, statement: str) -> None:
            # Another worker resolves cp_2 and commits while the purge is under way.
            if statement == store._sql.purge_records:
                import psycopg  # as test_store_postgres does: a missing driver skips

                with psycopg.connect(conninfo, autocommit=True) as elsewhere:
                    elsewhere.execute(
                        "UPDATE runlet_checkpoints SET status = 'resolved', token = NULL, "
                        "finished_at = now() - interval '1 h' WHERE id = 'cp_2'"
                    )

        hook(store, after=after)
        await store.purge_resolved(older_than=10)
        orphans = await execute(
            store,
            "SELECT checkpoint_id FROM runlet_records WHERE checkpoint_id NOT IN "
            "(SELECT id FROM runlet_checkpoints)",
        )
        assert [] == orphans


async def test_delete_leaves_no_record_of_a_resume_writing_meanwhile() -> None:
    conninfo = await schema()
    outcome: list[object] = []
    async with (
        PostgresCheckpointStore(conninfo, max_size=2) as worker,
        PostgresCheckpointStore(conninfo, max_size=2) as operator,
    ):
        cp = checkpoint()
        await worker.save(cp)
        claim = await worker.claim("cp_1")

        async def resume_records() -> None:
            try:
                await worker.record("cp_1", claim.token, [record(cp)])
                outcome.append("recorded")
            except LeaseLostError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as group:
            first = [True]

            def after(conn: Any, statement: str) -> None:
                if first.pop() if first else False:
                    # The resume records while the operator's delete is under way.
                    anyio.from_thread.run_sync(group.start_soon, resume_records)
                    hold_the_thread()  # the record comes while the delete is open

            hook(operator, after=after)
            await operator.delete("cp_1")
        assert [] == await execute(operator, "SELECT checkpoint_id FROM runlet_records")
        assert isinstance(outcome[0], LeaseLostError)


@pytest.mark.parametrize("where", ["connect", "schema"])
async def test_entering_cancelled_natively_while_opening_leaves_no_pool(
    anyio_backend: str, where: str
) -> None:
    from test_exactly_once import _NativeCancel

    native = _NativeCancel(anyio_backend)

    opened = threading.Event()

    def cancel_and_wait() -> None:
        anyio.from_thread.run_sync(native.cancel)
        hold_the_thread()  # the cancellation lands while the thread still opens

    class Store(PostgresCheckpointStore):
        def _open(self) -> None:
            try:
                super()._open()
            finally:
                opened.set()

        def _connect(self) -> None:
            if where == "connect":
                cancel_and_wait()
            super()._connect()

        def _check_schema(self, conn: Any) -> None:
            if where == "schema":
                cancel_and_wait()
            super()._check_schema(conn)

    store = Store(await schema(), min_size=2)

    async def enter() -> None:
        async with store:
            pass

    await native.run(enter)
    await anyio.to_thread.run_sync(opened.wait)  # the opening thread, done
    assert store._pool is None or store._pool.closed


async def test_a_natively_cancelled_claim_without_a_lease_does_not_strand_the_checkpoint(
    anyio_backend: str,
) -> None:
    from test_exactly_once import _NativeCancel

    native = _NativeCancel(anyio_backend)
    conninfo = await schema()
    async with PostgresCheckpointStore(conninfo, lease=None) as store:
        await store.save(checkpoint())

        def before(statement: str) -> None:
            if statement == store._sql.claim:
                anyio.from_thread.run_sync(native.cancel)
                hold_the_thread()  # the cancellation lands before the UPDATE

        ended = hook(store, before=before, ended_with=store._sql.claim)
        await native.run(lambda: store.claim("cp_1"))
        await anyio.to_thread.run_sync(ended.wait)  # the claim's thread, done
    async with PostgresCheckpointStore(conninfo, lease=None) as other:
        await other.cancel("cp_1")  # bug: CheckpointClaimedError, forever
        assert "cancelled" == (await other.get("cp_1")).status
