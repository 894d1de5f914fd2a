"""A durable checkpoint store in PostgreSQL: many workers on many machines.

Needs the extra ``runlet[postgres]`` (psycopg 3 and psycopg-pool). Neither async
PostgreSQL driver runs on trio, so the store uses psycopg's synchronous connections from
a :class:`psycopg_pool.ConnectionPool`, each call in an anyio worker thread, at most as
many at once as the pool has connections.

Claims are one conditional ``UPDATE … RETURNING`` (row locks make concurrent claimers
queue, and exactly one finds the row claimable); lease expiry is computed by the server's
``clock_timestamp()``, so the workers' clocks do not matter. The tables are created on
first use under a transaction-scoped advisory lock, so workers starting together do not
trip over each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Final

from .._errors import ConfigurationError
from .._util import is_seconds
from ._sql import SQLStore, Statements, dumps

try:
    import psycopg
    import psycopg_pool
    from psycopg.conninfo import conninfo_to_dict
except ImportError as _missing:  # pragma: no cover - the tests install the extra
    raise ImportError(
        'runlet.stores.postgres needs psycopg 3 and psycopg-pool: pip install "runlet[postgres]"'
    ) from _missing

__all__ = ["PostgresCheckpointStore"]

# Any fixed number works; it only has to be the same in every process. ("runlet" in hex.)
SCHEMA_LOCK: Final = "SELECT pg_advisory_xact_lock(114715857004660)"

SCHEMA_EXISTS: Final = "SELECT to_regclass('runlet_schema') IS NOT NULL"

SCHEMA_TABLE: Final = "CREATE TABLE IF NOT EXISTS runlet_schema (version integer NOT NULL)"

READ_VERSION: Final = "SELECT version FROM runlet_schema"

WRITE_VERSION: Final = "INSERT INTO runlet_schema (version) VALUES (%(version)s)"

# created_at (checkpoints) and decided_at (records) are written for operators' own
# queries (dashboards, audits); the store itself orders by seq (checkpoints as saved,
# records as recorded), which no worker's clock can reorder.
CREATE_CHECKPOINTS: Final = """
CREATE TABLE IF NOT EXISTS runlet_checkpoints (
    id text PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    run_id text NOT NULL,
    agent_name text NOT NULL,
    status text NOT NULL
        CHECK (status IN ('pending', 'claimed', 'resolved', 'cancelled')),
    token text,
    lease_until timestamptz,
    data text NOT NULL,
    metadata jsonb NOT NULL,
    resolution text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
)
"""

CREATE_OPEN_INDEX: Final = """
CREATE INDEX IF NOT EXISTS runlet_checkpoints_open
ON runlet_checkpoints (seq) WHERE status IN ('pending', 'claimed')
"""

CREATE_FINISHED_INDEX: Final = """
CREATE INDEX IF NOT EXISTS runlet_checkpoints_finished
ON runlet_checkpoints (finished_at) WHERE finished_at IS NOT NULL
"""

CREATE_RECORDS: Final = """
CREATE TABLE IF NOT EXISTS runlet_records (
    checkpoint_id text NOT NULL,
    tool_call_id text NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    run_id text NOT NULL,
    data text NOT NULL,
    decided_at timestamptz NOT NULL,
    PRIMARY KEY (checkpoint_id, tool_call_id)
)
"""

CREATE_RECORDS_RUN_INDEX: Final = """
CREATE INDEX IF NOT EXISTS runlet_records_run ON runlet_records (run_id)
"""

SAVE: Final = """
INSERT INTO runlet_checkpoints (id, run_id, agent_name, status, data, metadata)
VALUES (%(id)s, %(run_id)s, %(agent_name)s, 'pending', %(data)s, %(metadata)s::jsonb)
ON CONFLICT (id) DO UPDATE SET
    run_id = excluded.run_id,
    agent_name = excluded.agent_name,
    data = excluded.data,
    metadata = excluded.metadata
