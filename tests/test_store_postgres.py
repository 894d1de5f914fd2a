"""PostgresCheckpointStore: the conformance suite, plus what is specific to PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from _postgres import fresh_schema, postgres_store
from _store_semantics import T0, checkpoint, decision, semantics_tests, sql_store_tests
from _store_semantics import execute as in_store
from conftest import BACKENDS

from runlet import (
    Agent,
    CallRecord,
    CheckpointClaimedError,
    CheckpointSerializationError,
    ConfigurationError,
    HumanResponse,
    Runtime,
    StoreSchemaError,
    ToolSpec,
)

try:
    import psycopg
    import psycopg_pool
except ImportError:  # skips, but fails when CI is set, like a missing server
    if os.environ.get("CI"):
        raise
    pytest.skip('psycopg is not installed: pip install -e ".[tests]"', allow_module_level=True)

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from runlet._checkpoint import unstructure
from runlet.stores import postgres
from runlet.stores._sql import dumps
from runlet.stores.postgres import PostgresCheckpointStore
from runlet.testing import ScriptedModel, call, store_conformance_tests

_server: list[str] = []


@pytest.fixture(autouse=True)
def _server_conninfo(postgres_server: str) -> None:
    _server[:] = [postgres_server]


@asynccontextmanager
async def pg_store(lease: float | None) -> AsyncIterator[Any]:
    async with postgres_store(_server[0], lease) as store:
        yield store


def same_database(store: Any) -> PostgresCheckpointStore:
    """Another store on *store*'s database and schema, as another process opens it."""
    return PostgresCheckpointStore(store.conninfo, lease=store.lease, max_size=2)


async def age_leases(store: Any, seconds: float) -> None:
    """Move every live lease *seconds* nearer its end."""
    await in_store(
        store,
        "UPDATE runlet_checkpoints SET lease_until = lease_until - "
        f"{float(seconds)!r} * interval '1 second' WHERE status = 'claimed'",
    )


TestConformance = store_conformance_tests(
    pg_store, backends=BACKENDS, second_handle=same_database, age_leases=age_leases
)


class TestSemantics(semantics_tests(pg_store)):  # type: ignore[misc]
    pass


class TestSQLStore(
    sql_store_tests(  # type: ignore[misc]
        pg_store, rewind="UPDATE runlet_checkpoints SET {column} = {column} - interval '2 hours'"
    )
):
    pass


pytestmark = pytest.mark.anyio


async def schema() -> str:
    return await anyio.to_thread.run_sync(fresh_schema, _server[0])


def execute(conninfo: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


async def test_workers_share_the_tables_and_the_claims() -> None:
    conninfo = await schema()
    stores = [PostgresCheckpointStore(conninfo, min_size=0, max_size=2) for _ in range(6)]
    claimed: list[str] = []
    refused: list[str] = []

    saved = anyio.Event()

    async def worker(n: int, store: PostgresCheckpointStore) -> None:
        async with store:  # six pools create the tables at once
            if n == 0:
                await store.save(checkpoint())
                saved.set()
            await saved.wait()
            try:
                claimed.append((await store.claim("cp_1")).token)
            except CheckpointClaimedError:
                refused.append("refused")

    async with anyio.create_task_group() as group:
        for n, store in enumerate(stores):
            group.start_soon(worker, n, store)
    assert (1, 5) == (len(claimed), len(refused))
    assert [(1,)] == execute(conninfo, "SELECT version FROM runlet_schema")


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"checkpoint_id": "cp\x00"}, "id"),
        ({"run_id": "run\x00"}, "run_id"),
        ({"agent_name": "support\x00"}, "agent_name"),
    ],
)
async def test_a_checkpoint_text_cannot_hold_is_refused_by_name(
    changes: dict[str, Any], path: str
) -> None:
    # PostgreSQL text cannot hold U+0000: the error names the value, not a psycopg error.
    async with pg_store(60.0) as store:
        with pytest.raises(CheckpointSerializationError, match="U\\+0000") as info:
            await store.save(checkpoint(**changes))
        assert info.value.path == path
        assert await store.list_pending() == []


async def test_a_model_call_id_with_a_nul_character_fails_the_run_when_it_interrupts() -> None:
    # Records are kept by call id; refusing at the save beats a resume that can never
    # record (nothing would run twice, but the run would be stuck).
    pay = ToolSpec("pay", "Pay.", {"type": "object"}, _pay, requires_approval=True)
    model = ScriptedModel([call("pay", id="call\x001")])
    async with pg_store(60.0) as store:
        runtime = Runtime(checkpoint_store=store)
        agent = Agent(name="payer", instructions="", model=model, tools=(pay,))
        with pytest.raises(CheckpointSerializationError) as info:
            await runtime.run(agent, "Pay it.")
        assert info.value.path == "transcript[-1].tool_calls[0].id"
        assert await store.list_pending() == []


