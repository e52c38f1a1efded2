"""Dialling the agent's sockets: what the host client (and the agent's relay, for its own
unix socket) connects with."""

from __future__ import annotations

import socket

from guestagent.transport.address import HybridVsockAddress, VsockAddress


def dial_vsock(address: VsockAddress) -> socket.socket:
    sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        sock.connect((address.cid, address.port))
    except OSError:
        sock.close()
        raise
    return sock


def dial_hybrid_vsock(address: HybridVsockAddress) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address.path)
        sock.sendall(f"CONNECT {address.port}\n".encode())
        reply = _read_line(sock, limit=128)
        if not reply.startswith(b"OK "):
            raise ConnectionRefusedError(
                f"hybrid vsock {address.path} port {address.port} answered {reply!r}"
            )
    except OSError:
        sock.close()
        raise
    return sock


def _read_line(sock: socket.socket, limit: int) -> bytes:
    """Read up to a newline byte by byte, so no relayed data is consumed with it."""
    line = bytearray()
    while len(line) < limit:
        byte = sock.recv(1)
        if not byte or byte == b"\n":
            break
        line += byte
    return bytes(line)


def dial_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock
