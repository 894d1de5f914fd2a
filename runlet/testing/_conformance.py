"""The store conformance suite: what every :class:`~runlet.DurableCheckpointStore` must do.

Runlet's own stores run it, and so can the author of any other store::

    # tests/test_my_store.py
    from contextlib import asynccontextmanager
    from runlet.testing import store_conformance_tests

    @asynccontextmanager
    async def my_store(lease: float):
        async with MyStore(dsn, lease=lease) as store:
            await store.clear()          # each test starts from an empty store
            yield store

    TestMyStore = store_conformance_tests(my_store)

The factory gets the lease in seconds. ``lease=0`` must make every claim expire at once
(another claim takes it over), which is how the suite tests takeover without sleeping.
Every test runs once per backend in *backends* (asyncio and trio by default).
"""

from __future__ import annotations

import datetime
import enum
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, Literal

import anyio
import anyio.lowlevel
import attrs

from .._agent import Agent
from .._checkpoint import Checkpoint, structure, unstructure
from .._errors import (
    CheckpointCancelledError,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointResolvedError,
    ConfigurationError,
    HumanRequestExpiredError,
    HumanResponseConflictError,
    LeaseLostError,
)
from .._human import Decision, HumanRequest, HumanResponse
from .._messages import Message, ToolCall, ToolResult, Usage
from .._result import RunResult
from .._runtime import Runtime
from .._store import (
    DURABLE_MEMBERS,
    CallRecord,
    Claim,
    DurableCheckpointStore,
    PendingRequest,
    Resolution,
)
from .._tools import ToolContext, ToolSpec
from ._scripted import ScriptedModel, call

__all__ = ["AgeLeases", "SecondHandle", "StoreFactory", "store_conformance_tests"]

StoreFactory = Callable[[float], AbstractAsyncContextManager[DurableCheckpointStore]]
"""``factory(lease)`` → an async context manager yielding a fresh, empty store."""

SecondHandle = Callable[
    [DurableCheckpointStore], AbstractAsyncContextManager[DurableCheckpointStore]
]
"""``second_handle(store)`` → an async context manager yielding another store object on
*store*'s storage, with its lease."""

AgeLeases = Callable[[DurableCheckpointStore, float], Awaitable[None]]
"""``age_leases(store, seconds)`` → moves every live claim's lease in *store*'s storage
*seconds* closer to running out, as if that much time had passed."""

_UTC = datetime.timezone.utc
_T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=_UTC)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
}


def sample_checkpoint(
    checkpoint_id: str,
    *,
    run_id: str = "run_1",
    agent_name: str = "support",
    metadata: Mapping[str, Any] | None = None,
    minute: int = 0,
) -> Checkpoint:
    """A small checkpoint that hangs together: one approval pending for ``refund``."""
    pending = ToolCall(f"call_{checkpoint_id}", "refund", {"order_id": checkpoint_id})
    transcript = (Message.user("Refund it."), Message.assistant("", (pending,)))
    return Checkpoint(
        id=checkpoint_id,
        run_id=run_id,
        agent_name=agent_name,
        messages=transcript[:1],
        options={"temperature": 0.5},
        metadata=dict(metadata or {"tenant": "acme", "user": {"id": 7, "tags": ["a", "b"]}}),
        transcript=transcript,
        pending_tool_calls=(pending,),
        request=HumanRequest(
            f"req_{checkpoint_id}",
            "approval",
            "Allow refund?",
            tool_call=pending,
            created_at=_T0 + datetime.timedelta(minutes=minute),
        ),
        usage=Usage(10, 2, 1),
        turns=1,
    )


def sample_decision(checkpoint: Checkpoint, *, minute: int = 1) -> Decision:
    """An approval of *checkpoint*'s request, as the runtime records it."""
    request = checkpoint.request
    return Decision(
        request_id=request.id,
        checkpoint_id=checkpoint.id,
        tool_call_id=request.tool_call.id,
        tool_name=request.tool_call.name,
        kind="approval",
        action="approve",
        arguments=dict(request.tool_call.arguments),
        responded_by="ops@example.com",
        metadata={"ticket": 42},
        decided_at=_T0 + datetime.timedelta(minutes=minute),
    )


def sample_resolution(checkpoint: Checkpoint, next_id: str | None = None) -> Resolution:
    """A resolution of *checkpoint*: completed, or interrupted at *next_id*."""
    decision = sample_decision(checkpoint)
    result = RunResult(
        status="interrupted" if next_id else "completed",
        output=None if next_id else "Done.",
        checkpoint_id=next_id,
        transcript=checkpoint.transcript,
        usage=Usage(20, 4, 2),
        run_id=checkpoint.run_id,
        decisions=(decision,),
    )
    return Resolution(decisions=(decision,), result=result, resolved_at=_T0)


def _record(checkpoint: Checkpoint, call_id: str | None = None) -> CallRecord:
    """A record of an approval of *checkpoint*'s request (for *call_id*, if given)."""
    decision = sample_decision(checkpoint)
    if call_id is not None:
        decision = Decision(**{**_fields(decision), "tool_call_id": call_id})
    return CallRecord(tool_call_id=decision.tool_call_id, decision=decision)


async def _cancel_after(scope: anyio.CancelScope, points: int) -> None:
    """Cancel *scope* once this task has passed *points* scheduling points."""
    for _ in range(points):
        await anyio.lowlevel.checkpoint()
    scope.cancel()


class _AgentName(str, enum.Enum):
    SUPPORT = "support"


def _call_id(record: CallRecord) -> str:
    return record.tool_call_id


def _fields(instance: Any) -> dict[str, Any]:
    """An attrs instance's fields, to make a changed copy with its class."""
    return {name: getattr(instance, name) for name in attrs.fields_dict(type(instance))}


async def _race_record_and_takeover(
    store: DurableCheckpointStore, checkpoint_id: str
) -> tuple[CallRecord | None, Claim]:
    """Claim *checkpoint_id* in a store whose leases run out at once, then record with
    that claim while another claim takes it over. Returns the record if it was accepted,
    and the new claim."""
    checkpoint = sample_checkpoint(checkpoint_id)
    await store.save(checkpoint)
    old = await store.claim(checkpoint_id)
    record = _record(checkpoint)
    accepted: list[CallRecord] = []
    claims: list[Claim] = []

    async def write() -> None:
        try:
            await store.record(checkpoint_id, old.token, [record])
        except LeaseLostError:
            return
        accepted.append(record)

    async def take() -> None:
        claims.append(await store.claim(checkpoint_id))

    async with anyio.create_task_group() as group:
        group.start_soon(write)
        group.start_soon(take)
    return (accepted[0] if accepted else None), claims[0]


async def _race_cancel_and_claim(
    store: DurableCheckpointStore, checkpoint_id: str
) -> tuple[bool, bool]:
    """Cancel *checkpoint_id* while a claim takes it; returns whether the cancel and
    whether the claim succeeded."""
    await store.save(sample_checkpoint(checkpoint_id))
    cancelled, claimed = await _which_succeed(
        (partial(store.cancel, checkpoint_id), CheckpointClaimedError),
        (partial(store.claim, checkpoint_id), CheckpointCancelledError),
    )
    return cancelled, claimed


async def _race_resolve_and_takeover(
    store: DurableCheckpointStore, checkpoint_id: str
) -> tuple[bool, bool]:
    """Resolve *checkpoint_id* with a claim while another claim takes it over; returns
    whether the resolve and whether the takeover succeeded."""
    checkpoint = sample_checkpoint(checkpoint_id)
    await store.save(checkpoint)
    old = await store.claim(checkpoint_id)
    resolution = sample_resolution(checkpoint)
    resolved, taken = await _which_succeed(
        (partial(store.resolve, checkpoint_id, old.token, resolution, None), LeaseLostError),
        (partial(store.claim, checkpoint_id), CheckpointResolvedError),
    )
    return resolved, taken


