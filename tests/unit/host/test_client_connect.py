"""The client reaches an agent that is slow to send its HTTP/2 SETTINGS frame, as a guest on
a busy host is: the connection attempt is not abandoned before the call's own deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from guestagent.host.client import AgentClient
from guestagent.host.ctl import main as ctl_main
from tests.fakes.hvsock import hybrid_vsock_server

# Longer than the 1.2 s that grpc-core gave a connection attempt with a 100 ms
# min_reconnect_backoff_ms (1 s max backoff plus 20 % jitter).
SETTINGS_DELAY_S = 2.5


class SlowPeer:
    """A TCP proxy in front of a gRPC server that holds back the server's first bytes (its
    SETTINGS frame) for SETTINGS_DELAY_S after each connection is accepted."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            release_at = time.monotonic() + SETTINGS_DELAY_S
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, release_at), daemon=True
            ).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, release_at: float) -> None:
        # The held-back direction stands for a server that has not been scheduled yet.
        time.sleep(max(0.0, release_at - time.monotonic()))
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def slow_agent() -> Iterator[SlowPeer]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    peer = SlowPeer(port)
    try:
        yield peer
    finally:
        peer.close()
        server.stop(0)


def test_an_agent_slow_to_send_settings_is_reached_on_the_first_attempt(
    slow_agent: SlowPeer,
) -> None:
    with AgentClient(f"tcp://127.0.0.1:{slow_agent.port}", timeout=4 * SETTINGS_DELAY_S) as client:
        assert client.health() == "SERVING"
    # One connection: no attempt was abandoned while the peer was still about to answer.
    assert slow_agent.accepted == 1


def test_wait_ready_keeps_to_its_own_timeout(slow_agent: SlowPeer) -> None:
    # The client's calls may take 10 s, but wait_ready was given 1 s: it does not wait for
    # the SETTINGS frame that comes after 2.5 s.
    with AgentClient(f"tcp://127.0.0.1:{slow_agent.port}", timeout=4 * SETTINGS_DELAY_S) as client:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="not serving after 1 s"):
            client.wait_ready(1.0)
        assert time.monotonic() - started < SETTINGS_DELAY_S


@pytest.mark.parametrize(
    ("vmm_reply", "cause"),
    [
        (None, "No such file or directory (ENOENT)"),
        (b"FAILURE\n", "the VMM said 'FAILURE' to CONNECT 1024"),
    ],
)
def test_guestctl_names_the_hybrid_vsock_that_did_not_answer_and_why(
    vmm_reply: bytes | None, cause: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the relay's bare `relay_dial_failed` and grpc's `recvmsg: Connection reset by
    peer` on the relay's temporary socket were all a user saw."""
    vsock_path = str(tmp_path / "vsock.sock")
    if vmm_reply is not None:
        hybrid_vsock_server(vsock_path, vmm_reply, connections=100)
    status = ctl_main(["--target", f"hvsock://{vsock_path}:1024", "--timeout", "2", "health"])
    err = capsys.readouterr().err
    assert status == 1
    assert err == f"guestctl: hybrid vsock {vsock_path} port 1024 did not answer: {cause}" + (
        ", so nothing in the guest listens there (yet)\n" if vmm_reply else "\n"
    )


def test_an_unavailable_agent_without_a_failed_dial_is_grpcs_error(tmp_path: Path) -> None:
    client = AgentClient(f"unix://{tmp_path / 'none.sock'}", timeout=1)
    with pytest.raises(grpc.RpcError) as raised, client:
        client.health()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
