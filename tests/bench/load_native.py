"""The native section (issue 56): the agent on this host over a fake root, so that its own cost
shows without a guest's kernel or TCG. In one run, against one agent:

- one client setting limits in a loop, alone: SetMemoryLimits' p99 with no load;
- the same client while READERS more loop GetMemoryInfo, each on its connection: its p99
  under that load, and the agent's CPU per call (its /proc/PID/stat over the calls answered);
- the same readers looping the health check instead: what gRPC alone costs the agent a call;
- where a GetMemoryInfo's CPU goes by stage (tests/bench/call_cost.py, over the same root).

All through the agent's unix listener, which goes through the relay vsock uses.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guestagent.host.client import channel_options
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc
from tests.bench.figures import ratio_verdict
from tests.bench.load import percentile
from tests.bench.run import agent_command, agent_figures, install_wheel, start_and_wait
from tests.fakes.root import make_fake_root

READERS = 100
CGROUPS = 50
# The issue's targets: the agent's CPU per call under the readers' load, and SetMemoryLimits
# p99 under it against its p99 alone.
CPU_PER_CALL_MS = 0.5
SET_LIMITS_LOADED_VS_ALONE = 2.0
CALL_TIMEOUT_S = 30.0


async def set_limits_loop(stub: Any, cgroup: str, until: float) -> list[float]:
    """SetMemoryLimits one after another until `until`; each one's latency in seconds."""
    latencies = []
    limit = 64 << 20
    while time.monotonic() < until:
        request = pb.SetMemoryLimitsRequest(
            cgroup=cgroup, memory=pb.LinuxMemory(limit=limit, swap=2 * limit)
        )
        started = time.perf_counter()
        await stub.SetMemoryLimits(request, timeout=CALL_TIMEOUT_S)
        latencies.append(time.perf_counter() - started)
        limit = (64 << 20) + (limit + (1 << 20)) % (64 << 20)
    return latencies


async def loop_calls(call: Callable[[], Awaitable[object]], until: float) -> int:
    calls = 0
    while time.monotonic() < until:
        await call()
        calls += 1
    return calls


def summary(latencies: list[float]) -> dict[str, float]:
    samples = [s * 1e6 for s in latencies]
    return {
        "calls": len(samples),
        "p50_us": percentile(samples, 0.5),
        "p99_us": percentile(samples, 0.99),
    }


async def phases(target: str, pid: int, seconds: float) -> dict[str, Any]:
    options = [("grpc.use_local_subchannel_pool", 1), *channel_options(CALL_TIMEOUT_S)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(READERS + 1)]
    try:
        writer = pb_grpc.MemoryAgentStub(channels[0])
        readers = [pb_grpc.MemoryAgentStub(channel) for channel in channels[1:]]
        healths = [health_pb2_grpc.HealthStub(channel) for channel in channels[1:]]
        alone = await set_limits_loop(writer, "load/w0", time.monotonic() + seconds)

        def info(index: int) -> Callable[[], Awaitable[object]]:
            request = pb.GetMemoryInfoRequest(cgroups=[f"load/r{index % CGROUPS}"])
            return lambda: readers[index].GetMemoryInfo(request, timeout=CALL_TIMEOUT_S)

        def health(index: int) -> Callable[[], Awaitable[object]]:
            request = health_pb2.HealthCheckRequest()
            return lambda: healths[index].Check(request, timeout=CALL_TIMEOUT_S)

        async def loaded(
            make: Callable[[int], Callable[[], Awaitable[object]]],
        ) -> tuple[int, float, list[float]]:
            # Every connection is up before the agent's CPU is read.
            await asyncio.gather(*(make(i)() for i in range(READERS)))
            until = time.monotonic() + seconds
            before = agent_figures(pid)["cpu_s"]
            counts, *rest = await asyncio.gather(
                asyncio.gather(*(loop_calls(make(i), until) for i in range(READERS))),
                set_limits_loop(writer, "load/w0", until),
            )
            cpu = agent_figures(pid)["cpu_s"] - before
            return sum(counts), cpu, rest[0]

        reads, read_cpu, under_load = await loaded(info)
        checks, health_cpu, _ = await loaded(health)
    finally:
        for channel in channels:
            await channel.close()
    calls_loaded = reads + len(under_load)
    return {
        "set_memory_limits_alone": summary(alone),
        "set_memory_limits_under_load": summary(under_load),
        "get_memory_info_calls": reads,
        "get_memory_info_per_second": round(reads / seconds, 1),
        "agent_cpu_ms_per_call": round(read_cpu * 1000 / calls_loaded, 3),
        "health_calls": checks,
        "agent_cpu_ms_per_health_check": round(health_cpu * 1000 / max(checks, 1), 3),
    }


def stage_costs(root: Path, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-OO", "-m", "tests.bench.call_cost", "--root", str(root)]
    run = subprocess.run(
        [*command, "--cgroups", "load/r0"], capture_output=True, text=True, check=True, env=env
    )
    costs: dict[str, Any] = json.loads(run.stdout)
    return costs


def native_targets(figures: dict[str, Any]) -> dict[str, Any]:
    alone = figures["set_memory_limits_alone"]["p99_us"]
    loaded = figures["set_memory_limits_under_load"]["p99_us"]
    return {
        "agent_cpu_ms_per_call": ratio_verdict(figures["agent_cpu_ms_per_call"], CPU_PER_CALL_MS),
        "set_memory_limits_p99_loaded_vs_alone": ratio_verdict(
            loaded / alone, SET_LIMITS_LOADED_VS_ALONE
        ),
    }


def measure_native(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        fake = make_fake_root(Path(workdir) / "root")
        for i in range(CGROUPS):
            fake.add_cgroup(f"load/r{i}")
        fake.add_cgroup("load/w0")
        target = f"unix://{workdir}/agent.sock"
        env = install_wheel(Path(workdir))
        agent, _ = start_and_wait(
            agent_command("--root", str(fake.root), "--listen", target), target, env=env
        )
        try:
            figures = asyncio.run(phases(target, agent.pid, seconds))
        finally:
            agent.terminate()
            agent.wait()
        # The stage costs import the agent's code from the same wheel, and this tree's bench.
        figures["stages"] = stage_costs(
            fake.root, {**env, "PYTHONPATH": f"{env['PYTHONPATH']}:{Path.cwd()}"}
        )
    figures["readers"] = READERS
    figures["seconds_per_phase"] = seconds
    figures["targets"] = native_targets(figures)
    return figures