async def _which_succeed(
    *attempts: tuple[Callable[[], Awaitable[object]], type[Exception]],
) -> list[bool]:
    """Start every attempt at once; return, in order, whether each succeeded. An attempt
    that raises the error it is paired with lost the race; any other error fails."""
    won = [False] * len(attempts)

    async def attempt(
        index: int, call: Callable[[], Awaitable[object]], lost: type[Exception]
    ) -> None:
        try:
            await call()
        except lost:
            return
        won[index] = True

    async with anyio.create_task_group() as group:
        for index, (call, lost) in enumerate(attempts):
            group.start_soon(attempt, index, call, lost)
    return won


def _rich_checkpoint() -> Checkpoint:
    """Two open requests, an earlier result, a decision, an expiry, an outcome-unknown
    request and microseconds: every field a store could lose away from its default."""
    plain = sample_checkpoint("cp_1")
    first, second = plain.request.tool_call, ToolCall("call_2", "refund", {"order_id": "2"})
    done = ToolCall("call_0", "lookup", {"order_id": "1"})
    when = datetime.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=_UTC)
    request = HumanRequest(
        plain.request.id,
        "approval",
        plain.request.prompt,
        tool_call=first,
        created_at=when,
        expires_at=when + datetime.timedelta(hours=1),
        outcome_unknown=True,
    )
    later = HumanRequest("req_2", "approval", "Allow?", tool_call=second, created_at=when)
    transcript = (plain.transcript[0], Message.assistant("", (done, first, second)))
    return Checkpoint(
        **{
            **_fields(plain),
            "transcript": transcript,
            "results": (ToolResult("call_0", "Order 1: 30 EUR.", True),),
            "pending_tool_calls": (first, second),
            "request": request,
            "more_requests": (later,),
            "decisions": (sample_decision(plain),),
        }
    )


