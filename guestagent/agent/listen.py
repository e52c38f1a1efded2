"""The agent's listeners: vsock, and unix sockets never reachable with wider permissions
than asked. A taken address fails loudly: a second agent must never share a port."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

from guestagent.errors import AgentError, InvalidArgument
from guestagent.transport.address import VsockAddress

# Connections a listener holds before the relay accepts them: a runtime that opens many at once
# overflowed a backlog of 64, and a unix connect() that finds it full fails at once (EAGAIN).
LISTEN_BACKLOG = socket.SOMAXCONN
# What holds a port the agent wanted: said in the bind failure, so an operator knows where to look.
OTHER_AGENTS = (
    "another agent (kata-agent or vminitd on vsock 1024, or a second guestagent) holds it"
)


class AddressInUse(AgentError):
    """A listen address is taken: a second agent must fail loudly, never share the port."""

    default_reason = "ADDRESS_IN_USE"

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} is in use: {OTHER_AGENTS}", metadata={"address": address})


def open_vsock_listener(address: VsockAddress) -> socket.socket:
    listener = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        listener.bind((address.cid, address.port))
        listener.listen(LISTEN_BACKLOG)
    except OSError as e:
        listener.close()
        if e.errno == errno.EADDRINUSE:
            raise AddressInUse(f"vsock://:{address.port}") from None
        raise
    return listener


def unix_socket_answers(path: str) -> bool:
    """True when a server accepts on path; False for no file or a stale one left by a crash."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    finally:
        probe.close()
    return True


def open_unix_listener(path: str, mode: int = 0o600) -> socket.socket:
    """Listen on path, which is never reachable with wider permissions than mode.

    The socket is bound and given its mode inside a fresh 0700 directory beside path, and
    only then linked into place: a chmod after a bind at the final path would leave a
    moment in which anyone could connect. link(2), unlike rename(2), never replaces a
    socket that another agent has just put there; a stale one (its server gone) is removed.
    """
    private = private_directory(os.path.dirname(path) or ".", ".guestagent-")
    staged = os.path.join(private, "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(staged)
        os.chmod(staged, mode)
        listener.listen(LISTEN_BACKLOG)
        try:
            os.link(staged, path)
        except FileExistsError:
            _remove_stale_socket(path)
            os.link(staged, path)
    except BaseException:
        listener.close()
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.rmdir(private)
    return listener


def private_directory(parent: str, prefix: str) -> str:
    """A new directory only this process's user can enter (tempfile.mkdtemp, without
    loading tempfile, shutil and random into the daemon for one call at start)."""
    while True:
        path = os.path.join(parent, f"{prefix}{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


def _remove_stale_socket(path: str) -> None:
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise InvalidArgument(
            f"unix://{path}: a file that is not a socket is in the way",
            "ADDRESS_NOT_A_SOCKET",
            metadata={"address": f"unix://{path}"},
        )
    if unix_socket_answers(path):
        raise AddressInUse(f"unix://{path}")
    os.unlink(path)
