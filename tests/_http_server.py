"""A real HTTP server on 127.0.0.1 for the provider tests.

It runs a stdlib ``ThreadingHTTPServer`` in a thread, checks every request it gets with a
checker function (the documented wire format of one API), records it, and answers with
the next scripted :class:`Reply`: a JSON body, a server-sent event stream (optionally cut
off midway), or nothing until released. A request that fails its checks is answered with
a 400 whose message lists the problems, and the problems are kept so the fixture can fail
the test.
"""

from __future__ import annotations

import collections
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs


@attrs.frozen
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: Mapping[str, str]  # lower-cased names
    body: Any
    client: tuple[str, int] = ("", 0)  # the client's address: one per connection


Checker = Callable[[Seen], list[str]]


@attrs.frozen
class Reply:
    """One scripted answer.

    Attributes:
        status: The HTTP status.
        json: A JSON body.
        raw: A raw body (for answers that are not JSON); wins over ``json``.
        headers: Extra response headers; a ``content-type`` here replaces the usual one
            (an empty one sends none).
        events: A server-sent event stream: each string is sent as one chunk.
        cut_after: With ``events``, drop the connection after this many chunks (with
            ``len(events)``, right after the last one, without ending the body).
        reset: With ``events``, reset the connection (a TCP RST) right after the last
            chunk, instead of ending the body.
        hold: With ``events``, keep the response open after the last chunk until the
            test releases the server, then end the body.
        hang: Send nothing until the test releases the server.
    """

    status: int = 200
    json: Any = None
    raw: bytes | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    events: tuple[str, ...] | None = None
    cut_after: int | None = None
    reset: bool = False
    hold: bool = False
    hang: bool = False


def sse(data: Any, event: str | None = None) -> str:
    """One server-sent event carrying *data* (JSON-encoded unless it is a str)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n"


class ModelServer:
    """The server; use :meth:`running`."""

    def __init__(self, check: Checker) -> None:
        self.check = check
        self.requests: list[Seen] = []
        self.problems: list[str] = []
        self.replies: collections.deque[Reply] = collections.deque()
        self.arrived = threading.Event()  # set when a request has been received
        self.answered = threading.Event()  # set when an answer has been written
        self.release = threading.Event()  # lets a hanging reply finish
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _handler_for(self))
        host, port = self._httpd.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def reply(self, *replies: Reply) -> None:
        """Queue answers for the next requests, in order."""
        with self._lock:
            self.replies.extend(replies)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests received, in order."""
        return [seen.body for seen in self.requests]

    @classmethod
    @contextmanager
    def running(cls, check: Checker) -> Iterator[ModelServer]:
        """Start a server on 127.0.0.1 (a free port); stop it and its threads on exit."""
        server = cls(check)
        thread = threading.Thread(
            target=server._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        thread.start()
        try:
            yield server
        finally:
            server.release.set()
            server._httpd.shutdown()
            server._httpd.server_close()
            thread.join()

    def _next(self, seen: Seen) -> Reply:
        with self._lock:
            self.requests.append(seen)
            problems = self.check(seen)
            if problems:
                self.problems.extend(problems)
                return Reply(400, {"error": {"message": "; ".join(problems)}})
            if not self.replies:
                self.problems.append(f"no reply scripted for request {len(self.requests)}")
                return Reply(500, {"error": {"message": "no reply scripted"}})
            return self.replies.popleft()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up (cancelled, or done early) is not an error here


def _handler_for(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, like a real API

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def do_POST(self) -> None:
            try:
                self._answer()
            except OSError:  # the client went away (cancelled, or closed early)
                self.close_connection = True

        def _answer(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            headers = {name.lower(): value for name, value in self.headers.items()}
            client = self.client_address[:2]
            reply = server._next(Seen(self.command, self.path, headers, body, client))
            server.arrived.set()
            if reply.hang:
                server.release.wait()
                self.close_connection = True
                return
            if reply.events is not None:
                self._stream(reply)
            else:
                content = reply.raw if reply.raw is not None else json.dumps(reply.json).encode()
                self.send_response(reply.status)
                self._headers(reply, "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)
            self.wfile.flush()
            server.answered.set()

        def _headers(self, reply: Reply, content_type: str) -> None:
            headers = {"content-type": content_type, **reply.headers}
            for name, value in headers.items():
                if value:
                    self.send_header(name, value)

        def _stream(self, reply: Reply) -> None:
            assert reply.events is not None
            self.send_response(reply.status)
            self._headers(reply, "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for number, event in enumerate(reply.events):
                if reply.cut_after is not None and number >= reply.cut_after:
                    # Drop the connection without the closing chunk: a cut-off stream.
                    self.wfile.flush()
                    self.close_connection = True
                    return
                data = event.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if reply.reset:
                # Close with SO_LINGER 0: the kernel answers with a RST, not a FIN.
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
                self.close_connection = True
                return
            if reply.cut_after is not None:  # cut after every chunk: no closing chunk
                self.close_connection = True
                return
            if reply.hold:
                server.release.wait()
            self.wfile.write(b"0\r\n\r\n")

    return Handler
