"""Addresses and the vsock relay.

PyPI's grpcio is built without vsock ("VSOCK is not supported"), so vsock is bridged here:
the agent binds AF_VSOCK itself and joins each admitted connection to the gRPC server's
private unix socket; the host client does the mirror image (a private unix socket whose
connections are joined to vsock, or to a Cloud Hypervisor / Firecracker hybrid vsock).
Bytes move with splice(2) through a pipe, so a relayed call costs two extra copies in the
kernel and none in Python.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guestagent.errors import AgentError, InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.relay import SocketRelay, Upstream

log = EventLog("guestagent.transport")

HOST_CID = 2  # VMADDR_CID_HOST: the hypervisor side, the only trusted caller.
# 1024 is kata-agent's and vminitd's (1025/1026 are kata's log and debug console, vminitd's
# relays start at 0x10000000); both bind VMADDR_CID_ANY, so the agent takes a port of its own.
DEFAULT_VSOCK_PORT = 6464
# Connections a listener holds before the relay accepts them. A runtime that opens many at
# once (measured: 200 clients connecting together) overflowed a backlog of 64, and a unix
# connect() that finds it full fails at once with EAGAIN: grpc's UNAVAILABLE.
LISTEN_BACKLOG = socket.SOMAXCONN
# What holds a port the agent wanted: said in the bind failure, so an operator knows where to look.
OTHER_AGENTS = (
    "another agent (kata-agent or vminitd on vsock 1024, or a second guestagent) holds it"
)


class AddressInUse(AgentError):
    """A listen address is taken: a second agent must fail loudly, never share the port."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} is in use: {OTHER_AGENTS}")
        self.address = address


@dataclass(frozen=True)
class VsockAddress:
    cid: int
    port: int


@dataclass(frozen=True)
class HybridVsockAddress:
    """A Cloud Hypervisor / Firecracker vsock: a host unix socket plus a CONNECT handshake."""

    path: str
    port: int


@dataclass(frozen=True)
class UnixAddress:
    path: str


@dataclass(frozen=True)
class TcpAddress:
    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


Address = VsockAddress | HybridVsockAddress | UnixAddress | TcpAddress


def _port(text: str, address: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise InvalidArgument(f"address {address!r}: port {text!r} is not a number") from None
    if not 0 <= port <= 0xFFFFFFFF:
        raise InvalidArgument(f"address {address!r}: port {port} is out of range")
    return port


def parse_address(text: str) -> Address:
    """vsock://CID:PORT (CID may be empty: any), hvsock:///path:PORT, unix:///path, tcp://H:P."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise InvalidArgument(
            f"address {text!r} has no scheme (vsock://, hvsock://, unix://, tcp://)"
        )
    if scheme == "unix":
        if not rest.startswith("/"):
            raise InvalidArgument(f"address {text!r}: unix path must be absolute")
        return UnixAddress(rest)
    if scheme == "hvsock":
        path, colon, port = rest.rpartition(":")
        if not colon or not path.startswith("/"):
            raise InvalidArgument(f"address {text!r}: expected hvsock:///path/to/socket:PORT")
        return HybridVsockAddress(path, _port(port, text))
    host, colon, port = rest.rpartition(":")
    if not colon:
        raise InvalidArgument(f"address {text!r} has no port")
    if scheme == "vsock":
        if host in ("", "-1"):
            return VsockAddress(socket.VMADDR_CID_ANY, _port(port, text))
        return VsockAddress(_port(host, text), _port(port, text))
    if scheme == "tcp":
        if not host:
            raise InvalidArgument(f"address {text!r} has no host")
        tcp_port = _port(port, text)
        if tcp_port > 0xFFFF:
            raise InvalidArgument(f"address {text!r}: tcp port {tcp_port} is out of range")
        return TcpAddress(host.strip("[]"), tcp_port)
    raise InvalidArgument(f"address {text!r}: unknown scheme {scheme!r}")


def grpc_target(address: UnixAddress | TcpAddress) -> str:
    """The string grpcio takes for an address it can reach natively."""
    if isinstance(address, UnixAddress):
        return f"unix://{address.path}"
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:{address.port}"


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
        raise InvalidArgument(f"unix://{path}: a file that is not a socket is in the way")
    if unix_socket_answers(path):
        raise AddressInUse(f"unix://{path}")
    os.unlink(path)


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


class PeerTable:
    """Who is on the far side of each relayed connection, for the server behind the relay.

    The relay binds its upstream unix socket to an autobound abstract name before it
    connects, so the gRPC server sees that name as its peer ("unix-abstract:0a1b2");
    this table maps the name to the relay's own caller ("vsock:2:49152", "unix:uid=0,...").
    Autobinding lets the kernel pick a name no other process holds.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callers: dict[str, str] = {}

    def bind(self, caller: str) -> tuple[socket.socket, str]:
        """A unix socket, not yet connected, whose name now stands for caller."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("")  # Autobind: a fresh abstract name chosen by the kernel.
            name = bytes(sock.getsockname())[1:].decode()
        except OSError:
            sock.close()
            raise
        with self._lock:
            self._callers[name] = caller
        return sock, name

    def forget(self, name: str) -> None:
        with self._lock:
            self._callers.pop(name, None)

    def caller(self, grpc_peer: str) -> str:
        """The relayed caller behind grpc's peer string, or that string itself."""
        scheme, _, name = grpc_peer.partition(":")
        if scheme == "unix-abstract":
            with self._lock:
                return self._callers.get(name, grpc_peer)
        return grpc_peer


class NamedRelay(SocketRelay):
    """A relay to a local unix socket that tells the server who each connection's caller is
    (through a PeerTable): the vsock CID and port, or the unix caller's credentials."""

    def __init__(
        self,
        listener: socket.socket,
        upstream: str,
        peers: PeerTable,
        admit: Callable[[Any], bool] = lambda peer: True,
        name: str = "relay",
    ) -> None:
        super().__init__(listener, dial=lambda: dial_unix(upstream), admit=admit, name=name)
        self._upstream = upstream
        self._peers = peers

    def open_upstream(self, conn: socket.socket, peer: Any) -> Upstream:
        sock, name = self._peers.bind(describe_peer(conn, peer))
        return Upstream(sock, lambda: self._peers.forget(name), self._upstream)


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid.


def describe_peer(conn: socket.socket, peer: Any) -> str:
    """'vsock:CID:PORT' for a vsock caller, 'unix:uid=U,gid=G,pid=P' (SO_PEERCRED) for unix."""
    if conn.family == socket.AF_VSOCK:
        cid, port = peer
        return f"vsock:{cid}:{port}"
    if conn.family == socket.AF_UNIX:
        pid, uid, gid = _UCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
        return f"unix:uid={uid},gid={gid},pid={pid}"
    return str(peer)


def vsock_admitter(allowed_cids: frozenset[int]) -> Callable[[Any], bool]:
    """Only the host may call by default: a guest's container must not raise its own limits."""

    def admit(peer: Any) -> bool:
        cid, port = peer
        if cid in allowed_cids:
            return True
        log.warning("vsock_peer_refused", cid=cid, port=port, allowed=sorted(allowed_cids))
        return False

    return admit
