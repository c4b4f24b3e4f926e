"""probes/http_get.py: a GET reaches the host and port its URL names, IPv6 literals included."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from eaglelab.probes import http_get


def _v6_server():
    """A one-page HTTP server on [::1] (None where this machine has no IPv6 loopback)."""

    class V6(http.server.HTTPServer):
        address_family = socket.AF_INET6

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = f"host {self.headers['Host']}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    try:
        server = V6(("::1", 0), Page)
    except OSError:
        return None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("url, host, port", [
    ("http://[::1]/metrics", "::1", 80), ("https://[::1]/metrics", "::1", 443), ("http://[::1]:8080/", "::1", 8080),
    ("http://10.0.0.1/", "10.0.0.1", 80), ("https://example.org:8443/v1?x=1", "example.org", 8443),
])
def test_the_connection_targets_the_urls_host_and_port(url, host, port):
    """Left to http.client, "[::1]" with no port became host "::" and port 1."""
    conn, _ = http_get._connection(url, deadline=time.monotonic() + 5.0)
    assert (conn.host, conn.port) == (host, port)


def test_a_get_to_an_ipv6_literal_answers():
    server = _v6_server()
    if server is None:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        port = server.server_address[1]
        got = http_get.get(f"http://[::1]:{port}/", deadline_s=5.0, max_bytes=1000)
        assert got.body == f"host [::1]:{port}".encode()
    finally:
        server.shutdown()
        server.server_close()
