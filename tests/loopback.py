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


# How a misbehaving server answers, after reading the request: each is a list of (bytes, pause) it
# writes in a loop until the client goes or the server stops. None of them ever completes an answer.
MISBEHAVIOURS = ("trickle_body", "endless_body", "endless_headers", "trickle_headers", "silent", "garbage",
                 "short_body", "huge_header_line")


class MisbehavingServer:
    """A raw-socket server on 127.0.0.1 that answers every connection the way ``mode`` says (one of
    :data:`MISBEHAVIOURS`): bytes trickled one at a time, a body or headers without end, silence,
    non-HTTP bytes, a body shorter than its Content-Length. Use as a context manager; stopping
    closes every connection, so no test thread outlives it."""

    def __init__(self, mode: str, *, pause_s: float = 0.02) -> None:
        import socket

        assert mode in MISBEHAVIOURS, f"unknown mode {mode!r}"
        self.mode = mode
        self.pause_s = pause_s
        self.connections = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._threads: list[threading.Thread] = []
        host, port = self._listener.getsockname()[:2]
        self.url = f"http://{host}:{port}"  # the server's root URL

    def __enter__(self) -> "MisbehavingServer":
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:  # the 0.05 s accept timeout: look at the stop flag again
                continue
            self.connections += 1
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _answer(self, conn) -> None:
        conn.settimeout(0.05)
        try:
            conn.recv(65536)  # the request
            for data, pause in self._script():
                if self._stop.is_set():
                    return
                if data:
                    conn.sendall(data)
                self._stop.wait(pause)
        except OSError:  # the client gave up and closed: what a bounded client does
            pass
        finally:
            conn.close()

    def _script(self):
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        if self.mode == "trickle_body":
            yield ok + b"Content-Length: 100000\r\n\r\n", 0.0
            while True:
                yield b"#", self.pause_s
        elif self.mode == "endless_body":
            yield ok + b"Connection: close\r\n\r\n", 0.0
            while True:
                yield b'vllm:spec_decode_num_drafts_total{engine="0"} 1\n' * 512, 0.0
        elif self.mode == "endless_headers":
            yield ok, 0.0
            while True:
                yield b"X-More: yes\r\n" * 10, 0.0
        elif self.mode == "trickle_headers":
            for byte in ok:
                yield bytes([byte]), self.pause_s
            while True:
                yield b"X", self.pause_s
        elif self.mode == "silent":
            while True:
                yield b"", self.pause_s
        elif self.mode == "garbage":
            yield b"\x00\xff garbage, not HTTP\r\n\r\n", 0.0
        elif self.mode == "short_body":
            yield ok + b"Content-Length: 1000\r\n\r\nvllm:x 1\n", 0.0
        else:  # huge_header_line
            yield ok + b"X-Long: " + b"a" * (1 << 20) + b"\r\n\r\n", 0.0