"""

LOAD: Final = "SELECT status, data FROM runlet_checkpoints WHERE id = %(id)s"

STATE: Final = """
SELECT status, resolution, lease_until IS NULL OR lease_until > clock_timestamp()
FROM runlet_checkpoints WHERE id = %(id)s
"""

GET: Final = "SELECT status, data, resolution FROM runlet_checkpoints WHERE id = %(id)s"

RECORDS: Final = "SELECT data FROM runlet_records WHERE checkpoint_id = %(id)s ORDER BY seq"

CLAIM: Final = """
UPDATE runlet_checkpoints
SET status = 'claimed',
    token = %(token)s,
    lease_until = clock_timestamp() + %(lease)s::float8 * interval '1 second'
WHERE id = %(id)s
  AND (status = 'pending'
       OR (status = 'claimed' AND lease_until <= clock_timestamp()))
RETURNING data
"""

# FOR UPDATE: a takeover waits until this transaction's records are committed.
HOLDER: Final = """
SELECT run_id FROM runlet_checkpoints
WHERE id = %(id)s AND status = 'claimed' AND token = %(token)s
FOR UPDATE
"""

RENEW: Final = """
UPDATE runlet_checkpoints
SET lease_until = clock_timestamp() + %(lease)s::float8 * interval '1 second'
WHERE id = %(id)s AND status = 'claimed' AND token = %(token)s
"""

RECORD: Final = """
INSERT INTO runlet_records (checkpoint_id, tool_call_id, run_id, data, decided_at)
VALUES (%(id)s, %(tool_call_id)s, %(run_id)s, %(data)s, %(decided_at)s::timestamptz)
ON CONFLICT (checkpoint_id, tool_call_id) DO UPDATE SET
    data = excluded.data,
    decided_at = excluded.decided_at
"""

RESOLVE: Final = """
UPDATE runlet_checkpoints
SET status = 'resolved',
    token = NULL,
    lease_until = NULL,
    resolution = %(resolution)s,
    finished_at = clock_timestamp()
WHERE id = %(id)s AND status = 'claimed' AND token = %(token)s
"""

RELEASE: Final = """
UPDATE runlet_checkpoints
SET status = 'pending', token = NULL, lease_until = NULL
WHERE id = %(id)s AND status = 'claimed' AND token = %(token)s
"""

CANCEL: Final = """
UPDATE runlet_checkpoints
SET status = 'cancelled',
    token = NULL,
    lease_until = NULL,
    finished_at = coalesce(finished_at, clock_timestamp())
WHERE id = %(id)s
  AND (status IN ('pending', 'cancelled')
       OR (status = 'claimed' AND lease_until <= clock_timestamp()))
"""

DELETE_RECORDS: Final = "DELETE FROM runlet_records WHERE checkpoint_id = %(id)s"

DELETE: Final = "DELETE FROM runlet_checkpoints WHERE id = %(id)s"

SEQ: Final = "SELECT seq FROM runlet_checkpoints WHERE id = %(id)s"

# The metadata pre-filter: every key of %(keys)s is present and the values of %(exact)s
# (strings, ints and booleans, which jsonb compares as Python's check does: 1 is 1.0 and
# true is not 1) are equal.
PAGE: Final = """
SELECT seq, id, metadata::text, data FROM runlet_checkpoints
WHERE status IN ('pending', 'claimed')
  AND seq > %(after)s
  AND (%(agent_name)s::text IS NULL OR agent_name = %(agent_name)s::text)
  AND metadata ?& %(keys)s::text[]
  AND metadata @> %(exact)s::jsonb
ORDER BY seq
LIMIT %(limit)s
"""

DECISIONS: Final = """
SELECT r.data FROM runlet_records AS r
JOIN runlet_checkpoints AS c ON c.id = r.checkpoint_id
WHERE r.run_id = %(run_id)s
ORDER BY c.seq, r.seq
"""

# One statement, one snapshot and one clock reading: the records of exactly the
# checkpoints it deletes.
PURGE: Final = """
WITH gone AS (
    DELETE FROM runlet_checkpoints
    WHERE finished_at <= clock_timestamp() - %(age)s::float8 * interval '1 second'
    RETURNING id),
records AS (
    DELETE FROM runlet_records WHERE checkpoint_id IN (SELECT id FROM gone))
