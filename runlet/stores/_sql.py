"""What the SQL stores share: each protocol method as one short transaction of named
statements, run in a worker thread.

A store module supplies its :class:`Statements` (every SQL text it runs, as constants),
its connections and its transactions; nothing here builds SQL. The claim is one
conditional ``UPDATE … RETURNING`` whose lease arithmetic uses the database clock; every
write after a claim names the token in its ``WHERE`` clause, so a write by a resume that
lost its lease changes nothing and raises :class:`~runlet.LeaseLostError`.

Threads: every database call runs in an anyio worker thread, at most as many at once as
the store has connections (a capacity limiter). A worker thread always runs its whole
transaction to the end (commit or rollback) before it returns, because the calls do not
abandon their thread on cancellation: a cancelled call takes effect once the thread is
done, so no connection is ever left inside a transaction.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
import attrs

from .._checkpoint import (
    Checkpoint,
    structure,
    structure_checkpoint,
    unstructure,
    unstructure_checkpoint,
)
from .._errors import CheckpointSerializationError, ConfigurationError, StoreSchemaError
from .._human import Decision
from .._store import (
    CallRecord,
    Claim,
    PendingRequest,
    Resolution,
    StoredCheckpoint,
    cancel_claimed_error,
    cancelled_error,
    check_agent_filter,
    check_lease,
    check_limit,
    check_metadata_filter,
    claimed_error,
    lease_lost,
    metadata_matches,
    new_token,
    not_found,
    resolved_error,
    retired_error,
)
from .._util import PerLoop, is_cancellation, is_seconds, or_warn, to_the_end

__all__ = ["SCHEMA_VERSION", "Connection", "SQLStore", "Statements", "dumps"]

_THOUSAND_YEARS: Final = 1000 * 365.25 * 24 * 3600
# Seconds a batched purge waits between batches (see Statements.purge_batch): longer
# than the 100 ms SQLite's busy handler sleeps between its tries, so a writer that has
# waited a while finds the lock free at its next try.
_PURGE_PAUSE: Final = 0.15


async def _between_batches() -> None:
    """Other processes' writes wait for the lock while a batch runs: give them a turn."""
    await anyio.sleep(_PURGE_PAUSE)


SCHEMA_VERSION: Final = 1
"""The version of the tables the stores create, kept in ``runlet_schema``."""

Connection = Any
"""A DB-API connection (``sqlite3.Connection``, ``psycopg.Connection``): both have
``execute(sql, params)`` returning a cursor with ``fetchone``, ``fetchall``, ``rowcount``."""

T = TypeVar("T")
S = TypeVar("S", bound="SQLStore")

# A claim that a concurrent writer changed between the conditional UPDATE and the SELECT
# that explains its failure (PostgreSQL, READ COMMITTED) is tried again this many times.
_CLAIM_ATTEMPTS = 5


# Event loops whose limiters a store keeps; the oldest goes first. A loop dropped while
# it still has calls under way only lets a few more run at once.
_LOOPS_KEPT: Final = 64


@attrs.frozen(kw_only=True)
class Statements:
    """Every SQL text one store runs; named parameters are the same across stores."""

    schema_lock: str | None
    schema_exists: str
    schema_table: str
    read_version: str
    write_version: str
    create: tuple[str, ...]
    save: str
    load: str
    state: str
    get: str
    records: str
    claim: str
    holder: str
    renew: str
    record: str
    resolve: str
    release: str
    cancel: str
    delete_records: str
    delete: str
    seq: str
    page: str
    decisions: str
    # None: the purge statement deletes the records too, and returns the count.
    purge_records: str | None
    purge: str
    # SQLite: one writer at a time, so a purge goes in batches of *purge_batch*
    # checkpoints, with a pause between them for the other writers; *purge_cutoff*
    # fixes the purge's "now" once, so every batch deletes up to the same instant.
    purge_cutoff: str | None = None
    purge_batch: int | None = None


