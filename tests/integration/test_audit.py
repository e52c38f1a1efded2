"""Audit lines from the real daemon: one per state-changing call, refusals included, with the
caller as the agent saw it (unix: SO_PEERCRED through the relay; tcp: its address)."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import FakeRoot


def audit_lines(agent: AgentProcess) -> list[dict[str, object]]:
    return [e for e in agent.log_events() if e.get("event") == "audit"]


def test_a_change_and_a_refusal_over_unix(agent: AgentProcess, fake_root: FakeRoot) -> None:
    with AgentClient(agent.unix_target) as client:
        client.stub.SetMemoryLimits(
            pb.SetMemoryLimitsRequest(cgroup="pod/ctr", memory=pb.LinuxMemory(limit=64 * MIB)),
            timeout=30,
        )
        with pytest.raises(grpc.RpcError) as refused:
            client.stub.SetMemoryLimits(
                pb.SetMemoryLimitsRequest(
                    cgroup="pod/ctr", memory=pb.LinuxMemory(limit=64 * MIB, swap=32 * MIB)
                ),
                timeout=30,
            )
        client.info(["pod/ctr"])  # A read: no audit line.
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (fake_root.root / "sys/fs/cgroup/pod/ctr/memory.max").read_text() == str(64 * MIB)

    done, refusal = audit_lines(agent)
    caller = f"unix:uid={os.getuid()},gid={os.getgid()},pid={os.getpid()}"
    assert done["method"] == refusal["method"] == "SetMemoryLimits"
    assert done["peer"] == refusal["peer"] == caller
    assert done["request"] == {"cgroup": "pod/ctr", "memory": {"limit": 64 * MIB}}
    assert done["code"] == "OK" and "error" not in done
    assert refusal["code"] == "INVALID_ARGUMENT"
    assert refusal["request"] == {
        "cgroup": "pod/ctr",
        "memory": {"limit": 64 * MIB, "swap": 32 * MIB},
    }
    assert str(32 * MIB) in str(refusal["error"]) and str(64 * MIB) in str(refusal["error"])
    for line in (done, refusal):
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0


def test_every_state_changing_rpc_is_audited_over_tcp(
    agent: AgentProcess, fake_root: FakeRoot
) -> None:
    fake_root.write("sys/devices/system/memory/block_size_bytes", "8000000\n")
    with AgentClient(agent.tcp_target) as client:
        calls: list[tuple[Any, Any]] = [
            (client.stub.Reclaim, pb.ReclaimRequest(cgroup="pod/ctr", bytes=-1)),
            (client.stub.Compact, pb.CompactRequest(node=-3)),
            (client.stub.EnableSwap, pb.EnableSwapRequest()),
            (client.stub.DisableSwap, pb.DisableSwapRequest()),
            (client.stub.OnlineMemory, pb.OnlineMemoryRequest()),
        ]
        for call, request in calls:
            try:
                call(request, timeout=30)
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.INTERNAL, e
    lines = audit_lines(agent)
    assert [line["method"] for line in lines] == [
        "Reclaim",
        "Compact",
        "EnableSwap",
        "DisableSwap",
        "OnlineMemory",
    ]
    assert all(str(line["peer"]).startswith("ipv4:127.0.0.1:") for line in lines)
    reclaim, compact, enable, disable, online = lines
    assert reclaim["code"] == "INVALID_ARGUMENT" and reclaim["request"] == {
        "cgroup": "pod/ctr",
        "bytes": -1,
    }
    assert compact["request"] == {"node": -3} and "-3" in str(compact["error"])
    assert enable["code"] == disable["code"] == "INVALID_ARGUMENT"
    assert online["code"] == "OK" and online["request"] == {}
