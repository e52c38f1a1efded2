"""Dialling the agent's sockets: what the host client (and the agent's relay, for its own
unix socket) connects with."""

from __future__ import annotations

import errno
import socket

from guestagent.transport.address import HybridVsockAddress, VsockAddress


class DialError(ConnectionError):
    """The agent's vsock or hybrid vsock did not answer: the message names the target and
    why, since the caller (a relay's socket) only sees its connection closed."""


def _cause(error: OSError, timeout: float | None) -> str:
    if isinstance(error, TimeoutError) and error.errno is None:
        return f"no answer within {timeout:g} s"
    if error.errno is None:
        return str(error)
    return f"{error.strerror} ({errno.errorcode.get(error.errno, error.errno)})"


def dial_vsock(address: VsockAddress, timeout: float | None = None) -> socket.socket:
    """Connected, or DialError; `timeout` bounds the connect (the caller's relay waits)."""
    try:
        sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as e:
        raise DialError(f"vsock: no vsock on this host: {_cause(e, timeout)}") from e
    try:
        sock.settimeout(timeout)
        sock.connect((address.cid, address.port))
        sock.settimeout(None)
    except OSError as e:
        sock.close()
        raise DialError(
            f"vsock CID {address.cid} port {address.port} did not answer: {_cause(e, timeout)}"
        ) from e
    return sock


def dial_hybrid_vsock(address: HybridVsockAddress, timeout: float | None = None) -> socket.socket:
    """Connected past the CONNECT exchange, or DialError; `timeout` bounds the connect and the
    VMM's answer, so a VMM that accepts and says nothing does not hold the caller forever."""
    target = f"hybrid vsock {address.path} port {address.port}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address.path)
        sock.sendall(f"CONNECT {address.port}\n".encode())
        reply = _read_line(sock, limit=128)
        sock.settimeout(None)
    except OSError as e:
        sock.close()
        raise DialError(f"{target} did not answer: {_cause(e, timeout)}") from e
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
