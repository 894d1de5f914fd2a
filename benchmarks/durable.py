"""W5, the durable round trip: interrupt → checkpoint in a database → resume → completed.

Runlet side: ``Runtime.run`` (which saves the checkpoint in the store), then
``Runtime.resume`` with an approval (read, claim, record the decision, run the tool,
record its result, finish the run, resolve), on :class:`SQLiteCheckpointStore` and
:class:`PostgresCheckpointStore`.

Floor: the hand-written loop of ``benchmarks/floor.py`` with the *same SQL statements*
(imported from the store modules), in the same transactions, through the same driver, in
worker threads (an async application cannot block its event loop either), on one
connection per resumer; checkpoints are plain dicts turned into JSON.

Figures: time per sequential round trip (target ≤ 1.5x the floor), and resumes per second
with 1, 4 and 16 concurrent resumers working through a backlog of interrupted runs.

PostgreSQL: the server named by ``RUNLET_BENCH_POSTGRES`` (a conninfo), else (full counts
only, not ``--smoke``) a throwaway server started from the machine's PostgreSQL binaries
(see ``tests/_pgserver.py``), else the PostgreSQL figures are left out.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from runlet import HumanResponse, RunResult, Runtime
from runlet.stores import sqlite as sqlite_sql
from runlet.stores.sqlite import SQLiteCheckpointStore

from . import floor
from .workloads import (
    FULL,
    PROMPT,
    Counts,
    Figure,
    Outcome,
    add,
    alternate,
    floor_agent,
    runlet_agent,
    timed,
)

PLAN = ["approve_add"]
CONCURRENCY = (1, 4, 16)
LEASE = 60.0


def sizes(counts: Counts) -> tuple[int, int]:
    """Round trips per sample, and the backlog for the throughput figures."""
    if counts == FULL:
        return 40, 200
    return 2, 4


# -- databases ---------------------------------------------------------------------------


@contextmanager
def postgres_server(start: bool) -> Iterator[str | None]:
    """A conninfo of a PostgreSQL server for the benchmark, or None. Only *start* lets it
    start a throwaway server (the smoke run does not)."""
    given = os.environ.get("RUNLET_BENCH_POSTGRES")
    if given:
        yield given
        return
    if not start:
        yield None
        return
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from _pgserver import bindir, server

    found = bindir()
    if found is None:
        print("W5: no PostgreSQL server binaries; PostgreSQL figures left out", file=sys.stderr)
        yield None
        return
    with server(found) as conninfo:
        yield conninfo


def fresh_schema(conninfo: str) -> str:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    return make_conninfo(conninfo, options=f"-csearch_path={name}")


class Database:
    """One kind of database: how to make a fresh one, the store, and the floor's driver."""

    name: str
    sql: Any

    def fresh(self) -> str:
        raise NotImplementedError

    def store(self, where: str, resumers: int) -> Any:
        raise NotImplementedError

    def connect(self, where: str) -> Any:
        raise NotImplementedError

    def transaction(self, conn: Any, write: bool) -> AbstractContextManager[Any]:
        raise NotImplementedError


