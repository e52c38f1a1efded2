from pathlib import Path

import pytest

from guestagent.transport.address import HybridVsockAddress
from guestagent.transport.dial import dial_hybrid_vsock
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
        with pytest.raises(ConnectionRefusedError, match="ERR no listener"):
            dial_hybrid_vsock(HybridVsockAddress(vsock_path, 1024))
    finally:
        server.close()
