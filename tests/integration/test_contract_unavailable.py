"""A contract that cannot load at its first call: the agent answers health at start without
it (agent/first_call.py), so health must say the agent does not serve, and say it again
once a later call loads it. The daemon runs in this process over a fake root, with its
servicer's module made unimportable as a tree missing it would have it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guestagent.agent.daemon import SERVICE_NAME, Agent, ServerConfig
from guestagent.linux.kernel import Kernel
from guestagent.transport.address import UnixAddress
from tests.fakes.root import FakeRoot

Status = health_pb2.HealthCheckResponse


@pytest.fixture
async def channel(fake_root: FakeRoot, tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    socket = tmp_path / "agent.sock"
    config = ServerConfig(
        listen=(UnixAddress(str(socket)),),
        kernel=Kernel(fake_root.root, "sys/fs/cgroup"),
        online_memory=None,
        idle_aging_s=0,
        grace_seconds=0,
    )
    agent = Agent(config)
    await agent.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as opened:
            yield opened
    finally:
        await agent.stop()


async def statuses_once_changed(channel: grpc.aio.Channel, away_from: int) -> list[int]:
    """The agent's and its service's health, each once its Watch has moved off away_from."""
    stub = health_pb2_grpc.HealthStub(channel)
    seen = []
    for service in ("", SERVICE_NAME):
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)
        while (status := (await watch.read()).status) == away_from:
            pass
        watch.cancel()
        seen.append(status)
    return seen


async def test_health_says_not_serving_until_the_contract_loads(
    channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    info: Any = channel.unary_unary(f"/{SERVICE_NAME}/GetAgentInfo")
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
    assert reply.status == Status.SERVING  # Nothing of the contract loaded yet.
    monkeypatch.setitem(sys.modules, "guestagent.agent.rpc", None)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await info(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.INTERNAL
    assert refused.value.details() == (
        f"{SERVICE_NAME} did not load (ModuleNotFoundError: "
        "import of guestagent.agent.rpc halted; None in sys.modules)"
    )
    assert await statuses_once_changed(channel, Status.SERVING) == [Status.NOT_SERVING] * 2
    monkeypatch.delitem(sys.modules, "guestagent.agent.rpc")
    assert await info(b"", timeout=30)  # Built now: an AgentInfo's bytes.
    assert await statuses_once_changed(channel, Status.NOT_SERVING) == [Status.SERVING] * 2
