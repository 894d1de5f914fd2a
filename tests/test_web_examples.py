"""The example web applications in docs/examples, each run as a real server process on
127.0.0.1 (FastAPI on uvicorn, and the plain ASGI app on hypercorn's trio worker), with
the test client under asyncio and trio.

Each server gets a listening socket the test bound already (uvicorn ``--fd``, hypercorn
``fd://``), so the port is known and free, and the first request simply waits in the
socket's backlog until the server accepts it: no polling. Servers that share a data
folder share one SQLite checkpoint database and one refund ledger (a line per refund the
tool really made).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from runlet import (
    Agent,
    CheckpointCancelledError,
    CheckpointClaimedError,
    CheckpointNotFoundError,
    CheckpointResolvedError,
    CheckpointSerializationError,
    CheckpointStoreRequiredError,
    HumanRequestExpiredError,
    HumanResponseConflictError,
    HumanResponseError,
    Interrupted,
    LeaseLostError,
    MessageCompleted,
    MissingToolError,
    ModelError,
    RunFinished,
    RunResult,
    Runtime,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolContext,
    ToolSpec,
    structure,
    structure_event,
)
from runlet.testing import ScriptedModel, call

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parent.parent / "docs" / "examples"


def command(kind: str, fd: int) -> list[str]:
    if kind == "fastapi":
        return [sys.executable, "-m", "uvicorn", "--fd", str(fd), "--no-access-log"]
    return [sys.executable, "-m", "hypercorn", "--worker-class", "trio", "--bind", f"fd://{fd}"]


APP = {"fastapi": "fastapi_app:app", "trio": "asgi_trio_app:app"}


class Server:
    """One server process of an example app, with its own log file."""

    def __init__(self, kind: str, data_dir: Path, number: int) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.log = data_dir / f"server-{number}-{kind}.log"
        self.url = ""
        self.process: anyio.abc.Process | None = None

    async def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
            env = {
                **os.environ,
                "RUNLET_EXAMPLE_DIR": str(self.data_dir),
                "PYTHONPATH": os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
            }
            with self.log.open("wb") as log:
                self.process = await anyio.open_process(
                    [*command(self.kind, listener.fileno()), APP[self.kind]],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.data_dir,
                    pass_fds=[listener.fileno()],
                    start_new_session=True,  # hypercorn's worker is a child process
                )
        finally:
            listener.close()  # the server holds its own copy

    async def stop(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        with anyio.move_on_after(20):
            await process.wait()
            return
        os.killpg(process.pid, signal.SIGKILL)  # the group this test started
        await process.wait()

    def logged(self) -> str:
        return self.log.read_text(errors="replace")


Start = Callable[[str], Awaitable[Server]]


@pytest.fixture
async def serve(tmp_path: Path, anyio_backend: str) -> AsyncIterator[Start]:
    """``await serve(kind)`` starts a server on the test's data folder and waits until it
    answers; all are stopped at the end."""
    started: list[Server] = []

    async def start(kind: str) -> Server:
        server = Server(kind, tmp_path, len(started))
        started.append(server)
        await server.start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                health = (await client.get(f"{server.url}/health")).json()
        except httpx.HTTPError as exc:
            raise AssertionError(f"{kind} server did not start:\n{server.logged()}") from exc
        assert health["status"] == "ok"
        if kind == "trio":
            assert health["async_library"] == "trio"
        return server

    try:
        yield start
    finally:
        for server in started:
            await server.stop()


@pytest.fixture
async def client(anyio_backend: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def ledger(data_dir: Path) -> list[str]:
    """Orders the refund tool really refunded, one per run of its handler."""
    path = data_dir / "refunds.log"
    if not path.exists():
        return []
    return [line.split()[0] for line in path.read_text().splitlines()]


def approve(request_id: str, **fields: Any) -> dict[str, Any]:
    return {"request_id": request_id, "action": "approve", **fields}


def reject(request_id: str, reason: str | None = None, **fields: Any) -> dict[str, Any]:
    answer = {"request_id": request_id, "action": "reject", **fields}
    if reason is not None:
        answer["value"] = reason
    return answer


async def start_run(client: httpx.AsyncClient, server: Server, text: str) -> RunResult:
    response = await client.post(f"{server.url}/runs", json={"input": text})
    assert response.status_code == 200, response.text
    return structure(response.json(), RunResult)


async def answer(
    client: httpx.AsyncClient, server: Server, checkpoint_id: str, *answers: dict[str, Any]
) -> httpx.Response:
    return await client.post(
        f"{server.url}/checkpoints/{checkpoint_id}/responses", json={"responses": list(answers)}
    )


def parse_sse(response: httpx.Response) -> list[dict[str, Any]]:
    """Each server-sent event's data; its event name must be the data's type."""
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(fields["data"])
        assert fields["event"] == data["type"]
        events.append(data)
    return events


PAIRS = [("fastapi", "fastapi"), ("trio", "trio"), ("fastapi", "trio")]


@pytest.mark.parametrize(("first", "second"), PAIRS)
async def test_a_run_started_on_one_server_is_answered_on_another(
    serve: Start, client: httpx.AsyncClient, tmp_path: Path, first: str, second: str
) -> None:
    a = await serve(first)
    b = await serve(second)

    started = await start_run(client, a, "Refund orders 12 and 13, please.")
    assert started.status == "interrupted"
    assert [r.prompt for r in started.pending_requests] == ["Refund order 12?", "Refund order 13?"]
    assert started.checkpoint_id is not None

    listed = (await client.get(f"{b.url}/pending")).json()
    assert listed["next"] is None
    [pending] = listed["pending"]
    assert pending["checkpoint_id"] == started.checkpoint_id
    assert pending["run_id"] == started.run_id
    assert [r["id"] for r in pending["requests"]] == [r.id for r in started.pending_requests]

    # Answer one of the two on B: the run interrupts again, for the other one only.
    twelve, thirteen = started.pending_requests
    response = await answer(
        client, b, started.checkpoint_id, approve(twelve.id, responded_by="ann")
    )
    assert response.status_code == 200, response.text
    halfway = structure(response.json(), RunResult)
    assert halfway.status == "interrupted"
    assert [r.id for r in halfway.pending_requests] == [thirteen.id]
    assert halfway.checkpoint_id not in (None, started.checkpoint_id)
    assert ledger(tmp_path) == ["12"]

    # And the other on A, with a reason: the run completes.
    assert halfway.checkpoint_id is not None
    response = await answer(
        client, a, halfway.checkpoint_id, reject(thirteen.id, "already refunded", responded_by="bo")
    )
    assert response.status_code == 200, response.text
    done = structure(response.json(), RunResult)
    assert done.status == "completed"
    assert done.output == (
        "Refunded order 12. A human rejected this tool call, so it was not run. "
        "Reason: already refunded"
    )
    assert ledger(tmp_path) == ["12"]
    assert (await client.get(f"{a.url}/pending")).json() == {"pending": [], "next": None}

    trail = (await client.get(f"{b.url}/runs/{started.run_id}/decisions")).json()["decisions"]
    assert [(d["action"], d["responded_by"], d["tool_call_id"]) for d in trail] == [
        ("approve", "ann", "refund-12"),
        ("reject", "bo", "refund-13"),
    ]
    assert [d.responded_by for d in done.decisions] == ["ann", "bo"]


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
@pytest.mark.parametrize("answers", ["different", "equal"])
async def test_twenty_concurrent_answers_run_the_tool_once(
    serve: Start, client: httpx.AsyncClient, tmp_path: Path, kind: str, answers: str
) -> None:
    servers = [await serve(kind), await serve(kind)]
    started = await start_run(client, servers[0], "Refund order 7.")
    assert started.checkpoint_id is not None
    assert started.interruption is not None
    request_id, checkpoint_id = started.interruption.id, started.checkpoint_id

    def answer_of(number: int) -> dict[str, Any]:
        who = f"operator-{number}" if answers == "different" else "operator"
        return approve(request_id, responded_by=who)

    replies: dict[int, httpx.Response] = {}

    async def send(number: int) -> None:
        server = servers[number % 2]
        replies[number] = await answer(client, server, checkpoint_id, answer_of(number))

    async with anyio.create_task_group() as group:
        for number in range(20):
            group.start_soon(send, number)

    assert ledger(tmp_path) == ["7"]
    trail = (await client.get(f"{servers[1].url}/runs/{started.run_id}/decisions")).json()
    [decision] = trail["decisions"]
    won = [n for n, reply in replies.items() if reply.status_code == 200]
    assert won
    results = {json.dumps(replies[n].json(), sort_keys=True) for n in won}
    assert len(results) == 1  # every 200 carries the one stored result
    result = structure(replies[won[0]].json(), RunResult)
    assert result.status == "completed"
    assert result.output == "Refunded order 7."
    for number, reply in replies.items():
        if reply.status_code == 200:
            assert answer_of(number)["responded_by"] == decision["responded_by"]
        else:
            assert reply.status_code == 409, reply.text
            error = reply.json()["error"]
            assert error in ("CheckpointClaimedError", "HumanResponseConflictError")
            if error == "HumanResponseConflictError":
                assert answer_of(number)["responded_by"] != decision["responded_by"]
    if answers == "different":
        assert len(won) == 1

    # Afterwards: the winning answer again gets the same result, another one a 409.
    winner = approve(request_id, responded_by=decision["responded_by"])
    again = await answer(client, servers[1], checkpoint_id, winner)
    assert again.status_code == 200
    assert structure(again.json(), RunResult) == result
    other = await answer(client, servers[0], checkpoint_id, reject(request_id))
    assert other.status_code == 409
    assert other.json()["error"] == "HumanResponseConflictError"
    assert ledger(tmp_path) == ["7"]


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
async def test_a_run_and_its_resumption_stream_as_server_sent_events(
    serve: Start, client: httpx.AsyncClient, tmp_path: Path, kind: str
) -> None:
    server = await serve(kind)

    response = await client.post(f"{server.url}/runs/stream", json={"input": "Refund order 5."})
    assert response.status_code == 200
    events = [structure_event(data) for data in parse_sse(response)]
    assert [type(e) for e in events[-3:]] == [MessageCompleted, Interrupted, RunFinished]
    interrupted, finished = events[-2], events[-1]
    assert isinstance(interrupted, Interrupted)
    assert isinstance(finished, RunFinished)
    assert finished.result.status == "interrupted"
    assert interrupted.checkpoint_id == finished.result.checkpoint_id
    assert interrupted.request.prompt == "Refund order 5?"
    assert ledger(tmp_path) == []

    response = await client.post(
        f"{server.url}/checkpoints/{interrupted.checkpoint_id}/responses/stream",
        json={"responses": [approve(interrupted.request.id)]},
    )
    assert response.status_code == 200
    events = [structure_event(data) for data in parse_sse(response)]
    kinds = [type(e) for e in events]
    assert kinds[:2] == [ToolCallStarted, ToolCallFinished]
    assert kinds[-2:] == [MessageCompleted, RunFinished]
    assert set(kinds[2:-2]) == {TextDelta}
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert text == finished.result.output == "Refunded order 5."
    assert ledger(tmp_path) == ["5"]

    # An error before the first event gets its own status, not a stream.
    response = await client.post(
        f"{server.url}/checkpoints/{interrupted.checkpoint_id}/responses/stream",
        json={"responses": [reject(interrupted.request.id)]},
    )
    assert response.status_code == 409
    assert response.json()["error"] == "HumanResponseConflictError"
    response = await client.post(
        f"{server.url}/checkpoints/cp_unknown/responses/stream",
        json={"responses": [approve("req_unknown")]},
    )
    assert response.status_code == 404
    assert response.json()["error"] == "CheckpointNotFoundError"


async def read_to_the_end(connection: anyio.abc.ByteStream) -> bytes:
    """Everything *connection* sends until the server closes it."""
    received = b""
    with contextlib.suppress(anyio.EndOfStream):
        while True:
            received += await connection.receive()
    return received


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
async def test_a_stream_asked_to_close_the_connection_closes_it(serve: Start, kind: str) -> None:
    # HTTP/1.0 proxies (nginx's default upstream protocol) send Connection: close and read
    # to the end of the connection; hypercorn's trio worker held it open for good when the
    # app ended the stream while its disconnect watcher still waited on receive().
    server = await serve(kind)
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"input": "Refund order 6."}).encode()
    head = (
        "POST /runs/stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    async with await anyio.connect_tcp(host, int(port)) as connection:
        await connection.send(head.encode() + body)
        with anyio.fail_after(20):  # a connection held open fails here
            received = await read_to_the_end(connection)
    assert received.startswith(b"HTTP/1.1 200")
    assert b"event: run_finished" in received


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
async def test_errors_answer_with_the_status_of_their_class(
    serve: Start, client: httpx.AsyncClient, kind: str
) -> None:
    server = await serve(kind)
    started = await start_run(client, server, "Refund order 9.")
    assert started.checkpoint_id is not None
    assert started.interruption is not None
    checkpoint_id, request_id = started.checkpoint_id, started.interruption.id

    cases: list[tuple[str, Any, int, str]] = [
        ("cp_unknown", approve(request_id), 404, "CheckpointNotFoundError"),
        (checkpoint_id, approve("req_other"), 422, "HumanResponseError"),
        # Not responses at all: the client's mistake, not broken stored data.
        (checkpoint_id, {"request_id": request_id, "action": "select"}, 422, "HumanResponseError"),
        (checkpoint_id, {"request_id": request_id, "action": "sign"}, 422, "HumanResponseError"),
        (checkpoint_id, {"request_id": request_id}, 422, "HumanResponseError"),
        (checkpoint_id, approve(request_id, edited_arguments={"order": 9}), 422, ""),
    ]
    for where, body, status, error in cases:
        response = await answer(client, server, where, body)
        assert response.status_code == status, (body, response.text)
        if error:
            assert response.json()["error"] == error
    # None of those consumed the checkpoint: the right answer still works.
    response = await answer(client, server, checkpoint_id, approve(request_id))
    assert response.status_code == 200
    conflict = await answer(client, server, checkpoint_id, reject(request_id))
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "HumanResponseConflictError"

    # A cancelled run is gone for good: 410, and no longer pending.
    other = await start_run(client, server, "Refund order 10.")
    assert other.checkpoint_id is not None
    assert other.interruption is not None
    cancelled = await client.post(f"{server.url}/checkpoints/{other.checkpoint_id}/cancel")
    assert cancelled.json() == {"checkpoint_id": other.checkpoint_id, "status": "cancelled"}
    response = await answer(client, server, other.checkpoint_id, approve(other.interruption.id))
    assert response.status_code == 410
    assert response.json()["error"] == "CheckpointCancelledError"
    assert (await client.get(f"{server.url}/pending")).json()["pending"] == []
    again = await client.post(f"{server.url}/checkpoints/{checkpoint_id}/cancel")
    assert again.status_code == 409  # answered already: too late to cancel
    assert again.json()["error"] == "CheckpointResolvedError"
    unknown = await client.post(f"{server.url}/checkpoints/cp_unknown/cancel")
    assert unknown.status_code == 404
    assert ledger(server.data_dir) == ["9"]


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
async def test_pending_requests_come_in_pages(
    serve: Start, client: httpx.AsyncClient, kind: str
) -> None:
    server = await serve(kind)
    runs = [await start_run(client, server, f"Refund order {n}.") for n in (1, 2, 3)]
    first = (await client.get(f"{server.url}/pending", params={"limit": 2})).json()
    assert first["next"] == runs[1].checkpoint_id
    rest = (await client.get(f"{server.url}/pending", params={"after": first["next"]})).json()
    listed = [p["checkpoint_id"] for p in first["pending"] + rest["pending"]]
    assert listed == [run.checkpoint_id for run in runs]
    assert rest["next"] is None
    bad = await client.get(f"{server.url}/pending", params={"limit": 0})
    assert bad.status_code == 422
    assert bad.json()["error"] == "InvalidRequest"


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
async def test_a_request_refused_before_runlet_sees_it_has_the_error_shape(
    serve: Start, client: httpx.AsyncClient, kind: str
) -> None:
    server = await serve(kind)
    json_body = {"content-type": "application/json"}
    refusals = [
        ("POST", "/runs", b"not json", json_body, 422, "InvalidRequest"),
        ("POST", "/runs", b'{"metadata": {}}', json_body, 422, "InvalidRequest"),
        ("POST", "/runs", b'{"input": 5}', json_body, 422, "InvalidRequest"),
        ("POST", "/runs", b'{"input": "x"}', {"content-type": "text/plain"}, 422, "InvalidRequest"),
        (
            "POST",
            "/checkpoints/cp_1/responses",
            b'{"responses": [5]}',
            json_body,
            422,
            "InvalidRequest",
        ),
        ("GET", "/nowhere", b"", {}, 404, "NotFound"),
        ("DELETE", "/runs", b"", {}, 405, "MethodNotAllowed"),
        ("GET", "/checkpoints/cp_1/cancel", b"", {}, 405, "MethodNotAllowed"),
    ]
    for method, path, body, headers, status, name in refusals:
        refused = await client.request(method, server.url + path, content=body, headers=headers)
        assert refused.status_code == status, (method, path, body, refused.text)
        answer = refused.json()
        assert (answer["type"], answer["error"]) == ("error", name), (method, path, answer)
        assert answer["detail"]
    wrong = await client.request("DELETE", f"{server.url}/runs")
    assert wrong.headers["allow"] == "POST"  # HTTP asks a 405 to say what is allowed
    # A body that does not say it is JSON is not read as JSON (FastAPI's rule).
    unsaid = await client.post(f"{server.url}/runs", content=b'{"input": "Refund order 7."}')
    assert (unsaid.status_code, unsaid.json()["error"]) == (422, "InvalidRequest")
    said = await client.post(
        f"{server.url}/runs",
        content=b'{"input": "Refund order 7."}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert said.status_code == 200, said.text


def test_the_status_table_covers_every_error_people_can_cause() -> None:
    spec = importlib.util.spec_from_file_location("refund_agent", EXAMPLES / "refund_agent.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = {
        CheckpointNotFoundError: 404,
        CheckpointCancelledError: 410,
        HumanResponseConflictError: 409,
        CheckpointResolvedError: 409,
        CheckpointClaimedError: 409,
        HumanRequestExpiredError: 410,
        HumanResponseError: 422,
        CheckpointSerializationError: 500,  # from resume(): stored data is broken
        MissingToolError: 500,
        LeaseLostError: 503,
        ModelError: 502,
        CheckpointStoreRequiredError: 500,
    }
    # Only the class matters; the instances need no message or ids.
    actual = {cls: module.http_status(cls.__new__(cls)) for cls in expected}
    assert expected == actual


def load_example(monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module(name)


async def relay_in_process(
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    stream: Any,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    spec_version: str = "2.3",
) -> None:
    """Relay *stream* the way the example app of *kind* does, without a server."""
    if kind == "fastapi":
        app = load_example(monkeypatch, "fastapi_app")
        response = app.EventStream(app.relay(stream))
        await response({"type": "http", "asgi": {"spec_version": spec_version}}, receive, send)
    else:
        app = load_example(monkeypatch, "asgi_trio_app")
        await app.send_events(send, receive, stream)


def slow_agent(cleaned_up: list[str], running: anyio.Event) -> Agent:
    async def slow(arguments: Any, context: ToolContext) -> str:
        running.set()
        try:
            await anyio.sleep_forever()
        finally:
            cleaned_up.append(context.tool_call_id)
        return "never"  # pragma: no cover

    return Agent(
        name="slow",
        instructions="",
        model=ScriptedModel([call("slow", id="call_slow"), "done"]),
        tools=(ToolSpec("slow", "Takes forever.", {"type": "object"}, slow),),
    )


@pytest.mark.parametrize(
    ("kind", "spec_version"), [("fastapi", "2.3"), ("fastapi", "2.4"), ("trio", "2.1")]
)
async def test_a_relay_stops_the_run_in_its_own_task_when_the_client_leaves(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str, kind: str, spec_version: str
) -> None:
    """A client that goes away while a tool runs stops the run: the tool is cancelled and
    cleaned up before the relay returns, and the run's stream is left in the task that
    entered it. How the server says so differs: under ASGI 2.4 uvicorn's ``send`` raises
    OSError; otherwise ``receive`` returns ``http.disconnect`` (Starlette then cancels the
    response; the plain ASGI app watches for it itself). A plain StreamingResponse would
    leave the generator to the garbage collector, which closes it in another task:
    "cancel scope in a different task" on asyncio, "Cancel scope stack corrupted" on trio."""
    from starlette.requests import ClientDisconnect

    running = anyio.Event()
    cleaned_up: list[str] = []
    stream = Runtime().stream(slow_agent(cleaned_up, running), "Go.")
    sent: list[dict[str, Any]] = []
    gone = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if b"tool_call_started" in message.get("body", b""):
            await running.wait()  # the client leaves while the tool runs
            gone.set()
            if spec_version == "2.4":
                raise OSError("the client went away")
            if kind == "fastapi":
                await anyio.sleep_forever()  # a stalled client; the disconnect cancels it

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    with anyio.fail_after(10):
        if spec_version == "2.4":
            with pytest.raises(ClientDisconnect):
                await relay_in_process(monkeypatch, kind, stream, send, receive, "2.4")
        else:
            await relay_in_process(monkeypatch, kind, stream, send, receive, spec_version)
    assert cleaned_up == ["call_slow"]
    assert sent[0]["status"] == 200
    assert b"tool_call_started" in sent[-1]["body"]


@pytest.mark.parametrize("kind", ["fastapi", "trio"])
async def test_an_error_after_the_first_event_is_sent_as_an_error_event(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str, kind: str
) -> None:
    def outage(request: Any) -> str:
        raise ConnectionError("connection reset by peer")

    async def lookup(arguments: Any, context: ToolContext) -> str:
        return "found"

    agent = Agent(
        name="flaky",
        instructions="",
        model=ScriptedModel([call("lookup", id="call_1"), outage]),
        tools=(ToolSpec("lookup", "Look it up.", {"type": "object"}, lookup),),
    )
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    with anyio.fail_after(10):
        await relay_in_process(monkeypatch, kind, Runtime().stream(agent, "Go."), send, receive)
    assert sent[0]["status"] == 200
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    blocks = [m["body"].decode() for m in sent[1:-1]]
    data = [json.loads(block.split("data: ", 1)[1]) for block in blocks]
    assert [d["type"] for d in data][-3:] == ["tool_call_started", "tool_call_finished", "error"]
    assert data[-1]["error"] == "ModelError"
    assert "connection reset by peer" in data[-1]["detail"]
    assert blocks[-1].startswith("event: error\n")
