"""A durable checkpoint store in one SQLite file: for one machine, standard library only.

Any number of processes on the machine can share the file: claims are atomic (each write
is a ``BEGIN IMMEDIATE`` transaction, so writers take turns, waiting up to
``busy_timeout`` for each other) and leases are computed by SQLite from the machine's
clock. The file is in WAL mode with ``synchronous=FULL``, so a committed claim, record or
resolution survives a crash of the process and of the machine. Do not put the file on a
network file system: SQLite's locking is not reliable there; use
:mod:`runlet.stores.postgres` for workers on several machines.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Final

from .._errors import ConfigurationError
from .._util import is_seconds
from ._sql import SQLStore, Statements, dumps

__all__ = ["SQLiteCheckpointStore"]

# The lease arithmetic is in seconds since the epoch, from SQLite's clock:
# (julianday('now') - 2440587.5) * 86400.0. It is written out in each statement below.

SCHEMA_EXISTS: Final = (
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'runlet_schema'"
)

SCHEMA_TABLE: Final = "CREATE TABLE IF NOT EXISTS runlet_schema (version INTEGER NOT NULL)"

READ_VERSION: Final = "SELECT version FROM runlet_schema"

WRITE_VERSION: Final = "INSERT INTO runlet_schema (version) VALUES (:version)"

# created_at (checkpoints) and decided_at (records) are written for operators' own
# queries (dashboards, audits); the store itself orders by seq (checkpoints as saved,
# records as recorded), which no worker's clock can reorder.
CREATE_CHECKPOINTS: Final = """
CREATE TABLE IF NOT EXISTS runlet_checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    run_id TEXT NOT NULL,
    agent_name TEXT NOT NULL,
    status TEXT NOT NULL
        CHECK (status IN ('pending', 'claimed', 'resolved', 'cancelled')),
    token TEXT,
    lease_until REAL,
    data TEXT NOT NULL,
    metadata TEXT NOT NULL,
    resolution TEXT,
    created_at REAL NOT NULL,
    finished_at REAL
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
    checkpoint_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    data TEXT NOT NULL,
    decided_at TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, tool_call_id)
)
"""

CREATE_RECORDS_RUN_INDEX: Final = """
CREATE INDEX IF NOT EXISTS runlet_records_run ON runlet_records (run_id)
"""

SAVE: Final = """
INSERT INTO runlet_checkpoints (id, run_id, agent_name, status, data, metadata, created_at)
VALUES (:id, :run_id, :agent_name, 'pending', :data, :metadata,
        (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (id) DO UPDATE SET
    run_id = excluded.run_id,
    agent_name = excluded.agent_name,
    data = excluded.data,
    metadata = excluded.metadata
"""

LOAD: Final = "SELECT status, data FROM runlet_checkpoints WHERE id = :id"

STATE: Final = """
SELECT status, resolution,
       lease_until IS NULL OR lease_until > (julianday('now') - 2440587.5) * 86400.0
FROM runlet_checkpoints WHERE id = :id
"""

GET: Final = "SELECT status, data, resolution FROM runlet_checkpoints WHERE id = :id"

RECORDS: Final = "SELECT data FROM runlet_records WHERE checkpoint_id = :id ORDER BY rowid"

CLAIM: Final = """
UPDATE runlet_checkpoints
SET status = 'claimed',
    token = :token,
    lease_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE id = :id
  AND (status = 'pending'
       OR (status = 'claimed'
           AND lease_until <= (julianday('now') - 2440587.5) * 86400.0))
RETURNING data
"""

HOLDER: Final = """
SELECT run_id FROM runlet_checkpoints
WHERE id = :id AND status = 'claimed' AND token = :token
"""

RENEW: Final = """
UPDATE runlet_checkpoints
SET lease_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE id = :id AND status = 'claimed' AND token = :token
"""

RECORD: Final = """
INSERT INTO runlet_records (checkpoint_id, tool_call_id, run_id, data, decided_at)
VALUES (:id, :tool_call_id, :run_id, :data, :decided_at)
ON CONFLICT (checkpoint_id, tool_call_id) DO UPDATE SET
    data = excluded.data,
    decided_at = excluded.decided_at
"""

RESOLVE: Final = """
UPDATE runlet_checkpoints
SET status = 'resolved',
    token = NULL,
    lease_until = NULL,
    resolution = :resolution,
    finished_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :id AND status = 'claimed' AND token = :token
"""

RELEASE: Final = """
UPDATE runlet_checkpoints
SET status = 'pending', token = NULL, lease_until = NULL
WHERE id = :id AND status = 'claimed' AND token = :token
"""

CANCEL: Final = """
UPDATE runlet_checkpoints
SET status = 'cancelled',
    token = NULL,
    lease_until = NULL,
    finished_at = coalesce(finished_at, (julianday('now') - 2440587.5) * 86400.0)
WHERE id = :id
  AND (status IN ('pending', 'cancelled')
       OR (status = 'claimed'
           AND lease_until <= (julianday('now') - 2440587.5) * 86400.0))
"""

DELETE_RECORDS: Final = "DELETE FROM runlet_records WHERE checkpoint_id = :id"

DELETE: Final = "DELETE FROM runlet_checkpoints WHERE id = :id"

SEQ: Final = "SELECT seq FROM runlet_checkpoints WHERE id = :id"

# The metadata pre-filter: every key of :keys is present, and every scalar of :scalars
# has an equal atom (SQLite compares 1, 1.0 and true as Python does).
PAGE: Final = """
SELECT c.seq, c.id, c.metadata, c.data FROM runlet_checkpoints AS c
WHERE c.status IN ('pending', 'claimed')
  AND c.seq > :after
  AND (:agent_name IS NULL OR c.agent_name = :agent_name)
  AND NOT EXISTS (
      SELECT 1 FROM json_each(:keys) AS k
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(c.metadata) AS m WHERE m.key = k.value))
  AND NOT EXISTS (
      SELECT 1 FROM json_each(:scalars) AS w
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(c.metadata) AS m
          WHERE m.key = w.key AND m.atom = w.atom))