class SQLStore:
    """The durable store protocol on a SQL database (the shared part of the SQLite and
    PostgreSQL stores)."""

    _sql: Statements
    _name: str
    # Whether the database's text columns can hold U+0000 (PostgreSQL's cannot).
    _text_holds_nul = True
    # Checkpoints are kept as JSON: a Runtime refuses a run's non-JSON options and
    # metadata when the run starts, before any tool runs.
    _keeps_json = True

    def __init__(
        self, *, lease: float | None, connections: int, argument: str = "connections"
    ) -> None:
        """*argument* names the store's own argument that set *connections*, for errors."""
        check_lease(lease)
        if type(connections) is not int or connections < 1:
            raise ConfigurationError(
                f"{argument} is the number of connections and must be a positive int, "
                f"not {connections!r}."
            )
        self._lease = lease
        self._connections = connections
        self._entered = False
        # Set while __aenter__ opens the store, so that a second enter meanwhile (another
        # task, or another thread's loop) is refused rather than opening it twice.
        self._opening = False
        self._enter_lock = threading.Lock()
        # How many calls each event loop runs at once: one limiter per loop (by its anyio
        # token), as a limiter belongs to the loop (and backend) that made it. A store
        # shared by threads that each run a loop (a sync web framework's workers) then
        # never wakes one loop's waiter from another's thread.
        self._limiters: PerLoop[anyio.CapacityLimiter] = PerLoop(_LOOPS_KEPT)

    # -- what a store module supplies ----------------------------------------------------

    def _connect(self) -> None:
        """Open the connections (in a worker thread)."""
        raise NotImplementedError

    def _disconnect(self) -> None:
        """Close every connection (in a worker thread)."""
        raise NotImplementedError

    def _connection(self, *, write: bool, atomic: bool) -> AbstractContextManager[Connection]:
        """A connection for a unit of work that writes (*write*) or only reads, and whose
        statements must form one transaction (*atomic*). A store may run the statements
        of a non-atomic unit each on its own (PostgreSQL autocommit), saving the round
        trips of BEGIN and COMMIT; SQLite always wraps writes in ``BEGIN IMMEDIATE``."""
        raise NotImplementedError

    def _filter(self, scalars: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        """Parameters of the ``page`` statement's metadata pre-filter: rows whose
        metadata has every key of *keys*, and equal values for *scalars* where the
        database compares them as Python does. Python checks the rows it returns."""
        raise NotImplementedError

    def _unstorable(self, text: object) -> bool:
        """Whether *text* is a value no row can hold (not a string, a lone surrogate, or
        on PostgreSQL U+0000), so a lookup by it finds nothing and the database is not
        asked (the drivers refuse such a query)."""
        if text is None:
            return False
        if not isinstance(text, str):
            return True
        return (not self._text_holds_nul and "\x00" in text) or _not_utf8(text)

    def _params(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """The parameters that save *checkpoint*, after refusing values its text columns
        cannot hold."""
        _refuse_untextual(checkpoint, self._name, nul=not self._text_holds_nul)
        return _checkpoint_params(checkpoint)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def lease(self) -> float | None:
        """Seconds a claim lasts without renewal; ``None`` means until released."""
        return self._lease

    async def __aenter__(self: S) -> S:
        with self._enter_lock:
            if self._entered or self._opening:
                raise ConfigurationError(f"This {self._name} is already open; enter it once.")
            self._opening = True
        try:
            try:
                # A cancellation that came meanwhile is raised once it has opened.
                await to_the_end(partial(anyio.to_thread.run_sync, self._open))
            except BaseException as exc:
                if isinstance(exc, Exception) and not is_cancellation(exc):
                    raise  # opening failed, and closed what it opened
                # Cancelled, or Ctrl-C: the thread may have finished opening before it
                # took effect.
                await to_the_end(partial(anyio.to_thread.run_sync, self._disconnect))
                raise
            self._entered = True
        finally:
            self._opening = False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._entered = False
        self._limiters.clear()
        await to_the_end(partial(anyio.to_thread.run_sync, self._disconnect))

    def _open(self) -> None:
        self._connect()
        try:
            with self._connection(write=True, atomic=True) as conn:
                self._check_schema(conn)
        except BaseException:
            self._disconnect()
            raise

    def _check_schema(self, conn: Connection) -> None:
        sql = self._sql
        if sql.schema_lock is not None:
            conn.execute(sql.schema_lock)
        # Created only when missing, so a role that may only read and write the tables
        # (PostgreSQL checks CREATE even for CREATE TABLE IF NOT EXISTS) can open them.
        if not conn.execute(sql.schema_exists).fetchone()[0]:
            conn.execute(sql.schema_table)
        found = {row[0] for row in conn.execute(sql.read_version).fetchall()}
        if not found:
            for statement in sql.create:
                conn.execute(statement)
            conn.execute(sql.write_version, {"version": SCHEMA_VERSION})
        elif found != {SCHEMA_VERSION}:
            shown = ", ".join(str(version) for version in sorted(found, key=str))
            raise StoreSchemaError(
                f"This database holds Runlet store tables of schema version {shown}, but this "
                f"Runlet knows version {SCHEMA_VERSION} only. Use the Runlet release that "
                "created them (or a newer one), or point the store at another database. "
                "Nothing was changed.",
                found=next(iter(found)) if len(found) == 1 else tuple(sorted(found, key=str)),
                expected=SCHEMA_VERSION,
            )

    def _lost_connection(self, error: Exception) -> bool:
        """Whether *error* says the connection died (the database may be back by now),
        rather than that the database refused the statement."""
        return False

    async def _run(self, work: Callable[[], T]) -> T:
        if not self._entered:
            raise ConfigurationError(
                f"This {self._name} is not open. Use it as an async context manager: "
                f"`async with {self._name}(...) as store:` and use the store inside the block."
            )
        limiter = self._limiters.this_loop()
        if limiter is None:
            limiter = self._limiters.this_loop_or(self._limiter)
        return await anyio.to_thread.run_sync(work, limiter=limiter)

    def _limiter(self) -> anyio.CapacityLimiter:
        return anyio.CapacityLimiter(self._connections)

    # -- the three-method protocol -------------------------------------------------------

    async def save(self, checkpoint: Checkpoint) -> None:
        """Store *checkpoint* as pending (replacing the data of one with the same id,
        whose state is kept).

        Raises:
            ~runlet.CheckpointSerializationError: The checkpoint holds data that is not
                JSON, or (PostgreSQL) an id or agent name with the character U+0000.
        """

        def work() -> None:
            params = self._params(checkpoint)
            with self._connection(write=True, atomic=False) as conn:
                conn.execute(self._sql.save, params)

        await self._run(work)

    async def load(self, checkpoint_id: str) -> Checkpoint:
        """Return the checkpoint while it waits for an answer (pending or claimed).

        Raises:
            ~runlet.CheckpointNotFoundError: There is none with this id, or a resume
                finished with it (it is retired; :meth:`get` still shows it).
            ~runlet.CheckpointCancelledError: It was cancelled.
        """
        if self._unstorable(checkpoint_id):
            raise not_found(checkpoint_id)

        def work() -> Checkpoint:
            with self._connection(write=False, atomic=False) as conn:
                row = conn.execute(self._sql.load, {"id": checkpoint_id}).fetchone()
            if row is None:
                raise not_found(checkpoint_id)
            if row[0] == "cancelled":
                raise cancelled_error(checkpoint_id)
            if row[0] == "resolved":
                raise retired_error(checkpoint_id)
            return _checkpoint(row[1])

        return await self._run(work)

    async def delete(self, checkpoint_id: str) -> None:
        """Forget the checkpoint with its records and outcome; nothing if there is none."""
        if self._unstorable(checkpoint_id):
            return

        def work() -> None:
            with self._connection(write=True, atomic=True) as conn:
                # The checkpoint first: its row lock makes a concurrent record() wait
                # and then find no holder, so no record is left behind.
                conn.execute(self._sql.delete, {"id": checkpoint_id})
                conn.execute(self._sql.delete_records, {"id": checkpoint_id})

        await self._run(work)

    # -- the durable protocol ------------------------------------------------------------

    async def get(self, checkpoint_id: str) -> StoredCheckpoint:
        """The checkpoint with its status, records and resolution.

        Raises:
            ~runlet.CheckpointNotFoundError: There is none with this id.
        """
        if self._unstorable(checkpoint_id):
            raise not_found(checkpoint_id)

        def work() -> StoredCheckpoint:
            with self._connection(write=False, atomic=False) as conn:
                row = conn.execute(self._sql.get, {"id": checkpoint_id}).fetchone()
                if row is None:
                    raise not_found(checkpoint_id)
                records = conn.execute(self._sql.records, {"id": checkpoint_id}).fetchall()
            status, data, resolution = row
            return StoredCheckpoint(
                checkpoint=_checkpoint(data),
                status=status,
                records=_records(records),
                resolution=None if resolution is None else _resolution(resolution),
            )

        return await self._run(work)

    async def claim(self, checkpoint_id: str) -> Claim:
        """Take the checkpoint for one resume, in one conditional ``UPDATE``: it succeeds
        when the checkpoint is pending, or claimed under a lease that has run out by the
        database's clock. A cancelled call gives the claim back before it re-raises.

        Raises:
            ~runlet.CheckpointNotFoundError: There is none with this id.
            ~runlet.CheckpointCancelledError: It was cancelled.
            ~runlet.CheckpointResolvedError: It was already resolved (``.resolution`` holds how).
            ~runlet.CheckpointClaimedError: Another claim holds it and its lease has not run out.
        """
        if self._unstorable(checkpoint_id):
            raise not_found(checkpoint_id)
        token = new_token()
        params = {"id": checkpoint_id, "token": token, "lease": self._lease}

        def work() -> Claim:
            with self._connection(write=True, atomic=False) as conn:
                for _ in range(_CLAIM_ATTEMPTS):
                    row = conn.execute(self._sql.claim, params).fetchone()
                    if row is not None:
                        return self._claimed(conn, row[0], params)
                    self._refuse(conn, checkpoint_id, cancelling=False)
            raise claimed_error(checkpoint_id)  # pragma: no cover - five lost races in a row

        try:
            # A cancellation that arrived while the thread ran is raised after it (by
            # to_the_end), so no claim goes to a caller who will never see it.
            return await to_the_end(partial(self._run, work))
        except BaseException as exc:
            if (
                isinstance(exc, Exception)
                and not is_cancellation(exc)
                and not self._lost_connection(exc)
            ):
                raise  # the claim was refused: nothing to give back
            # Cancelled, or Ctrl-C, or the connection died (after the claim committed,
            # maybe): the claim may have been taken, and nobody holds that token, so give
            # the checkpoint back instead of waiting a lease (to its end, even under
            # asyncio's own Task.cancel()). The token makes it a no-op if it was not.
            await to_the_end(
                partial(
                    or_warn,
                    partial(self.release, checkpoint_id, token),
                    "A claim on checkpoint %r was cancelled or lost its connection, and "
                    "giving it back failed; if it was taken, it stays claimed until the "
                    "lease runs out: %s",
                    checkpoint_id,
                )
            )
            raise

    async def renew(self, checkpoint_id: str, token: str) -> None:
        """Extend the claim's lease by :attr:`lease` seconds from now (database clock).

        Raises:
            ~runlet.LeaseLostError: *token* no longer holds the checkpoint.
        """
        if self._unstorable(checkpoint_id) or self._unstorable(token):
            raise lease_lost(checkpoint_id)
        params = {"id": checkpoint_id, "token": token, "lease": self._lease}

        def work() -> None:
            with self._connection(write=True, atomic=False) as conn:
                renewed = conn.execute(self._sql.renew, params).rowcount
            if renewed != 1:
                raise lease_lost(checkpoint_id)

        await self._run(work)

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        """Add or replace (by ``tool_call_id``) records of the checkpoint, in one
        transaction that first checks the token.

        Raises:
            ~runlet.LeaseLostError: *token* no longer holds the checkpoint.
        """
        if self._unstorable(checkpoint_id) or self._unstorable(token):
            raise lease_lost(checkpoint_id)
        for index, record in enumerate(records):
            if self._unstorable(record.tool_call_id):
                path = f"records[{index}].tool_call_id"
                raise _text_error(path, record.tool_call_id, self._name)
        rows = [
            {
                "id": checkpoint_id,
                "tool_call_id": record.tool_call_id,
                "data": dumps(unstructure(record)),
                "decided_at": record.decision.decided_at.isoformat(),
            }
            for record in records
        ]

        def work() -> None:
            with self._connection(write=True, atomic=True) as conn:
                held = conn.execute(self._sql.holder, {"id": checkpoint_id, "token": token})
                row = held.fetchone()
                if row is None:
                    raise lease_lost(checkpoint_id)
                for params in rows:
                    conn.execute(self._sql.record, {**params, "run_id": row[0]})

        try:
            await self._run(work)
        except Exception as exc:
            if not self._lost_connection(exc):
                raise
            # The connection died under the write (a server restart, a failover), maybe
            # right after an approved handler ran: write once more, on a fresh connection,
            # rather than leave a finished call to come back as outcome unknown. Writing a
            # record twice is harmless: the second replaces the first with the same data.
            await self._run(work)

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        """Mark the checkpoint resolved with *resolution* and save *next_checkpoint* as
        pending, in one transaction.

        Raises:
            ~runlet.LeaseLostError: *token* no longer holds the checkpoint.
        """
        if self._unstorable(checkpoint_id) or self._unstorable(token):
            raise lease_lost(checkpoint_id)
        params = {"id": checkpoint_id, "token": token}

        def work() -> None:
            params["resolution"] = dumps(unstructure(resolution))
            after = None if next_checkpoint is None else self._params(next_checkpoint)
            with self._connection(write=True, atomic=after is not None) as conn:
                if conn.execute(self._sql.resolve, params).rowcount != 1:
                    raise lease_lost(checkpoint_id)
                if after is not None:
                    conn.execute(self._sql.save, after)

        await self._run(work)

    async def release(self, checkpoint_id: str, token: str) -> None:
        """Give the claim back, so the checkpoint is pending again (records are kept).
        Does nothing if *token* no longer holds it."""
        if self._unstorable(checkpoint_id) or self._unstorable(token):
            return

        def work() -> None:
            with self._connection(write=True, atomic=False) as conn:
                conn.execute(self._sql.release, {"id": checkpoint_id, "token": token})

        await self._run(work)

    async def cancel(self, checkpoint_id: str) -> None:
        """Retire the checkpoint without resolving it; cancelling twice is fine.

        Raises:
            ~runlet.CheckpointNotFoundError: There is none with this id.
            ~runlet.CheckpointClaimedError: A resume holds it right now (its lease holds).
            ~runlet.CheckpointResolvedError: It was already resolved.
        """
        if self._unstorable(checkpoint_id):
            raise not_found(checkpoint_id)

        def work() -> None:
            with self._connection(write=True, atomic=False) as conn:
                for _ in range(_CLAIM_ATTEMPTS):
                    if conn.execute(self._sql.cancel, {"id": checkpoint_id}).rowcount == 1:
                        return
                    self._refuse(conn, checkpoint_id, cancelling=True)
            raise claimed_error(checkpoint_id)  # pragma: no cover - five lost races in a row

        await self._run(work)

    async def list_pending(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        agent_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Sequence[PendingRequest]:
        """Checkpoints waiting for an answer (pending or claimed), oldest first.

        Args:
            limit: At most this many.
            after: The last ``checkpoint_id`` of the previous page.
            agent_name: Only this agent's.
            metadata: Only runs whose metadata has each of these top-level keys with an
                equal value.

        Raises:
            ~runlet.CheckpointNotFoundError: *after* names no checkpoint of this store.
            ~runlet.ConfigurationError: *limit* is not a positive int.
        """
        check_limit(limit)
        check_agent_filter(agent_name)
        check_metadata_filter(metadata)
        if after is not None and self._unstorable(after):
            raise not_found(after)
        wanted = dict(metadata) if metadata else {}
        prefilter = None if self._unstorable(agent_name) else _prefilter(wanted)

        def work() -> list[PendingRequest]:
            with self._connection(write=False, atomic=False) as conn:
                start = 0
                if after is not None:
                    row = conn.execute(self._sql.seq, {"id": after}).fetchone()
                    if row is None:
                        raise not_found(after)
                    start = row[0]
                if prefilter is None:
                    return []
                # A limit beyond any table's size means "all": the databases' own
                # integers stop at 2**63.
                page = min(limit, _ALL)
                params = {"agent_name": agent_name, "limit": page, **self._filter(*prefilter)}
                # When the metadata column holds every entry asked for, the rows are
                # checked on it, and only the checkpoints that match are read.
                by_column = len(prefilter[1]) == len(wanted)
                return _pages(conn, self._sql.page, params, start, wanted, page, by_column)

        return await self._run(work)

    async def decisions(self, run_id: str) -> Sequence[Decision]:
        """Every decision recorded for the run's checkpoints, oldest first: by checkpoint
        in the order they were saved, then in the order recorded (not by ``decided_at``,
        which comes from each worker's own clock)."""
        if self._unstorable(run_id):
            return []

        def work() -> list[Decision]:
            with self._connection(write=False, atomic=False) as conn:
                rows = conn.execute(self._sql.decisions, {"run_id": run_id}).fetchall()
            return [record.decision for record in _records(rows)]

        return await self._run(work)

    async def purge_resolved(self, *, older_than: timedelta | float) -> int:
        """Delete resolved and cancelled checkpoints (with their records) that finished
        at least *older_than* ago (a :class:`~datetime.timedelta` or seconds), by the
        database's clock. Returns how many checkpoints were deleted.

        A purged checkpoint is gone: resuming it again raises
        :class:`~runlet.CheckpointNotFoundError` instead of returning the stored result,
        and :meth:`decisions` no longer lists its decisions. Keep resolved records for
        as long as a client may repeat a response, or your audit rules require.

        Raises:
            ~runlet.ConfigurationError: *older_than* is negative or not a duration.
        """
        age = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        if not is_seconds(age):
            raise ConfigurationError(
                "purge_resolved(older_than=...) must be a timedelta or a non-negative number "
                f"of seconds, not {older_than!r}."
            )
        # Nothing finished before the store existed: an age beyond any the database's
        # date arithmetic can take means the same as a thousand years.
        sql = self._sql
        params: dict[str, Any] = {"age": min(float(age), _THOUSAND_YEARS)}
        if sql.purge_batch is not None:
            params["batch"] = sql.purge_batch

        def work() -> int:
            with self._connection(write=True, atomic=True) as conn:
                if sql.purge_cutoff is not None and "cutoff" not in params:
                    params["cutoff"] = conn.execute(sql.purge_cutoff, params).fetchone()[0]
                if sql.purge_records is not None:
                    conn.execute(sql.purge_records, params)
                cursor = conn.execute(sql.purge, params)
                purged: int = cursor.fetchone()[0] if sql.purge_records is None else cursor.rowcount
            return purged

        total = 0
        while True:
            purged = await self._run(work)
            total += purged
            if sql.purge_batch is None or purged < sql.purge_batch:
                return total
            await _between_batches()

    def _claimed(self, conn: Connection, data: str, params: dict[str, Any]) -> Claim:
        """The claim just taken, with its records; if reading them fails, the claim is
        given back (on PostgreSQL the claim is already committed)."""
        try:
            records = conn.execute(self._sql.records, params).fetchall()
            return Claim(
                checkpoint=_checkpoint(data), token=params["token"], records=_records(records)
            )
        except BaseException:
            conn.execute(self._sql.release, params)
            raise

    def _refuse(self, conn: Connection, checkpoint_id: str, *, cancelling: bool) -> None:
        """Raise why a conditional claim or cancel changed nothing; return if the row is
        claimable after all (a concurrent writer changed it meanwhile)."""
        row = conn.execute(self._sql.state, {"id": checkpoint_id}).fetchone()
        if row is None:
            raise not_found(checkpoint_id)
        status, resolution, held = row
        if status == "claimed" and held:
            if cancelling:
                raise cancel_claimed_error(checkpoint_id)
            raise claimed_error(checkpoint_id)
        if status == "resolved":
            raise resolved_error(checkpoint_id, _resolution(resolution))
        if status == "cancelled" and not cancelling:
            raise cancelled_error(checkpoint_id)


def _pages(
    conn: Connection,
    statement: str,
    params: dict[str, Any],
    start: int,
    wanted: Mapping[str, Any],
    limit: int,
    by_column: bool,
) -> list[PendingRequest]:
    found: list[PendingRequest] = []
    while True:
        rows = conn.execute(statement, {**params, "after": start}).fetchall()
        for _, checkpoint_id, metadata, data in rows:
            if wanted and by_column and not metadata_matches(_column(metadata), wanted):
                continue
            try:
                checkpoint = _checkpoint(data)
            except CheckpointSerializationError as exc:
                # Say which one: an operator can retire it and list the others again.
                raise CheckpointSerializationError(
                    f"Checkpoint {checkpoint_id!r} in this store cannot be read, so "
                    f"list_pending cannot list past it: {str(exc).rstrip('.')}. Retire it with "
                    f"runtime.cancel({checkpoint_id!r}) (or store.delete(...) to forget it).",
                    path=exc.path,
                ) from exc
            # The column may match where the run's own metadata does not (see _column).
            if metadata_matches(checkpoint.metadata, wanted):
                found.append(PendingRequest.of(checkpoint))
                if len(found) == limit:
                    return found
        if len(rows) < limit:
            return found
        start = rows[-1][0]


def _prefilter(wanted: Mapping[Any, Any]) -> tuple[dict[str, Any], list[str]] | None:
    """The metadata filter as ``(scalars, keys)`` for the SQL pre-filter, or ``None``
    when no stored (JSON) metadata can match. Entries the metadata column cannot hold
    (see :func:`_indexed`) are left to the check in Python."""
    scalars: dict[str, Any] = {}
    keys: list[str] = []
    for key, value in wanted.items():
        if not isinstance(key, str):
            return None
        if not _indexable(key, value):
            continue
        keys.append(key)
        # Compared in SQL as a double only where that is exact (an int too large for a
        # float, say 10**400, is left to Python).
        if isinstance(value, str) or (
            isinstance(value, (int, float)) and -(2**53) < value < 2**53 and value == value
        ):
            scalars[key] = value
    return scalars, keys


def _indexed(metadata: Mapping[str, Any]) -> str:
    """The metadata column: the run metadata as JSON, without the entries that hold the
    character U+0000 or a lone surrogate (which a JSON body may carry), which PostgreSQL's
    ``jsonb`` cannot store. The column only serves the pre-filter, which leaves such
    entries to Python; the checkpoint's data keeps them."""
    text = dumps(metadata)
    if "\\u0000" not in text and not _LONE_SURROGATE.search(text):
        return text
    return dumps({key: value for key, value in metadata.items() if _indexable(key, value)})


# A surrogate escape that is not half of a pair, in json.dumps' ASCII output. A match
# where there is none (an escaped backslash before "ud800") only leaves an entry to Python.
_LONE_SURROGATE = re.compile(
    r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}"
)


def _indexable(key: str, value: Any) -> bool:
    try:
        text = dumps([key, value])
    except (TypeError, ValueError):  # a filter value JSON cannot hold: Python compares it
        return False
    return "\\u0000" not in text and not _LONE_SURROGATE.search(text)


def dumps(data: Any) -> str:
    """Compact JSON text."""
    return json.dumps(data, separators=(",", ":"))


def _checkpoint_params(checkpoint: Checkpoint) -> dict[str, Any]:
    data = unstructure_checkpoint(checkpoint)
    return {
        "id": checkpoint.id,
        "run_id": checkpoint.run_id,
        "agent_name": checkpoint.agent_name,
        "data": dumps(data),
        "metadata": _indexed(data.get("metadata", {})),
    }


# Beyond any table's size; below the 2**63 where SQLite's and PostgreSQL's integers end.
_ALL = 2**62


def _not_utf8(text: str) -> bool:
    """Whether *text* holds a lone surrogate (a JSON body may carry one: ``"\\ud800"``),
    which no UTF-8 text column can hold."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _refuse_untextual(checkpoint: Checkpoint, store: str, *, nul: bool) -> None:
    """Refuse a checkpoint whose ids or agent name its text columns cannot hold (the
    checkpoint's, and its records' call ids): a lone surrogate, or with *nul* U+0000."""
    last = checkpoint.transcript[-1].tool_calls if checkpoint.transcript else ()
    named = [
        ("id", checkpoint.id, ""),
        ("run_id", checkpoint.run_id, ""),
        ("agent_name", checkpoint.agent_name, "Give the agent a name without it."),
        *(
            (
                f"transcript[-1].tool_calls[{index}].id",
                call.id,
                "The model adapter gave this call id; it must not hold that character.",
            )
            for index, call in enumerate(last)
        ),
    ]
    for path, text, hint in named:
        if (nul and "\x00" in text) or _not_utf8(text):
            raise _text_error(path, text, store, hint)


def _text_error(
    path: str, text: object, store: str, hint: str = ""
) -> CheckpointSerializationError:
    if not isinstance(text, str):
        what = f"a {type(text).__name__}, not text, which {{store}} cannot store"
    elif "\x00" in text:
        what = "the character U+0000, which {store} cannot store (PostgreSQL text cannot hold it)"
    else:
        what = "a lone surrogate (half of a UTF-16 pair), which {store} cannot store as text"
    return CheckpointSerializationError(
        f"{path} holds {what.format(store=store)}. {hint}".rstrip(), path=path
    )


def _checkpoint(text: str) -> Checkpoint:
    return structure_checkpoint(_json(text, "checkpoint"))


def _resolution(text: str) -> Resolution:
    return structure(_json(text, "resolution"), Resolution, what="resolution")


def _records(rows: Iterator[Sequence[Any]] | Sequence[Sequence[Any]]) -> tuple[CallRecord, ...]:
    return tuple(structure(_json(row[0], "record"), CallRecord, what="record") for row in rows)


class _Whole:
    """A whole number read from the metadata column, which may have been a float: a
    database that keeps JSON numbers as decimals (PostgreSQL's ``jsonb``) writes the float
    ``1e23`` back as ``100000000000000000000000``, and ``2.0**70`` (written
    ``1.1805916207174113e+21``) as ``1180591620717411300000``. Equal to what either
    reading is equal to, so the column never hides a match; the run's own metadata then
    decides."""

    __slots__ = ("exact", "near")

    def __init__(self, text: str) -> None:
        self.exact = int(text)
        self.near = float(text)  # the float it was written from, if it was one

    def __eq__(self, other: object) -> bool:
        return bool(self.exact == other or self.near == other)

    __hash__ = None  # type: ignore[assignment]


# Whole numbers up to this size are the same as an int and as a float.
_EXACT_FLOAT: Final = 2**53


def _whole(text: str) -> int | _Whole:
    value = int(text)
    return value if -_EXACT_FLOAT < value < _EXACT_FLOAT else _Whole(text)


def _column(text: Any) -> Any:
    """The metadata column's JSON, for the pre-filter in Python: it may match more than
    the run's own metadata (see :class:`_Whole`), never less."""
    return _json(text, "metadata", _whole)


def _json(text: Any, what: str, parse_int: Callable[[str], Any] | None = None) -> Any:
    """The data of a stored JSON column: a row that is not JSON (cut short, emptied, or
    written by something else) is a CheckpointSerializationError, like any stored data
    that is not what Runlet wrote."""
    try:
        return json.loads(text, parse_int=parse_int)
    except (TypeError, ValueError) as exc:
        raise CheckpointSerializationError(
            f"The stored {what} is not JSON ({exc}): it was cut short or written by "
            "something other than Runlet. It cannot be read.",
            path=what,
        ) from None
