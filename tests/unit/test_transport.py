import socket
from pathlib import Path

import pytest

from guestagent.errors import InvalidArgument
from guestagent.transport import (
    HybridVsockAddress,
    TcpAddress,
    UnixAddress,
    VsockAddress,
    dial_hybrid_vsock,
    grpc_target,
    parse_address,
    vsock_admitter,
)
from tests.fakes.hvsock import hybrid_vsock_server


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


def test_hybrid_vsock_handshake_then_stream(tmp_path: Path) -> None:
    vsock_path = str(tmp_path / "vsock.sock")
    server = hybrid_vsock_server(vsock_path, b"OK 1073741824\nfirst")
    sock = dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    try:
        # Bytes after the OK line belong to the stream and must not be eaten by the handshake.
        assert sock.recv(5) == b"first"
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
    finally:
        sock.close()
        server.close()


def test_hybrid_vsock_refusal_names_the_reply(tmp_path: Path) -> None:
    vsock_path = str(tmp_path / "vsock.sock")
    server = hybrid_vsock_server(vsock_path, b"ERR no listener\n")
    try:
        with pytest.raises(ConnectionRefusedError, match="ERR no listener"):
            dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    finally:
        server.close()