async def test_a_record_whose_call_id_text_cannot_hold_is_refused_by_name() -> None:
    async with pg_store(60.0) as store:
        saved = checkpoint()
        await store.save(saved)
        claim = await store.claim("cp_1")
        record = CallRecord(tool_call_id="call\x00", decision=decision(saved))
        with pytest.raises(CheckpointSerializationError) as info:
            await store.record("cp_1", claim.token, [record])
        assert info.value.path == "records[0].tool_call_id"
        assert (await store.get("cp_1")).records == ()


async def _pay(arguments: Any, context: Any) -> str:
    raise AssertionError("never runs")  # pragma: no cover


async def test_metadata_with_a_lone_surrogate_is_saved_and_found() -> None:
    # json.loads accepts "\\ud800" in a request body; PostgreSQL's jsonb does not. The
    # checkpoint keeps it; the column the filter uses leaves that entry to Python.
    odd = {"note": "\ud800", "tenant": "acme", "smile": "\U0001f600"}
    async with pg_store(60.0) as store:
        await store.save(checkpoint(metadata=odd))
        assert odd == (await store.load("cp_1")).metadata
        for wanted in ({"tenant": "acme"}, {"note": "\ud800"}, {"smile": "\U0001f600"}):
            assert ["cp_1"] == [p.checkpoint_id for p in await store.list_pending(metadata=wanted)]
        assert [] == await store.list_pending(metadata={"note": "\ud801"})


async def test_a_database_of_an_unknown_schema_version_is_refused() -> None:
    conninfo = await schema()
    async with PostgresCheckpointStore(conninfo) as store:
        await store.save(checkpoint())
        assert "<conninfo>" in repr(store)
    execute(conninfo, "UPDATE runlet_schema SET version = 7")
    refusing = PostgresCheckpointStore(conninfo)
    with pytest.raises(StoreSchemaError, match="schema version 7") as caught:
        async with refusing:
            pass  # pragma: no cover
    assert (7, 1) == (caught.value.found, caught.value.expected)
    assert refusing._pool is None  # its pool was closed
    assert [(1,)] == execute(conninfo, "SELECT count(*) FROM runlet_checkpoints")


