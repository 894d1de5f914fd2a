"""The floor: the smallest hand-written anyio agent loop that does the same logical work.

Messages are dicts, tools are looked up in a dict, arguments are checked with the same
compiled jsonschema_rs validator Runlet uses, handler failures become error results, calls
of one turn run concurrently in a task group (a single call is awaited directly), and a
call that needs approval suspends the run into a checkpoint dict that goes through
``json``. Its resume keeps the same exactly-once records Runlet keeps (a claim, the
decision and the result recorded before the run goes on, the outcome kept for a repeated
answer), as plain dict writes, so W3 compares like with like. There is no typing, no
error hierarchy, no streaming and no checks on what the model returns: it is what a
careful person would write by hand for one application.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import anyio
import jsonschema_rs

Handler = Callable[[dict[str, Any], Any], Awaitable[Any]]
FloorModel = Callable[[str, list[dict[str, Any]], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


class FloorTool:
    __slots__ = ("approval", "definition", "handler", "name", "validator")

    def __init__(
        self,
        name: str,
        description: str,
        schema: dict[str, Any],
        handler: Handler,
        *,
        approval: bool = False,
    ) -> None:
        self.name = name
        self.handler = handler
        self.approval = approval
        self.validator = jsonschema_rs.validator_for(schema)
        self.definition = {"name": name, "description": description, "input_schema": schema}


async def call_tool(tool: FloorTool | None, call: dict[str, Any]) -> dict[str, Any]:
    """Run one call; always returns the tool message (errors included)."""
    arguments = call["arguments"]
    is_error = True
    if tool is None:
        content = f"There is no tool named {call['name']!r}."
    elif not tool.validator.is_valid(arguments):
        problems = "; ".join(e.message for e in tool.validator.iter_errors(arguments))
        content = f"Invalid arguments for tool {call['name']!r}: {problems}"
    else:
        try:
            value = await tool.handler(arguments, None)
        except Exception as exc:
            content = f"Tool {call['name']!r} failed: {type(exc).__name__}: {exc}"
        else:
            is_error = False
            content = value if type(value) is str else json.dumps(value)
    return {"role": "tool", "tool_call_id": call["id"], "content": content, "is_error": is_error}


async def _call_into(
    results: list[dict[str, Any] | None], index: int, tool: FloorTool | None, call: dict[str, Any]
) -> None:
    results[index] = await call_tool(tool, call)


class FloorAgent:
    __slots__ = ("definitions", "instructions", "model", "tools")

    def __init__(self, instructions: str, model: FloorModel, tools: list[FloorTool]) -> None:
        self.instructions = instructions
        self.model = model
        self.tools = {tool.name: tool for tool in tools}
        self.definitions = [tool.definition for tool in tools]


class FloorRuntime:
    """``run`` and ``resume`` over a dict of checkpoints."""

    def __init__(self, max_turns: int = 50) -> None:
        self.max_turns = max_turns
        self.store: dict[str, dict[str, Any]] = {}
        # The same exactly-once bookkeeping Runlet does, as bare dicts: a claim token per
        # checkpoint, a record of the decision and of the result before the run goes on,
        # and the stored outcome that answers a repeated response.
        self.claims: dict[str, str] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}

    async def run(self, agent: FloorAgent, text: str) -> dict[str, Any]:
        state = {
            "run_id": new_id("run"),
            "messages": [{"role": "user", "content": text}],
            "turns": 0,
        }
        return await self._drive(agent, state)

    async def resume(
        self, agent: FloorAgent, checkpoint_id: str, request_id: str, action: str
    ) -> dict[str, Any]:
        if checkpoint_id in self.outcomes:
            return self.outcomes[checkpoint_id]
        checkpoint = self.store[checkpoint_id]
        if checkpoint["request"]["id"] != request_id or action not in ("approve", "reject"):
            raise ValueError("this response does not answer the open request")
        if checkpoint_id in self.claims:
            raise RuntimeError("being resumed")
        self.claims[checkpoint_id] = token = new_id("tok")
        try:
            call = checkpoint["pending"]
            record = self.records[checkpoint_id] = {"action": action, "at": time.time()}
            if action == "approve":
                result = await call_tool(agent.tools.get(call["name"]), call)
            else:
                result = {"role": "tool", "tool_call_id": call["id"], "content": "rejected"}
            record["result"] = result
            state = {
                "run_id": checkpoint["run_id"],
                "messages": checkpoint["messages"],
                "turns": checkpoint["turns"],
            }
            state["messages"].append(result)
            outcome = await self._drive(agent, state)
            assert self.claims[checkpoint_id] == token
            self.outcomes[checkpoint_id] = outcome
            del self.store[checkpoint_id]
        finally:
            del self.claims[checkpoint_id]
        return outcome

    def _suspend(self, state: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        """Save a checkpoint for *call* and report the interruption."""
        checkpoint = {
            "id": new_id("cp"),
            "run_id": state["run_id"],
            "messages": state["messages"],
            "turns": state["turns"],
            "pending": call,
            "request": {
                "id": new_id("req"),
                "created_at": datetime.now(timezone.utc).isoformat(),
                "kind": "approval",
                "prompt": f"Allow {call['name']} with "
                f"{json.dumps(call['arguments'], sort_keys=True)}?",
            },
        }
        self.store[checkpoint["id"]] = checkpoint
        return {"status": "interrupted", "checkpoint": checkpoint, **state}

    async def _drive(self, agent: FloorAgent, state: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = state["messages"]
        tools = agent.tools
        while True:
            if state["turns"] >= self.max_turns:
                raise RuntimeError("too many turns")
            state["turns"] += 1
            message = await agent.model(agent.instructions, messages, agent.definitions)
            messages.append(message)
            calls = message.get("tool_calls")
            if not calls:
                return {"status": "completed", "output": message["content"], **state}
            gated = [c for c in calls if (t := tools.get(c["name"])) and t.approval]
            if gated:
                # One gated call per turn in these workloads: suspend before running it.
                return self._suspend(state, gated[0])
            if len(calls) == 1:
                messages.append(await call_tool(tools.get(calls[0]["name"]), calls[0]))
                continue
            results: list[dict[str, Any] | None] = [None] * len(calls)

            async with anyio.create_task_group() as group:
                for index, call in enumerate(calls):
                    group.start_soon(_call_into, results, index, tools.get(call["name"]), call)
            messages.extend(results)  # type: ignore[arg-type]


class LeanFloorRuntime(FloorRuntime):
    """The floor without exactly-once bookkeeping, for comparison only: its checkpoint
    holds just the messages and the pending call, and its resume keeps no claim, no
    records and no outcome, so a retried resume can run an approved call twice. W3
    reports Runlet against it as information: what the journal costs on top of the
    smallest at-least-once round trip."""

    async def resume(
        self, agent: FloorAgent, checkpoint_id: str, request_id: str, action: str
    ) -> dict[str, Any]:
        checkpoint = self.store.pop(checkpoint_id)
        call = checkpoint["pending"]
        if call["id"] != request_id or action not in ("approve", "reject"):
            raise ValueError("this response does not answer the open request")
        if action == "approve":
            result = await call_tool(agent.tools.get(call["name"]), call)
        else:
            result = {"role": "tool", "tool_call_id": call["id"], "content": "rejected"}
        messages = checkpoint["messages"]
        messages.append(result)
        state = {"run_id": checkpoint_id, "messages": messages, "turns": len(messages) // 2}
        return await self._drive(agent, state)

    def _suspend(self, state: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        checkpoint = {"id": new_id("cp"), "messages": state["messages"], "pending": call}
        self.store[checkpoint["id"]] = checkpoint
        return {"status": "interrupted", "checkpoint": checkpoint, **state}
