"""The epoll relay: bytes intact both ways, half-close carried, one thread for everything."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from guestagent.transport.dial import dial_unix
from guestagent.transport.relay import SocketRelay, Upstream


def _listen(path: Path, backlog: int = 256) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(backlog)
    return listener


def _echo_until_eof(conn: socket.socket) -> None:
    """Echo everything, then answer EOF with "bye" and EOF: a peer that half-closes."""
    with conn, contextlib.suppress(OSError):  # A vanished peer ends the echo.
        while chunk := conn.recv(1 << 16):
            conn.sendall(chunk)
        conn.sendall(b"bye")


@pytest.fixture
def echo_upstream(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "up.sock"
    server = _listen(path)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo_until_eof, args=(conn,), name="echo", daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()


@pytest.fixture
def relay_front(tmp_path: Path, echo_upstream: Path) -> Iterator[tuple[Path, SocketRelay]]:
    front = tmp_path / "front.sock"
    relay = SocketRelay(_listen(front), dial=lambda: dial_unix(str(echo_upstream))).start()
    yield front, relay
    relay.close()


def _exchange(front: Path, payload: bytes) -> bytes:
    """Send payload, half-close, read until EOF: the echo plus the upstream's "bye"."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(front))
        sender = threading.Thread(
            target=lambda: [client.sendall(payload), client.shutdown(socket.SHUT_WR)]  # type: ignore[func-returns-value]
        )
        sender.start()
        received = _recv_all(client)
        sender.join()
    return received


def _recv_all(sock: socket.socket) -> bytes:
    received = bytearray()
    while chunk := sock.recv(1 << 16):
        received += chunk
    return bytes(received)


def _wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_bytes_cross_intact_and_half_close_reaches_both_ends(
    relay_front: tuple[Path, SocketRelay],
) -> None:
    front, _ = relay_front
    payload = os.urandom(3 * 1024 * 1024 + 17)
    assert _exchange(front, payload) == payload + b"bye"


def test_many_connections_share_one_thread(relay_front: tuple[Path, SocketRelay]) -> None:
    front, relay = relay_front

    def not_echo() -> list[str]:
        return sorted(t.name for t in threading.enumerate() if t.name != "echo")

    threads_before = not_echo()
    clients = []
    for _ in range(100):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(front))
        clients.append(client)
    _wait_until(lambda: relay.connections == 100, "100 relayed connections")
    for index, client in enumerate(clients):
        client.sendall(b"%d" % index)
    for index, client in enumerate(clients):
        assert client.recv(16) == b"%d" % index
    # The echo upstream has a thread per connection; the relay added none for them (an
    # earlier test's daemon thread may end meanwhile: only a new one counts).
    assert set(not_echo()) - set(threads_before) == set()
    assert threads_before.count("relay") == 1
    for client in clients:
        client.close()
    _wait_until(lambda: relay.connections == 0, "the relay to drop closed connections")


def test_concurrent_large_transfers(relay_front: tuple[Path, SocketRelay]) -> None:
    front, _ = relay_front
    payloads = [os.urandom(512 * 1024 + i) for i in range(16)]
    results: list[bytes] = [b""] * len(payloads)

    def run(i: int) -> None:
        results[i] = _exchange(front, payloads[i])

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(payloads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert results == [p + b"bye" for p in payloads]


def test_a_peer_that_vanishes_ends_its_connection(
    tmp_path: Path, relay_front: tuple[Path, SocketRelay]
) -> None:
    front, relay = relay_front
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(front))
    client.sendall(b"x" * 1000)
    _wait_until(lambda: relay.connections == 1, "the connection")
    client.close()  # No half-close: gone both ways.
    _wait_until(lambda: relay.connections == 0, "the relay to drop the vanished peer")
    assert _exchange(front, b"still works") == b"still worksbye"


def test_refused_peer_is_closed_without_dialling(tmp_path: Path) -> None:
    front = tmp_path / "front.sock"
    dialled = threading.Event()

    def dial() -> socket.socket:
        dialled.set()
        raise OSError("must not dial")

    relay = SocketRelay(_listen(front), dial=dial, admit=lambda peer: False).start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(front))
            assert client.recv(1) == b""
        assert not dialled.is_set()
    finally:
        relay.close()


def test_failed_dial_closes_the_caller(tmp_path: Path) -> None:
    front = tmp_path / "front.sock"
    relay = SocketRelay(_listen(front), dial=lambda: dial_unix(str(tmp_path / "none"))).start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(front))
            assert client.recv(1) == b""
    finally:
        relay.close()


def test_close_stops_accepting_but_lets_a_call_in_flight_finish(
    relay_front: tuple[Path, SocketRelay],
) -> None:
    front, relay = relay_front
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(front))
        client.sendall(b"before")
        assert client.recv(6) == b"before"
        relay.close()
        with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as late:
            late.connect(str(front))
            late.sendall(b"x")
            assert late.recv(1) != b""
        client.sendall(b"after")
        client.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := client.recv(1 << 16):
            received += chunk
        assert bytes(received) == b"afterbye"