async def test_a_role_that_may_only_use_the_tables_opens_a_store_made_by_their_owner() -> None:
    # The usual production split: a migration (the owner) creates the tables once, and
    # the application connects as a role that may read and write rows but not create
    # anything. CREATE TABLE IF NOT EXISTS needs CREATE even when the table exists.
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    owner = await schema()
    async with PostgresCheckpointStore(owner) as store:
        await store.save(checkpoint())
    role = f"app_{uuid.uuid4().hex[:12]}"
    (name,) = [
        part.removeprefix("-csearch_path=")
        for part in str(conninfo_to_dict(owner)["options"]).split()
    ]
    execute(owner, f"CREATE ROLE {role} LOGIN")
    execute(owner, f"GRANT USAGE ON SCHEMA {name} TO {role}")
    execute(owner, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {name} TO {role}")
    try:
        async with PostgresCheckpointStore(make_conninfo(owner, user=role)) as app:
            claim = await app.claim("cp_1")
            await app.release("cp_1", claim.token)
            assert ["cp_1"] == [p.checkpoint_id for p in await app.list_pending()]
    finally:
        execute(owner, f"DROP OWNED BY {role}")
        execute(owner, f"DROP ROLE {role}")


async def test_lease_times_come_from_the_server() -> None:
    conninfo = await schema()
    async with PostgresCheckpointStore(conninfo, lease=30) as store:
        await store.save(checkpoint())
        await store.claim("cp_1")
    ((seconds,),) = execute(
        conninfo,
        "SELECT extract(epoch FROM lease_until - clock_timestamp()) FROM runlet_checkpoints",
    )
    assert 0 < seconds <= 30


async def test_a_takeover_waits_for_a_record_that_passed_the_token_check() -> None:
    # record() checks the token (HOLDER) and writes in one transaction. HOLDER's row lock
    # makes a takeover claim wait for that transaction, so the new holder reads what the
    # old one recorded; without it both would pass their checks, and the old holder would
    # act on a record the new one never sees.
    conninfo = await schema()
    options = conninfo_to_dict(conninfo)["options"]
    impatient = make_conninfo(conninfo, options=f"{options} -c lock_timeout=100")
    cp = checkpoint()
    call = CallRecord(tool_call_id="call_0", decision=decision(cp))
    async with PostgresCheckpointStore(impatient, lease=0) as store:
        await store.save(cp)
        old = await store.claim("cp_1")  # lease 0: open to a takeover at once
        with psycopg.connect(conninfo) as writer:  # not autocommit: one transaction
            held = {"id": "cp_1", "token": old.token}
            assert writer.execute(postgres.HOLDER, held).fetchone() is not None
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await store.claim("cp_1")
            row = {"tool_call_id": "call_0", "run_id": "run_1", "decided_at": T0}
            writer.execute(postgres.RECORD, {**held, **row, "data": dumps(unstructure(call))})
        new = await store.claim("cp_1")
        assert (call,) == new.records


async def test_connect_kwargs_reach_the_connections() -> None:
    conninfo = await schema()
    kwargs = {"prepare_threshold": None}
    async with PostgresCheckpointStore(
        conninfo, connect_kwargs=kwargs, min_size=0, check_connections=True
    ) as store:
        await store.save(checkpoint())
        assert store._pool is not None
        with store._pool.connection() as conn:
            assert (None, True) == (conn.prepare_threshold, conn.autocommit)


async def test_an_unreachable_server_fails_on_entering() -> None:
    conninfo = "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=1"
    with pytest.raises(psycopg_pool.PoolTimeout, match="refused"):
        async with PostgresCheckpointStore(conninfo, timeout=0.5):
            pass  # pragma: no cover


@pytest.mark.parametrize(
    "arguments",
    [
        {"lease": -1},
        {"max_size": 0},
        {"min_size": 3, "max_size": 2},
        {"timeout": 0},
        {"timeout": float("inf")},
    ],
)
def test_arguments_are_checked(arguments: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        PostgresCheckpointStore("dbname=x", **arguments)


@pytest.mark.parametrize("conninfo", ["this is not a conninfo", None, b"dbname=x"])
def test_a_conninfo_that_is_not_one_is_refused_at_once(conninfo: Any) -> None:
    with pytest.raises(ConfigurationError, match="conninfo"):
        PostgresCheckpointStore(conninfo)


async def test_a_server_that_refuses_the_connection_says_why() -> None:
    # The pool only logs its failed attempts; entering raises the server's own reason.
    conninfo = make_conninfo(await schema(), dbname="no_such_database")
    with pytest.raises(psycopg_pool.PoolTimeout, match="no_such_database") as refused:
        async with PostgresCheckpointStore(conninfo, timeout=0.5):
            pass  # pragma: no cover
    assert isinstance(refused.value.__cause__, psycopg.OperationalError)


def test_a_bad_max_size_is_named_in_the_error() -> None:
    with pytest.raises(ConfigurationError, match=r"^max_size is the number of connections"):
        PostgresCheckpointStore("dbname=x", max_size=0)


@pytest.mark.parametrize("check", [False, True], ids=["unchecked", "checked"])
async def test_a_dropped_connection_is_replaced(check: bool) -> None:
    conninfo = await schema()
    async with PostgresCheckpointStore(
        conninfo, min_size=1, max_size=1, check_connections=check
    ) as store:
        await store.save(checkpoint())
        assert store._pool is not None
        with store._pool.connection() as conn:  # the pool's only connection
            pid = conn.info.backend_pid
        await anyio.to_thread.run_sync(execute, conninfo, f"SELECT pg_terminate_backend({pid})")
        if not check:  # the one call on the dead connection fails ...
            with pytest.raises(psycopg.OperationalError):
                await store.get("cp_1")
        assert "pending" == (await store.get("cp_1")).status  # ... then it is replaced


async def test_after_the_server_drops_every_connection_only_one_call_fails() -> None:
    # As after a server restart: every pooled connection is dead at once. The call that
    # meets the first one fails; the pool then tests the others, so the next call works.
    conninfo = await schema()
    async with PostgresCheckpointStore(conninfo, min_size=3, max_size=3) as store:
        await store.save(checkpoint())
        pool = store._pool
        assert pool is not None
        with pool.connection() as a, pool.connection() as b, pool.connection() as c:
            pids = [conn.info.backend_pid for conn in (a, b, c)]
        for pid in pids:  # with a timeout, it returns once the backend is gone
            await anyio.to_thread.run_sync(
                execute, conninfo, f"SELECT pg_terminate_backend({pid}, 10000)"
            )

        with pytest.raises(psycopg.OperationalError):
            await store.get("cp_1")
        assert "pending" == (await store.get("cp_1")).status
        assert "pending" == (await store.get("cp_1")).status


def _pool_backend(store: PostgresCheckpointStore) -> int:
    """The server process behind the one connection of *store*'s pool."""
    assert store._pool is not None
    with store._pool.connection() as conn:
        return conn.info.backend_pid


async def test_a_result_is_recorded_on_a_fresh_connection_when_the_old_one_died() -> None:
    # A server restart or failover while an approved handler runs: the handler finished,
    # but the connection its result would be written on is dead. The write is done once
    # more on a fresh one, so the finished call is not sent back to a person as
    # outcome unknown (and its side effect is not repeated when they approve again).
    conninfo = await schema()
    paid: list[str] = []
    async with PostgresCheckpointStore(conninfo, min_size=1, max_size=1) as store:

        async def pay(arguments: Any, context: Any) -> str:
            pid = await anyio.to_thread.run_sync(_pool_backend, store)
            await anyio.to_thread.run_sync(
                execute, conninfo, f"SELECT pg_terminate_backend({pid}, 10000)"
            )
            paid.append(context.idempotency_key)
            return "paid"

        tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
        agent = Agent("payer", "Pay.", ScriptedModel([call("pay", id="c1"), "Paid."]), [tool])
        runtime = Runtime(checkpoint_store=store)
        first = await runtime.run(agent, "Pay.")
        assert first.interruption is not None
        assert first.checkpoint_id is not None
        answer = HumanResponse(first.interruption.id, "approve")
        done = await runtime.resume(agent, checkpoint_id=first.checkpoint_id, response=answer)
        assert done.output == "Paid."
        assert len(paid) == 1
        assert (await store.get(first.checkpoint_id)).status == "resolved"


async def test_a_claim_whose_data_cannot_be_read_is_given_back() -> None:
    conninfo = await schema()
    async with PostgresCheckpointStore(conninfo) as store:
        await store.save(checkpoint())
        execute(conninfo, """UPDATE runlet_checkpoints SET data = '{"version": 99}'""")
        with pytest.raises(CheckpointSerializationError, match="version 99"):
            await store.claim("cp_1")
        assert [("pending", None)] == execute(
            conninfo, "SELECT status, token FROM runlet_checkpoints"
        )


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.AdminShutdown(), True),
        (psycopg.errors.ConnectionFailure(), True),
        (psycopg.errors.QueryCanceled(), False),
        (psycopg.errors.UniqueViolation(), False),
        (psycopg.InterfaceError("the connection is closed"), False),
        (psycopg_pool.PoolTimeout("no connection free"), False),
        (psycopg_pool.PoolClosed("the pool is closed"), False),
        (ValueError("not the database's"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_only_a_lost_connection_counts_as_one(error: Exception, lost: bool) -> None:
    assert PostgresCheckpointStore("dbname=x")._lost_connection(error) is lost


@pytest.mark.parametrize(
    ("failure", "attempts"),
    [
        (psycopg.OperationalError("server closed the connection"), 2),
        (psycopg.errors.QueryCanceled(), 1),
    ],
    ids=["lost-twice", "refused"],
)
async def test_a_record_is_written_again_once_and_only_after_a_lost_connection(
    failure: Exception, attempts: int
) -> None:
    store = PostgresCheckpointStore("dbname=x")
    tries: list[object] = []

    async def failing(work: object) -> None:
        tries.append(work)
        raise failure

    store._run = failing  # type: ignore[method-assign,assignment]
    first = checkpoint()
    record = CallRecord(tool_call_id=first.request.tool_call.id, decision=decision(first))
    with pytest.raises(type(failure)):
        await store.record("cp_1", "token", [record])
    assert len(tries) == attempts


def test_the_diagnosis_after_a_timeout_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def refuse(conninfo: str, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise psycopg.OperationalError("refused")

    monkeypatch.setattr(psycopg, "connect", refuse)
    assert str(PostgresCheckpointStore("dbname=x")._why_not_connected()) == "refused"
    assert str(PostgresCheckpointStore("dbname=x connect_timeout=7")._why_not_connected())
    mine = {"connect_timeout": 9}
    PostgresCheckpointStore("dbname=x", connect_kwargs=mine)._why_not_connected()
    assert [kwargs.get("connect_timeout") for kwargs in seen] == [2, None, 9]
