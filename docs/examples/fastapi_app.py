"""Approvals over HTTP with FastAPI on uvicorn (asyncio).

Run it (from the repository root; ``pip install "runlet[examples]"``)::

    RUNLET_EXAMPLE_DIR=/tmp/refunds uvicorn --app-dir docs/examples fastapi_app:app

Endpoints (JSON in and out, Runlet objects in the form of ``runlet.unstructure``):

- ``POST /runs`` ``{"input": "Refund orders 12 and 13"}``: start a run.
- ``POST /runs/stream``: the same, as server-sent events.
- ``GET /pending?limit=20&after=<checkpoint_id>``: runs waiting for a person.
- ``POST /checkpoints/{checkpoint_id}/responses`` ``{"responses": [...]}``: answer one
  or several of a checkpoint's requests.
- ``POST /checkpoints/{checkpoint_id}/responses/stream``: the same, as server-sent events.
- ``POST /checkpoints/{checkpoint_id}/cancel``: give up on a run without running anything.
- ``GET /runs/{run_id}/decisions``: the run's audit trail.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from refund_agent import (
    agent,
    error_body,
    http_status,
    open_store,
    read_responses,
    server_sent_event,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from runlet import (
    DurableCheckpointStore,
    HumanResponse,
    RunletError,
    RunStream,
    Runtime,
    unstructure,
    unstructure_event,
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncGenerator[None, None]:
    async with open_store() as store:
        app.state.store = store
        app.state.runtime = Runtime(checkpoint_store=store)
        yield


app = FastAPI(title="Refund approvals", lifespan=lifespan)


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


def store(request: Request) -> DurableCheckpointStore:
    return request.app.state.store  # type: ignore[no-any-return]


@app.exception_handler(RunletError)
async def runlet_error(request: Request, error: Exception) -> JSONResponse:
    """Every error Runlet raises on purpose becomes a status chosen by its class."""
    assert isinstance(error, RunletError)
    return JSONResponse(error_body(error), status_code=http_status(error))


@app.exception_handler(RequestValidationError)
async def invalid_request(request: Request, error: Exception) -> JSONResponse:
    """A request refused before Runlet sees it, in the same shape as Runlet's errors."""
    assert isinstance(error, RequestValidationError)
    where = "; ".join(
        f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
        for problem in error.errors()
    )
    body = {"type": "error", "error": "InvalidRequest", "detail": where}
    return JSONResponse(body, status_code=422)


@app.exception_handler(StarletteHTTPException)
async def http_error(request: Request, error: Exception) -> JSONResponse:
    """An unknown path or method, in the same shape as Runlet's errors."""
    assert isinstance(error, StarletteHTTPException)
    name = {404: "NotFound", 405: "MethodNotAllowed"}.get(error.status_code, "HTTPError")
    body = {"type": "error", "error": name, "detail": str(error.detail)}
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


class StartRun(BaseModel):
    input: str
    metadata: dict[str, Any] = {}


class Answers(BaseModel):
    responses: list[dict[str, Any]]

    def parsed(self) -> list[HumanResponse]:
        # Bad data raises HumanResponseError (422) naming the field.
        return read_responses(self.responses)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/runs")
async def start_run(body: StartRun, request: Request) -> JSONResponse:
    result = await runtime(request).run(agent, body.input, metadata=body.metadata)
    return JSONResponse(unstructure(result))


@app.get("/pending")
async def list_pending(
    request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None
) -> JSONResponse:
    pending = await store(request).list_pending(limit=limit, after=after, agent_name=agent.name)
    next_page = pending[-1].checkpoint_id if len(pending) == limit else None
    return JSONResponse({"pending": [unstructure(p) for p in pending], "next": next_page})


@app.post("/checkpoints/{checkpoint_id}/responses")
async def answer(checkpoint_id: str, body: Answers, request: Request) -> JSONResponse:
    result = await runtime(request).resume(
        agent, checkpoint_id=checkpoint_id, responses=body.parsed()
    )
    return JSONResponse(unstructure(result))


@app.post("/checkpoints/{checkpoint_id}/cancel")
async def cancel(checkpoint_id: str, request: Request) -> JSONResponse:
    await runtime(request).cancel(checkpoint_id)
    return JSONResponse({"checkpoint_id": checkpoint_id, "status": "cancelled"})


@app.get("/runs/{run_id}/decisions")
async def decisions(run_id: str, request: Request) -> JSONResponse:
    found = await store(request).decisions(run_id)
    return JSONResponse({"decisions": [unstructure(d) for d in found]})


# Streaming: an async generator owns the `async with` block of the run's stream, and
# EventStream, the response that iterates it, closes it in the same task (see the
# relay section of the streaming guide).


async def relay(stream: RunStream) -> AsyncGenerator[bytes, None]:
    """The run's events as server-sent events; an error after the first event becomes
    an ``error`` event, since the response status is sent by then."""
    started = False
    async with stream:
        try:
            async for event in stream:
                started = True
                yield server_sent_event(unstructure_event(event))
        except RunletError as error:
            if not started:
                raise  # EventStream answers with the error's own status instead
            yield server_sent_event(error_body(error))


class EventStream(StreamingResponse):
    """Streams a :func:`relay` generator. Unlike a plain StreamingResponse it closes the
    generator in the task that iterates it, however the response ends (so the run's
    stream is left there, never by the garbage collector in another task), and it holds
    the response head back until the first event, so an error raised before any event
    (unknown checkpoint, conflicting answer) gets its own HTTP status."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, headers={"cache-control": "no-cache"})
        self.events = events

    async def stream_response(self, send: Send) -> None:
        async with aclosing(self.events) as events:
            try:
                first = await anext(events)
            except StopAsyncIteration:
                first = b""
            except RunletError as error:
                refusal = JSONResponse(error_body(error), status_code=http_status(error))
                await send(
                    {
                        "type": "http.response.start",
                        "status": refusal.status_code,
                        "headers": refusal.raw_headers,
                    }
                )
                await send({"type": "http.response.body", "body": refusal.body})
                return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@app.post("/runs/stream")
async def stream_run(body: StartRun, request: Request) -> EventStream:
    stream = runtime(request).stream(agent, body.input, metadata=body.metadata)
    return EventStream(relay(stream))


@app.post("/checkpoints/{checkpoint_id}/responses/stream")
async def stream_answer(checkpoint_id: str, body: Answers, request: Request) -> EventStream:
    stream = runtime(request).stream_resume(
        agent, checkpoint_id=checkpoint_id, responses=body.parsed()
    )
    return EventStream(relay(stream))
