"""Edge cases of the store protocol beyond the conformance suite (runlet.testing), where a
SQL store could easily drift from the in-memory reference: saving over a claimed
checkpoint, record order, token writes on unknown ids, metadata filters whose values
compare differently in SQL (1, 1.0, true, "1", null, nested objects), paging after a
resolved checkpoint, retention and the open/closed life.

``semantics_tests(factory)`` and ``sql_store_tests(factory)`` return test classes;
``factory(lease)`` is an async context manager yielding a fresh, empty store with that
lease (``0`` means a claim can be taken over at once). The in-memory store runs the
semantics too, so they pin the reference behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
import pytest

from runlet import (
    CallRecord,
    Checkpoint,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    ConfigurationError,
    Decision,
    HumanRequest,
    LeaseLostError,
    Message,
    Resolution,
    RunResult,
    ToolCall,
    ToolResult,
    Usage,
)

Factory = Callable[[float | None], AbstractAsyncContextManager[Any]]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def checkpoint(
    checkpoint_id: str = "cp_1",
    *,
    run_id: str = "run_1",
    agent_name: str = "agent",
    metadata: dict[str, Any] | None = None,
    calls: int = 1,
    text: str = "go",
) -> Checkpoint:
    """A valid checkpoint waiting on *calls* approvals."""
    pending = tuple(ToolCall(f"call_{n}", "pay", {"n": n}) for n in range(calls))
    requests = tuple(
        HumanRequest(
            f"req_{checkpoint_id}_{n}", "approval", "Allow pay?", tool_call=call, created_at=T0
        )
        for n, call in enumerate(pending)
    )
    return Checkpoint(
        id=checkpoint_id,
        run_id=run_id,
        agent_name=agent_name,
        messages=(Message.user(text),),
        options={},
        metadata=metadata or {},
        transcript=(Message.user(text), Message.assistant("", pending)),
        pending_tool_calls=pending,
        request=requests[0],
        more_requests=requests[1:],
    )


def decision(cp: Checkpoint, n: int = 0, *, minutes: int = 0) -> Decision:
    request = cp.open_requests[n]
    return Decision(
        request_id=request.id,
        checkpoint_id=cp.id,
        tool_call_id=request.tool_call.id,
        tool_name="pay",
        kind="approval",
        action="approve",
        arguments=dict(request.tool_call.arguments),
        decided_at=T0 + timedelta(minutes=minutes),
    )


def record(
    cp: Checkpoint, n: int = 0, *, result: str | None = None, minutes: int = 0
) -> CallRecord:
    call_id = cp.open_requests[n].tool_call.id
    return CallRecord(
        tool_call_id=call_id,
        decision=decision(cp, n, minutes=minutes),
        result=None if result is None else ToolResult(call_id, result),
    )


def resolution(cp: Checkpoint) -> Resolution:
    return Resolution(
        decisions=(decision(cp),),
        result=RunResult(
            status="completed",
            output="done",
            transcript=(*cp.transcript, Message.assistant("done")),
            usage=Usage(),
            run_id=cp.run_id,
        ),
        resolved_at=T0,
    )


def semantics_tests(factory: Factory) -> type:
    """A pytest class checking the durable store protocol on stores from *factory*."""

    @pytest.mark.anyio
    class StoreSemantics:
        async def test_save_again_replaces_data_and_keeps_state(self) -> None:
            async with factory(60.0) as store:
                await store.save(checkpoint())
                claim = await store.claim("cp_1")
                changed = checkpoint(text="changed")
                await store.save(changed)
                stored = await store.get("cp_1")
                assert (changed, "claimed") == (stored.checkpoint, stored.status)
                await store.release("cp_1", claim.token)

        @pytest.mark.parametrize("bad", ["cp\ud800", "\udfff", 5, None, ["cp_1"], {"id": 1}])
        async def test_an_id_no_row_can_hold_is_an_unknown_id(self, bad: Any) -> None:
            # A web request's JSON may carry a lone surrogate ("\\ud800"), or a number
            # where an id belongs: each store answers as for any unknown id.
            async with factory(60.0) as store:
                await store.save(checkpoint())
                for method in (store.get, store.load, store.claim, store.cancel):
                    with pytest.raises(CheckpointNotFoundError):
                        await method(bad)
                with pytest.raises(CheckpointNotFoundError):
                    await store.list_pending(after=bad if bad is not None else "nope")
                for write in (store.renew, store.record, store.resolve):
                    args = {store.renew: (), store.record: ([],)}.get(write, (None, None))
                    with pytest.raises(LeaseLostError):
                        await write(bad, "token", *args)
                    with pytest.raises(LeaseLostError):
                        await write("cp_1", bad, *args)
                await store.release(bad, "token")
                await store.delete(bad)
                assert [] == list(await store.decisions(bad))
                assert [] == list(await store.list_pending(agent_name="agent\ud800"))
                assert "pending" == (await store.get("cp_1")).status

        async def test_a_limit_beyond_any_table_lists_everything(self) -> None:
            async with factory(60.0) as store:
                for name in ("cp_1", "cp_2", "cp_3"):
                    await store.save(checkpoint(name))
                for limit in (2**62, 2**63, 10**30):
                    page = await store.list_pending(limit=limit)
                    assert ["cp_1", "cp_2", "cp_3"] == [p.checkpoint_id for p in page]

        async def test_a_filter_on_an_int_too_large_for_a_float(self) -> None:
            async with factory(60.0) as store:
                await store.save(checkpoint("cp_1", metadata={"n": 10**400}))
                await store.save(checkpoint("cp_2", metadata={"n": 1}))
                await store.save(checkpoint("cp_3", metadata={"n": 10**400 + 1}))
                for wanted, found in (
                    (10**400, ["cp_1"]),
                    (-(10**400), []),
                    (1, ["cp_2"]),
                    (2**53, []),
                ):
                    page = await store.list_pending(metadata={"n": wanted})
                    assert found == [p.checkpoint_id for p in page], wanted

        async def test_the_longest_lease_holds_a_claim(self) -> None:
            async with factory(1e9) as store:
                await store.save(checkpoint())
                claim = await store.claim("cp_1")
                with pytest.raises(CheckpointClaimedError):
                    await store.claim("cp_1")
                await store.renew("cp_1", claim.token)

        async def test_token_writes_on_unknown_checkpoints_lose_the_lease(self) -> None:
            async with factory(60.0) as store:
                with pytest.raises(LeaseLostError):
                    await store.renew("nope", "token")
                with pytest.raises(LeaseLostError):
                    await store.record("nope", "token", [])
                with pytest.raises(LeaseLostError):
                    await store.resolve("nope", "token", resolution(checkpoint()))

        async def test_records_replace_by_call_and_keep_their_order(self) -> None:
            cp = checkpoint(calls=3)
            async with factory(60.0) as store:
                await store.save(cp)
                claim = await store.claim("cp_1")
                await store.record("cp_1", claim.token, [record(cp, 1), record(cp, 0)])
                await store.record("cp_1", claim.token, [record(cp, 2)])
                await store.record("cp_1", claim.token, [record(cp, 1, result="ok")])
                assert (record(cp, 1, result="ok"), record(cp, 0), record(cp, 2)) == (
                    await store.get("cp_1")
                ).records

        async def test_cancel_takes_an_expired_claim(self) -> None:
            async with factory(0) as store:
                await store.save(checkpoint())
                claim = await store.claim("cp_1")
                await store.cancel("cp_1")
                with pytest.raises(LeaseLostError):
                    await store.renew("cp_1", claim.token)
                assert "cancelled" == (await store.get("cp_1")).status

        @pytest.mark.parametrize("lease", [60.0, None])
        async def test_cancelling_a_held_claim_says_to_try_again_later(
            self, lease: float | None
        ) -> None:
            async with factory(lease) as store:
                await store.save(checkpoint())
                await store.claim("cp_1")
                with pytest.raises(CheckpointClaimedError, match="cannot be cancelled; try again"):
                    await store.cancel("cp_1")

        async def test_delete_forgets_records_and_outcome(self) -> None:
            cp = checkpoint()
            async with factory(60.0) as store:
                await store.save(cp)
                claim = await store.claim("cp_1")
                await store.record("cp_1", claim.token, [record(cp)])
                await store.delete("cp_1")
                await store.delete("cp_1")
                with pytest.raises(CheckpointNotFoundError):
                    await store.get("cp_1")
                assert [] == list(await store.decisions("run_1"))
                await store.save(cp)
                assert () == (await store.get("cp_1")).records

        async def test_list_pending_pages_oldest_first(self) -> None:
            async with factory(0) as store:
                for n in range(7):
                    await store.save(checkpoint(f"cp_{n}", run_id=f"run_{n}"))
                await store.cancel("cp_1")
                claim = await store.claim("cp_2")  # claimed ones are still waiting
                claim = await store.claim("cp_3")
                await store.resolve("cp_3", claim.token, resolution(checkpoint("cp_3")))
                pages: list[list[str]] = []
                after = None
                while True:
                    page = await store.list_pending(limit=2, after=after)
                    if not page:
                        break
                    pages.append([found.checkpoint_id for found in page])
                    after = page[-1].checkpoint_id
                assert [["cp_0", "cp_2"], ["cp_4", "cp_5"], ["cp_6"]] == pages
                first = (await store.list_pending(limit=1))[0]
                cp = checkpoint("cp_0", run_id="run_0")
                assert (cp.id, cp.run_id, cp.agent_name, cp.request, {}, T0, cp.open_requests) == (
                    first.checkpoint_id,
                    first.run_id,
                    first.agent_name,
                    first.request,
                    dict(first.metadata),
                    first.created_at,
                    first.requests,
                )
                # a resolved checkpoint still marks a place in the order
                assert ["cp_4", "cp_5", "cp_6"] == [
                    found.checkpoint_id for found in await store.list_pending(after="cp_3")
                ]
                with pytest.raises(CheckpointNotFoundError):
                    await store.list_pending(after="nope")
                for limit in (0, -1, True, 1.0, "2"):
                    with pytest.raises(ConfigurationError):
                        await store.list_pending(limit=limit)

        async def test_list_pending_filters(self) -> None:
            metadatas: list[dict[str, Any]] = [
                {"user": "ann", "n": 1},
                {"user": "bob", "n": 1.0},
                {"user": "ann", "n": True, "tags": ["x"]},
                {"user": "ann", "n": "1", "tags": ["x", "y"], "team": None},
                {"n": 2, "nested": {"a": 1, "b": [1, 2]}},
                {},
            ]
            async with factory(60.0) as store:
                for n, metadata in enumerate(metadatas):
                    agent = "other" if n == 2 else "agent"
                    await store.save(checkpoint(f"cp_{n}", metadata=metadata, agent_name=agent))

                async def ids(**kwargs: Any) -> list[str]:
                    return [found.checkpoint_id for found in await store.list_pending(**kwargs)]

                assert ["cp_0", "cp_2", "cp_3"] == await ids(metadata={"user": "ann"})
                assert ["cp_0", "cp_3"] == await ids(metadata={"user": "ann"}, agent_name="agent")
                assert ["cp_2"] == await ids(agent_name="other")
                assert ["cp_0", "cp_1"] == await ids(metadata={"n": 1})  # as JSON: 1 is 1.0
                assert ["cp_2"] == await ids(metadata={"n": True})  # but true is not 1
                assert ["cp_3"] == await ids(metadata={"n": "1"})
                assert ["cp_2"] == await ids(metadata={"tags": ["x"]})
                assert ["cp_3"] == await ids(metadata={"team": None})
                assert ["cp_4"] == await ids(metadata={"nested": {"b": [1, 2], "a": 1}})
                assert [] == await ids(metadata={"nested": {"a": 1}})
                assert [] == await ids(metadata={"user": "ann", "n": 2})
                assert [] == await ids(metadata={"missing": None})
                assert [] == await ids(metadata={"n": T0})
                assert [] == await ids(metadata={"n": float("nan")})
                assert [] == await ids(metadata={"n": float("inf")})
                assert [] == await ids(metadata={"n": float("-inf")})
                assert [] == await ids(metadata={1: 1})
                assert 6 == len(await ids(metadata={}))
                assert ["cp_2"] == await ids(metadata={"user": "ann"}, limit=1, after="cp_0")
                for wrong in ("user", ["user"], [("user", "ann")], 1):
                    with pytest.raises(
                        ConfigurationError, match=r"metadata=\.\.\.\) must be a dict"
                    ):
                        await store.list_pending(metadata=wrong)

        async def test_decisions_in_the_run_s_order_across_checkpoints(self) -> None:
            # By checkpoint as saved, then as recorded; decided_at (a worker's clock)
            # does not reorder them.
            first = checkpoint("cp_1", calls=2)
            second = checkpoint("cp_2")
            other = checkpoint("cp_3", run_id="run_2")
            async with factory(60.0) as store:
                for cp in (first, second, other):
                    await store.save(cp)
                for cp, records in (
                    (second, [record(second, 0, minutes=3)]),
                    (first, [record(first, 1, minutes=2), record(first, 0, minutes=1)]),
                    (other, [record(other, 0, minutes=0)]),
                ):
                    claim = await store.claim(cp.id)
                    await store.record(cp.id, claim.token, records)
                    await store.release(cp.id, claim.token)
                assert [
                    decision(first, 1, minutes=2),
                    decision(first, 0, minutes=1),
                    decision(second, 0, minutes=3),
                ] == list(await store.decisions("run_1"))
                assert [] == list(await store.decisions("run_nope"))

        async def test_decisions_of_one_moment_keep_the_order_they_were_recorded_in(
            self,
        ) -> None:
            # One response decides every call of a turn at the same time.
            first = checkpoint("cp_1", calls=2)
            second = checkpoint("cp_2", calls=2)
            async with factory(60.0) as store:
                for cp in (first, second):
                    await store.save(cp)
                    claim = await store.claim(cp.id)
                    await store.record(cp.id, claim.token, [record(cp, 1), record(cp, 0)])
                    await store.record(cp.id, claim.token, [record(cp, 1, result="ok")])
                assert [
                    decision(first, 1),
                    decision(first, 0),
                    decision(second, 1),
                    decision(second, 0),
                ] == list(await store.decisions("run_1"))

    return StoreSemantics


async def execute(store: Any, statement: str) -> list[tuple[Any, ...]]:
    """Run *statement* in one transaction of the SQL *store*'s own connections; return
    the rows it returns."""

    def work() -> list[tuple[Any, ...]]:
        with store._connection(write=True, atomic=True) as conn:
            cursor = conn.execute(statement)
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    result: list[tuple[Any, ...]] = await store._run(work)
    return result


def sql_store_tests(factory: Factory, *, rewind: str) -> type:
    """What the SQL stores add to the protocol: retention, and the open/closed life.

    *rewind* is an ``UPDATE`` of every checkpoint that moves the time in column
    ``{column}`` two hours back, in the store's SQL dialect.
    """

    async def two_hours_back(store: Any, column: str) -> None:
        await execute(store, rewind.format(column=column))

    @pytest.mark.anyio
    class SQLStoreBehaviour:
        @pytest.mark.parametrize(
            ("changes", "path"),
            [
                ({"checkpoint_id": "cp\ud800"}, "id"),
                ({"run_id": "\udc00run"}, "run_id"),
                ({"agent_name": "support\ud83d"}, "agent_name"),
            ],
        )
        async def test_a_checkpoint_with_a_lone_surrogate_in_an_id_is_refused_by_name(
            self, changes: dict[str, Any], path: str
        ) -> None:
            async with factory(60.0) as store:
                with pytest.raises(CheckpointSerializationError, match="lone surrogate") as info:
                    await store.save(checkpoint(**changes))
                assert info.value.path == path
                assert await store.list_pending() == []

        async def test_a_record_whose_call_id_has_a_lone_surrogate_is_refused_by_name(
            self,
        ) -> None:
            async with factory(60.0) as store:
                saved = checkpoint()
                await store.save(saved)
                claim = await store.claim("cp_1")
                odd = CallRecord(tool_call_id="call\ud800", decision=decision(saved))
                with pytest.raises(CheckpointSerializationError, match="lone surrogate") as info:
                    await store.record("cp_1", claim.token, [odd])
                assert info.value.path == "records[0].tool_call_id"
                assert (await store.get("cp_1")).records == ()

        async def test_a_record_whose_call_id_is_not_text_is_refused_by_name(self) -> None:
            # A CallRecord is not validated: a non-str call id reaches the store.
            async with factory(60.0) as store:
                saved = checkpoint(calls=2)
                await store.save(saved)
                claim = await store.claim("cp_1")
                odd = CallRecord(tool_call_id=5, decision=decision(saved, 1))  # type: ignore[arg-type]
                with pytest.raises(CheckpointSerializationError, match="a int, not text") as info:
                    await store.record("cp_1", claim.token, [record(saved), odd])
                assert info.value.path == "records[1].tool_call_id"
                assert (await store.get("cp_1")).records == ()

        async def test_an_agent_name_it_cannot_store_says_how_to_fix_it(self) -> None:
            async with factory(60.0) as store:
                with pytest.raises(
                    CheckpointSerializationError, match="Give the agent a name without it"
                ):
                    await store.save(checkpoint(agent_name="support\ud83d"))

        async def test_a_later_call_id_it_cannot_store_is_named_by_its_index(self) -> None:
            saved = checkpoint(calls=2)
            calls = (
                saved.pending_tool_calls[0],
                attrs.evolve(saved.pending_tool_calls[1], id="call\ud800"),
            )
            odd = attrs.evolve(
                saved, transcript=(*saved.transcript[:-1], Message.assistant("", calls))
            )
            async with factory(60.0) as store:
                with pytest.raises(CheckpointSerializationError, match="lone surrogate") as info:
                    await store.save(odd)
                assert info.value.path == "transcript[-1].tool_calls[1].id"

        async def test_renew_extends_a_lease_that_ran_out(self) -> None:
            async with factory(60.0) as store:
                await store.save(checkpoint())
                claim = await store.claim("cp_1")
                await two_hours_back(store, "lease_until")
                await store.renew("cp_1", claim.token)  # not yet taken over: still held
                with pytest.raises(CheckpointClaimedError):
                    await store.claim("cp_1")

        async def test_a_row_list_pending_cannot_read_is_named_and_can_be_retired(
            self,
        ) -> None:
            # One bad row (a hand edit, data of a newer version) must not hide which one
            # it is: an operator retires it and the inbox lists the rest again.
            async with factory(60.0) as store:
                for name in ("cp_1", "cp_2", "cp_3"):
                    await store.save(checkpoint(name))
                await execute(
                    store,
                    "UPDATE runlet_checkpoints SET data = '{\"version\": 99}' WHERE id = 'cp_2'",
                )
                with pytest.raises(CheckpointSerializationError, match="version 99") as caught:
                    await store.list_pending()
                assert "Checkpoint 'cp_2' in this store cannot be read" in str(caught.value)
                assert [("cp_1",)] == [
                    (found.checkpoint_id,) for found in await store.list_pending(limit=1)
                ]
                await store.cancel("cp_2")
                listed = await store.list_pending()
                assert ["cp_1", "cp_3"] == [found.checkpoint_id for found in listed]

        async def test_cancelling_again_keeps_the_first_finished_time(self) -> None:
            async with factory(60.0) as store:
                await store.save(checkpoint())
                await store.cancel("cp_1")
                await two_hours_back(store, "finished_at")
                await store.cancel("cp_1")
                assert 1 == await store.purge_resolved(older_than=timedelta(hours=1))

        async def test_records_keep_the_decision_time_for_operators_queries(self) -> None:
            cp = checkpoint(calls=2)
            async with factory(60.0) as store:
                await store.save(cp)
                claim = await store.claim("cp_1")
                await store.record("cp_1", claim.token, [record(cp, 0, minutes=5)])
                await store.record("cp_1", claim.token, [record(cp, 1)])
                rows = await execute(
                    store,
                    "SELECT tool_call_id FROM runlet_records "
                    "WHERE decided_at = '2026-01-01T00:05:00+00:00'",
                )
                assert [("call_0",)] == rows

        async def test_resolve_changes_nothing_when_saving_the_next_checkpoint_fails(
            self,
        ) -> None:
            cp = checkpoint()
            async with factory(60.0) as store:
                await store.save(cp)
                claim = await store.claim("cp_1")
                store._sql = attrs.evolve(
                    store._sql, save="INSERT INTO runlet_no_such_table (id) VALUES (1)"
                )
                with pytest.raises(Exception, match="runlet_no_such_table"):
                    await store.resolve("cp_1", claim.token, resolution(cp), checkpoint("cp_2"))
                del store._sql  # the class's statements again
                assert ("claimed", None) == (
                    (await store.get("cp_1")).status,
                    (await store.get("cp_1")).resolution,
                )
                await store.resolve("cp_1", claim.token, resolution(cp), checkpoint("cp_2"))
                assert "pending" == (await store.get("cp_2")).status

        async def test_purge_resolved(self) -> None:
            async with factory(60.0) as store:
                for n in range(3):
                    await store.save(checkpoint(f"cp_{n}"))
                claim = await store.claim("cp_0")
                await store.record("cp_0", claim.token, [record(checkpoint("cp_0"))])
                await store.resolve("cp_0", claim.token, resolution(checkpoint("cp_0")))
                await store.cancel("cp_1")
                assert 0 == await store.purge_resolved(older_than=timedelta(hours=1))
                assert 0 == await store.purge_resolved(older_than=3600)
                for ages_ago in (timedelta.max, 1e300):  # longer than any clock goes back
                    assert 0 == await store.purge_resolved(older_than=ages_ago)
                kept = await store.get("cp_0")
                assert ("resolved", (record(checkpoint("cp_0")),)) == (kept.status, kept.records)
                assert 2 == await store.purge_resolved(older_than=0)
                for gone in ("cp_0", "cp_1"):
                    with pytest.raises(CheckpointNotFoundError):
                        await store.get(gone)
                assert [] == list(await store.decisions("run_1"))
                await store.save(checkpoint("cp_0"))  # the id again: none of the old records
                assert () == (await store.get("cp_0")).records
                assert "pending" == (await store.get("cp_2")).status
                for wrong in (-1, float("inf"), "1", None, timedelta(seconds=-1)):
                    with pytest.raises(ConfigurationError):
                        await store.purge_resolved(older_than=wrong)

        async def test_used_outside_async_with(self) -> None:
            async with factory(60.0) as store:
                with pytest.raises(ConfigurationError, match="already open"):
                    await store.__aenter__()
            with pytest.raises(ConfigurationError, match="async with") as caught:
                await store.get("cp_1")
            assert type(store).__name__ in str(caught.value)
            with pytest.raises(ConfigurationError, match="async with"):
                await store.save(checkpoint())

        async def test_a_runtime_resumes_through_the_store(self) -> None:
            from runlet import Agent, HumanResponse, Runtime, ToolSpec
            from runlet.testing import ScriptedModel, call

            ran: list[str] = []

            async def pay(arguments: Any, context: Any) -> str:
                ran.append(context.idempotency_key)
                return "paid"

            tool = ToolSpec(
                name="pay",
                description="Pay.",
                input_schema={"type": "object"},
                handler=pay,
                requires_approval=True,
            )
            agent = Agent("payer", "Pay.", ScriptedModel([call("pay"), "done"]), (tool,))
            async with factory(60.0) as store:
                runtime = Runtime(checkpoint_store=store)
                interrupted = await runtime.run(agent, "go", metadata={"user": "ann"})
                assert interrupted.checkpoint_id is not None
                assert interrupted.interruption is not None
                (listed,) = await store.list_pending(metadata={"user": "ann"})
                assert interrupted.checkpoint_id == listed.checkpoint_id
                response = HumanResponse(interrupted.interruption.id, "approve")
                cp_id = interrupted.checkpoint_id
                done = await runtime.resume(agent, checkpoint_id=cp_id, response=response)
                again = await runtime.resume(agent, checkpoint_id=cp_id, response=response)
                assert ("completed", "done") == (done.status, done.output)
                assert done == again
                assert 1 == len(ran)
                assert "resolved" == (await store.get(cp_id)).status
                assert ["approve"] == [d.action for d in await store.decisions(done.run_id)]

    return SQLStoreBehaviour
