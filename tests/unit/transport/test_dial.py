import socket
import time
from pathlib import Path

import pytest

from guestagent.transport.address import HybridVsockAddress, VsockAddress
from guestagent.transport.dial import DialError, dial_hybrid_vsock, dial_vsock
from tests.fakes.hvsock import hybrid_vsock_server


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
        with pytest.raises(DialError, match=f"{vsock_path} port 1024 .*'ERR no listener'"):
            dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    finally:
        server.close()


def test_a_vmm_that_closes_is_named_with_what_it_said(tmp_path: Path) -> None:
    vsock_path = str(tmp_path / "vsock.sock")
    server = hybrid_vsock_server(vsock_path, b"")
    try:
        with pytest.raises(DialError, match="the VMM said nothing"):
            dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    finally:
        server.close()


def test_a_missing_hybrid_vsock_socket_is_named_with_the_errno(tmp_path: Path) -> None:
    missing = tmp_path / "gone.sock"
    with pytest.raises(DialError, match=f"hybrid vsock {missing} port 6464 .*ENOENT"):
        dial_hybrid_vsock(HybridVsockAddress(str(missing), 6464))


def test_an_unreachable_vsock_cid_is_named_with_the_errno() -> None:
    # CID 1 is the local loopback CID; a port nobody listens on there is refused or, without
    # vsock_loopback, has no device: either way the message names the CID, port and errno.
    with pytest.raises(DialError, match=r"vsock .*\(E[A-Z]+\)"):
        dial_vsock(VsockAddress(1, 0xFFFFFFF0))


def test_a_vmm_that_accepts_and_says_nothing_is_given_up_on(tmp_path: Path) -> None:
    """It held the client's relay (and so guestctl) for ever before."""
    vsock_path = str(tmp_path / "vsock.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(vsock_path)
    listener.listen()  # Never accepted, never answered: the connect lands in the backlog.
    try:
        started = time.monotonic()
        with pytest.raises(DialError, match=r"port 1024 did not answer: no answer within 0.2 s"):
            dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024), timeout=0.2)
        assert time.monotonic() - started < 5
    finally:
        listener.close()
