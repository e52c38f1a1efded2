"""`make run`'s demo, without a VM: its first health line waits for SERVING, and its waits
end on their condition or name it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guestagent.vm import demo

NOT_SERVING_CHECKS = 3


class StartingAgent(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """An agent whose port answers before its state is loaded: NOT_SERVING to the first
    checks, as agent/daemon.py says until start-up is done, then SERVING."""

    def __init__(self) -> None:
        self.checks = 0

    def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        self.checks += 1
        started = self.checks > NOT_SERVING_CHECKS
        statuses = health_pb2.HealthCheckResponse
        return statuses(status=statuses.SERVING if started else statuses.NOT_SERVING)


@pytest.fixture
def starting_agent() -> Iterator[tuple[str, StartingAgent]]:
    agent = StartingAgent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"tcp://127.0.0.1:{port}", agent
    finally:
        server.stop(0)


def test_the_first_health_line_is_serving(
    starting_agent: tuple[str, StartingAgent], capsys: pytest.CaptureFixture[str]
) -> None:
    target, agent = starting_agent
    demo.health_once_serving(target, timeout=30)
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "SERVING"
    assert "NOT_SERVING" not in out
    assert agent.checks > NOT_SERVING_CHECKS


def test_a_wait_returns_once_its_condition_holds() -> None:
    answers = iter([False, False, True])
    assert demo.wait_for(lambda: next(answers), "a condition", timeout=30) < 30


def test_a_wait_past_its_bound_names_what_it_waited_for() -> None:
    with pytest.raises(SystemExit, match="demo: no swap file steady after 0 s"):
        demo.wait_for(lambda: False, "swap file steady", timeout=0.01)


def test_steady_holds_once_two_readings_are_close() -> None:
    readings = iter([100, 50, 49, 10])
    check = demo.steady(lambda: next(readings), tolerance=1)
    assert [check(), check(), check()] == [False, False, True]
