"""/metrics over HTTP as a scraper sees it: the two paths, the statuses and headers
http.server gave, and a request that is too long or too slow dropped without holding the
others up."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from guestagent.host.metrics.families import Family, Sample
from guestagent.host.metrics.server import HEAD_LIMIT, MetricsServer, serve_in_background
from guestagent.transport.address import TcpAddress

FAMILY = Family("guestagent_up", "gauge", "Whether the agent answers.", (), (Sample((), 1.0),))


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    announced: list[tuple[str, str]] = []
    served = serve_in_background(
        TcpAddress("127.0.0.1", 0), lambda: [FAMILY], lambda *said: announced.append(said)
    )
    assert announced == [(f"http://127.0.0.1:{served.server_port}/metrics", "metrics")]
    yield served
    served.shutdown()
    served.server_close()


def get(server: MetricsServer, path: str) -> tuple[int, str, bytes]:
    url = f"http://127.0.0.1:{server.server_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def raw(server: MetricsServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_the_paths_a_scraper_asks(server: MetricsServer) -> None:
    status, kind, body = get(server, "/metrics?name[]=x")
    assert (status, kind) == (200, "text/plain; version=0.0.4; charset=utf-8")
    assert b"# TYPE guestagent_up gauge\nguestagent_up 1.0\n" in body
    assert get(server, "/")[0] == 200
    assert get(server, "/healthz") == (200, "text/plain; charset=utf-8", b"ok\n")
    assert get(server, "/other") == (404, "text/plain; charset=utf-8", b"/metrics or /healthz\n")


def test_what_is_not_a_get_is_refused(server: MetricsServer) -> None:
    answer = raw(server, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 501 Not Implemented\r\n"), answer
    assert b"unsupported method 'POST'" in answer
    assert raw(server, b"garbage\r\n\r\n").startswith(b"HTTP/1.0 400 Bad Request\r\n")


def test_a_head_too_long_or_too_slow_is_dropped(server: MetricsServer) -> None:
    header = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    flood = b"GET /metrics HTTP/1.1\r\n" + header * (HEAD_LIMIT // len(header) + 1) + b"\r\n"
    assert raw(server, flood) == b""
    # A client that sends half a request and waits holds none of the others up.
    with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        started = time.monotonic()
        assert get(server, "/healthz")[0] == 200
        assert time.monotonic() - started < 1.0


def test_an_address_in_use_is_an_os_error(server: MetricsServer) -> None:
    with pytest.raises(OSError, match="in use"):
        MetricsServer(TcpAddress("127.0.0.1", server.server_port), lambda: [], "metrics")
