"""Where checkpoints live between an interruption and its resume.

Two protocols:

- :class:`CheckpointStore`, three methods (save, load, delete). Enough for resume, with
  at-least-once behaviour: an approved call whose resume failed later may run again.
- :class:`DurableCheckpointStore`, the exactly-once protocol: an atomic claim with a lease
  and a token, records of the decisions and tool results of the interrupted turn,
  resolution with the stored outcome, cancellation, and listing of open requests.
  :class:`InMemoryCheckpointStore` and the stores in :mod:`runlet.stores` implement it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from ._checkpoint import Checkpoint, always_write
from ._errors import (
    CheckpointCancelledError,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointResolvedError,
    ConfigurationError,
    LeaseLostError,
)
from ._human import Decision, HumanRequest
from ._messages import ToolResult
from ._result import RunResult
from ._util import is_seconds, slot_builder

__all__ = [
    "CallRecord",
    "CheckpointStatus",
    "CheckpointStore",
    "Claim",
    "DurableCheckpointStore",
    "InMemoryCheckpointStore",
    "PendingRequest",
    "Resolution",
    "StoredCheckpoint",
]

CheckpointStatus = Literal["pending", "claimed", "resolved", "cancelled"]


@attrs.frozen(kw_only=True)
class CallRecord:
    """What a resume recorded about one call of the interrupted turn, before acting on it.

    A record with a :attr:`decision` but no :attr:`result` means the call was approved
    and its handler may have started: if the resume that wrote it never finished, the
    call's outcome is unknown.

    Attributes:
        tool_call_id: The call.
        decision: The person's answer (or the expiry) that decided the call.
        result: The call's result, once known.
    """

    tool_call_id: str
    decision: Decision
    result: ToolResult | None = None


@attrs.frozen(kw_only=True)
class Resolution:
    """The stored outcome of a checkpoint whose resume finished.

    Attributes:
        decisions: The answers accepted for this checkpoint's requests, in call order.
        result: What the resume returned; an equal response gets it again.
        resolved_at: When the checkpoint was resolved (aware UTC).
        expired: Whether :meth:`~runlet.Runtime.expire` resolved it, so a repeated
            ``expire()`` returns the stored result. Its decisions hold the expiry, or, for
            a request an earlier attempt had recorded an answer to before it died, that
            answer (the first accepted answer is final).
    """

    decisions: tuple[Decision, ...]
    result: RunResult
    resolved_at: datetime
    expired: bool = False


@attrs.frozen(kw_only=True)
class Claim:
    """A held claim on a checkpoint, returned by :meth:`DurableCheckpointStore.claim`.

    Attributes:
        checkpoint: The checkpoint.
        token: Proves the claim in every later write; a write with a token that no longer
            holds the checkpoint raises :class:`~runlet.LeaseLostError`.
        records: What earlier attempts recorded (decisions and results), if any, in the
            order first recorded (the order of the audit trail).
    """

    checkpoint: Checkpoint
    token: str
    records: tuple[CallRecord, ...] = ()


@attrs.frozen(kw_only=True)
class StoredCheckpoint:
    """A checkpoint with its state in a durable store.

    Attributes:
        checkpoint: The checkpoint.
        status: ``"pending"`` (waiting for an answer), ``"claimed"`` (a resume holds it),
            ``"resolved"`` (a resume finished; :attr:`resolution` says how) or
            ``"cancelled"``.
        records: Decisions and results recorded by resumes so far, in the order first
            recorded.
        resolution: The stored outcome when resolved.
    """

    checkpoint: Checkpoint
    status: CheckpointStatus
    records: tuple[CallRecord, ...] = ()
    resolution: Resolution | None = None


@attrs.frozen
class PendingRequest:
    """An open request, as :meth:`DurableCheckpointStore.list_pending` lists it.

    Attributes:
        checkpoint_id: The checkpoint to resume.
        run_id: The run it belongs to.
        agent_name: The interrupted agent's name.
        request: The first open request (the run's ``interruption``).
        metadata: The run's metadata.
        created_at: When the run stopped (the request's ``created_at``).
        requests: Every open request of the checkpoint, in call order (by default just
            *request*).
    """

    checkpoint_id: str
    run_id: str
    agent_name: str
    request: HumanRequest
    metadata: Mapping[str, Any] = attrs.field(hash=False)
    created_at: datetime
    # A default= (not a decorator) so every type checker sees that it has one.
    requests: tuple[HumanRequest, ...] = attrs.field(
        default=attrs.Factory(lambda self: (self.request,), takes_self=True)
    )

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> PendingRequest:
        """The pending request of *checkpoint*."""
        request = checkpoint.request
        return cls(
            checkpoint.id,
            checkpoint.run_id,
            checkpoint.agent_name,
            request,
            checkpoint.metadata,
            request.created_at,
            checkpoint.open_requests,
        )


always_write(PendingRequest, "requests")


@runtime_checkable
class CheckpointStore(Protocol):
    """Saves, loads and deletes checkpoints.

    Three methods are enough to resume runs across processes, at least once: if a resume
    fails after an approved call ran (the model fails next, the process dies), resuming
    again runs that call again. For exactly once, implement :class:`DurableCheckpointStore`
    (or use one of Runlet's stores).
    """

    async def save(self, checkpoint: Checkpoint, /) -> None:
        """Store *checkpoint* under ``checkpoint.id``."""
        ...

    async def load(self, checkpoint_id: str, /) -> Checkpoint:
        """Return the checkpoint with this id.

        Raises:
            CheckpointNotFoundError: There is none (a durable store also raises it for a
                checkpoint a resume finished with: it is retired).
            CheckpointCancelledError: (a durable store) It was cancelled.
        """
        ...

    async def delete(self, checkpoint_id: str, /) -> None:
        """Remove the checkpoint with this id; do nothing if there is none."""
        ...


@runtime_checkable
class DurableCheckpointStore(CheckpointStore, Protocol):
    """The exactly-once store protocol. Every store Runlet ships implements it, and
    :func:`runlet.testing.store_conformance_tests` checks an implementation.

    A checkpoint is ``pending`` when saved; :meth:`claim` makes it ``claimed`` for
    :attr:`lease` seconds under a fresh token; the claimant records decisions and results
    (:meth:`record`), renews the lease while it works (:meth:`renew`), and finally either
    resolves the checkpoint with its outcome (:meth:`resolve`, which also saves the next
    checkpoint, atomically) or gives it back (:meth:`release`). A claim whose lease ran out
    can be taken over by another :meth:`claim` (or retired by :meth:`cancel`); from then
    on the old token's writes raise :class:`~runlet.LeaseLostError`. Until then the old
    token still holds, even past its lease: a late writer that nobody replaced finishes
    its work. Records survive a release and a takeover.

    Saving a checkpoint again under an id the store has replaces its data only: its
    status, records and outcome stay (a resolved checkpoint saved again is still
    resolved, so a repeated answer still gets its stored result).

    Guarantees a store must give:

    - :meth:`claim` is atomic: among any number of concurrent claimers (processes,
      machines) exactly one wins while the lease holds.
    - Every write after a claim checks the token in the same atomic step as the write.
    - :meth:`resolve` stores the outcome and saves the next checkpoint in one atomic step.
    - Lease times come from one clock shared by all claimers (the database's).
    - Claims, tokens and leases live in the shared storage, not in the store object:
      every process (and every store object) that opens the same storage sees the same
      claims, and tokens are unique across all of them.
    """

    @property
    def lease(self) -> float | None:
        """Seconds a claim lasts without renewal; ``None`` means until released."""
        ...

    async def get(self, checkpoint_id: str, /) -> StoredCheckpoint:
        """The checkpoint with its status, records and resolution.

        Raises:
            CheckpointNotFoundError: There is none.
        """
        ...

    async def claim(self, checkpoint_id: str, /) -> Claim:
        """Atomically take the checkpoint for one resume.

        Raises:
            CheckpointNotFoundError: There is none.
            CheckpointCancelledError: It was cancelled.
            CheckpointResolvedError: It was already resolved (``.resolution`` holds how).
            CheckpointClaimedError: Another claim holds it and its lease has not run out.
        """
        ...

    async def renew(self, checkpoint_id: str, token: str, /) -> None:
        """Extend the claim's lease by :attr:`lease` seconds from now.

        Raises:
            LeaseLostError: *token* no longer holds the checkpoint.
        """
        ...

    async def record(
        self, checkpoint_id: str, token: str, records: Sequence[CallRecord], /
    ) -> None:
        """Add or replace (by ``tool_call_id``) records of the checkpoint, atomically.

        Raises:
            LeaseLostError: *token* no longer holds the checkpoint.
        """
        ...

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None,
        /,
    ) -> None:
        """Mark the checkpoint resolved with *resolution* and save *next_checkpoint* (the
        run's next interruption, or ``None``) as pending, in one atomic step. Runlet
        always passes all four arguments, so a default for *next_checkpoint* is up to
        the store.

        Raises:
            LeaseLostError: *token* no longer holds the checkpoint.
        """
        ...

    async def release(self, checkpoint_id: str, token: str, /) -> None:
        """Give the claim back, so the checkpoint is pending again (records are kept).
        Does nothing if *token* no longer holds it, or there is no such checkpoint."""
        ...

    async def cancel(self, checkpoint_id: str, /) -> None:
        """Retire the checkpoint without resolving it; cancelling twice is fine. A claim
        whose lease ran out does not stop it (its token then holds nothing). It must work
        without reading the checkpoint's data, so that a checkpoint whose data cannot be
        read any more can still be retired.

        Raises:
            CheckpointNotFoundError: There is none.
            CheckpointClaimedError: A resume holds it right now (its lease holds).
            CheckpointResolvedError: It was already resolved (``.resolution`` holds how).
        """
        ...

    async def list_pending(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        agent_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Sequence[PendingRequest]:
        """Checkpoints waiting for an answer (pending or claimed), oldest first: in the
        order they were first saved (saving one again keeps its place).

        Args:
            limit: At most this many.
            after: The last ``checkpoint_id`` of the previous page; the page starts after
                it, even if it was resolved or cancelled since.
            agent_name: Only checkpoints of the agent with exactly this name.
            metadata: Only runs whose metadata has each of these top-level keys with an
                equal value, as JSON values compare: nested values compare whole, ``1``
                and ``1.0`` are equal, but ``true`` is not ``1`` and ``"1"`` is not ``1``.

        Raises:
            ~runlet.CheckpointNotFoundError: *after* names no checkpoint of this store
                (never saved, or deleted).
            ~runlet.ConfigurationError: *limit* is not a positive int, *agent_name* is
                neither a str nor None, or *metadata* is not a mapping.
        """
        ...

    async def decisions(self, run_id: str, /) -> Sequence[Decision]:
        """Every decision recorded for the run's checkpoints, oldest first: by checkpoint,
        in the order they were saved (which is the run's order), then in the order they
        were first recorded (a record replaced later, say with its call's result, keeps
        its place). Not by :attr:`~runlet.Decision.decided_at`, which comes from the
        clock of the worker that took the decision: workers' clocks may disagree."""
        ...


_TOKENS = itertools.count()
_PROCESS = os.urandom(8).hex()


# Built from the store's own values, without the classes' __init__.
_new_stored = slot_builder(StoredCheckpoint)
_new_claim = slot_builder(Claim)


def _new_process() -> None:
    # A forked worker (gunicorn, multiprocessing) must not repeat its parent's tokens.
    global _PROCESS, _TOKENS
    _PROCESS = os.urandom(8).hex()
    _TOKENS = itertools.count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process)


def new_token() -> str:
    """A fresh claim token: unique across processes (a random per-process prefix) and
    within one (a counter), and cheap. Tokens fence writes; they are not secrets."""
    return f"{_PROCESS}-{next(_TOKENS)}"


# The members of the durable protocol beyond a plain store's save, load and delete, by
# which Runtime tells a durable store; the first five only a durable store has.
DURABLE_ONLY = ("claim", "renew", "record", "resolve", "release")
DURABLE_MEMBERS = ("lease", "get", *DURABLE_ONLY, "cancel", "list_pending", "decisions")


def check_limit(limit: object) -> None:
    """Refuse a ``list_pending`` limit that is not a positive int."""
    if type(limit) is not int or limit < 1:
        raise ConfigurationError(f"list_pending(limit=...) must be a positive int, not {limit!r}.")


def check_agent_filter(agent_name: object) -> None:
    """Refuse a ``list_pending`` agent name that is not a str (or None): it would match
    nothing, silently."""
    if agent_name is not None and not isinstance(agent_name, str):
        raise ConfigurationError(
            f"list_pending(agent_name=...) must be an agent's name (a str) or None, not "
            f"{agent_name!r}."
        )


def check_metadata_filter(metadata: object) -> None:
    """Refuse a ``list_pending`` metadata filter that is not a mapping (a key that no
    metadata can hold, such as ``1``, is allowed: it matches nothing)."""
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ConfigurationError(
            "list_pending(metadata=...) must be a dict of top-level metadata keys to the "
            f"values they must have, e.g. {{'tenant': 'acme'}}, not {metadata!r}."
        )


# The longest lease: about 31 years, far below where the databases' date arithmetic
# overflows (PostgreSQL's intervals, from 1e13 s); None is the lease that never runs out.
MAX_LEASE = 1e9


def check_lease(lease: object) -> None:
    """Refuse a lease that is not a number of seconds from 0 to :data:`MAX_LEASE` (or
    None)."""
    if lease is not None and not (is_seconds(lease) and lease <= MAX_LEASE):  # type: ignore[operator]
        raise ConfigurationError(
            f"lease must be a non-negative number of seconds (or None), at most {MAX_LEASE:g} "
            f"(about 31 years; None makes a claim last until released), not {lease!r}."
        )


def metadata_matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """Whether *metadata* has every top-level key of *wanted* with an equal JSON value."""
    if not wanted:
        return True
    missing = object()
    return all(json_equal(metadata.get(key, missing), value) for key, value in wanted.items())


def json_equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: like ``==``, except that a bool equals
    only a bool (Python's ``True == 1``), and a tuple and a list are both arrays."""
    if type(a) is bool or type(b) is bool:
        return a is b
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, Mapping):
        return (
            isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(json_equal(value, b[key]) for key, value in a.items())
        )
    return bool(a == b)


# How many forgotten checkpoints an in-memory store still knows the place of, for
# list_pending(after=...): about 100 bytes each.
_CURSORS_KEPT = 10_000


class _Entry:
    __slots__ = ("checkpoint", "lease_until", "records", "resolution", "seq", "status", "token")

    def __init__(self, checkpoint: Checkpoint, seq: int) -> None:
        self.checkpoint = checkpoint
        self.seq = seq
        self.status: CheckpointStatus = "pending"
        self.token: str | None = None
        self.lease_until = 0.0
        self.records: dict[str, CallRecord] = {}
        self.resolution: Resolution | None = None


class InMemoryCheckpointStore:
    """A :class:`DurableCheckpointStore` that keeps checkpoints in memory.

    Checkpoints last only as long as the process: use it for tests, demos and single-process
    apps. Every operation completes without yielding to the event loop, under a lock, so
    each is atomic, also when threads that each run an event loop (a sync web framework's
    workers) share the store. Resolved and cancelled checkpoints are kept, so that a
    repeated resume returns the stored result, up to *keep_finished* of them: beyond that
    the oldest are forgotten, so a long-running process does not grow without bound. A
    repeated answer comes within seconds (a second click, a client's retry), so the default
    keeps the latest 1,000. Keeping more costs memory (each holds its run's whole
    transcript) and time on every resume: new objects cannot reuse the memory of the ones
    kept, and while the store fills, the garbage collector walks them. Give a larger
    *keep_finished* (or ``None``) for a longer window, or use a durable store, which keeps
    every outcome until you purge it.

    Args:
        lease: Seconds a claim lasts; ``None`` (the default) means until the resume that
            holds it finishes or fails, which is right within one process.
        keep_finished: How many resolved or cancelled checkpoints to keep (with their
            outcomes and records); ``None`` keeps them all.

    Raises:
        ConfigurationError: *lease* or *keep_finished* is unusable.
    """

    def __init__(self, *, lease: float | None = None, keep_finished: int | None = 1_000) -> None:
        check_lease(lease)
        if keep_finished is not None and (type(keep_finished) is not int or keep_finished < 0):
            raise ConfigurationError(
                f"keep_finished must be a non-negative int or None, not {keep_finished!r}."
            )
        self._lease = lease
        self._keep = keep_finished
        self._entries: dict[str, _Entry] = {}
        self._finished: deque[str] = deque()
        self._seq = 0
        # Where the checkpoints keep_finished forgot stood, so a list_pending() page that
        # ended at one goes on after it (the latest _CURSORS_KEPT of them).
        self._forgotten: dict[str, int] = {}
        # Threads that each run a loop may share the store: every operation runs whole
        # under this lock (never across an await, so a loop never waits on it for long).
        # Reentrant: a signal handler that runs in the middle of one operation (between
        # any two bytecodes of the main thread) may call another.
        self._lock = threading.RLock()

    @property
    def lease(self) -> float | None:
        """Seconds a claim lasts without renewal; ``None`` means until released."""
        return self._lease

    def __repr__(self) -> str:
        return f"InMemoryCheckpointStore(lease={self._lease!r})"

    def __len__(self) -> int:
        """How many checkpoints wait for an answer (pending or claimed)."""
        with self._lock:
            return sum(
                1 for entry in self._entries.values() if entry.status in ("pending", "claimed")
            )

    def __contains__(self, checkpoint_id: object) -> bool:
        """Whether the checkpoint waits for an answer (pending or claimed)."""
        with self._lock:
            try:
                entry = self._entries.get(checkpoint_id)  # type: ignore[call-overload]
            except TypeError:  # an id no dict key can be
                return False
            return entry is not None and entry.status in ("pending", "claimed")

    async def save(self, checkpoint: Checkpoint) -> None:
        """Store *checkpoint* as pending (replacing the data of one with the same id)."""
        with self._lock:
            self._put(checkpoint)

    async def load(self, checkpoint_id: str) -> Checkpoint:
        """Return the checkpoint while it waits for an answer (pending or claimed).

        Raises:
            CheckpointNotFoundError: There is none with this id, or a resume finished with
                it (it is retired; :meth:`get` still shows it with its outcome).
            CheckpointCancelledError: It was cancelled.
        """
        with self._lock:
            entry = self._entry(checkpoint_id)
            if entry.status == "cancelled":
                raise cancelled_error(checkpoint_id)
            if entry.status == "resolved":
                raise retired_error(checkpoint_id)
            return entry.checkpoint

    async def delete(self, checkpoint_id: str) -> None:
        """Forget the checkpoint with its records and outcome."""
        # TypeError: an id no dict key can be, so nothing to forget.
        with self._lock, contextlib.suppress(TypeError):
            self._entries.pop(checkpoint_id, None)

    async def get(self, checkpoint_id: str) -> StoredCheckpoint:
        """The checkpoint with its status, records and resolution."""
        with self._lock:
            entry = self._entry(checkpoint_id)
            records = entry.records
            return _new_stored(
                checkpoint=entry.checkpoint,
                status=entry.status,
                records=tuple(records.values()) if records else (),
                resolution=entry.resolution,
            )

    async def claim(self, checkpoint_id: str) -> Claim:
        """Take the checkpoint for one resume (see :meth:`DurableCheckpointStore.claim`)."""
        with self._lock:
            entry = self._entry(checkpoint_id)
            status = entry.status
            if status == "claimed":
                if self._held_now(entry):
                    raise claimed_error(checkpoint_id)
            elif status != "pending":
                _refuse_final(entry, checkpoint_id)
            entry.status = "claimed"
            entry.token = token = new_token()
            if self._lease is not None:
                entry.lease_until = time.monotonic() + self._lease
            records = entry.records
            return _new_claim(
                checkpoint=entry.checkpoint,
                token=token,
                records=tuple(records.values()) if records else (),
            )

    async def renew(self, checkpoint_id: str, token: str) -> None:
        """Extend the lease; raises :class:`~runlet.LeaseLostError` for a stale token."""
        with self._lock:
            entry = self._holding(checkpoint_id, token)
            if self._lease is not None:
                entry.lease_until = time.monotonic() + self._lease

    async def record(self, checkpoint_id: str, token: str, records: Sequence[CallRecord]) -> None:
        """Add or replace records; raises :class:`~runlet.LeaseLostError` for a stale token."""
        with self._lock:
            entry = self._holding(checkpoint_id, token)
            for record in records:
                entry.records[record.tool_call_id] = record

    async def resolve(
        self,
        checkpoint_id: str,
        token: str,
        resolution: Resolution,
        next_checkpoint: Checkpoint | None = None,
    ) -> None:
        """Resolve the checkpoint and save the next one; raises
        :class:`~runlet.LeaseLostError` for a stale token."""
        with self._lock:
            entry = self._holding(checkpoint_id, token)
            entry.status = "resolved"
            entry.token = None
            entry.resolution = resolution
            self._finish(checkpoint_id)
            if next_checkpoint is not None:
                self._put(next_checkpoint)

    async def release(self, checkpoint_id: str, token: str) -> None:
        """Give the claim back; does nothing for a stale token."""
        # TypeError: an id no dict key can be, so nothing to give back.
        with self._lock, contextlib.suppress(TypeError):
            entry = self._entries.get(checkpoint_id)
            if entry is None or entry.status != "claimed" or entry.token != token:
                return
            entry.status = "pending"
            entry.token = None

    async def cancel(self, checkpoint_id: str) -> None:
        """Retire the checkpoint (see :meth:`DurableCheckpointStore.cancel`)."""
        with self._lock:
            entry = self._entry(checkpoint_id)
            if entry.status == "claimed" and self._held_now(entry):
                raise cancel_claimed_error(checkpoint_id)
            if entry.status == "resolved":
                _refuse_final(entry, checkpoint_id)
            if entry.status != "cancelled":
                entry.status = "cancelled"
                entry.token = None
                self._finish(checkpoint_id)

    async def list_pending(
        self,
        *,
        limit: int = 100,
        after: str | None = None,
        agent_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Sequence[PendingRequest]:
        """Checkpoints waiting for an answer, oldest first (see
        :meth:`DurableCheckpointStore.list_pending`)."""
        check_limit(limit)
        check_agent_filter(agent_name)
        check_metadata_filter(metadata)
        with self._lock:
            start = -1 if after is None else self._cursor(after)
            found: list[PendingRequest] = []
            for entry in self._entries.values():  # in insertion order, which is seq order
                if entry.seq <= start or entry.status not in ("pending", "claimed"):
                    continue
                checkpoint = entry.checkpoint
                if agent_name is not None and checkpoint.agent_name != agent_name:
                    continue
                if not metadata_matches(checkpoint.metadata, metadata):
                    continue
                found.append(PendingRequest.of(checkpoint))
                if len(found) == limit:
                    break
            return found

    async def decisions(self, run_id: str) -> Sequence[Decision]:
        """Every decision recorded for the run's checkpoints, oldest first (see
        :meth:`DurableCheckpointStore.decisions`)."""
        with self._lock:
            # Entries and records keep the order they were first stored in.
            return [
                record.decision
                for entry in self._entries.values()
                if entry.checkpoint.run_id == run_id
                for record in entry.records.values()
            ]

    def _finish(self, checkpoint_id: str) -> None:
        keep = self._keep
        if keep is None:
            return
        finished = self._finished
        finished.append(checkpoint_id)
        while len(finished) > keep:
            old = self._entries.get(finished.popleft())
            if old is not None and old.status in ("resolved", "cancelled"):
                del self._entries[old.checkpoint.id]
                forgotten = self._forgotten
                if len(forgotten) >= _CURSORS_KEPT:
                    del forgotten[next(iter(forgotten))]
                forgotten[old.checkpoint.id] = old.seq

    def _put(self, checkpoint: Checkpoint) -> None:
        entry = self._entries.get(checkpoint.id)
        if entry is None:
            self._seq += 1
            self._entries[checkpoint.id] = _Entry(checkpoint, self._seq)
        else:
            entry.checkpoint = checkpoint

    def _cursor(self, after: str) -> int:
        """Where the page that ended at checkpoint *after* stopped."""
        try:
            entry = self._entries.get(after)
        except TypeError:  # an id no dict key can be
            entry = None
        if entry is not None:
            return entry.seq
        seq = self._forgotten.get(after) if type(after) is str else None
        if seq is None:
            raise not_found(after)
        return seq

    def _entry(self, checkpoint_id: str) -> _Entry:
        try:
            return self._entries[checkpoint_id]
        except (KeyError, TypeError):  # TypeError: an id no dict key can be (a list)
            raise not_found(checkpoint_id) from None

    def _held_now(self, entry: _Entry) -> bool:
        return self._lease is None or time.monotonic() < entry.lease_until

    def _holding(self, checkpoint_id: str, token: str) -> _Entry:
        try:
            entry = self._entries.get(checkpoint_id)
        except TypeError:  # an id no dict key can be (a list)
            entry = None
        if entry is None or entry.status != "claimed" or entry.token != token:
            raise lease_lost(checkpoint_id)
        return entry


def _refuse_final(entry: _Entry, checkpoint_id: str) -> None:
    if entry.status == "cancelled":
        raise cancelled_error(checkpoint_id)
    raise resolved_error(checkpoint_id, entry.resolution)


def not_found(checkpoint_id: str) -> CheckpointNotFoundError:
    """The error for a checkpoint id a store does not know."""
    return CheckpointNotFoundError(
        f"No checkpoint {checkpoint_id!r}: it was never saved in this store, or it was "
        "deleted. Use the checkpoint_id of the latest interruption.",
        checkpoint_id=checkpoint_id,
    )


def retired_error(checkpoint_id: str) -> CheckpointNotFoundError:
    """The error for loading a checkpoint a resume already finished with."""
    return CheckpointNotFoundError(
        f"Checkpoint {checkpoint_id!r} is retired: a resume already finished with it. "
        "Resuming it again with the same response returns the stored result; the run goes "
        "on at the checkpoint of its latest interruption, if any.",
        checkpoint_id=checkpoint_id,
    )


def cancelled_error(checkpoint_id: str) -> CheckpointCancelledError:
    """The error for a cancelled checkpoint."""
    return CheckpointCancelledError(
        f"Checkpoint {checkpoint_id!r} was cancelled, so it can no longer be resumed. "
        "Start a new run if the work is still wanted.",
        checkpoint_id=checkpoint_id,
    )


def resolved_error(checkpoint_id: str, resolution: Resolution | None) -> CheckpointResolvedError:
    """The error for a checkpoint that was already resolved."""
    return CheckpointResolvedError(
        f"Checkpoint {checkpoint_id!r} was already resolved: a resume finished with it. "
        "Resuming it again with the same response returns the stored result.",
        checkpoint_id=checkpoint_id,
        resolution=resolution,
    )


def claimed_error(checkpoint_id: str) -> CheckpointClaimedError:
    """The error for claiming a checkpoint another resume holds right now."""
    return CheckpointClaimedError(
        f"Checkpoint {checkpoint_id!r} is being resumed by another caller right now. Wait "
        "for that resume: it either resolves the checkpoint (then repeating your response "
        "returns its result) or leaves it resumable once it fails or its lease runs out.",
        checkpoint_id=checkpoint_id,
    )


def cancel_claimed_error(checkpoint_id: str) -> CheckpointClaimedError:
    """The error for cancelling a checkpoint a resume holds right now."""
    return CheckpointClaimedError(
        f"Checkpoint {checkpoint_id!r} is being resumed right now and cannot be "
        "cancelled; try again once that resume has finished or failed.",
        checkpoint_id=checkpoint_id,
    )


def lease_lost(checkpoint_id: str) -> LeaseLostError:
    """The error for a write whose claim token no longer holds the checkpoint."""
    return LeaseLostError(
        f"This resume no longer holds checkpoint {checkpoint_id!r}: its lease ran out and "
        "another resume took it over (or it was released). Its work was not recorded; the "
        "other resume carries on. Use a longer lease if resumes legitimately take longer.",
        checkpoint_id=checkpoint_id,
    )
