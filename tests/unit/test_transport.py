import os
import socket
import threading
from pathlib import Path

import pytest

from guestagent.errors import InvalidArgument
from guestagent.transport import (
    HybridVsockAddress,
    SocketRelay,
    TcpAddress,
    UnixAddress,
    VsockAddress,
    _copy_pump,
    dial_hybrid_vsock,
    dial_unix,
    grpc_target,
    join,
    parse_address,
    vsock_admitter,
)


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("vsock://:1024", VsockAddress(socket.VMADDR_CID_ANY, 1024)),
        ("vsock://-1:1024", VsockAddress(socket.VMADDR_CID_ANY, 1024)),
        ("vsock://3:1024", VsockAddress(3, 1024)),
        ("hvsock:///run/vm/vsock.sock:1024", HybridVsockAddress("/run/vm/vsock.sock", 1024)),
        ("unix:///run/guestagent.sock", UnixAddress("/run/guestagent.sock")),
        ("tcp://127.0.0.1:50051", TcpAddress("127.0.0.1", 50051)),
        ("tcp://[::1]:50051", TcpAddress("::1", 50051)),
    ],
)
def test_parse_address(text: str, address: object) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("localhost:1024", "no scheme"),
        ("vsock://3", "no port"),
        ("vsock://x:1", "'x' is not a number"),
        ("unix://relative.sock", "absolute"),
        ("tcp://:80", "no host"),
        ("tcp://127.0.0.1:70000", "out of range"),
        ("hvsock://relative:1", "hvsock:///path"),
        ("http://x:1", "unknown scheme"),
    ],
)
def test_parse_address_refusals(text: str, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        parse_address(text)


def test_grpc_targets() -> None:
    assert grpc_target(UnixAddress("/a.sock")) == "unix:///a.sock"
    assert grpc_target(TcpAddress("::1", 5)) == "[::1]:5"
    assert TcpAddress("127.0.0.2", 1).is_loopback and not TcpAddress("10.0.2.15", 1).is_loopback


def test_admitter_allows_only_listed_cids() -> None:
    admit = vsock_admitter(frozenset({2}))
    assert admit((2, 50000))
    assert not admit((1, 50000))
    assert not admit((3, 50000))


def _echo_server(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _roundtrip(path: str, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(path)
        sender = threading.Thread(target=lambda: (client.sendall(payload), client.shutdown(1)))
        sender.start()
        received = bytearray()
        while chunk := client.recv(65536):
            received += chunk
        sender.join()
    return bytes(received)


def test_relay_carries_bytes_both_ways_and_half_closes(tmp_path: Path) -> None:
    upstream = str(tmp_path / "up.sock")
    front = str(tmp_path / "front.sock")
    echo = _echo_server(upstream)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(front)
    listener.listen()
    relay = SocketRelay(listener, dial=lambda: dial_unix(upstream)).start()
    payload = os.urandom(3 * 1024 * 1024 + 17)
    try:
        assert _roundtrip(front, payload) == payload
    finally:
        relay.close()
        echo.close()


def test_relay_refuses_peers_the_admitter_rejects(tmp_path: Path) -> None:
    front = str(tmp_path / "front.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(front)
    listener.listen()
    dialled = threading.Event()

    def dial() -> socket.socket:
        dialled.set()
        raise OSError("must not dial")

    relay = SocketRelay(listener, dial=dial, admit=lambda peer: False).start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(front)
            assert client.recv(1) == b""  # Closed without a byte.
        assert not dialled.is_set()
    finally:
        relay.close()


def test_copy_pump_fallback_matches_splice() -> None:
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    payload = os.urandom(1 << 20)
    threading.Thread(target=lambda: (a.sendall(payload), a.shutdown(1)), daemon=True).start()
    pumper = threading.Thread(target=lambda: (_copy_pump(b, c), c.shutdown(1)))
    pumper.start()
    received = bytearray()
    while chunk := d.recv(65536):
        received += chunk
    pumper.join()
    assert bytes(received) == payload
    for s in (a, b, c, d):
        s.close()


def _hybrid_vsock_server(path: str, reply: bytes, upstream: str) -> socket.socket:
    """Stands in for Cloud Hypervisor's vsock socket: 'CONNECT port' then a byte stream."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def serve() -> None:
        conn, _ = server.accept()
        line = b""
        while not line.endswith(b"\n"):
            line += conn.recv(1)
        assert line == b"CONNECT 1024\n"
        conn.sendall(reply)
        if reply.startswith(b"OK"):
            join(conn, dial_unix(upstream))
        else:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_hybrid_vsock_handshake_then_stream(tmp_path: Path) -> None:
    upstream = str(tmp_path / "up.sock")
    echo = _echo_server(upstream)
    vsock_path = str(tmp_path / "vsock.sock")
    server = _hybrid_vsock_server(vsock_path, b"OK 1073741824\nfirst", upstream)
    sock = dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    try:
        # Bytes after the OK line belong to the stream and must not be eaten by the handshake.
        assert sock.recv(5) == b"first"
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
    finally:
        sock.close()
        server.close()
        echo.close()


def test_hybrid_vsock_refusal_names_the_reply(tmp_path: Path) -> None:
    vsock_path = str(tmp_path / "vsock.sock")
    server = _hybrid_vsock_server(vsock_path, b"ERR no listener\n", "")
    try:
        with pytest.raises(ConnectionRefusedError, match="ERR no listener"):
            dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    finally:
        server.close()
