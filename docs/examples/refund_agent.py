"""The agent both example web applications serve, and what they share.

A support agent refunds orders; every refund waits for a person's approval. A scripted
model plays the model, so the examples need no API key: it asks to refund every order
number in the user's message (one approval each) and then reports the tool results.

Set ``RUNLET_EXAMPLE_DIR`` to the folder for the SQLite checkpoint database and the refund
ledger (default: the current folder). Every server process pointed at the same folder
shares the same runs, so one process can answer a run another one started.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import anyio

from runlet import (
    Agent,
    CheckpointCancelledError,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointResolvedError,
    CheckpointSerializationError,
    HumanRequestExpiredError,
    HumanResponse,
    HumanResponseConflictError,
    HumanResponseError,
    LeaseLostError,
    MissingToolError,
    ModelError,
    ModelRequest,
    RunletError,
    ToolCall,
    ToolContext,
    ToolSpec,
    structure,
)
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel

DATA_DIR = Path(os.environ.get("RUNLET_EXAMPLE_DIR", "."))
LEDGER = DATA_DIR / "refunds.log"


def open_store() -> SQLiteCheckpointStore:
    """The checkpoint store, shared by every server process that uses the same folder.
    Enter it with ``async with``. (``InMemoryCheckpointStore()`` works too, for one
    process; a run it holds is lost when the process stops.)"""
    return SQLiteCheckpointStore(DATA_DIR / "checkpoints.db", lease=60.0)


async def refund(arguments: Any, context: ToolContext) -> str:
    """The side effect people approve: here, a line in the refund ledger."""
    line = f"{arguments['order_id']} {context.idempotency_key}\n"
    await anyio.to_thread.run_sync(_append, line)
    return f"Refunded order {arguments['order_id']}."


def _append(line: str) -> None:
    with LEDGER.open("a", encoding="utf-8") as ledger:
        ledger.write(line)


def _next_step(request: ModelRequest) -> str | list[ToolCall]:
    last = request.messages[-1]
    if last.role == "user":
        orders = re.findall(r"\d+", last.content)
        if not orders:
            return "Which order should I refund? Please give its number."
        return [ToolCall(f"refund-{order}", "refund", {"order_id": order}) for order in orders]
    # The tool results of the last turn follow the assistant message that asked for them.
    results = []
    for message in reversed(request.messages):
        if message.role != "tool" or message.tool_result is None:
            break
        results.append(message.tool_result.content)
    return " ".join(reversed(results))


agent = Agent(
    name="support",
    instructions="Refund the orders the customer names.",
    model=ScriptedModel(_next_step, chunk_size=8),
    tools=(
        ToolSpec(
            name="refund",
            description="Refund an order.",
            input_schema={
                "type": "object",
                "required": ["order_id"],
                "properties": {"order_id": {"type": "string"}},
                "additionalProperties": False,
            },
            handler=refund,
            requires_approval=True,
            approval_prompt=lambda arguments: f"Refund order {arguments['order_id']}?",
        ),
    ),
)

# Looked up along the exception's class hierarchy, most specific class first, so a
# CheckpointCancelledError (a CheckpointNotFoundError) answers 410, not 404.
HTTP_STATUS: dict[type[RunletError], int] = {
    CheckpointNotFoundError: 404,  # unknown checkpoint
    CheckpointCancelledError: 410,  # cancelled: it will never be resumed
    HumanResponseConflictError: 409,  # already answered with another response
    CheckpointResolvedError: 409,  # already resolved
    CheckpointClaimedError: 409,  # being resumed right now: try again later
    HumanRequestExpiredError: 410,  # answered too late
    HumanResponseError: 422,  # a response that does not answer the request (or no response)
    CheckpointSerializationError: 500,  # stored data that is not a valid checkpoint
    MissingToolError: 500,  # the agent lacks a tool the run needs: a deployment bug
    LeaseLostError: 503,  # another resume took over: retry
    ModelError: 502,  # the model failed after the answer was recorded: retry
}


def read_responses(items: list[Any]) -> list[HumanResponse]:
    """The responses of a request body. Data that is not a response is the client's
    mistake: structure() says what is wrong with a CheckpointSerializationError, which
    from resume() would mean broken stored data (500), so it becomes a
    HumanResponseError (422) here, where the body is read."""
    try:
        return [
            structure(item, HumanResponse, what=f"responses[{index}]")
            for index, item in enumerate(items)
        ]
    except CheckpointSerializationError as error:
        raise HumanResponseError(f"This is not a response: {error}") from error


def http_status(error: RunletError) -> int:
    """The HTTP status for *error*: by its class, else 500."""
    for cls in type(error).__mro__:
        status = HTTP_STATUS.get(cls)
        if status is not None:
            return status
    return 500


def error_body(error: RunletError) -> dict[str, Any]:
    """The JSON body of an error response (and of an ``error`` server-sent event)."""
    return {"type": "error", "error": type(error).__name__, "detail": str(error)}


def server_sent_event(data: dict[str, Any]) -> bytes:
    """One server-sent event: its name is the data's ``type``, its data the JSON."""
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()
