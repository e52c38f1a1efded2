"""Who is calling: the vsock admission (only the host, by default), and the table that tells
the gRPC server behind the relay which caller each relayed connection stands for."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from guestagent.jsonlog import EventLog
from guestagent.linux.syscalls import name_thread
from guestagent.transport.relay import ConnectionBudget, SocketRelay, Upstream

log = EventLog("guestagent.agent.peers")


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
        budget: ConnectionBudget | None = None,
    ) -> None:
        super().__init__(listener, admit=admit, name=name, budget=budget)
        self._upstream = upstream
        self._peers = peers

    def _loop(self) -> None:
        name_thread(self._name)  # For ps -L and the footprint bench's wakeups by thread.
        super()._loop()

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
