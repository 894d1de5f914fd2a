"""A worker process for tests/test_store_processes.py: runs or resumes agent runs against
a durable store named on the command line, and reports on stdout, one JSON line each.

    python tests/_worker.py --store sqlite:/tmp/x.db --backend trio --effects LOG COMMAND

The agent has one approval-gated tool, ``pay``, whose handler appends
``<idempotency key> <pid>`` to the effects log (O_APPEND, so lines from several processes
never mix): the tests count the lines to see how often the tool really ran.

Commands:
    open                     open the store (creating its tables) and exit
    setup --count N          start N runs, each interrupted for approval of ``pay``
    resume --checkpoint ID   approve and resume one checkpoint; ``--barrier`` first prints
                             ``ready`` and waits for a line on stdin; ``--wait-lease``
                             retries while another claim holds the checkpoint
    drain                    resume every pending checkpoint until none is left

Test hooks: ``--hang-in-tool`` prints ``started`` from inside the handler (after logging
the effect) and hangs; ``--hang-after-result`` prints ``recorded`` once the tool's result
is recorded in the store and hangs. The test then kills the process with SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread

from runlet import (
    Agent,
    CheckpointClaimedError,
    HumanResponse,
    ModelRequest,
    ResumeError,
    Runtime,
    ToolContext,
    ToolSpec,
)
from runlet.testing import ScriptedModel, call

# Waiting for another process's lease to run out is the one wait these tests need.
LEASE_WAIT_LIMIT = 30.0


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def make_agent(args: argparse.Namespace) -> Agent:
    async def pay(arguments: Mapping[str, Any], context: ToolContext) -> str:
        line = f"{context.idempotency_key} {os.getpid()}\n".encode()
        fd = os.open(args.effects, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        if args.hang_in_tool:
            say(event="started")
            await anyio.sleep_forever()
        return f"paid {arguments['n']}"

    tool = ToolSpec(
        name="pay",
        description="Pay invoice n.",
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
        handler=pay,
        requires_approval=True,
        idempotent=args.idempotent,
    )

    def script(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.tool_result is None:
            return call("pay", n=int(last.content))
        return f"done: {last.content}"

    return Agent("payer", "Pay what you are asked to.", ScriptedModel(script), (tool,))


def open_store(spec: str, lease: float) -> Any:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        from runlet.stores.sqlite import SQLiteCheckpointStore

        return SQLiteCheckpointStore(where, lease=lease)
    from runlet.stores.postgres import PostgresCheckpointStore

    return PostgresCheckpointStore(where, lease=lease, max_size=2)


def hang_after_result(store: Any) -> None:
    record = store.record

    async def recording(checkpoint_id: str, token: str, records: Sequence[Any]) -> None:
        await record(checkpoint_id, token, records)
        if any(one.result is not None for one in records):
            say(event="recorded")
            await anyio.sleep_forever()

    store.record = recording


async def resume_one(runtime: Runtime, agent: Agent, store: Any, checkpoint_id: str) -> Any:
    stored = await store.get(checkpoint_id)
    response = HumanResponse(stored.checkpoint.request.id, "approve")
    return await runtime.resume(agent, checkpoint_id=checkpoint_id, response=response)


async def resume_command(
    args: argparse.Namespace, runtime: Runtime, agent: Agent, store: Any
) -> None:
    if args.barrier:
        say(event="ready")
        await anyio.to_thread.run_sync(sys.stdin.readline)
    deadline = time.monotonic() + LEASE_WAIT_LIMIT
    while True:
        try:
            result = await resume_one(runtime, agent, store, args.checkpoint)
        except CheckpointClaimedError:
            if args.wait_lease and time.monotonic() < deadline:
                await anyio.sleep(0.05)
                continue
            say(event="refused", error="CheckpointClaimedError")
            return
        except ResumeError as exc:
            say(event="refused", error=type(exc).__name__)
            return
        break
    request = result.interruption
    say(
        event="done",
        status=result.status,
        output=result.output,
        outcome_unknown=None if request is None else request.outcome_unknown,
        checkpoint_id=result.checkpoint_id,
    )


async def drain(runtime: Runtime, agent: Agent, store: Any) -> None:
    answered = 0
    while True:
        pending = []
        after = None
        while True:
            page = await store.list_pending(limit=100, after=after)
            if not page:
                break
            pending.extend(page)
            after = page[-1].checkpoint_id
        if not pending:
            break
        progress = False
        for found in pending:
            response = HumanResponse(found.request.id, "approve")
            try:
                await runtime.resume(agent, checkpoint_id=found.checkpoint_id, response=response)
            except ResumeError:  # claimed by another worker right now, or gone
                continue
            progress = True
            answered += 1  # by this worker, or (a repeated response) by another
        if not progress:  # the rest is claimed by others: let them finish
            await anyio.sleep(0.02)
    say(event="drained", answered=answered)


async def main(args: argparse.Namespace) -> None:
    agent = make_agent(args)
    async with open_store(args.store, args.lease) as store:
        if args.hang_after_result:
            hang_after_result(store)
        runtime = Runtime(checkpoint_store=store)
        if args.command == "open":
            say(event="open")
        elif args.command == "setup":
            ids = []
            for n in range(args.count):
                metadata = {"n": n, "group": f"g{n % 4}", "even": n % 2 == 0}
                result = await runtime.run(agent, str(n), metadata=metadata)
                ids.append(result.checkpoint_id)
            say(event="setup", checkpoint_ids=ids)
        elif args.command == "resume":
            await resume_command(args, runtime, agent, store)
        else:
            await drain(runtime, agent, store)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--effects", required=True)
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument("--hang-in-tool", action="store_true")
    parser.add_argument("--hang-after-result", action="store_true")
    parser.add_argument("command", choices=("open", "setup", "resume", "drain"))
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--checkpoint")
    parser.add_argument("--barrier", action="store_true")
    parser.add_argument("--wait-lease", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse(sys.argv[1:])
    anyio.run(main, arguments, backend=arguments.backend)
