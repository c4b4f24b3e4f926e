"""One HTTP GET bounded as a whole: a deadline for the request, limits on headers and body.

``urllib``'s ``timeout`` bounds each socket read, not the request: a server that trickles one byte
a second, streams without end, or sends headers forever holds the caller for ever. Here every read
first checks the request's deadline and waits at most for what is left of it, so a GET ends within
``deadline_s`` (plus one scheduling tick) whatever the server does. The host name is resolved under the
same deadline: ``getaddrinfo`` cannot be given a timeout, so it runs in a daemon thread the request waits
for at most until the deadline (a slow DNS server hung the caller before any read began). Headers are capped by
``http.client`` (64 KiB a line, 100 lines) and the body by ``max_bytes``. No proxies, no redirects:
a watcher talks to the server it was given. Standard library only.
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any


class RequestFailed(Exception):
    """No usable answer: refused, timed out, too large, garbled, or an HTTP error (``status`` set)."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    """A complete answer: status, body (at most ``max_bytes``), and its Content-Type."""

    status: int
    body: bytes
    content_type: str


class _DeadlineReader(io.RawIOBase):
    """The socket's reads, each waiting at most for the time left before the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """A connected socket whose ``makefile`` (what ``http.client`` reads the answer through) keeps the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        assert "r" in mode, f"the answer is only read, not {mode!r}"
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(max(self._deadline - time.monotonic(), 0.001))
        self._sock.sendall(data)

    def close(self) -> None:
        """Kept open: ``http.client`` closes the connection before the body is read (``Connection:
        close``); :func:`get` closes the real socket once it has the whole answer."""

    def __getattr__(self, name: str) -> Any:  # setsockopt, shutdown ... go to the real socket
        return getattr(self._sock, name)


def _connection(url: str, deadline: float) -> tuple[http.client.HTTPConnection, str]:
    """The (not yet connected) connection for ``url`` (its ``host`` and ``port`` the ones to reach) and the path."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise RequestFailed(f"not a valid URL ({exc}): {url}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestFailed(f"not an http(s) URL: {url}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    # the port always given: left to http.client, an IPv6 literal's last group would be read as one ("::1" -> port 1)
    conn = kind(parts.hostname, kind.default_port if port is None else port,
                timeout=max(deadline - time.monotonic(), 0.001))
    path = parts.path or "/"
    return conn, path + (f"?{parts.query}" if parts.query else "")


class _Lookup:
    """One ``getaddrinfo`` running in a daemon thread; callers wait for it at most until their deadline."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.result: list[tuple[Any, ...]] = []
        self.error: OSError | None = None
        threading.Thread(target=self._run, args=(host, port), name=f"resolve {host}", daemon=True).start()

    def _run(self, host: str, port: int) -> None:
        try:
            self.result = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            self.error = exc
        finally:
            self.done.set()


_lookups: dict[tuple[str, int], _Lookup] = {}  # one lookup per name in flight: a poller never piles up threads
_lookups_lock = threading.Lock()


def resolve(host: str, port: int, *, deadline: float, deadline_s: float) -> list[tuple[Any, ...]]:
    """``getaddrinfo(host, port)`` finished before ``deadline`` (a ``time.monotonic()`` value), or
    :class:`RequestFailed` naming the host and ``deadline_s``. An IP address is not looked up."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    with _lookups_lock:
        lookup = _lookups.get((host, port))
        if lookup is None or lookup.done.is_set():  # a late answer to an abandoned lookup is not reused
            lookup = _lookups[(host, port)] = _Lookup(host, port)
    finished = lookup.done.wait(max(deadline - time.monotonic(), 0.0))
    if not finished:
        raise RequestFailed(f"the host name {host!r} did not resolve within the {round(deadline_s, 1):g} s deadline "
                            "(a slow or unreachable DNS server): check the name, or pass the server's IP address")
    with _lookups_lock:
        if _lookups.get((host, port)) is lookup:
            del _lookups[(host, port)]
    if lookup.error is not None:
        raise RequestFailed(f"cannot resolve the host name {host!r}: {_os_words(lookup.error)}")
    return lookup.result


def _open_socket(addresses: list[tuple[Any, ...]], deadline: float) -> socket.socket:
    """A TCP socket connected to the first of ``addresses`` that accepts before ``deadline``."""
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error if error is not None else OSError("the name resolved to no address")


def get(url: str, *, deadline_s: float, max_bytes: int, accept: str = "*/*") -> Answer:
    """GET ``url``; the whole request (connect, headers, body) ends within ``deadline_s``.

    Raises :class:`RequestFailed` for everything that is not a complete 2xx answer of at most
    ``max_bytes`` bytes (an HTTP error carries its ``status``).
    """
    deadline = time.monotonic() + deadline_s
    conn, path = _connection(url, deadline)
    raw: socket.socket | None = None
    try:
        raw = _open_socket(resolve(conn.host, conn.port, deadline=deadline, deadline_s=deadline_s), deadline)
        if isinstance(conn, http.client.HTTPSConnection):
            raw = ssl.create_default_context().wrap_socket(raw, server_hostname=conn.host)
        conn.sock = _DeadlineSocket(raw, deadline)  # type: ignore[assignment]
        conn.request("GET", path, headers={"Accept": accept, "Connection": "close"})
        response = conn.getresponse()
        body = response.read(max_bytes + 1)
        missing = response.length  # what a Content-Length promised and never came (None: no length given)
    except (TimeoutError, socket.timeout):
        raise RequestFailed(f"no complete answer within {deadline_s:g} s") from None
    except ConnectionRefusedError:
        raise RequestFailed("connection refused") from None
    except http.client.HTTPException as exc:  # garbled status line, headers past the limits ...
        raise RequestFailed(f"not an HTTP answer ({type(exc).__name__}: {str(exc)[:60]!r})") from None
    except (OSError, ValueError) as exc:  # reset, unreachable, a name that does not resolve
        raise RequestFailed(_os_words(exc)) from None
    finally:
        conn.close()
        if raw is not None:
            raw.close()
    if len(body) > max_bytes:
        raise RequestFailed(f"answered more than {_size(max_bytes)}: not the page asked for")
    if missing:
        raise RequestFailed(f"the answer was cut short: {len(body)} bytes of the {len(body) + missing} announced")
    if not 200 <= response.status < 300:
        where = response.getheader("Location")
        moved = f" (redirects to {where[:200]}: pass that URL)" if where and 300 <= response.status < 400 else ""
        raise RequestFailed(f"HTTP {response.status} {response.reason}{moved}", response.status, response.reason)
    return Answer(response.status, body, response.getheader("Content-Type") or "")


def _os_words(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"