def store_conformance_tests(
    factory: StoreFactory,
    *,
    backends: tuple[Literal["asyncio", "trio"], ...] = ("asyncio", "trio"),
    second_handle: SecondHandle | None = None,
    age_leases: AgeLeases | None = None,
) -> type[Any]:
    """A pytest test class that checks a :class:`~runlet.DurableCheckpointStore`.

    Assign it to a name starting with ``Test`` in a test module. Needs pytest and the
    anyio pytest plugin (installed with anyio), and trio for the trio backend.

    Args:
        factory: ``factory(lease)`` returns an async context manager that yields a fresh,
            empty store whose claims last *lease* seconds.
        backends: The anyio backends to run every test on.
        second_handle: For a store that several processes share: ``second_handle(store)``
            returns an async context manager that yields another store object on the
            same storage (the same file or database) with the same lease, as another
            process would open it. With it the suite also checks that claims, tokens,
            records, outcomes and cancellations live in the storage, not in one object:
            a store that keeps them in the object passes every other test.
        age_leases: ``await age_leases(store, seconds)`` moves the end of every live
            claim's lease in *store*'s storage *seconds* earlier, as if that much time
            had passed (for a SQL store, an ``UPDATE`` of the lease column). With it the
            suite also checks when a lease runs out: that a claim holds until then, that a
            takeover and a renewal each start a full lease from now, and that a cancel
            waits for the lease. ``lease=0`` alone cannot tell a takeover that starts a
            fresh lease from one that keeps the expired one, which lets a third resume in
            beside the second.

    Raises:
        ImportError: pytest is not installed.
        ConfigurationError: *backends* is empty or names something other than
            ``"asyncio"`` and ``"trio"``.
    """
    try:
        import pytest
    except ImportError as exc:
        raise ImportError(
            "store_conformance_tests() makes pytest tests, so it needs pytest: "
            "pip install pytest, then run the module with pytest."
        ) from exc

    unknown = [backend for backend in backends if backend not in ("asyncio", "trio")]
    if unknown or not backends:
        raise ConfigurationError(
            f"backends must name anyio backends, 'asyncio' and/or 'trio', not {backends!r}."
        )

    class StoreConformance:
        pytestmark = pytest.mark.anyio

        @pytest.fixture(params=backends)
        def anyio_backend(self, request: Any) -> str:
            return str(request.param)

        @pytest.fixture
        async def store(self) -> AsyncIterator[DurableCheckpointStore]:
            async with factory(60.0) as store:
                yield store

        @pytest.fixture
        async def quick(self) -> AsyncIterator[DurableCheckpointStore]:
            """A store whose claims expire at once (lease 0)."""
            async with factory(0.0) as store:
                yield store

        # --- The three-method protocol ---------------------------------------------

        async def test_is_a_durable_store(self, store: DurableCheckpointStore) -> None:
            # Runtime recognises a durable store by its methods; without one of them it
            # uses the store as a plain one, at least once.
            members = ("save", "load", "delete", *DURABLE_MEMBERS)
            missing = [name for name in members if not hasattr(store, name)]
            assert not missing, f"the store lacks {', '.join(missing)}"
            assert isinstance(store, DurableCheckpointStore)
            assert store.lease == 60.0, f"lease is {store.lease!r}: the factory was given 60.0"

        async def test_save_then_load_gives_an_equal_checkpoint(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            assert checkpoint == await store.load("cp_1")

        async def test_load_of_an_unknown_id_raises_not_found(
            self, store: DurableCheckpointStore
        ) -> None:
            with pytest.raises(CheckpointNotFoundError) as info:
                await store.load("cp_missing")
            assert info.value.checkpoint_id == "cp_missing"
            assert not isinstance(info.value, CheckpointCancelledError)

        async def test_delete_forgets_and_ignores_unknown_ids(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            await store.delete("cp_1")
            await store.delete("cp_1")
            with pytest.raises(CheckpointNotFoundError):
                await store.get("cp_1")

        async def test_an_id_with_a_nul_character_names_no_checkpoint(
            self, store: DurableCheckpointStore
        ) -> None:
            # Ids come from web requests; PostgreSQL text cannot hold U+0000. Either way
            # such an id is an unknown one, never a database error nor another checkpoint.
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            for lookup in (store.load, store.get, store.claim, store.cancel):
                with pytest.raises(CheckpointNotFoundError):
                    await lookup("cp_1\x00")
            with pytest.raises(CheckpointNotFoundError):
                await store.list_pending(after="cp_1\x00")
            assert await store.list_pending(agent_name="support\x00") == []
            assert await store.decisions("run_1\x00") == []
            await store.delete("cp_1\x00")
            claim = await store.claim("cp_1")
            stale = claim.token + "\x00"
            record = CallRecord(
                tool_call_id=checkpoint.request.tool_call.id,
                decision=sample_decision(checkpoint),
            )
            for wrong_id, token in (("cp_1\x00", claim.token), ("cp_1", stale)):
                with pytest.raises(LeaseLostError):
                    await store.renew(wrong_id, token)
                with pytest.raises(LeaseLostError):
                    await store.record(wrong_id, token, [record])
                with pytest.raises(LeaseLostError):
                    await store.resolve(wrong_id, token, sample_resolution(checkpoint), None)
                await store.release(wrong_id, token)
            stored = await store.get("cp_1")
            assert (stored.status, stored.records) == ("claimed", ())
            await store.renew("cp_1", claim.token)

        # --- Claims ------------------------------------------------------------------

        async def test_a_saved_checkpoint_is_pending(self, store: DurableCheckpointStore) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            stored = await store.get("cp_1")
            assert (checkpoint, "pending", (), None) == (
                stored.checkpoint,
                stored.status,
                stored.records,
                stored.resolution,
            )

        async def test_claim_returns_the_checkpoint_and_holds_it(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            assert checkpoint == claim.checkpoint, "the claim holds another checkpoint"
            assert claim.token, f"the claim's token is {claim.token!r}: it must be a str"
            status = (await store.get("cp_1")).status
            assert status == "claimed", f"a claimed checkpoint's status is {status!r}"
            with pytest.raises(CheckpointClaimedError) as info:
                await store.claim("cp_1")
            assert info.value.checkpoint_id == "cp_1"

        async def test_claim_of_an_unknown_id_raises_not_found(
            self, store: DurableCheckpointStore
        ) -> None:
            with pytest.raises(CheckpointNotFoundError):
                await store.claim("cp_missing")

        async def test_exactly_one_of_many_concurrent_claimers_wins(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            won: list[str] = []
            refused: list[BaseException] = []

            async def claimer() -> None:
                try:
                    won.append((await store.claim("cp_1")).token)
                except CheckpointClaimedError as exc:
                    refused.append(exc)

            async with anyio.create_task_group() as group:
                for _ in range(16):
                    group.start_soon(claimer)
            assert len(won) == 1
            assert len(refused) == 15

        async def test_release_makes_it_claimable_again_and_keeps_records(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            first = await store.claim("cp_1")
            record = CallRecord(
                tool_call_id=checkpoint.request.tool_call.id,
                decision=sample_decision(checkpoint),
            )
            await store.record("cp_1", first.token, [record])
            await store.release("cp_1", first.token)
            assert (await store.get("cp_1")).status == "pending"

            second = await store.claim("cp_1")
            assert first.token != second.token
            assert (record,) == second.records

        async def test_an_expired_lease_is_taken_over_and_the_old_token_is_refused(
            self, quick: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            old = await quick.claim("cp_1")
            new = await quick.claim("cp_1")  # lease 0: taken over at once
            assert old.token != new.token, "a takeover must get a token of its own"
            record = CallRecord(
                tool_call_id=checkpoint.request.tool_call.id,
                decision=sample_decision(checkpoint),
            )
            with pytest.raises(LeaseLostError):
                await quick.record("cp_1", old.token, [record])
            with pytest.raises(LeaseLostError):
                await quick.renew("cp_1", old.token)
            with pytest.raises(LeaseLostError):
                await quick.resolve("cp_1", old.token, sample_resolution(checkpoint), None)
            await quick.release("cp_1", old.token)  # a stale release changes nothing
            await quick.record("cp_1", new.token, [record])
            stored = await quick.get("cp_1")
            assert ("claimed", (record,)) == (stored.status, stored.records)

        async def test_a_live_lease_is_renewed(self, store: DurableCheckpointStore) -> None:
            await store.save(sample_checkpoint("cp_1"))
            claim = await store.claim("cp_1")
            await store.renew("cp_1", claim.token)
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")
            with pytest.raises(LeaseLostError):
                await store.renew("cp_1", "not-the-token")

        async def test_the_lease_is_counted_in_seconds(self, store: DurableCheckpointStore) -> None:
            await store.save(sample_checkpoint("cp_1"))
            await store.claim("cp_1")
            await anyio.sleep(0.1)  # far below 60 s: a lease kept in ms would be gone
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")

        async def test_a_takeover_gets_the_records_of_the_claim_it_replaces(
            self, quick: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            old = await quick.claim("cp_1")
            record = _record(checkpoint)
            await quick.record("cp_1", old.token, [record])
            assert (record,) == (await quick.claim("cp_1")).records

        async def test_a_resolved_checkpoint_is_never_claimed_again(
            self, quick: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            claim = await quick.claim("cp_1")
            await quick.resolve("cp_1", claim.token, sample_resolution(checkpoint), None)
            with pytest.raises(CheckpointResolvedError):
                await quick.claim("cp_1")  # even though its lease (0 s) ran out

        async def test_a_token_is_dead_once_its_checkpoint_is_resolved(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            resolution = sample_resolution(checkpoint)
            await store.resolve("cp_1", claim.token, resolution, None)
            with pytest.raises(LeaseLostError):
                await store.record("cp_1", claim.token, [_record(checkpoint)])
            with pytest.raises(LeaseLostError):
                await store.renew("cp_1", claim.token)
            other = Resolution(
                decisions=resolution.decisions,
                result=RunResult(**{**_fields(resolution.result), "output": "Other."}),
                resolved_at=_T0,
            )
            with pytest.raises(LeaseLostError):
                await store.resolve("cp_1", claim.token, other, None)
            stored = await store.get("cp_1")
            assert ("resolved", resolution, ()) == (
                stored.status,
                stored.resolution,
                stored.records,
            )

        async def test_a_cancel_after_the_lease_ran_out_fences_the_old_token(
            self, quick: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            claim = await quick.claim("cp_1")
            await quick.cancel("cp_1")  # allowed: the lease (0 s) ran out
            with pytest.raises(LeaseLostError):
                await quick.record("cp_1", claim.token, [_record(checkpoint)])
            with pytest.raises(LeaseLostError):
                await quick.resolve("cp_1", claim.token, sample_resolution(checkpoint), None)
            assert (await quick.get("cp_1")).status == "cancelled"

        async def test_a_write_racing_a_takeover_is_seen_by_the_new_owner_or_refused(
            self, quick: DurableCheckpointStore
        ) -> None:
            # A record that succeeds happened before the takeover: the new owner sees it.
            for index in range(20):
                recorded, claim = await _race_record_and_takeover(quick, f"cp_{index}")
                if recorded is not None:
                    assert (recorded,) == claim.records, index

        async def test_a_resolve_racing_a_takeover_has_one_winner(
            self, quick: DurableCheckpointStore
        ) -> None:
            for index in range(20):
                resolved, taken = await _race_resolve_and_takeover(quick, f"cp_{index}")
                assert resolved != taken, (index, resolved, taken)

        async def test_a_cancel_racing_a_claim_has_one_winner(
            self, store: DurableCheckpointStore
        ) -> None:
            # A cancel that checks, then writes, lets a claim in between: the resume then
            # runs the tool on a checkpoint its caller was told is cancelled.
            for index in range(20):
                cancelled, claimed = await _race_cancel_and_claim(store, f"cp_{index}")
                assert cancelled != claimed, (index, cancelled, claimed)

        # --- Records and resolution --------------------------------------------------

        async def test_records_belong_to_their_own_checkpoint(
            self, store: DurableCheckpointStore
        ) -> None:
            # A later checkpoint of the same run may wait on a call with the same id (some
            # models number calls per message): it must not inherit the other's records.
            first = sample_checkpoint("cp_1")
            second = Checkpoint(**{**_fields(first), "id": "cp_2"})
            await store.save(first)
            await store.save(second)
            claim = await store.claim("cp_1")
            await store.record("cp_1", claim.token, [_record(first)])
            leaked = "cp_2 holds a record of cp_1's call: records belong to one checkpoint"
            assert tuple((await store.get("cp_2")).records) == (), leaked
            assert tuple((await store.claim("cp_2")).records) == (), leaked
            decided = [d.checkpoint_id for d in await store.decisions("run_1")]
            assert decided == ["cp_1"], f"decisions('run_1') are of checkpoints {decided}"

        async def test_one_record_call_keeps_every_record_it_is_given(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            records = [_record(checkpoint, call_id) for call_id in ("call_c", "call_a", "call_b")]
            await store.record("cp_1", claim.token, records)
            kept = [record.tool_call_id for record in (await store.get("cp_1")).records]
            assert kept == ["call_c", "call_a", "call_b"], (
                f"get() gives the records of calls {kept}: every one, in the order recorded"
            )
            await store.release("cp_1", claim.token)
            again = [record.tool_call_id for record in (await store.claim("cp_1")).records]
            assert again == kept, f"a claim gives the records of calls {again}, not {kept}"

        async def test_a_stale_resolve_saves_no_next_checkpoint(
            self, quick: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            old = await quick.claim("cp_1")
            await quick.claim("cp_1")  # taken over
            with pytest.raises(LeaseLostError):
                await quick.resolve(
                    "cp_1",
                    old.token,
                    sample_resolution(checkpoint, "cp_2"),
                    sample_checkpoint("cp_2"),
                )
            with pytest.raises(CheckpointNotFoundError):
                await quick.get("cp_2")
            assert [found.checkpoint_id for found in await quick.list_pending()] == ["cp_1"]

        async def test_delete_forgets_the_records_and_the_outcome(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            await store.record("cp_1", claim.token, [_record(checkpoint)])
            await store.resolve("cp_1", claim.token, sample_resolution(checkpoint), None)
            await store.delete("cp_1")
            await store.save(checkpoint)  # the same id again: a new checkpoint
            stored = await store.get("cp_1")
            assert (stored.status, stored.records, stored.resolution) == ("pending", (), None)
            assert (await store.claim("cp_1")).records == ()

        async def test_records_are_replaced_by_call_id(self, store: DurableCheckpointStore) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            call_id = checkpoint.request.tool_call.id
            started = CallRecord(tool_call_id=call_id, decision=sample_decision(checkpoint))
            finished = CallRecord(
                tool_call_id=call_id,
                decision=sample_decision(checkpoint),
                result=ToolResult(call_id, "Refunded.", False),
            )
            await store.record("cp_1", claim.token, [started])
            await store.record("cp_1", claim.token, [finished])
            assert (finished,) == (await store.get("cp_1")).records

        async def test_records_of_other_calls_are_kept_by_a_later_record_call(
            self, store: DurableCheckpointStore
        ) -> None:
            # A resume records every decision at once, then each result on its own: the
            # result of one call must not drop what was recorded for another (a record
            # lost this way makes a crashed resume run that other call again).
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            first, second = _record(checkpoint, "call_a"), _record(checkpoint, "call_b")
            await store.record("cp_1", claim.token, [first, second])
            finished = CallRecord(
                tool_call_id="call_a",
                decision=first.decision,
                result=ToolResult("call_a", "Refunded.", False),
            )
            await store.record("cp_1", claim.token, [finished])
            third = _record(checkpoint, "call_c")
            await store.record("cp_1", claim.token, [third])
            expected = sorted([finished, second, third], key=_call_id)
            assert expected == sorted((await store.get("cp_1")).records, key=_call_id)
            await store.release("cp_1", claim.token)
            assert expected == sorted((await store.claim("cp_1")).records, key=_call_id)

        async def test_resolve_stores_the_outcome_and_the_next_checkpoint(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            follow_up = sample_checkpoint("cp_2", minute=5)
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            resolution = sample_resolution(checkpoint, next_id="cp_2")

            await store.resolve("cp_1", claim.token, resolution, follow_up)

            stored = await store.get("cp_1")
            assert stored.status == "resolved", f"after resolve, the status is {stored.status!r}"
            assert resolution == stored.resolution, (
                f"get() gives back {stored.resolution!r}, not the resolution stored"
            )
            with pytest.raises(CheckpointNotFoundError) as retired:
                await store.load("cp_1")  # retired: get() still shows it
            assert not isinstance(retired.value, CheckpointCancelledError)
            assert follow_up == await store.load("cp_2")
            assert (await store.get("cp_2")).status == "pending"
            with pytest.raises(CheckpointResolvedError) as info:
                await store.claim("cp_1")
            assert resolution == info.value.resolution
            with pytest.raises(CheckpointResolvedError):
                await store.cancel("cp_1")

        async def test_saving_a_checkpoint_again_keeps_its_state(
            self, store: DurableCheckpointStore
        ) -> None:
            # An application may save a checkpoint it already handed over (a re-import, a
            # retried request): its status, records and outcome must stay, or a repeated
            # answer would run the approved call again.
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            await store.save(checkpoint)  # while a resume holds it: the claim stays
            status = (await store.get("cp_1")).status
            assert status == "claimed", f"saving a claimed checkpoint again made it {status!r}"
            await store.record("cp_1", claim.token, [_record(checkpoint)])
            resolution = sample_resolution(checkpoint)
            await store.resolve("cp_1", claim.token, resolution, None)
            await store.save(checkpoint)
            stored = await store.get("cp_1")
            assert (stored.status, stored.resolution) == ("resolved", resolution), (
                f"saving a resolved checkpoint again made it {stored.status!r}: a save "
                "replaces the data only, never the status, records or outcome"
            )
            assert stored.records == (_record(checkpoint),), "a save dropped the records"

        async def test_resolve_is_all_or_nothing_when_interrupted(
            self, store: DurableCheckpointStore
        ) -> None:
            # A cancellation at any await of resolve() stands in for a process that dies
            # between two writes: either the outcome and the next checkpoint are both
            # stored, or neither is and the claim still holds.
            for stop_at in range(12):
                first = sample_checkpoint(f"cp_a{stop_at}")
                follow_up = sample_checkpoint(f"cp_b{stop_at}", minute=5)
                await store.save(first)
                claim = await store.claim(first.id)
                resolution = sample_resolution(first, next_id=follow_up.id)
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as group:
                        group.start_soon(_cancel_after, scope, stop_at)
                        await store.resolve(first.id, claim.token, resolution, follow_up)
                        group.cancel_scope.cancel()
                status = (await store.get(first.id)).status
                try:
                    saved = (await store.get(follow_up.id)).status
                except CheckpointNotFoundError:
                    saved = None
                assert (status, saved) in (("resolved", "pending"), ("claimed", None)), (
                    f"resolve() cut off after {stop_at} scheduling points left the checkpoint "
                    f"{status!r} and the next one {saved or 'missing'}: store the outcome "
                    "and the next checkpoint in one atomic step"
                )
                if status == "claimed":
                    await store.release(first.id, claim.token)

        async def test_decisions_are_listed_by_run_oldest_first(
            self, store: DurableCheckpointStore
        ) -> None:
            # In the run's order: by checkpoint as saved, then as recorded. Not by
            # decided_at: it comes from each worker's clock, and clocks disagree (here the
            # second checkpoint's worker runs six minutes behind the first's).
            first = sample_checkpoint("cp_9")
            second = sample_checkpoint("cp_1")
            other = sample_checkpoint("cp_5", run_id="run_2")
            for checkpoint, minute, call_ids in (
                (first, 9, ["call_b", "call_a"]),
                (other, 1, ["call_x"]),
                (second, 3, ["call_c"]),
            ):
                await store.save(checkpoint)
                claim = await store.claim(checkpoint.id)
                for call_id in call_ids:  # one record call each, as a resume's results
                    decision = sample_decision(checkpoint, minute=minute)
                    decision = Decision(**{**_fields(decision), "tool_call_id": call_id})
                    record = CallRecord(tool_call_id=call_id, decision=decision)
                    await store.record(checkpoint.id, claim.token, [record])
                if checkpoint is first:  # call_b's result comes: its record keeps its place
                    done = CallRecord(
                        tool_call_id="call_b",
                        decision=Decision(**{**_fields(decision), "tool_call_id": "call_b"}),
                        result=ToolResult("call_b", "Done."),
                    )
                    await store.record(checkpoint.id, claim.token, [done])
            decisions = await store.decisions("run_1")
            listed = [(d.checkpoint_id, d.tool_call_id) for d in decisions]
            assert listed == [("cp_9", "call_b"), ("cp_9", "call_a"), ("cp_1", "call_c")], (
                f"decisions('run_1') come as {listed}: by checkpoint as saved, then in the "
                "order first recorded (a record replaced later keeps its place)"
            )
            assert decisions[2].decided_at < decisions[0].decided_at
            assert list(await store.decisions("run_none")) == []

        # --- Cancellation ------------------------------------------------------------

        async def test_cancel_retires_a_pending_checkpoint(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            await store.cancel("cp_1")
            await store.cancel("cp_1")  # twice is fine
            assert (await store.get("cp_1")).status == "cancelled"
            with pytest.raises(CheckpointCancelledError):
                await store.claim("cp_1")
            with pytest.raises(CheckpointCancelledError):
                await store.load("cp_1")
            assert list(await store.list_pending()) == []

        async def test_cancel_refuses_a_held_claim_and_unknown_ids(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            await store.claim("cp_1")
            with pytest.raises(CheckpointClaimedError):
                await store.cancel("cp_1")
            with pytest.raises(CheckpointNotFoundError):
                await store.cancel("cp_missing")

        async def test_cancel_of_a_resolved_checkpoint_says_how_it_was_resolved(
            self, store: DurableCheckpointStore
        ) -> None:
            # The caller who tried to cancel learns the outcome it came too late for.
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            resolution = sample_resolution(checkpoint)
            await store.resolve("cp_1", claim.token, resolution, None)
            with pytest.raises(CheckpointResolvedError) as info:
                await store.cancel("cp_1")
            assert info.value.checkpoint_id == "cp_1"
            assert resolution == info.value.resolution, (
                f"cancel() of a resolved checkpoint raised with .resolution = "
                f"{info.value.resolution!r}: it must hold the stored outcome"
            )
            stored = await store.get("cp_1")
            assert (stored.status, stored.resolution) == ("resolved", resolution)

        # --- Listing -----------------------------------------------------------------

        async def test_list_pending_pages_oldest_first(self, store: DurableCheckpointStore) -> None:
            for index in range(7):
                await store.save(sample_checkpoint(f"cp_{index}", minute=index))
            pages: list[list[str]] = []
            after: str | None = None
            for _ in range(5):  # bounded: a store whose `after` is inclusive never ends
                page = await store.list_pending(limit=3, after=after)
                if not page:
                    break
                pages.append([p.checkpoint_id for p in page])
                after = page[-1].checkpoint_id
            assert pages == [["cp_0", "cp_1", "cp_2"], ["cp_3", "cp_4", "cp_5"], ["cp_6"]]

        async def test_list_pending_shows_claimed_but_not_finished_checkpoints(
            self, store: DurableCheckpointStore
        ) -> None:
            for name in ("cp_a", "cp_b", "cp_c", "cp_d"):
                await store.save(sample_checkpoint(name))
            await store.claim("cp_b")
            done = await store.claim("cp_c")
            await store.resolve(
                "cp_c", done.token, sample_resolution(sample_checkpoint("cp_c")), None
            )
            await store.cancel("cp_d")
            listed = await store.list_pending()
            assert [p.checkpoint_id for p in listed] == ["cp_a", "cp_b"]
            checkpoint = sample_checkpoint("cp_a")
            assert PendingRequest.of(checkpoint) == listed[0]

        async def test_list_pending_filters_by_agent_and_metadata(
            self, store: DurableCheckpointStore
        ) -> None:
            cases: list[tuple[str, str, dict[str, Any]]] = [
                ("cp_1", "support", {"tenant": "acme", "user": {"id": 1}}),
                ("cp_2", "billing", {"tenant": "acme", "user": {"id": 1}}),
                ("cp_3", "support", {"tenant": "other", "user": {"id": 1}}),
                ("cp_4", "support", {"tenant": "acme", "user": {"id": 2}}),
                ("cp_5", "support", {"tenant": "acme"}),
            ]
            for name, agent, metadata in cases:
                await store.save(sample_checkpoint(name, agent_name=agent, metadata=metadata))

            async def ids(**filters: Any) -> list[str]:
                return [p.checkpoint_id for p in await store.list_pending(**filters)]

            assert await ids(agent_name="support") == ["cp_1", "cp_3", "cp_4", "cp_5"]
            # A str subclass (an application's enum of agent names) is its text.
            assert await ids(agent_name=_AgentName.SUPPORT) == ["cp_1", "cp_3", "cp_4", "cp_5"]
            assert await ids(metadata={"tenant": "acme"}) == ["cp_1", "cp_2", "cp_4", "cp_5"]
            assert await ids(metadata={"tenant": "acme", "user": {"id": 1}}) == ["cp_1", "cp_2"]
            assert await ids(agent_name="support", metadata={"user": {"id": 1}}) == ["cp_1", "cp_3"]
            assert await ids(metadata={"missing": None}) == []
            # The whole name, exactly: not a prefix, another case, or a pattern.
            for name, agent in [("cp_6", "support_admin"), ("cp_7", "Support"), ("cp_8", "s%")]:
                await store.save(sample_checkpoint(name, agent_name=agent))
            assert await ids(agent_name="support") == ["cp_1", "cp_3", "cp_4", "cp_5"]
            assert await ids(agent_name="support_admin") == ["cp_6"]
            assert await ids(agent_name="s%") == ["cp_8"]
            assert await ids(agent_name="s_pport") == []

        async def test_list_pending_fills_a_page_past_checkpoints_that_do_not_match(
            self, store: DurableCheckpointStore
        ) -> None:
            # A store may pre-filter in its database and check the rest itself: a page
            # still fills up from the checkpoints beyond those that do not match.
            for index in range(6):
                user = {"id": 2 if index >= 3 else 1}
                await store.save(sample_checkpoint(f"cp_{index}", metadata={"user": user}))
            wanted = {"user": {"id": 2}}
            first = await store.list_pending(limit=2, metadata=wanted)
            assert [p.checkpoint_id for p in first] == ["cp_3", "cp_4"]
            rest = await store.list_pending(limit=2, after="cp_4", metadata=wanted)
            assert [p.checkpoint_id for p in rest] == ["cp_5"]

        async def test_saving_again_changes_what_list_pending_filters_on(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1", metadata={"tenant": "acme"}))
            moved = sample_checkpoint("cp_1", agent_name="billing", metadata={"tenant": "other"})
            await store.save(moved)

            async def ids(**filters: Any) -> list[str]:
                return [p.checkpoint_id for p in await store.list_pending(**filters)]

            assert await ids(agent_name="billing", metadata={"tenant": "other"}) == ["cp_1"]
            assert await ids(agent_name="support") == []
            assert await ids(metadata={"tenant": "acme"}) == []

        async def test_metadata_with_a_nul_character_is_stored_and_filtered(
            self, store: DurableCheckpointStore
        ) -> None:
            # PostgreSQL's jsonb and text cannot hold U+0000; a store must still keep it.
            metadata = {"note": "a\x00b", "\x00key": 1, "tenant": "acme"}
            await store.save(sample_checkpoint("cp_1", metadata=metadata))
            await store.save(sample_checkpoint("cp_2", metadata={"note": "ab", "tenant": "acme"}))

            async def ids(**filters: Any) -> list[str]:
                return [p.checkpoint_id for p in await store.list_pending(**filters)]

            assert metadata == (await store.load("cp_1")).metadata
            assert await ids(metadata={"note": "a\x00b"}) == ["cp_1"]
            assert await ids(metadata={"\x00key": 1, "tenant": "acme"}) == ["cp_1"]
            assert await ids(metadata={"note": "ab"}) == ["cp_2"]
            assert await ids(metadata={"tenant": "acme"}) == ["cp_1", "cp_2"]
            assert await ids(metadata={"note": "a"}) == []

        async def test_list_pending_keeps_the_order_of_saving_not_of_ids(
            self, store: DurableCheckpointStore
        ) -> None:
            for index in range(12):
                await store.save(sample_checkpoint(f"cp_{index}", minute=index))
            listed = [found.checkpoint_id for found in await store.list_pending()]
            assert [f"cp_{index}" for index in range(12)] == listed
            page = await store.list_pending(after="cp_9", limit=2)
            assert [found.checkpoint_id for found in page] == ["cp_10", "cp_11"]

        async def test_list_pending_keeps_the_order_of_saving_not_of_request_times(
            self, store: DurableCheckpointStore
        ) -> None:
            # Oldest first means first saved first; the requests' created_at come from the
            # workers' clocks, which may disagree (here each worker runs behind the last).
            for name, minute in (("cp_a", 30), ("cp_b", 10), ("cp_c", 20)):
                await store.save(sample_checkpoint(name, minute=minute))
            listed = [found.checkpoint_id for found in await store.list_pending()]
            assert listed == ["cp_a", "cp_b", "cp_c"], (
                f"list_pending() gives {listed}: in the order first saved, not by created_at"
            )
            pages: list[str] = []
            after: str | None = None
            for _ in range(4):  # bounded, in case a page never ends
                page = await store.list_pending(limit=1, after=after)
                if not page:
                    break
                pages.append(page[0].checkpoint_id)
                after = page[0].checkpoint_id
            assert pages == ["cp_a", "cp_b", "cp_c"], f"pages of one give {pages}"

        async def test_saving_again_keeps_a_checkpoint_s_place_in_the_listing(
            self, store: DurableCheckpointStore
        ) -> None:
            # A checkpoint saved again (a re-import, a retried request) stays where it was
            # first saved: moving it would let a client paging with `after` skip or repeat it.
            for index in range(3):
                await store.save(sample_checkpoint(f"cp_{index}", minute=index))
            await store.save(sample_checkpoint("cp_0", metadata={"tenant": "other"}, minute=9))
            listed = [found.checkpoint_id for found in await store.list_pending()]
            assert listed == ["cp_0", "cp_1", "cp_2"], (
                f"after saving cp_0 again, list_pending() gives {listed}: saving again keeps "
                "the place of the first save"
            )
            page = await store.list_pending(limit=1, after="cp_0")
            assert [found.checkpoint_id for found in page] == ["cp_1"]
            assert (await store.list_pending())[0].metadata == {"tenant": "other"}

        async def test_list_pending_gives_every_open_request_of_a_checkpoint(
            self, store: DurableCheckpointStore
        ) -> None:
            # A turn may wait on several calls; a dashboard shows them all.
            checkpoint = _rich_checkpoint()
            await store.save(checkpoint)
            [listed] = await store.list_pending()
            assert listed.requests == checkpoint.open_requests, (
                f"list_pending() gives the requests {[r.id for r in listed.requests]}, not "
                f"every open request {[r.id for r in checkpoint.open_requests]}"
            )
            assert PendingRequest.of(checkpoint) == listed

        async def test_list_pending_refuses_an_unknown_after_and_a_bad_limit_or_filter(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            with pytest.raises(CheckpointNotFoundError):
                await store.list_pending(after="cp_missing")
            await store.delete("cp_1")
            with pytest.raises(CheckpointNotFoundError):  # a page cannot start after it
                await store.list_pending(after="cp_1")
            for limit in (0, -1, "3", 2.0, True):
                with pytest.raises(ConfigurationError):
                    await store.list_pending(limit=limit)  # type: ignore[arg-type]
            with pytest.raises(ConfigurationError):
                await store.list_pending(metadata=[("tenant", "acme")])  # type: ignore[arg-type]
            for agent_name in (5, b"support", ["support"]):
                with pytest.raises(ConfigurationError):
                    await store.list_pending(agent_name=agent_name)  # type: ignore[arg-type]

        async def test_paging_goes_on_after_a_listed_checkpoint_was_resolved(
            self, store: DurableCheckpointStore
        ) -> None:
            for index in range(4):
                await store.save(sample_checkpoint(f"cp_{index}", minute=index))
            last = (await store.list_pending(limit=2))[-1].checkpoint_id
            claim = await store.claim(last)
            await store.resolve(last, claim.token, sample_resolution(sample_checkpoint(last)), None)
            page = await store.list_pending(limit=2, after=last)
            assert [found.checkpoint_id for found in page] == ["cp_2", "cp_3"]

        async def test_a_metadata_filter_matches_equal_values_only(
            self, store: DurableCheckpointStore
        ) -> None:
            metadata = {"user": {"id": 1, "role": "admin"}, "tags": [1, 2], "n": 1}
            await store.save(sample_checkpoint("cp_1", metadata=metadata))

            async def ids(wanted: dict[str, Any]) -> list[str]:
                found = await store.list_pending(metadata=wanted)
                return [item.checkpoint_id for item in found]

            assert await ids({"user": {"id": 1}}) == []  # not containment
            assert await ids({"tags": [1]}) == []
            assert await ids({"n": "1"}) == []  # not text
            assert await ids({"user": {"role": "admin", "id": 1}}) == ["cp_1"]
            assert await ids({"tags": [1, 2], "n": 1}) == ["cp_1"]

        async def test_a_metadata_filter_compares_as_json_so_true_is_not_1(
            self, store: DurableCheckpointStore
        ) -> None:
            # Python says True == 1 and 1 == 1.0; JSON has booleans apart from numbers.
            # Compare the values as JSON (a bool equals only a bool), not with ==.
            await store.save(sample_checkpoint("cp_1", metadata={"vip": True, "n": 1}))
            await store.save(sample_checkpoint("cp_2", metadata={"vip": 1, "n": [False, 0]}))

            async def ids(wanted: dict[str, Any]) -> list[str]:
                found = await store.list_pending(metadata=wanted)
                return [item.checkpoint_id for item in found]

            assert await ids({"vip": True}) == ["cp_1"]
            assert await ids({"vip": 1}) == ["cp_2"]
            assert await ids({"vip": 1.0}) == ["cp_2"]  # one number, as in JSON
            assert await ids({"n": True}) == []
            assert await ids({"n": 1.0}) == ["cp_1"]
            assert await ids({"n": [0, False]}) == []
            assert await ids({"n": [False, 0]}) == ["cp_2"]
            assert await ids({"n": [False, False]}) == []

        async def test_a_metadata_filter_finds_every_float_as_it_was_given(
            self, store: DurableCheckpointStore
        ) -> None:
            # A database that keeps JSON numbers as decimals (PostgreSQL's jsonb) gives
            # 1e23 back as the integer 10**23, which is not the float 1e23; 2.0**70 is
            # written 1.1805916207174113e+21, which is not 2**70 either. Each run's float
            # must still be found by that same float, and only by it.
            floats = [1e23, 2.0**70, -1e300, 1.7976931348623157e308, 1e16, 0.1, 5e-324]
            for n, value in enumerate(floats):
                nested = {"amount": value, "deep": {"v": [value]}}
                await store.save(sample_checkpoint(f"cp_{n}", metadata=nested))
            await store.save(sample_checkpoint("cp_int", metadata={"amount": 10**23}))

            async def ids(wanted: dict[str, Any]) -> list[str]:
                found = await store.list_pending(metadata=wanted)
                return [item.checkpoint_id for item in found]

            for n, value in enumerate(floats):
                assert await ids({"amount": value}) == [f"cp_{n}"], value
                assert await ids({"deep": {"v": [value]}}) == [f"cp_{n}"], value
            assert await ids({"amount": 10**23}) == ["cp_int"]  # not the float 1e23
            assert await ids({"amount": 2**70}) == ["cp_1"]  # one number, as in JSON
            assert await ids({"amount": 1e16}) == ["cp_4"]

        async def test_a_metadata_filter_takes_tuples_and_lists_as_arrays(
            self, store: DurableCheckpointStore
        ) -> None:
            # A JSON array may come as a tuple, in the run's metadata or in the filter.
            await store.save(sample_checkpoint("cp_1", metadata={"tags": ("a", "b")}))
            await store.save(sample_checkpoint("cp_2", metadata={"tags": ["a"]}))

            async def ids(wanted: dict[str, Any]) -> list[str]:
                found = await store.list_pending(metadata=wanted)
                return [item.checkpoint_id for item in found]

            assert await ids({"tags": ["a", "b"]}) == ["cp_1"]
            assert await ids({"tags": ("a", "b")}) == ["cp_1"]
            assert await ids({"tags": ("a",)}) == ["cp_2"]
            assert await ids({"tags": ("b", "a")}) == []

        async def test_a_metadata_filter_never_matches_a_missing_key(
            self, store: DurableCheckpointStore
        ) -> None:
            # A key the run's metadata lacks is no match, even for None; also for a key a
            # store cannot look up in its database (U+0000), which it checks itself.
            await store.save(sample_checkpoint("cp_1", metadata={"tenant": "acme", "n": None}))

            async def ids(wanted: dict[str, Any]) -> list[str]:
                found = await store.list_pending(metadata=wanted)
                return [item.checkpoint_id for item in found]

            assert await ids({"n": None}) == ["cp_1"]
            assert await ids({"missing": None}) == []
            assert await ids({"\x00missing": None}) == []
            assert await ids({"tenant": "acme", "\x00missing": None}) == []

        # --- JSON --------------------------------------------------------------------

        async def test_every_field_round_trips(self, store: DurableCheckpointStore) -> None:
            # Fields away from their defaults, where a lost field would read back as one.
            checkpoint = _rich_checkpoint()
            await store.save(checkpoint)
            assert checkpoint == await store.load("cp_1")
            claim = await store.claim("cp_1")
            decision = Decision(
                **{**_fields(sample_decision(checkpoint)), "edited": True, "value": "why"}
            )
            record = CallRecord(
                tool_call_id=decision.tool_call_id,
                decision=decision,
                result=ToolResult(decision.tool_call_id, "It failed.", True),
            )
            await store.record("cp_1", claim.token, [record])
            assert (record,) == (await store.get("cp_1")).records
            following = Checkpoint(**{**_fields(checkpoint), "id": "cp_2"})
            plain = sample_resolution(checkpoint, "cp_2")
            resolution = Resolution(
                decisions=plain.decisions,
                result=RunResult(
                    **{
                        **_fields(plain.result),
                        "interruption": following.request,
                        "pending_requests": following.open_requests,
                    }
                ),
                resolved_at=_T0 + datetime.timedelta(microseconds=654321),
                expired=True,
            )
            await store.resolve("cp_1", claim.token, resolution, following)
            assert resolution == (await store.get("cp_1")).resolution
            assert following == await store.load("cp_2")

        async def test_data_round_trips_exactly(self, store: DurableCheckpointStore) -> None:
            text = 'Ünïcödé ✓ "quoted" \\ \n'
            checkpoint = sample_checkpoint(
                "cp_1",
                metadata={"text": text, "n": 1.5, "big": 2**53, "nested": [None, True, {}]},
            )
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            resolution = sample_resolution(checkpoint)
            await store.resolve("cp_1", claim.token, resolution, None)
            stored = await store.get("cp_1")
            assert checkpoint == stored.checkpoint
            assert resolution == stored.resolution
            assert resolution == structure(
                json.loads(json.dumps(unstructure(resolution))), Resolution
            )

        # --- Through the runtime -----------------------------------------------------

        async def test_concurrent_resumes_run_the_tool_once(
            self, store: DurableCheckpointStore
        ) -> None:
            app = _App(store)
            first = await app.interrupt()
            outcomes = await app.resume_many(first, 8)
            assert len(app.effects) == 1
            completed = [o for o in outcomes if isinstance(o, RunResult)]
            assert all(r.output == "Refunded." for r in completed)
            assert all(isinstance(o, (RunResult, CheckpointClaimedError)) for o in outcomes), (
                outcomes
            )

        async def test_repeating_a_finished_resume_returns_the_stored_result(
            self, store: DurableCheckpointStore
        ) -> None:
            app = _App(store)
            first = await app.interrupt()
            done = await app.resume(first, app.approve(first))
            again = await app.resume(first, app.approve(first))
            assert done == again
            assert len(app.effects) == 1
            assert len(app.model.requests) == 2  # no model call for the repeat
            with pytest.raises(HumanResponseConflictError):
                await app.resume(first, HumanResponse(app.request_id(first), "reject"))

        async def test_expiry_racing_an_answer_has_one_winner(
            self, store: DurableCheckpointStore
        ) -> None:
            app = _App(store)
            first = await app.interrupt()
            outcomes: list[object] = []

            async def answer() -> None:
                try:
                    outcomes.append(await app.resume(first, app.approve(first)))
                except Exception as exc:  # noqa: BLE001 - collected for the assertions
                    outcomes.append(exc)

            async def expire() -> None:
                try:
                    outcomes.append(
                        await app.runtime.expire(app.agent, checkpoint_id=app.cp(first))
                    )
                except Exception as exc:  # noqa: BLE001 - collected for the assertions
                    outcomes.append(exc)

            async with anyio.create_task_group() as group:
                group.start_soon(answer)
                group.start_soon(expire)
            [result] = [o for o in outcomes if isinstance(o, RunResult)]
            assert result.status == "completed"
            losers = (
                CheckpointClaimedError,
                CheckpointResolvedError,
                HumanResponseConflictError,
                HumanRequestExpiredError,
            )
            assert all(isinstance(o, (RunResult, *losers)) for o in outcomes), outcomes
            assert len(app.effects) <= 1
            stored = await store.get(app.cp(first))
            assert stored.status == "resolved"

        async def test_cancelled_checkpoints_cannot_be_resumed(
            self, store: DurableCheckpointStore
        ) -> None:
            app = _App(store)
            first = await app.interrupt()
            await app.runtime.cancel(app.cp(first))
            with pytest.raises(CheckpointCancelledError):
                await app.resume(first, app.approve(first))
            assert app.effects == []

    suite: type = StoreConformance
    if second_handle is not None:
        suite = _with_two_handles(suite, second_handle)
    if age_leases is not None:
        suite = _with_lease_times(suite, age_leases)
    suite.__name__ = suite.__qualname__ = "StoreConformance"
    return suite


def _with_lease_times(base: type, age_leases: AgeLeases) -> type:
    """*base* with the tests that move time on for the leases (each 60 s long)."""
    import pytest  # present: store_conformance_tests checked

    class LeaseTimes(base):  # type: ignore[misc]
        async def test_a_claim_holds_until_its_lease_runs_out(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            first = await store.claim("cp_1")
            await age_leases(store, 55.0)
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")  # 5 s left
            await age_leases(store, 10.0)
            second = await store.claim("cp_1")  # ran out 5 s ago: taken over
            assert first.token != second.token

        async def test_a_takeover_holds_a_lease_of_its_own(
            self, store: DurableCheckpointStore
        ) -> None:
            # A takeover that kept the lease it replaced would be open to a third
            # claimer at once: two resumes would run side by side.
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            await store.claim("cp_1")
            await age_leases(store, 65.0)
            taken = await store.claim("cp_1")
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")
            await age_leases(store, 55.0)
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")  # 5 s of the takeover's lease left
            await store.record("cp_1", taken.token, [_record(checkpoint)])
            await age_leases(store, 10.0)
            third = await store.claim("cp_1")
            assert (_record(checkpoint),) == third.records

        async def test_a_renewal_starts_a_full_lease_from_now(
            self, store: DurableCheckpointStore
        ) -> None:
            await store.save(sample_checkpoint("cp_1"))
            claim = await store.claim("cp_1")
            await age_leases(store, 50.0)
            await store.renew("cp_1", claim.token)  # 60 s from now, not from the claim
            await age_leases(store, 50.0)
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")  # 10 s left
            await store.renew("cp_1", claim.token)
            await age_leases(store, 55.0)
            with pytest.raises(CheckpointClaimedError):
                await store.claim("cp_1")  # 5 s left
            await age_leases(store, 10.0)
            taken = await store.claim("cp_1")  # renewals do not make a lease endless
            assert taken.token != claim.token
            with pytest.raises(LeaseLostError):
                await store.renew("cp_1", claim.token)

        async def test_a_cancel_waits_for_the_lease_then_fences_the_claim(
            self, store: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            claim = await store.claim("cp_1")
            await age_leases(store, 55.0)
            with pytest.raises(CheckpointClaimedError):
                await store.cancel("cp_1")
            assert (await store.get("cp_1")).status == "claimed"
            await age_leases(store, 10.0)
            await store.cancel("cp_1")
            with pytest.raises(LeaseLostError):
                await store.record("cp_1", claim.token, [_record(checkpoint)])
            assert (await store.get("cp_1")).status == "cancelled"

    return LeaseTimes


def _with_two_handles(base: type, second_handle: SecondHandle) -> type:
    """*base* with the tests that need a second store object on the same storage."""
    import pytest  # present: store_conformance_tests checked

    class TwoHandles(base):  # type: ignore[misc]
        @pytest.fixture
        async def other(
            self, store: DurableCheckpointStore
        ) -> AsyncIterator[DurableCheckpointStore]:
            async with second_handle(store) as other:
                yield other

        @pytest.fixture
        async def quick_other(
            self, quick: DurableCheckpointStore
        ) -> AsyncIterator[DurableCheckpointStore]:
            async with second_handle(quick) as other:
                yield other

        async def test_a_second_handle_sees_checkpoints_and_claims(
            self, store: DurableCheckpointStore, other: DurableCheckpointStore
        ) -> None:
            assert other is not store, "second_handle must open another store object"
            checkpoint = sample_checkpoint("cp_1")
            await store.save(checkpoint)
            assert checkpoint == await other.load("cp_1")
            assert [p.checkpoint_id for p in await other.list_pending()] == ["cp_1"]
            claim = await store.claim("cp_1")
            with pytest.raises(CheckpointClaimedError):
                await other.claim("cp_1")  # the claim lives in the storage
            await store.record("cp_1", claim.token, [_record(checkpoint)])
            assert (_record(checkpoint),) == (await other.get("cp_1")).records
            await store.release("cp_1", claim.token)
            taken = await other.claim("cp_1")
            assert taken.token != claim.token, "each claim needs a token of its own"
            with pytest.raises(LeaseLostError):
                await store.renew("cp_1", claim.token)

        async def test_a_takeover_through_a_second_handle_fences_the_first(
            self, quick: DurableCheckpointStore, quick_other: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            old = await quick.claim("cp_1")
            new = await quick_other.claim("cp_1")  # lease 0: taken over at once
            assert old.token != new.token, (
                "two store objects gave the same token: tokens must be unique across every "
                "object on the storage (random, not a counter kept in the object)"
            )
            record = _record(checkpoint)
            with pytest.raises(LeaseLostError):
                await quick.record("cp_1", old.token, [record])
            with pytest.raises(LeaseLostError):
                await quick.resolve("cp_1", old.token, sample_resolution(checkpoint), None)
            await quick_other.record("cp_1", new.token, [record])
            resolution = sample_resolution(checkpoint)
            await quick_other.resolve("cp_1", new.token, resolution, None)
            stored = await quick.get("cp_1")
            assert ("resolved", (record,), resolution) == (
                stored.status,
                stored.records,
                stored.resolution,
            )
            with pytest.raises(CheckpointResolvedError):
                await quick.claim("cp_1")

        async def test_a_cancel_through_a_second_handle(
            self, quick: DurableCheckpointStore, quick_other: DurableCheckpointStore
        ) -> None:
            checkpoint = sample_checkpoint("cp_1")
            await quick.save(checkpoint)
            claim = await quick.claim("cp_1")
            await quick_other.cancel("cp_1")  # allowed: the lease (0 s) ran out
            with pytest.raises(LeaseLostError):
                await quick.record("cp_1", claim.token, [_record(checkpoint)])
            with pytest.raises(CheckpointCancelledError):
                await quick.load("cp_1")
            assert list(await quick.list_pending()) == []

        async def test_a_run_interrupted_on_one_handle_resumes_once_on_another(
            self, store: DurableCheckpointStore, other: DurableCheckpointStore
        ) -> None:
            first, second = _App(store), _App(other)
            interrupted = await first.interrupt()
            outcomes = await second.resume_many(interrupted, 3)
            outcomes += await first.resume_many(interrupted, 3)
            results = [o for o in outcomes if isinstance(o, RunResult)]
            assert results, outcomes
            assert all(r.output == "Refunded." for r in results), outcomes
            assert all(isinstance(o, (RunResult, CheckpointClaimedError)) for o in outcomes), (
                outcomes
            )
            assert len(first.effects + second.effects) == 1
            again = await first.resume(interrupted, first.approve(interrupted))
            assert again.output == "Refunded."
            assert len(first.effects + second.effects) == 1

    return TwoHandles


class _App:
    """A refund agent over *store*: one approval, then a final answer."""

    def __init__(self, store: DurableCheckpointStore) -> None:
        self.effects: list[str] = []
        self.model = ScriptedModel(lambda request: _answer(request))
        tool = ToolSpec("refund", "Refund an order.", _SCHEMA, self.refund, requires_approval=True)
        self.agent = Agent("support", "Refund when approved.", self.model, (tool,))
        self.runtime = Runtime(checkpoint_store=store)

    async def refund(self, arguments: Mapping[str, Any], context: ToolContext) -> str:
        self.effects.append(context.idempotency_key)
        await anyio.lowlevel.checkpoint()
        return "Refunded."

    async def interrupt(self) -> RunResult:
        return await self.runtime.run(self.agent, "Refund order 1.", metadata={"tenant": "acme"})

    @staticmethod
    def cp(result: RunResult) -> str:
        assert result.checkpoint_id is not None
        return result.checkpoint_id

    @staticmethod
    def request_id(result: RunResult) -> str:
        assert result.interruption is not None
        return result.interruption.id

    def approve(self, result: RunResult) -> HumanResponse:
        return HumanResponse(self.request_id(result), "approve", responded_by="ops")

    async def resume(self, result: RunResult, response: HumanResponse) -> RunResult:
        return await self.runtime.resume(
            self.agent, checkpoint_id=self.cp(result), response=response
        )

    async def resume_many(self, result: RunResult, count: int) -> list[object]:
        outcomes: list[object] = []

        async def one() -> None:
            try:
                outcomes.append(await self.resume(result, self.approve(result)))
            except Exception as exc:  # noqa: BLE001 - collected for the assertions
                outcomes.append(exc)

        async with anyio.create_task_group() as group:
            for _ in range(count):
                group.start_soon(one)
        return outcomes


def _answer(request: Any) -> Any:
    last = request.messages[-1]
    if last.role == "tool":
        return last.content
    return call("refund", id="call_1", order_id="1")
