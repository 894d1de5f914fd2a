"""Approvals over HTTP as a plain ASGI application, served by hypercorn's trio worker.

No web framework: the application reads ASGI messages and sends them. Runlet runs on
trio here without a line of trio in this file (anyio does the work).

Run it (from the repository root; ``pip install "runlet[examples]"``)::

    RUNLET_EXAMPLE_DIR=/tmp/refunds PYTHONPATH=docs/examples \\
        hypercorn --worker-class trio --bind 127.0.0.1:8001 asgi_trio_app:app

It serves the same endpoints as ``fastapi_app.py``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import anyio
import sniffio
from refund_agent import agent, error_body, http_status, open_store, server_sent_event
from refund_agent import read_responses as parse_responses

from runlet import (
    DurableCheckpointStore,
    HumanResponse,
    RunletError,
    RunStream,
    Runtime,
    unstructure,
    unstructure_event,
)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class HTTPError(Exception):
    """A request this application refuses before Runlet sees it."""

    def __init__(
        self,
        status: int,
        detail: str,
        name: str = "InvalidRequest",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.name = name
        self.headers = headers or []


class App:
    """The ASGI application: ``app(scope, receive, send)``."""

    def __init__(self) -> None:
        self.runtime: Runtime | None = None
        self.store: DurableCheckpointStore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            try:
                await self.route(scope, receive, send)
            except RunletError as error:
                await send_json(send, error_body(error), http_status(error))
            except HTTPError as error:
                body = {"type": "error", "error": error.name, "detail": str(error)}
                await send_json(send, body, error.status, error.headers)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        async with open_store() as store:
            self.store, self.runtime = store, Runtime(checkpoint_store=store)
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown: the server is stopping
            self.store = self.runtime = None
        await send({"type": "lifespan.shutdown.complete"})

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime, store = self.runtime, self.store
        if runtime is None or store is None:
            raise HTTPError(503, "The server is starting or stopping; try again.", "Unavailable")
        query = {
            key: values[-1] for key, values in parse_qs(scope["query_string"].decode()).items()
        }
        match scope["method"], scope["path"].strip("/").split("/"):
            case "GET", ["health"]:
                await send_json(
                    send, {"status": "ok", "async_library": sniffio.current_async_library()}
                )
            case "POST", ["runs"]:
                text, metadata = await read_start(receive, scope)
                result = await runtime.run(agent, text, metadata=metadata)
                await send_json(send, unstructure(result))
            case "POST", ["runs", "stream"]:
                text, metadata = await read_start(receive, scope)
                await send_events(send, receive, runtime.stream(agent, text, metadata=metadata))
            case "GET", ["pending"]:
                limit, after = read_page(query)
                pending = await store.list_pending(limit=limit, after=after, agent_name=agent.name)
                next_page = pending[-1].checkpoint_id if len(pending) == limit else None
                await send_json(
                    send, {"pending": [unstructure(p) for p in pending], "next": next_page}
                )
            case "POST", ["checkpoints", checkpoint_id, "responses"]:
                responses = await read_responses(receive, scope)
                result = await runtime.resume(
                    agent, checkpoint_id=checkpoint_id, responses=responses
                )
                await send_json(send, unstructure(result))
            case "POST", ["checkpoints", checkpoint_id, "responses", "stream"]:
                responses = await read_responses(receive, scope)
                stream = runtime.stream_resume(
                    agent, checkpoint_id=checkpoint_id, responses=responses
                )
                await send_events(send, receive, stream)
            case "POST", ["checkpoints", checkpoint_id, "cancel"]:
                await runtime.cancel(checkpoint_id)
                await send_json(send, {"checkpoint_id": checkpoint_id, "status": "cancelled"})
            case "GET", ["runs", run_id, "decisions"]:
                found = await store.decisions(run_id)
                await send_json(send, {"decisions": [unstructure(d) for d in found]})
            case _, parts if (allowed := endpoint(parts)) is not None:
                raise HTTPError(
                    405,
                    f"{scope['path']} takes {allowed}, not {scope['method']}.",
                    "MethodNotAllowed",
                    [(b"allow", allowed.encode())],
                )
            case _:
                raise HTTPError(404, f"No endpoint {scope['path']}.", "NotFound")


def endpoint(parts: list[str]) -> str | None:
    """The method the endpoint *parts* (the path) names takes, if it names one."""
    match parts:
        case ["health" | "pending"] | ["runs", _, "decisions"]:
            return "GET"
        case ["runs"] | ["runs", "stream"] | ["checkpoints", _, "responses" | "cancel"]:
            return "POST"
        case ["checkpoints", _, "responses", "stream"]:
            return "POST"
    return None


async def send_events(send: Send, receive: Receive, stream: RunStream) -> None:
    """Relay a run's stream as server-sent events, and stop the run if the client goes
    away. An error before the first event is raised (to ``App.__call__``, which answers
    with its status) instead of starting a stream."""
    started: list[bool] = []
    relayed: list[RunletError | None] = []
    async with anyio.create_task_group() as group:
        group.start_soon(cancel_when_gone, receive, group.cancel_scope)
        relayed.append(await relay(send, stream, started))
        group.cancel_scope.cancel()  # done: stop watching
    if not relayed:  # the client went away: the run was stopped, nobody reads the rest
        return
    if relayed[0] is not None:
        raise relayed[0]
    # The response ends only now that nothing waits on receive(): ended while a task
    # still did, hypercorn's trio worker never closed a `Connection: close` response.
    if not started:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def relay(send: Send, stream: RunStream, started: list[bool]) -> RunletError | None:
    """Send each event from inside the stream's `async with` block: nothing is yielded,
    so the block is always left here, in this task. The response head waits for the
    first event (*started* records it); an error before it is returned, one after it
    becomes an error event."""
    async with stream:
        try:
            async for event in stream:
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": SSE})
                    started.append(True)
                body = server_sent_event(unstructure_event(event))
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except RunletError as error:
            if not started:
                return error
            body = server_sent_event(error_body(error))
            await send({"type": "http.response.body", "body": body, "more_body": True})
    return None


async def cancel_when_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel *scope* (and so the run) when the client disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def send_json(
    send: Send, data: Any, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    all_headers = JSON_HEADERS + (headers or [])
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": json.dumps(data).encode()})


async def read_json(receive: Receive, scope: Scope) -> dict[str, Any]:
    # As FastAPI reads a body: JSON only when it says so.
    media_type = dict(scope["headers"]).get(b"content-type", b"").partition(b";")[0]
    media_type = media_type.strip().lower()
    if media_type != b"application/json" and not media_type.endswith(b"+json"):
        raise HTTPError(422, "Send the request body as JSON (Content-Type: application/json).")
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    try:
        data = json.loads(body)
    except ValueError:
        raise HTTPError(422, "The request body is not JSON.") from None
    if not isinstance(data, dict):
        raise HTTPError(422, "The request body must be a JSON object.")
    return data


def read_page(query: dict[str, str]) -> tuple[int, str | None]:
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise HTTPError(422, "limit must be a whole number from 1 to 100.")
    return int(limit), query.get("after")


async def read_start(receive: Receive, scope: Scope) -> tuple[str, dict[str, Any]]:
    data = await read_json(receive, scope)
    text, metadata = data.get("input"), data.get("metadata", {})
    if not isinstance(text, str) or not isinstance(metadata, dict):
        raise HTTPError(422, 'Start a run with {"input": "...", "metadata": {...}}.')
    return text, metadata


async def read_responses(receive: Receive, scope: Scope) -> list[HumanResponse]:
    items = (await read_json(receive, scope)).get("responses")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise HTTPError(422, 'Answer with {"responses": [{"request_id": ..., "action": ...}]}.')
    # Bad data raises HumanResponseError (422) naming the field.
    return parse_responses(items)


app = App()