SELECT count(*) FROM gone
"""

STATEMENTS: Final = Statements(
    schema_lock=SCHEMA_LOCK,
    schema_exists=SCHEMA_EXISTS,
    schema_table=SCHEMA_TABLE,
    read_version=READ_VERSION,
    write_version=WRITE_VERSION,
    create=(
        CREATE_CHECKPOINTS,
        CREATE_OPEN_INDEX,
        CREATE_FINISHED_INDEX,
        CREATE_RECORDS,
        CREATE_RECORDS_RUN_INDEX,
    ),
    save=SAVE,
    load=LOAD,
    state=STATE,
    get=GET,
    records=RECORDS,
    claim=CLAIM,
    holder=HOLDER,
    renew=RENEW,
    record=RECORD,
    resolve=RESOLVE,
    release=RELEASE,
    cancel=CANCEL,
    delete_records=DELETE_RECORDS,
    delete=DELETE,
    seq=SEQ,
    page=PAGE,
    decisions=DECISIONS,
    purge_records=None,
    purge=PURGE,
)


# The SQLSTATEs of a server that shut down or ended the session: admin_shutdown,
# crash_shutdown, cannot_connect_now.
_SHUT_DOWN = frozenset({"57P01", "57P02", "57P03"})


class PostgresCheckpointStore(SQLStore):
    """A :class:`~runlet.DurableCheckpointStore` in PostgreSQL, shared by any number of
    workers on any number of machines. Use it as an async context manager::

        async with PostgresCheckpointStore("postgresql://app@db/app") as store:
            runtime = Runtime(checkpoint_store=store)

    Entering opens the connection pool, creates the tables if they are missing (under an
    advisory lock, so workers starting together are safe) and refuses a database whose
    Runlet tables have an unknown schema version; leaving closes the pool. The tables
    live in the connection's ``search_path`` (set it in *conninfo*, e.g.
    ``options=-csearch_path=runlet``, to keep them in their own schema). Checkpoints,
    records and outcomes are kept as JSON text, the run metadata as ``jsonb``.

    Args:
        conninfo: A libpq connection string or URI.
        lease: Seconds a claim lasts without renewal (the resume renews it every third of
            the lease while it works). After a crash, the checkpoint can be taken over
            once the lease has run out, by the server's clock. ``None``: until released,
            never taken over, not even after its process died (see the stores page
            before choosing it).
        min_size: Connections the pool keeps open.
        max_size: Connections the pool opens at most; also how many calls run at once.
        timeout: Seconds to wait for the server when opening, and for a free connection.
        connect_kwargs: Extra keyword arguments for each ``psycopg.connect`` (for
            instance ``{"prepare_threshold": None}`` behind PgBouncer in transaction mode).
        check_connections: Check that a pooled connection is alive (an empty query, one
            more round trip) before each store call. Without the check, a connection that
            died (a restarted server, a proxy timeout) fails the one call that uses it;
            the pool then tests the others it holds and replaces the dead ones. A failed
            resume leaves its checkpoint resumable.

    Raises:
        ~runlet.ConfigurationError: An argument is out of range, or *conninfo* is not a
            connection string.
        ~runlet.StoreSchemaError: On entering, the database holds tables of an unknown schema.

    Entering waits up to *timeout* for the server (one that is still starting, say), then
    raises ``psycopg_pool.PoolTimeout`` if no connection could be made, with the reason
    of one more attempt (of at most 2 seconds) in its message (a wrong password, a
    database that does not exist, a server that cannot be reached). Other database
    failures raise psycopg's own errors.
    """

    _sql = STATEMENTS
    _name = "PostgresCheckpointStore"
    _text_holds_nul = False

    def __init__(
        self,
        conninfo: str,
        *,
        lease: float | None = 60.0,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 30.0,
        connect_kwargs: Mapping[str, Any] | None = None,
        check_connections: bool = False,
    ) -> None:
        super().__init__(lease=lease, connections=max_size, argument="max_size")
        if type(min_size) is not int or not 0 <= min_size <= max_size:
            raise ConfigurationError(
                f"min_size must be an int from 0 to max_size ({max_size}), not {min_size!r}."
            )
        if not is_seconds(timeout, positive=True):
            raise ConfigurationError(
                f"timeout must be a positive number of seconds, not {timeout!r}."
            )
        if not isinstance(conninfo, str):
            raise ConfigurationError(
                f"conninfo must be a libpq connection string or URI (a str), not {conninfo!r}."
            )
        try:
            conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(
                f"conninfo is not a libpq connection string or URI: {str(exc).strip()}. "
                "Write it as 'host=... dbname=... user=...' or 'postgresql://user@host/db'."
            ) from exc
        self._conninfo = conninfo
        self._min_size = min_size
        self._timeout = float(timeout)
        self._kwargs = {**(connect_kwargs or {}), "autocommit": True}
        self._check = psycopg_pool.ConnectionPool.check_connection if check_connections else None
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None

    def __repr__(self) -> str:
        return f"PostgresCheckpointStore(<conninfo>, lease={self._lease!r})"

    @property
    def conninfo(self) -> str:
        """The connection string it was given, to open another store on the same
        database (with the same ``connect_kwargs``, which it does not include). It may
        hold a password: keep it out of logs."""
        return self._conninfo

    def _connect(self) -> None:
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = psycopg_pool.ConnectionPool(
            self._conninfo,
            min_size=self._min_size,
            max_size=self._connections,
            timeout=self._timeout,
            kwargs=self._kwargs,
            check=self._check,
            name="runlet",
            open=False,
        )
        try:
            pool.open(wait=True, timeout=self._timeout)
        except psycopg_pool.PoolTimeout as timed_out:
            pool.close()
            # The pool only logs why it could not connect; one more attempt says why (a
            # wrong password, a database that does not exist, a server still down).
            reason = self._why_not_connected()
            if reason is None:
                raise
            why = str(reason).strip()
            raise psycopg_pool.PoolTimeout(f"{timed_out}; the last attempt: {why}") from reason
        except BaseException:
            pool.close()
            raise
        self._pool = pool

    def _why_not_connected(self) -> psycopg.Error | None:
        """The error of one more connection attempt, bounded in time unless the
        connection settings bound it; ``None`` if it connects after all."""
        params = dict(self._kwargs)
        if "connect_timeout" not in params and "connect_timeout" not in conninfo_to_dict(
            self._conninfo
        ):
            params["connect_timeout"] = 2  # libpq's least: a diagnosis, not another wait
        try:
            psycopg.connect(self._conninfo, **params).close()
        except psycopg.Error as exc:
            return exc
        return None

    def _lost_connection(self, error: Exception) -> bool:
        # A connection that broke (a proxy dropped it, the server crashed) gives no
        # SQLSTATE; a server that shut down or ended it says so (57P01-57P03), and class
        # 08 is a connection exception. Any other SQLSTATE is a statement refused.
        if not isinstance(error, psycopg.OperationalError) or isinstance(
            error, (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed)
        ):
            return False  # a pool that is full or closed lost no connection
        state = error.sqlstate
        return state is None or state.startswith("08") or state in _SHUT_DOWN

    def _disconnect(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    @contextmanager
    def _connection(self, *, write: bool, atomic: bool) -> Iterator[psycopg.Connection[Any]]:
        pool = self._pool
        assert pool is not None
        broken = False
        try:
            # Connections are in autocommit mode: each statement is its own transaction,
            # unless the unit is atomic: then conn.transaction() commits or rolls back.
            with pool.connection() as conn:
                try:
                    if atomic:
                        with conn.transaction():
                            yield conn
                    else:
                        yield conn
                except psycopg.OperationalError:
                    broken = conn.broken
                    raise
        finally:
            if broken:
                # The server went away (a restart, a failover): its other connections in
                # the pool are dead too. Test them now, so that this call is the only one
                # to fail, not one call per pooled connection. The call's own error
                # stands, whatever the check meets (a pool closing, say).
                with suppress(Exception):
                    pool.check()

    def _filter(self, scalars: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        exact = {
            key: value
            for key, value in scalars.items()
            if isinstance(value, (str, int)) and not isinstance(value, float)
        }
        return {"exact": dumps(exact), "keys": list(keys)}
