"""PeerTable and NamedRelay: the server behind a relay learns who the relay's caller was."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from guestagent.agent.listen import open_unix_listener
from guestagent.agent.peers import NamedRelay, PeerTable, vsock_admitter
from guestagent.transport.address import HOST_CID


def test_peer_strings_that_are_not_relayed_pass_through() -> None:
    peers = PeerTable()
    assert peers.caller("ipv4:127.0.0.1:40000") == "ipv4:127.0.0.1:40000"
    assert peers.caller("unix-abstract:00000") == "unix-abstract:00000"


def test_a_relayed_connection_is_named_until_it_ends(tmp_path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "server.sock"))
    server.listen()
    front = open_unix_listener(str(tmp_path / "front.sock"))
    peers = PeerTable()
    relay = NamedRelay(front, str(tmp_path / "server.sock"), peers, name="test").start()
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(tmp_path / "front.sock"))
        accepted, address = server.accept()
        grpc_peer = "unix-abstract:" + bytes(address)[1:].decode()
        expected = f"unix:uid={os.getuid()},gid={os.getgid()},pid={os.getpid()}"
        assert peers.caller(grpc_peer) == expected
        # The relay's thread carries its name in /proc (ps -L, the bench's wakeups by thread).
        comms = {t.read_text().strip() for t in Path("/proc/self/task").glob("*/comm")}
        assert "test" in comms
        client.sendall(b"ping")
        assert accepted.recv(4) == b"ping"
        client.close()
        assert accepted.recv(1) == b""  # EOF relayed
        accepted.close()
        done = threading.Event()
        for _ in range(200):
            if peers.caller(grpc_peer) == grpc_peer:
                done.set()
                break
            done.wait(0.01)
        assert done.is_set(), "the name outlived its connection"
    finally:
        relay.close()
        server.close()


def test_admitter_allows_only_listed_cids() -> None:
    admit = vsock_admitter(frozenset({HOST_CID}))
    assert admit((2, 50000))
    assert not admit((1, 50000))
    assert not admit((3, 50000))