ORDER BY c.seq
LIMIT :limit
"""

DECISIONS: Final = """
SELECT r.data FROM runlet_records AS r
JOIN runlet_checkpoints AS c ON c.id = r.checkpoint_id
WHERE r.run_id = :run_id
ORDER BY c.seq, r.rowid
"""

PURGE_CUTOFF: Final = "SELECT (julianday('now') - 2440587.5) * 86400.0 - :age"

# One batch: the oldest :batch finished checkpoints up to :cutoff, the same ones in both
# statements (one transaction, and no other writer meanwhile).
_PURGED = """
    SELECT id FROM runlet_checkpoints
    WHERE finished_at <= :cutoff
    ORDER BY finished_at, seq
    LIMIT :batch"""

PURGE_RECORDS: Final = f"DELETE FROM runlet_records WHERE checkpoint_id IN ({_PURGED})"

PURGE: Final = f"DELETE FROM runlet_checkpoints WHERE id IN ({_PURGED})"

# A purge writes at most this many checkpoints per transaction: a backlog of months
# would otherwise hold the database's one write lock for many seconds.
PURGE_BATCH: Final = 500

BEGIN: Final = "BEGIN"
BEGIN_IMMEDIATE: Final = "BEGIN IMMEDIATE"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
JOURNAL_MODE: Final = "PRAGMA journal_mode"
JOURNAL_MODE_WAL: Final = "PRAGMA journal_mode = WAL"
SYNCHRONOUS_FULL: Final = "PRAGMA synchronous = FULL"

STATEMENTS: Final = Statements(
    schema_lock=None,
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
    purge_records=PURGE_RECORDS,
    purge=PURGE,
    purge_cutoff=PURGE_CUTOFF,
    purge_batch=PURGE_BATCH,
)

# UPDATE ... RETURNING arrived in SQLite 3.35 (2021).
_MIN_SQLITE = (3, 35, 0)
# list_pending filters by metadata with json_each(): built in since SQLite 3.38, an
# option (JSON1) of the build before, which nearly every build turns on.
_JSON_PROBE = "SELECT count(*) FROM json_each('[1]')"
_checked_sqlite: list[bool] = []


def _check_sqlite() -> None:
    """Refuse, once per process, a SQLite the store cannot work with."""
    if _checked_sqlite:
        return
    if sqlite3.sqlite_version_info < _MIN_SQLITE:  # pragma: no cover - old platforms
        raise ConfigurationError(
            f"SQLiteCheckpointStore needs SQLite 3.35 or newer; this Python has "
            f"{sqlite3.sqlite_version}. Use a newer Python build."
        )
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute(_JSON_PROBE)
    except sqlite3.OperationalError as exc:
        raise ConfigurationError(
            f"SQLiteCheckpointStore needs SQLite's JSON functions, which this Python's "
            f"SQLite {sqlite3.sqlite_version} was built without ({exc}). They are built in "
            "from SQLite 3.38 on; use a Python linked against such a SQLite, or one built "
            "with JSON1."
        ) from None
    finally:
        probe.close()
    _checked_sqlite.append(True)


_SQLITE_READONLY: Final = 8  # the primary result code of every "readonly" error


def _read_only(error: sqlite3.OperationalError) -> bool:
    """Whether *error* is SQLite's "attempt to write a readonly database" (or another
    SQLITE_READONLY error)."""
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return bool(code & 0xFF == _SQLITE_READONLY)
    return "readonly" in str(error)  # pragma: no cover - Python 3.10


class SQLiteCheckpointStore(SQLStore):
    """A :class:`~runlet.DurableCheckpointStore` in a SQLite file, shared by any number of
    processes on one machine. Use it as an async context manager::

        async with SQLiteCheckpointStore("checkpoints.db") as store:
            runtime = Runtime(checkpoint_store=store)

    Entering creates the tables if they are missing (safe when several processes start at
    once) and refuses a file whose Runlet tables have an unknown schema version. Every
    call runs in a worker thread; checkpoints, records and outcomes are kept as JSON
    text. Resolved and cancelled checkpoints are kept (so a repeated resume returns the
    stored result) until :meth:`delete` or :meth:`purge_resolved`.

    Args:
        path: The database file (created if missing). ``":memory:"`` keeps everything
            in one private in-memory database, for tests.
        lease: Seconds a claim lasts without renewal (the resume renews it every third of
            the lease while it works). After a crash, the checkpoint can be taken over
            once the lease has run out. ``None``: until released, never taken over, not
            even after its process died (see the stores page before choosing it).
        busy_timeout: Seconds a write waits for another process's write before SQLite
            gives up with ``sqlite3.OperationalError: database is locked``.
        connections: Connections (and so worker threads) the store uses at most.

    Raises:
        ~runlet.ConfigurationError: An argument is out of range, or Python's SQLite is older
            than 3.35 or lacks its JSON functions (built in from 3.38); on entering, the
            file cannot be opened (its directory is missing, or it is not a SQLite
            database); on any call, the file was deleted or replaced since the store
            opened it (open a new store once it is back).
        ~runlet.StoreSchemaError: On entering, the file holds tables of an unknown schema.
    """

    _sql = STATEMENTS
    _name = "SQLiteCheckpointStore"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease: float | None = 60.0,
        busy_timeout: float = 10.0,
        connections: int = 4,
    ) -> None:
        _check_sqlite()
        if not is_seconds(busy_timeout):
            raise ConfigurationError(
                f"busy_timeout must be a non-negative number of seconds, not {busy_timeout!r}."
            )
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigurationError(
                f"path must be the database file's path (a str or a Path), not {path!r}."
            )
        self._path = os.fspath(path)
        self._memory = memory = self._path in ("", ":memory:")
        # Where connections open the file: the path made absolute when the store opens,
        # so a later os.chdir() (a daemon's, say) neither sends new connections to
        # another file nor makes the file look deleted.
        self._where = self._path
        super().__init__(lease=lease, connections=1 if memory else connections)
        self._busy_timeout = float(busy_timeout)
        self._idle: list[sqlite3.Connection] = []
        self._idle_lock = threading.Lock()
        self._closed = False  # set when the store closes: connections given back close
        # The file the store opened, as (device, inode), for files (not ":memory:"): a
        # file deleted or replaced under the store is refused (see _check_file).
        self._file: tuple[int, int] | None = None
        self._write_lock = threading.Lock()
        # At most *connections* connections in use, whatever the event loops (each has
        # its own limiter) and threads that call: a private database has only one.
        self._slots = threading.Semaphore(self._connections)

    def __repr__(self) -> str:
        return f"SQLiteCheckpointStore({self._path!r}, lease={self._lease!r})"

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def _connect(self) -> None:
        memory = self._memory
        # Joined, not normalised: "link/../db" is where the link leads, as for SQLite.
        self._where = self._path if memory else os.path.join(os.getcwd(), self._path)
        try:
            conn = self._new()
        except sqlite3.DatabaseError as exc:
            # Only the failures of opening a file are the path's fault; "locked", a full
            # disk or an I/O error stay SQLite's own errors.
            if "unable to open" not in str(exc) and "not a database" not in str(exc):
                raise
            raise ConfigurationError(
                f"Could not open the SQLite database {self._path!r}: {exc}. Check that its "
                "directory exists and is writable, and that the file (if any) is a SQLite "
                "database."
            ) from exc
        if not memory:
            try:
                found = os.stat(self._where)
            except OSError:  # pragma: no cover - deleted the instant it was opened
                conn.close()
                raise
            self._file = (found.st_dev, found.st_ino)
        with self._idle_lock:
            self._closed = False
            self._idle.append(conn)

    def _check_file(self) -> None:
        """Refuse to go on if the database file was deleted or replaced since the store
        opened it. The store's connections would go on reading and writing the old file,
        which nobody else sees and which is gone once they close: a checkpoint saved
        there would be reported as saved and then lost. A new connection would open (or
        create) the new file at the path: another database."""
        if self._file is None:
            return
        try:
            found = os.stat(self._where)
        except (FileNotFoundError, NotADirectoryError):
            what = "was deleted"
        else:
            if (found.st_dev, found.st_ino) == self._file:
                return
            what = "was replaced by another file"
        raise ConfigurationError(
            f"The SQLite database {self._path!r} {what} while this store had it open, so the "
            "store refuses to read or write it (its connections still hold the old file, "
            "which nothing else sees); nothing was written. Put the database back at its "
            "path (restore it from a backup if it was deleted) and open the store again: "
            "this one stays unusable."
        )

    def _new(self) -> sqlite3.Connection:
        # isolation_level=None: the store issues BEGIN / COMMIT itself. The connection
        # moves between worker threads, but only one uses it at a time (the idle list).
        conn = sqlite3.connect(
            self._where,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._use_wal(conn)
            conn.execute(SYNCHRONOUS_FULL)
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        # WAL is a property of the file, set once. Switching to it needs the database to
        # itself, and SQLite answers "database is locked" at once (its busy handler does
        # not cover this) when several processes open a new file together: retry, with
        # backoff, for up to the busy timeout. This runs in a worker thread, never on the
        # event loop.
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.005
        while True:
            try:
                if conn.execute(JOURNAL_MODE).fetchone()[0].lower() != "wal":
                    conn.execute(JOURNAL_MODE_WAL)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _disconnect(self) -> None:
        with self._idle_lock:
            idle, self._idle = self._idle, []
            self._closed = True  # a call still under way closes its connection itself
        for conn in idle:
            conn.close()

    def _take(self) -> sqlite3.Connection:
        with self._idle_lock:
            if self._idle:
                return self._idle.pop()
        return self._new()

    def _give(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:  # a failed ROLLBACK: never reuse it
            conn.close()
            return
        with self._idle_lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def _connection(self, *, write: bool, atomic: bool) -> Iterator[sqlite3.Connection]:
        # Every write takes the write lock up front (BEGIN IMMEDIATE), so it waits for
        # other writers with the busy timeout instead of failing half-way. Writers of this
        # process queue on a thread lock first: SQLite's busy handler waits by sleeping
        # (up to 100 ms at a time), which is right between processes but slow within one.
        with (
            self._write_lock if write else nullcontext(),
            self._transaction(write=write, atomic=atomic) as conn,
        ):
            yield conn

    @contextmanager
    def _transaction(self, *, write: bool, atomic: bool) -> Iterator[sqlite3.Connection]:
        with self._slots, self._connected(write=write, atomic=atomic) as conn:
            yield conn

    @contextmanager
    def _connected(self, *, write: bool, atomic: bool) -> Iterator[sqlite3.Connection]:
        self._check_file()  # before _take(), which may connect: and so create a new file
        conn = self._take()
        keep = True
        try:
            if write:
                conn.execute(BEGIN_IMMEDIATE)
            elif atomic:
                conn.execute(BEGIN)
            try:
                yield conn
                if conn.in_transaction:
                    if write:
                        self._check_file()  # not committed into a file that is gone
                    conn.execute(COMMIT)
            finally:
                if conn.in_transaction:
                    conn.execute(ROLLBACK)
        except sqlite3.OperationalError as exc:
            # SQLite opens a file it may not write (read-only then: permissions, an
            # immutable file, a read-only mount) read-only, and such a connection stays
            # so when the file is writable again: a new one is opened next time.
            keep = not _read_only(exc)
            raise
        finally:
            if keep:
                self._give(conn)
            else:
                conn.close()

    def _filter(self, scalars: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        return {"scalars": dumps(scalars), "keys": dumps(list(keys))}
