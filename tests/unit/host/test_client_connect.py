"""The client reaches an agent that is slow to send its HTTP/2 SETTINGS frame, as a guest on
a busy host is: the connection attempt is not abandoned before the call's own deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from guestagent.host.client import AgentClient

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
