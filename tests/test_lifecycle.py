"""Objects that outlive an event loop: one store, runtime or model adapter used across
several ``anyio.run()`` calls, across backends, from threads that each run their own
event loop (sync web frameworks: a portal or ``async_to_sync`` per worker thread), and
closed while work is in flight or interrupted by Ctrl-C.

The tests that run event loops in threads bound each wait with a join timeout: a
failure there is a hang of the code under test, not a slow machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from _files import needs_proc, open_files_under
from _threads import JOIN, in_threads
from anyio import wait_all_tasks_blocked
from anyio.from_thread import start_blocking_portal
from conftest import BACKENDS

from runlet import (
    Agent,
    CheckpointNotFoundError,
    ConfigurationError,
    HumanResponse,
    InMemoryCheckpointStore,
    Message,
    ModelRequest,
    RunletError,
    Runtime,
    ToolSpec,
)
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call

REPO = Path(__file__).resolve().parent.parent


async def _pay(arguments: Any, context: Any) -> str:
    return "paid"


PAY = ToolSpec("pay", "Pay.", {"type": "object"}, _pay, requires_approval=True)


def _agent() -> Agent:
    return Agent("billing", "Pay.", ScriptedModel([call("pay", invoice="A-1"), "Paid."]), (PAY,))


def _other(backend: str) -> str:
    return "trio" if backend == "asyncio" else "asyncio"


# -- 1. One open SQL store, several event loops in several threads ---------------------


def _open_in(backend: str, make: Callable[[], Any]) -> Any:
    store = make()
    anyio.run(store.__aenter__, backend=backend)
    return store


def _close_in(backend: str, store: Any) -> None:
    anyio.run(store.__aexit__, None, None, None, backend=backend)


def _two_loops_contend(backend: str, store: Any) -> None:
    """Loop A holds the store's only connection while loop B's call waits for it; then A
    lets go. B must get the connection. A sync web server whose worker threads each
    run their own event loop (a portal or asgiref's async_to_sync per thread) shares
    one store this way."""
    holding = threading.Event()
    let_go = threading.Event()
    b_waits = threading.Event()
    loaded: list[str] = []

    async def loop_a() -> None:
        def hold() -> None:
            holding.set()
            let_go.wait(JOIN)

        await store._run(hold)  # a store call that takes a while (a busy database)

    async def loop_b() -> None:
        await anyio.to_thread.run_sync(holding.wait)

        async def load() -> None:
            try:
                await store.load("nothing-here")
            except CheckpointNotFoundError:
                loaded.append("answered")

        async with anyio.create_task_group() as group:
            group.start_soon(load)
            await wait_all_tasks_blocked()  # load() waits for the connection now
            b_waits.set()

    def a() -> None:
        anyio.run(loop_a, backend=backend)

    def b() -> None:
        anyio.run(loop_b, backend=backend)

    def release() -> None:
        b_waits.wait(JOIN)
        let_go.set()

    errors = in_threads(a, b, release)
    assert [] == errors
    assert ["answered"] == loaded


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_sqlite_store_serves_event_loops_in_several_threads(
    backend: str, tmp_path: Path
) -> None:
    store = _open_in(backend, lambda: SQLiteCheckpointStore(tmp_path / "c.db", connections=1))
    try:
        _two_loops_contend(backend, store)
    finally:
        _close_in(backend, store)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_postgres_store_serves_event_loops_in_several_threads(
    backend: str, postgres_server: str
) -> None:
    from _postgres import fresh_schema

    from runlet.stores.postgres import PostgresCheckpointStore

    conninfo = fresh_schema(postgres_server)
    store = _open_in(backend, lambda: PostgresCheckpointStore(conninfo, max_size=1))
    try:
        _two_loops_contend(backend, store)
    finally:
        _close_in(backend, store)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_requests_from_many_loops_share_one_sqlite_store(backend: str, tmp_path: Path) -> None:
    # The same without the choreography: eight worker threads, each with an event loop
    # per request, four connections.
    store = _open_in(backend, lambda: SQLiteCheckpointStore(tmp_path / "c.db"))
    runtime = Runtime(checkpoint_store=store)

    def worker() -> None:
        async def requests() -> None:
            for _ in range(10):
                result = await runtime.run(_agent(), "pay")
                assert result.status == "interrupted"
                await store.list_pending(limit=5)

        anyio.run(requests, backend=backend)

    try:
        assert [] == in_threads(*[worker] * 8)
    finally:
        _close_in(backend, store)


# -- 2. A store entered under one backend, used under the other ------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sqlite_store_used_after_its_event_loop_ended_works_on_the_same_backend(
    backend: str, tmp_path: Path
) -> None:
    # Guard: a CLI that opens the store in one anyio.run and runs commands in others.
    store = _open_in(backend, lambda: SQLiteCheckpointStore(tmp_path / "c.db"))
    runtime = Runtime(checkpoint_store=store)
    agent = _agent()
    result = anyio.run(runtime.run, agent, "pay", backend=backend)
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    checkpoint_id = result.checkpoint_id
    response = HumanResponse(result.interruption.id, "approve")

    async def resume() -> Any:
        return await runtime.resume(agent, checkpoint_id=checkpoint_id, response=response)

    assert "Paid." == anyio.run(resume, backend=backend).output
    _close_in(backend, store)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sqlite_store_entered_under_one_backend_works_or_says_why_under_the_other(
    backend: str, tmp_path: Path
) -> None:
    # Today: RuntimeError("no running event loop") / ("must be called from async
    # context") from deep inside anyio's CapacityLimiter, made when the store was entered.
    store = _open_in(backend, lambda: SQLiteCheckpointStore(tmp_path / "c.db"))
    try:
        try:
            anyio.run(store.load, "nothing-here", backend=_other(backend))
        except CheckpointNotFoundError:
            pass  # it works
        except RunletError:
            pass  # or it says, in Runlet's words, that the store belongs to another loop
    finally:
        _close_in(backend, store)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_in_memory_store_resumes_under_the_other_backend(backend: str) -> None:
    # Guard: plain data, no loop-bound primitives.
    runtime = Runtime(checkpoint_store=InMemoryCheckpointStore(lease=60))
    agent = _agent()
    result = anyio.run(runtime.run, agent, "pay", backend=backend)
    assert result.interruption is not None
    assert result.checkpoint_id is not None
    checkpoint_id = result.checkpoint_id
    response = HumanResponse(result.interruption.id, "approve")

    async def resume() -> Any:
        return await runtime.resume(agent, checkpoint_id=checkpoint_id, response=response)

    assert "Paid." == anyio.run(resume, backend=_other(backend)).output


# -- 3. Closing -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_closed_sqlite_store_says_so_and_closes_twice(tmp_path: Path) -> None:
    # Guard.
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    async with store:
        pass
    with pytest.raises(ConfigurationError, match="not open"):
        await store.load("x")
    await store.__aexit__(None, None, None)
    async with store:  # and opens again
        with pytest.raises(CheckpointNotFoundError):
            await store.load("x")


@needs_proc
@pytest.mark.anyio
async def test_closing_the_sqlite_store_during_a_call_leaves_no_connection_open(
    tmp_path: Path,
) -> None:
    # A web app's lifespan closes the store while a request's store call is in its
    # worker thread: that call's connection goes back to the idle list after the close
    # emptied it, and stays open (with the -wal and -shm files) until the store object
    # is collected, or the store is closed a second time.
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    inside = threading.Event()
    go_on = threading.Event()

    def slow() -> None:
        with store._connection(write=False, atomic=False):  # as each store call does
            inside.set()
            go_on.wait(JOIN)

    async def call() -> None:
        await store._run(slow)

    await store.__aenter__()
    async with anyio.create_task_group() as group:
        group.start_soon(call)
        await anyio.to_thread.run_sync(inside.wait)
        await store.__aexit__(None, None, None)
        go_on.set()
    assert 0 == open_files_under(tmp_path)


# -- 4. Ctrl-C while a resume waits for its store in a worker thread ---------------------

_CTRL_C = r"""
import signal, sys, threading, anyio
from runlet import Agent, HumanResponse, Runtime, ToolSpec
from runlet.stores.sqlite import SQLiteCheckpointStore
from runlet.testing import ScriptedModel, call

backend, path, method = sys.argv[1:4]
handled = threading.Event()

class Store(SQLiteCheckpointStore):
    trap = False

    def _connection(self, *, write, atomic):  # runs in the worker thread
        if self.trap:
            self.trap = False
            # Ctrl-C now; the call finishes only once the event loop has taken it.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            handled.wait(30)
        return super()._connection(write=write, atomic=atomic)

def trapping(name):
    async def method(self, *args):
        self.trap = True
        return await getattr(SQLiteCheckpointStore, name)(self, *args)
    return method

setattr(Store, method, trapping(method))

async def pay(arguments, context):
    return "paid"

tool = ToolSpec("pay", "Pay.", {"type": "object"}, pay, requires_approval=True)
agent = Agent("a", "Pay.", ScriptedModel([call("pay"), "Paid."]), (tool,))
state = {}

async def main():
    installed = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        try:
            installed(signum, frame)
        finally:
            handled.set()

    signal.signal(signal.SIGINT, handler)
    async with Store(path) as store:
        runtime = Runtime(checkpoint_store=store)
        result = await runtime.run(agent, "pay")
        state["id"] = result.checkpoint_id
        response = HumanResponse(result.interruption.id, "approve")
        await runtime.resume(agent, checkpoint_id=result.checkpoint_id, response=response)

try:
    anyio.run(main, backend=backend)
    print("not interrupted")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
except BaseException as exc:
    print("raised", repr(exc))

async def status():
    async with SQLiteCheckpointStore(path) as store:
        return (await store.get(state["id"])).status

print("status", anyio.run(status, backend=backend))
"""


@pytest.mark.parametrize(
    ("method", "status"), [("claim", "pending"), ("record", "pending"), ("resolve", "resolved")]
)
def test_ctrl_c_during_a_store_call_of_a_resume_on_trio(
    method: str, status: str, tmp_path: Path
) -> None:
    # On trio, Ctrl-C goes to the main task as KeyboardInterrupt. Where the resume waits
    # in to_the_end()'s task group (the claim, the resolve, opening a store), it comes
    # out as BaseExceptionGroup([KeyboardInterrupt()]), which `except KeyboardInterrupt`
    # in a CLI does not catch; and a claim taken meanwhile is not given back, so the
    # checkpoint stays claimed for the lease (for good with lease=None). On asyncio the
    # same Ctrl-C is a cancellation: a plain KeyboardInterrupt, the claim given back.
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C, "trio", str(tmp_path / "c.db"), method],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert f"KeyboardInterrupt\nstatus {status}\n" == done.stdout, done.stderr


# -- 5. Portals (sync web frameworks) -----------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_and_resume_through_a_portal_and_cancel_a_resume(backend: str, tmp_path: Path) -> None:
    # Guard: a Flask/Django app with one portal for the process. A resume whose future
    # is cancelled (the client went away) leaves the checkpoint resumable; the tool it
    # was in counts as started, so the next resume asks again (outcome_unknown).
    entered = threading.Event()
    release = threading.Event()

    async def slow(arguments: Any, context: Any) -> str:
        entered.set()
        await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        return "paid"

    tool = ToolSpec("pay", "Pay.", {"type": "object"}, slow, requires_approval=True)

    def agent() -> Agent:
        return Agent("a", "Pay.", ScriptedModel([call("pay"), "Paid."]), (tool,))

    with (
        start_blocking_portal(backend) as portal,
        portal.wrap_async_context_manager(
            SQLiteCheckpointStore(tmp_path / "c.db", lease=60)
        ) as store,
    ):
        runtime = Runtime(checkpoint_store=store)
        result = portal.call(runtime.run, agent(), "pay")
        response = HumanResponse(result.interruption.id, "approve")

        def resume() -> Awaitable[Any]:
            return runtime.resume(agent(), checkpoint_id=result.checkpoint_id, response=response)

        finished = threading.Event()

        async def tracked() -> Any:
            try:
                return await resume()
            finally:  # after the resume gave its claim back
                finished.set()

        future = portal.start_task_soon(tracked)
        entered.wait(JOIN)
        future.cancel()
        release.set()
        assert finished.wait(JOIN)
        again = portal.call(resume)
    assert "interrupted" == again.status
    assert again.interruption.outcome_unknown


# -- 6. Model adapters ----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_shared_by_two_long_lived_event_loops_keeps_one_client_each(
    backend: str,
) -> None:
    # Two worker threads with a portal each share a module-level model. The adapter
    # keeps one client, for the loop that asked last: each request from the other loop
    # replaces it, so every request opens a new connection and leaves a client unclosed.
    from _http_server import ModelServer, Reply
    from _wire import openai_completion

    from runlet.providers.openai import OpenAIChatModel

    with ModelServer.running(lambda seen: []) as server:
        for _ in range(8):
            server.reply(Reply(json=openai_completion("hi")))
        model = OpenAIChatModel("m", api_key="k", base_url=server.url + "/v1")
        request = ModelRequest("", (Message.user("hi"),), (), {})
        with start_blocking_portal(backend) as first, start_blocking_portal(backend) as second:
            for _ in range(4):
                first.call(model.complete, request)
                second.call(model.complete, request)
            first.call(model.aclose)
            second.call(model.aclose)
        connections = {seen.client for seen in server.requests}
    assert 8 == len(server.requests)
    assert 2 == len(connections)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_closed_in_its_own_loop_leaves_nothing_to_collect(backend: str) -> None:
    # Guard: aclose() in each loop that used the model closes that loop's connection.
    import gc

    from _http_server import ModelServer, Reply
    from _wire import openai_completion

    from runlet.providers.openai import OpenAIChatModel

    with ModelServer.running(lambda seen: []) as server:
        server.reply(Reply(json=openai_completion("hi")), Reply(json=openai_completion("hi")))
        model = OpenAIChatModel("m", api_key="k", base_url=server.url + "/v1")
        request = ModelRequest("", (Message.user("hi"),), (), {})

        async def ask_and_close() -> None:
            await model.complete(request)
            await model.aclose()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            anyio.run(ask_and_close, backend=backend)
            anyio.run(ask_and_close, backend=_other(backend))
            gc.collect()
    assert [] == [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_per_loop_values_are_kept_for_the_latest_loops_only() -> None:
    # What a SQL store keeps its limiters in and an HTTP adapter its clients: one value
    # per event loop, made once in it, and only for the latest loops (a CLI's
    # anyio.run() per command would otherwise keep every dead loop's value).
    from runlet._util import PerLoop

    values: PerLoop[object] = PerLoop(2)
    made: list[object] = []

    async def use() -> tuple[object, object, object | None]:
        first = values.this_loop_or(lambda: made.append(object()) or made[-1])
        again = values.this_loop_or(lambda: made.append(object()) or made[-1])
        return first, again, values.this_loop()

    seen = [anyio.run(use, backend=backend) for backend in ["asyncio", "trio", "asyncio"]]

    assert all(first is again is current for first, again, current in seen)
    assert 3 == len(made)  # one per loop, not per call
    assert [seen[1][0], seen[2][0]] == list(values.values())  # the oldest loop's dropped

    async def take_out() -> object | None:
        return values.pop_this_loop()

    assert anyio.run(take_out) is None  # a new loop has none to take out
