"""A real HTTP server on 127.0.0.1 (port 0) for tests, speaking whatever wire format its routes implement.

Routes are plain functions `handler(request: Request) -> Reply`. The server records every request and can
script faults per route (a queue of replies served before the handler, e.g. 429 with Retry-After, 503, a slow
body), so the production clients run against real sockets.

    with LoopbackServer() as server:
        server.route("POST", "/search", lambda req: Reply.json({"organic": []}))
        server.fail_next("POST", "/search", Reply(status=429, headers={"Retry-After": "0"}))
        client = SerperClient(base_url=server.url)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import urllib.parse
from collections import defaultdict, deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay_s: float = 0.0  # sleep before sending headers (timeouts)
    chunks: list[bytes] | None = None  # stream these chunks with `chunk_delay_s` between them (slow bodies)
    chunk_delay_s: float = 0.0

    @classmethod
    def json(cls, obj: Any, status: int = 200, **kwargs) -> "Reply":
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        return cls(status=status, body=json.dumps(obj).encode("utf-8"), headers=headers, **kwargs)

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8", **kwargs) -> "Reply":
        headers = {"Content-Type": content_type, **kwargs.pop("headers", {})}
        return cls(status=status, body=text.encode("utf-8"), headers=headers, **kwargs)


Handler = Callable[[Request], Reply]


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a timeout test's client gives up on a slow reply) is expected here: its connection's
    reset is not printed as a traceback. Any other error in a handler thread still is."""

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """Threaded HTTP/1.1 server bound to 127.0.0.1 with scripted routes and faults."""

    def __init__(self, host: str = "127.0.0.1"):
        self._routes: dict[tuple[str, str], Handler] = {}
        self._faults: dict[tuple[str, str], deque[Reply]] = defaultdict(deque)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _handle(self):
                parsed = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(
                    method=self.command,
                    path=parsed.path,
                    query=urllib.parse.parse_qs(parsed.query),
                    headers={k: v for k, v in self.headers.items()},
                    body=body,
                )
                reply = server._dispatch(request)
                try:
                    self._send(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _send(self, reply: Reply):
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                if reply.chunks is not None:
                    total = sum(len(c) for c in reply.chunks)
                    self.send_header("Content-Length", str(total))
                    self.end_headers()
                    for chunk in reply.chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        time.sleep(reply.chunk_delay_s)
                    return
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self._httpd = _QuietServer((host, 0), _Handler)
        self._httpd.daemon_threads = True
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method.upper(), path)] = handler

    def fail_next(self, method: str, path: str, *replies: Reply) -> None:
        """Serve `replies` (in order) for the next requests to this route before its handler runs again."""
        self._faults[(method.upper(), path)].extend(replies)

    def count(self, method: str | None = None, path: str | None = None) -> int:
        with self._lock:
            return sum(
                1 for r in self.requests if (method is None or r.method == method.upper()) and (path is None or r.path == path)
            )

    def _dispatch(self, request: Request) -> Reply:
        key = (request.method, request.path)
        with self._lock:
            self.requests.append(request)
            fault = self._faults[key].popleft() if self._faults.get(key) else None
        if fault is not None:
            return fault
        handler = self._routes.get(key)
        if handler is None:
            return Reply.json({"detail": f"no route {request.method} {request.path}"}, status=404)
        try:
            return handler(request)
        except Exception as err:  # a handler bug must show up as a 500 in the test, not hang it
            return Reply.text(f"handler error: {type(err).__name__}: {err}", status=500)

    def __enter__(self) -> "LoopbackServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