class SQLiteDatabase(Database):
    name = "sqlite"
    sql = sqlite_sql

    def __init__(self, root: Path) -> None:
        self.root = root

    def fresh(self) -> str:
        return str(self.root / f"{uuid.uuid4().hex}.db")

    def store(self, where: str, resumers: int) -> Any:
        return SQLiteCheckpointStore(where, lease=LEASE, connections=min(resumers, 4))

    def connect(self, where: str) -> Any:
        conn = sqlite3.connect(where, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.execute(sqlite_sql.JOURNAL_MODE_WAL)
        conn.execute(sqlite_sql.SYNCHRONOUS_FULL)
        return conn

    @contextmanager
    def transaction(self, conn: Any, write: bool) -> Iterator[Any]:
        conn.execute(sqlite_sql.BEGIN_IMMEDIATE if write else sqlite_sql.BEGIN)
        try:
            yield conn
        except BaseException:
            conn.execute(sqlite_sql.ROLLBACK)
            raise
        conn.execute(sqlite_sql.COMMIT)


class PostgresDatabase(Database):
    name = "postgres"

    def __init__(self, conninfo: str) -> None:
        from runlet.stores import postgres

        self.sql = postgres
        self.conninfo = conninfo

    def fresh(self) -> str:
        return fresh_schema(self.conninfo)

    def store(self, where: str, resumers: int) -> Any:
        from runlet.stores.postgres import PostgresCheckpointStore

        # All connections open up front, as the floor's are.
        return PostgresCheckpointStore(where, lease=LEASE, min_size=resumers, max_size=resumers)

    def connect(self, where: str) -> Any:
        import psycopg

        return psycopg.connect(where, autocommit=True)

    def transaction(self, conn: Any, write: bool) -> AbstractContextManager[Any]:
        return conn.transaction()  # type: ignore[no-any-return]


# -- the floor: the same statements by hand ----------------------------------------------


class FloorStore:
    """The store's statements, issued by hand on one connection, in a worker thread."""

    def __init__(self, db: Database, conn: Any) -> None:
        self.db, self.conn, self.sql = db, conn, db.sql

    async def call(self, work: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(work)

    def _single(self) -> AbstractContextManager[Any]:
        # As the store does: SQLite writes always take the write lock first (BEGIN
        # IMMEDIATE); on PostgreSQL, statements that need no common transaction run in
        # autocommit.
        if self.db.name == "sqlite":
            return self.db.transaction(self.conn, True)
        return nullcontext()

    async def save(self, checkpoint: dict[str, Any]) -> None:
        params = {
            "id": checkpoint["id"],
            "run_id": checkpoint["run_id"],
            "agent_name": "adder",
            "data": json.dumps(checkpoint),
            "metadata": "{}",
        }

        def work() -> None:
            with self._single():
                self.conn.execute(self.sql.SAVE, params)

        await self.call(work)

    async def resume(
        self, runtime: floor.FloorRuntime, agent: floor.FloorAgent, checkpoint_id: str
    ) -> dict[str, Any]:
        sql, conn, token = self.sql, self.conn, uuid.uuid4().hex
        ids = {"id": checkpoint_id, "token": token}

        def read() -> Any:  # as the store reads: no explicit transaction
            row = conn.execute(sql.GET, ids).fetchone()
            conn.execute(sql.RECORDS, ids).fetchall()
            return json.loads(row[1])

        def claim() -> None:
            with self._single():
                conn.execute(sql.CLAIM, {**ids, "lease": LEASE}).fetchone()
                conn.execute(sql.RECORDS, ids).fetchall()

        def record(data: dict[str, Any]) -> Callable[[], None]:
            def work() -> None:
                with self.db.transaction(conn, True):
                    (run_id,) = conn.execute(sql.HOLDER, ids).fetchone()
                    conn.execute(
                        sql.RECORD,
                        {
                            **ids,
                            "run_id": run_id,
                            "tool_call_id": data["call"],
                            "data": json.dumps(data),
                            "decided_at": "2026-01-01T00:00:00+00:00",
                        },
                    )

            return work

        def resolve(outcome: dict[str, Any]) -> Callable[[], None]:
            def work() -> None:
                with self._single():
                    conn.execute(sql.RESOLVE, {**ids, "resolution": json.dumps(outcome)})

            return work

        checkpoint = await self.call(read)
        await self.call(claim)
        call = checkpoint["pending"]
        await self.call(record({"call": call["id"], "action": "approve"}))
        result = await floor.call_tool(agent.tools.get(call["name"]), call)
        await self.call(record({"call": call["id"], "action": "approve", "result": result}))
        messages = [*checkpoint["messages"], result]
        state = {"run_id": checkpoint["run_id"], "messages": messages, "turns": checkpoint["turns"]}
        outcome = await runtime._drive(agent, state)
        await self.call(resolve({"output": outcome["output"], "messages": outcome["messages"]}))
        return outcome


# -- the workload ------------------------------------------------------------------------


async def one_database(db: Database, counts: Counts) -> tuple[list[Figure], dict[str, Any]]:
    trips, backlog = sizes(counts)
    agent = runlet_agent(PLAN, add)
    fagent = floor_agent(PLAN, add)
    last: dict[str, Any] = {}

    @asynccontextmanager
    async def runlet_side(resumers: int) -> AsyncIterator[tuple[Any, Runtime]]:
        where = await anyio.to_thread.run_sync(db.fresh)
        async with db.store(where, resumers) as store:
            yield store, Runtime(checkpoint_store=store)

    async def runlet_trip(runtime: Runtime) -> RunResult:
        interrupted = await runtime.run(agent, PROMPT)
        assert interrupted.checkpoint_id is not None
        assert interrupted.interruption is not None
        response = HumanResponse(interrupted.interruption.id, "approve")
        return await runtime.resume(
            agent, checkpoint_id=interrupted.checkpoint_id, response=response
        )

    @asynccontextmanager
    async def floor_side(resumers: int) -> AsyncIterator[list[FloorStore]]:
        where = await anyio.to_thread.run_sync(db.fresh)
        async with db.store(where, 1):  # the tables, as the store creates them
            pass
        conns = [await anyio.to_thread.run_sync(db.connect, where) for _ in range(resumers)]
        try:
            yield [FloorStore(db, conn) for conn in conns]
        finally:
            for conn in conns:
                conn.close()

    async def floor_trip(store: FloorStore, runtime: floor.FloorRuntime) -> dict[str, Any]:
        interrupted = await runtime.run(fagent, PROMPT)
        checkpoint = interrupted["checkpoint"]
        runtime.store.clear()
        await store.save(checkpoint)
        return await store.resume(runtime, fagent, checkpoint["id"])

    async def runlet_rep() -> float:
        async with runlet_side(1) as (_, runtime):

            async def work() -> None:
                for _ in range(trips):
                    last["runlet"] = await runlet_trip(runtime)

            return await timed(work)

    async def floor_rep() -> float:
        async with floor_side(1) as (store,):
            runtime = floor.FloorRuntime()

            async def work() -> None:
                for _ in range(trips):
                    last["floor"] = await floor_trip(store, runtime)

            return await timed(work)

    ours, theirs = await alternate(counts.reps, runlet_rep, floor_rep)
    per_trip = 1e6 / trips
    figures = [
        Figure(
            f"w5_{db.name}_us_per_round_trip",
            f"W5 durable round trip ({db.name}): time per round trip",
            "µs",
            [t * per_trip for t in ours],
            [t * per_trip for t in theirs],
            target=("floor", 1.5),
        )
    ]

    async def runlet_throughput(resumers: int) -> float:
        async with runlet_side(resumers) as (store, runtime):
            pending = [await runtime.run(agent, PROMPT) for _ in range(backlog)]
            queue = list(reversed(pending))

            async def resumer() -> None:
                while queue:
                    interrupted = queue.pop()
                    assert interrupted.interruption is not None
                    response = HumanResponse(interrupted.interruption.id, "approve")
                    checkpoint_id = interrupted.checkpoint_id
                    assert checkpoint_id is not None
                    done = await runtime.resume(
                        agent, checkpoint_id=checkpoint_id, response=response
                    )
                    assert done.status == "completed"

            async def work() -> None:
                async with anyio.create_task_group() as group:
                    for _ in range(resumers):
                        group.start_soon(resumer)

            elapsed = await timed(work)
            assert not await store.list_pending()
            return backlog / elapsed

    async def floor_throughput(resumers: int) -> float:
        async with floor_side(resumers) as stores:
            runtime = floor.FloorRuntime()
            queue: list[str] = []
            for _ in range(backlog):
                checkpoint = (await runtime.run(fagent, PROMPT))["checkpoint"]
                await stores[0].save(checkpoint)
                queue.append(checkpoint["id"])
            runtime.store.clear()
            queue.reverse()

            async def resumer(store: FloorStore) -> None:
                while queue:
                    outcome = await store.resume(runtime, fagent, queue.pop())
                    assert outcome["status"] == "completed"

            async def work() -> None:
                async with anyio.create_task_group() as group:
                    for store in stores:
                        group.start_soon(resumer, store)

            return backlog / await timed(work)

    for resumers in CONCURRENCY:
        ours_tp: list[float] = []
        theirs_tp: list[float] = []
        for _ in range(max(1, counts.reps // 3)):
            ours_tp.append(await runlet_throughput(resumers))
            theirs_tp.append(await floor_throughput(resumers))
        figures.append(
            Figure(
                f"w5_{db.name}_resumes_per_s_{resumers}",
                f"W5 durable resumes per second ({db.name}, {resumers} at once)",
                "resumes/s",
                ours_tp,
                theirs_tp,
                higher_is_better=True,
            )
        )
    result: RunResult = last["runlet"]
    checks = {
        f"{db.name}_runlet_status": result.status,
        f"{db.name}_runlet_output": result.output,
        f"{db.name}_floor_output": last["floor"]["output"],
    }
    return figures, checks


async def bench_w5(counts: Counts) -> Outcome:
    """W5 on SQLite, and on PostgreSQL when a server is at hand."""
    outcome = Outcome()
    with tempfile.TemporaryDirectory(prefix="runlet-w5-") as root:
        databases: list[Callable[[], Awaitable[tuple[list[Figure], dict[str, Any]]]]] = [
            lambda: one_database(SQLiteDatabase(Path(root)), counts)
        ]
        with postgres_server(start=counts == FULL) as conninfo:
            if conninfo is not None:
                databases.append(lambda: one_database(PostgresDatabase(conninfo), counts))
            for measure in databases:
                figures, checks = await measure()
                outcome.figures.extend(figures)
                outcome.checks.update(checks)
    return outcome