def test_sockets_that_cannot_splice_fall_back_to_a_buffer(
    monkeypatch: pytest.MonkeyPatch, relay_front: tuple[Path, SocketRelay]
) -> None:
    """vsock has no splice_read on some kernels: splice from it fails with EINVAL."""
    real_splice = os.splice
    refused = []

    def splice(src: int, dst: int, count: int, *args: object, **kwargs: object) -> int:
        if stat.S_ISSOCK(os.fstat(src).st_mode):
            refused.append(src)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_splice(src, dst, count, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "splice", splice)
    front, _ = relay_front
    payload = os.urandom(2 * 1024 * 1024 + 3)
    assert _exchange(front, payload) == payload + b"bye"
    assert refused


class RoutedRelay(SocketRelay):
    """Each caller's upstream is the next address in the list, connected by the relay."""

    def __init__(self, listener: socket.socket, routes: Sequence[tuple[int, Any]]) -> None:
        super().__init__(listener, dial=lambda: pytest.fail("the relay must connect"))
        self.routes = iter(routes)
        self.released: list[Any] = []

    def open_upstream(self, conn: socket.socket, peer: Any) -> Upstream:
        family, address = next(self.routes)
        sock = socket.socket(family, socket.SOCK_STREAM)
        return Upstream(sock, lambda: self.released.append(address), address)


@pytest.fixture
def full_upstream(tmp_path: Path) -> Iterator[socket.socket]:
    """A unix listener whose backlog is full: a connect to it blocks, or is EAGAIN."""
    listener = _listen(tmp_path / "busy.sock", backlog=0)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler.connect(str(tmp_path / "busy.sock"))  # Backlog 0 holds one; the next is refused.
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    assert probe.connect_ex(str(tmp_path / "busy.sock")) == errno.EAGAIN
    probe.close()
    yield listener
    filler.close()
    listener.close()


def test_a_slow_upstream_dial_holds_up_only_its_own_caller(
    tmp_path: Path, echo_upstream: Path, full_upstream: socket.socket
) -> None:
    busy = str(tmp_path / "busy.sock")
    routes = [(socket.AF_UNIX, busy), (socket.AF_UNIX, str(echo_upstream))]
    relay = RoutedRelay(_listen(tmp_path / "front.sock"), routes)
    relay.start()
    try:
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        first.settimeout(10)
        first.connect(str(tmp_path / "front.sock"))
        first.sendall(b"first")
        _wait_until(lambda: relay.dialling == 1, "the first caller's dial to be pending")
        # A blocking dial would hold the loop here, and this exchange would time out.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
            second.settimeout(10)
            second.connect(str(tmp_path / "front.sock"))
            second.sendall(b"second")
            second.shutdown(socket.SHUT_WR)
            assert _recv_all(second) == b"secondbye"
        assert relay.dialling == 1
        full_upstream.settimeout(10)
        full_upstream.accept()[0].close()  # Room in the backlog: the retried connect lands.
        upstream, _ = full_upstream.accept()
        with upstream, first:
            assert upstream.recv(5) == b"first"  # Sent while the dial was pending.
            upstream.sendall(b"reply")
            assert first.recv(5) == b"reply"
        assert relay.dialling == 0
    finally:
        relay.close()


def test_a_caller_that_leaves_during_the_dial_is_dropped(
    tmp_path: Path, full_upstream: socket.socket
) -> None:
    busy = str(tmp_path / "busy.sock")
    relay = RoutedRelay(_listen(tmp_path / "front.sock"), [(socket.AF_UNIX, busy)])
    relay.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(tmp_path / "front.sock"))
            _wait_until(lambda: relay.dialling == 1, "the dial to be pending")
        _wait_until(lambda: relay.dialling == 0, "the relay to drop the pending dial")
        assert relay.released == [busy]
        assert relay.connections == 0
    finally:
        relay.close()


@pytest.fixture
def tcp_echo() -> Iterator[tuple[str, int]]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=_echo_until_eof, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()
    server.close()


def test_a_connect_in_progress_completes_on_epollout(
    tmp_path: Path, tcp_echo: tuple[str, int]
) -> None:
    """TCP answers a non-blocking connect with EINPROGRESS; SO_ERROR says how it ended."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        refused = closed.getsockname()
    routes = [(socket.AF_INET, tcp_echo), (socket.AF_INET, refused)]
    relay = RoutedRelay(_listen(tmp_path / "front.sock"), routes)
    relay.start()
    try:
        assert _exchange(tmp_path / "front.sock", b"over tcp") == b"over tcpbye"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(tmp_path / "front.sock"))
            assert client.recv(1) == b""  # Refused: the caller is closed.
        _wait_until(lambda: relay.released == [tcp_echo, refused], "both upstreams released")
    finally:
        relay.close()


def test_an_upstream_that_is_not_there_closes_the_caller(tmp_path: Path) -> None:
    missing = str(tmp_path / "none")
    relay = RoutedRelay(_listen(tmp_path / "front.sock"), [(socket.AF_UNIX, missing)])
    relay.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(tmp_path / "front.sock"))
            assert client.recv(1) == b""
        _wait_until(lambda: relay.released == [missing], "the upstream released")
    finally:
        relay.close()
