"""The HTTP/1.1 client on a unix socket against a peer that answers canned bytes: each way a
body can be framed (Content-Length, chunks, to the close), the request as it goes out, and
every bound: a head or body too long, an answer cut short, a peer that drips within its
timeout each time but past the request's."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.vmm.unixhttp import BODY_LIMIT, HEAD_LIMIT, ApiError, UnixHttpClient


class Peer:
    """Accepts one connection, keeps what it was sent, answers `parts` (a pause between
    them, if any), then closes unless told to hold the connection open."""

    def __init__(self, path: Path, parts: list[bytes], pause: float = 0.0, hold: bool = False):
        self.parts, self.pause, self.hold = parts, pause, hold
        self.received = b""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            connection.settimeout(5)
            while b"\r\n\r\n" not in self.received:
                self.received += connection.recv(65536)
            head, _, body = self.received.partition(b"\r\n\r\n")
            length = [h for h in head.split(b"\r\n") if h.startswith(b"Content-Length: ")]
            while length and len(body) < int(length[0].split(b": ")[1]):
                body += connection.recv(65536)
                self.received = head + b"\r\n\r\n" + body
            try:
                for part in self.parts:
                    connection.sendall(part)
                    time.sleep(self.pause)
            except OSError:
                pass  # The client gave up.
            if self.hold:
                self.done.wait(10)

    def close(self) -> None:
        self.done.set()
        self.listener.close()


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "api.sock"


def answer(path: Path, parts: list[bytes], timeout: float = 2.0, **peer: object) -> str:
    server = Peer(path, parts, **peer)  # type: ignore[arg-type]
    try:
        return UnixHttpClient(str(path), timeout).text("GET", "/agent-url")
    finally:
        server.close()


def test_the_request_as_it_goes_out(path: Path) -> None:
    server = Peer(path, [b"HTTP/1.1 204 No Content\r\n\r\n"], hold=True)
    client = UnixHttpClient(str(path), 2.0, prefix="/api/v1")
    assert client.request("PUT", "/vm.resize", {"desired_balloon": 4096}) is None
    server.close()
    assert server.received == (
        b"PUT /api/v1/vm.resize HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: identity\r\n"
        b"Accept: application/json\r\nContent-Type: application/json\r\n"
        b'Content-Length: 25\r\n\r\n{"desired_balloon": 4096}'
    )


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"], "hello"),
        # Go's net/http chunks a body it did not know the length of.
        (
            [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
                b"lo\r\n6;x=1\r\n world\r\n0\r\nTrailer: t\r\n\r\n",
            ],
            "hello world",
        ),
        ([b"HTTP/1.0 200 OK\r\n\r\nvsock://3:1024"], "vsock://3:1024"),  # Up to the close.
        ([b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 \r\ncontent-length: 2\r\n\r\nok"], "ok"),
        ([b"HTTP/1.1 200 OK\nContent-Length: 0\n\n"], ""),  # Bare LFs, runtime-rs's empty 200.
    ],
)
def test_each_way_a_body_is_framed(path: Path, parts: list[bytes], text: str) -> None:
    assert answer(path, parts) == text


def test_an_error_status_quotes_the_body(path: Path) -> None:
    parts = [b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 18\r\n\r\nsandbox not ready\n"]
    with pytest.raises(
        ApiError, match=r"^GET /agent-url: HTTP 500 Internal Server Error: sandbox not ready$"
    ):
        answer(path, parts)


@pytest.mark.parametrize(
    ("parts", "said"),
    [
        ([b"SSH-2.0-OpenSSH_9.2\r\n"], "not an HTTP/1.x status line: b'SSH-2.0-OpenSSH_9.2'"),
        ([b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"], "not a header: b'no colon'"),
        ([b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * HEAD_LIMIT], f"longer than {HEAD_LIMIT}"),
        (
            [b"HTTP/1.1 200 OK\r\n" + b"X: aaaaaaaa\r\n" * (HEAD_LIMIT // 11 + 1) + b"\r\n"],
            f"headers longer than {HEAD_LIMIT} bytes",
        ),
        (
            [f"HTTP/1.1 200 OK\r\nContent-Length: {BODY_LIMIT + 1}\r\n\r\n".encode()],
            f"a body of {BODY_LIMIT + 1} bytes, more than {BODY_LIMIT}",
        ),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"], "not a Content-Length: '-1'"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], "closed after 3 of 10 bytes"),
        (
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
            + [b"100000\r\n" + b"a" * 0x100000 + b"\r\n"] * 5,
            f"a body longer than {BODY_LIMIT} bytes",
        ),
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], "not a chunk size"),
        ([b"HTTP/1.0 200 OK\r\n\r\n", b"a" * (BODY_LIMIT + 1)], "a body longer than"),
        ([b""], "the connection closed mid-answer"),
    ],
)
def test_what_is_not_an_answer_within_bounds_is_one_error(
    path: Path, parts: list[bytes], said: str
) -> None:
    with pytest.raises(ApiError, match=f"^GET /agent-url: {path}: .*") as raised:
        answer(path, parts)
    assert said in str(raised.value)


def test_a_peer_that_drips_is_given_up_on_at_the_requests_timeout(path: Path) -> None:
    drip = [b"HTTP/1.1 200 OK\r\n"] + [b"X: y\r\n"] * 100
    started = time.monotonic()
    with pytest.raises(ApiError, match=rf"no answer from {path} within 0\.5 s"):
        answer(path, drip, timeout=0.5, pause=0.1)
    assert time.monotonic() - started < 1.5


def test_a_peer_that_holds_the_connection_after_a_short_body(path: Path) -> None:
    with pytest.raises(ApiError, match=r"no answer from .* within 0\.5 s"):
        answer(path, [b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"], timeout=0.5, hold=True)
