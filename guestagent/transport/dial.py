"""Dialling the agent's sockets: what the host client (and the agent's relay, for its own
unix socket) connects with."""

from __future__ import annotations

import errno
import socket

from guestagent.transport.address import HybridVsockAddress, VsockAddress


class DialError(ConnectionError):
    """The agent's vsock or hybrid vsock did not answer: the message names the target and
    why, since the caller (a relay's socket) only sees its connection closed."""


def _cause(error: OSError) -> str:
    if error.errno is None:
        return str(error)
    return f"{error.strerror} ({errno.errorcode.get(error.errno, error.errno)})"


def dial_vsock(address: VsockAddress) -> socket.socket:
    try:
        sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as e:
        raise DialError(f"vsock: no vsock on this host: {_cause(e)}") from e
    try:
        sock.connect((address.cid, address.port))
    except OSError as e:
        sock.close()
        raise DialError(
            f"vsock CID {address.cid} port {address.port} did not answer: {_cause(e)}"
        ) from e
    return sock


def dial_hybrid_vsock(address: HybridVsockAddress) -> socket.socket:
    target = f"hybrid vsock {address.path} port {address.port}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address.path)
        sock.sendall(f"CONNECT {address.port}\n".encode())
        reply = _read_line(sock, limit=128)
    except OSError as e:
        sock.close()
        raise DialError(f"{target} did not answer: {_cause(e)}") from e
    if not reply.startswith(b"OK "):
        sock.close()
        # The VMM answered for the guest: anything but OK, or closing, means nothing in the
        # guest listens on that port, or not yet (docs/contract.md, hybrid vsock).
        said = repr(reply.decode(errors="replace")) if reply else "nothing (it closed)"
        raise DialError(
            f"{target} did not answer: the VMM said {said} to CONNECT {address.port}, so "
            "nothing in the guest listens there (yet)"
        )
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
