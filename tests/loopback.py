"""A scripted HTTP server on 127.0.0.1 for tests that watch a server: it answers ``GET /metrics``
with the next page of a script (the last page repeats), and can be stopped to play a server that
went down. Nothing leaves the machine; every wait in the tests that use it is bounded."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Sequence

FIXTURES = Path(__file__).parent / "fixtures" / "server"


def page(name: str) -> str:
    """A recorded page or log from ``tests/fixtures/server``."""
    return (FIXTURES / name).read_text()


class ScriptedServer:
    """Serves ``pages`` (status, body) in order on ``/metrics``; 404 elsewhere. Use as a context manager."""

    def __init__(self, pages: Sequence[tuple[int, str]]) -> None:
        assert pages, "a script needs at least one page"
        self.pages = list(pages)
        self.requests: list[str] = []
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                served.requests.append(self.path)
                if self.path != "/metrics":
                    self._answer(404, "not found")
                    return
                index = min(sum(p == "/metrics" for p in served.requests) - 1, len(served.pages) - 1)
                self._answer(*served.pages[index])

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        """The server's root URL."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and free the port (the server is now down)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port_url() -> str:
    """A loopback URL where nothing listens (a port just freed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"
