import socket

import pytest

from guestagent.errors import InvalidArgument
from guestagent.transport.address import (
    HybridVsockAddress,
    TcpAddress,
    UnixAddress,
    VsockAddress,
    grpc_target,
    parse_address,
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
