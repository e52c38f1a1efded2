"""The native section (issue 56): the agent on this host over a fake root, so that its own cost
shows without a guest's kernel or TCG. In one run, against one agent:

- one client setting limits in a loop, alone: SetMemoryLimits' p99 with no load;
- the same client while READERS more loop GetMemoryInfo, each on its connection: its p99
  under that load, and the agent's CPU per call (its /proc/PID/stat over the calls answered);
- the same readers looping the health check instead: what gRPC alone costs the agent a call,
  through the relay and straight into grpc (its tcp listener);
- the same readers against the grpcio floor server (floor_server.py): what grpcio's aio server
  costs a call that does nothing, and one that sends bytes already encoded;
- where a GetMemoryInfo's CPU goes by stage (tests/bench/call_cost.py, over the same root).

All through the agent's unix listener, which goes through the relay vsock uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
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
from guestagent.records import record
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc
from tests.bench.figures import cpu_by_thread_kind, ratio_verdict
from tests.bench.floor_server import ANSWER_METHOD as FLOOR_ANSWER_METHOD
from tests.bench.floor_server import METHOD as FLOOR_METHOD
from tests.bench.load import percentile
from tests.bench.run import (
    agent_command,
    agent_figures,
    floor_serving,
    free_tcp_port,
    install_wheel,
    start_and_wait,
)
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


Call = Callable[[], Awaitable[object]]


def thread_cpu(pid: int) -> dict[str, float]:
    """The server's CPU seconds so far by thread (its pools' threads together)."""
    tasks = Path(f"/proc/{pid}/task")
    stats = []
    for task in tasks.iterdir():
        with contextlib.suppress(FileNotFoundError):  # A thread that ended meanwhile.
            stats.append((task / "stat").read_text())
    return cpu_by_thread_kind(stats, os.sysconf("SC_CLK_TCK"))


@record
class Loaded:
    calls: int
    cpu_s: float
    by_thread: dict[str, float]  # CPU seconds by thread kind.
    writer: list[float]  # The writer's latencies.

    def ms_per_call_by_thread(self, calls: int) -> dict[str, float]:
        return {
            kind: round(seconds * 1000 / calls, 3)
            for kind, seconds in sorted(self.by_thread.items(), key=lambda kv: -kv[1])
            if seconds > 0
        }


async def loaded(calls: list[Call], pid: int, seconds: float, writer: Any = None) -> Loaded:
    """Each call looped on its own until `seconds` pass, with `writer` (a stub) setting limits
    beside them: the calls answered, the server's CPU seconds meanwhile (by thread too), the
    writer's latencies."""
    # Every connection is up before the server's CPU is read.
    await asyncio.gather(*(call() for call in calls))
    until = time.monotonic() + seconds
    before, threads_before = agent_figures(pid)["cpu_s"], thread_cpu(pid)
    setting = set_limits_loop(writer, "load/w0", until) if writer is not None else None
    counts, under_load = await asyncio.gather(
        asyncio.gather(*(loop_calls(call, until) for call in calls)),
        setting if setting is not None else asyncio.sleep(0, []),
    )
    cpu, threads_after = agent_figures(pid)["cpu_s"] - before, thread_cpu(pid)
    by_thread = {
        kind: spent - threads_before.get(kind, 0.0) for kind, spent in threads_after.items()
    }
    return Loaded(sum(counts), cpu, by_thread, under_load)


def open_channels(target: str) -> list[grpc.aio.Channel]:
    options = [("grpc.use_local_subchannel_pool", 1), *channel_options(CALL_TIMEOUT_S)]
    return [grpc.aio.insecure_channel(target, options=options) for _ in range(READERS + 1)]


async def phases(target: str, direct: str, pid: int, seconds: float) -> dict[str, Any]:
    channels = open_channels(target)
    direct_channels = open_channels(direct)
    try:
        writer = pb_grpc.MemoryAgentStub(channels[0])
        alone = await set_limits_loop(writer, "load/w0", time.monotonic() + seconds)

        def info(channel: grpc.aio.Channel, index: int) -> Call:
            stub = pb_grpc.MemoryAgentStub(channel)
            request = pb.GetMemoryInfoRequest(cgroups=[f"load/r{index % CGROUPS}"])
            return lambda: stub.GetMemoryInfo(request, timeout=CALL_TIMEOUT_S)

        def health(channel: grpc.aio.Channel) -> Call:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest()
            return lambda: stub.Check(request, timeout=CALL_TIMEOUT_S)

        readers = channels[1:]
        reads = await loaded([info(c, i) for i, c in enumerate(readers)], pid, seconds, writer)
        checks = await loaded([health(c) for c in readers], pid, seconds)
        direct_checks = await loaded([health(c) for c in direct_channels[1:]], pid, seconds)
    finally:
        for channel in channels + direct_channels:
            await channel.close()
    calls_loaded = reads.calls + len(reads.writer)
    return {
        "set_memory_limits_alone": summary(alone),
        "set_memory_limits_under_load": summary(reads.writer),
        "get_memory_info_calls": reads.calls,
        "get_memory_info_per_second": round(reads.calls / seconds, 1),
        "agent_cpu_ms_per_call": round(reads.cpu_s * 1000 / calls_loaded, 3),
        # Which thread spends it: "python" is the event loop's with grpc's poller (neither
        # named), the relay's is named for its listener, "read" the report readers', and
        # "event_engine" grpc's own.
        "agent_cpu_ms_per_call_by_thread": reads.ms_per_call_by_thread(calls_loaded),
        "health_calls": checks.calls,
        "agent_cpu_ms_per_health_check": round(checks.cpu_s * 1000 / max(checks.calls, 1), 3),
        "agent_cpu_ms_per_health_check_direct": round(
            direct_checks.cpu_s * 1000 / max(direct_checks.calls, 1), 3
        ),
    }


async def floor_phases(target: str, pid: int, seconds: float) -> dict[str, Any]:
    """The grpcio floor server under the same readers: CPU per call of a method that does
    nothing, and of one that sends an answer already encoded (raw bytes, no serializer)."""
    channels = open_channels(target)[1:]
    try:
        figures = {}
        for name, method, request in (
            ("nothing", FLOOR_METHOD, b""),
            ("answer_bytes", FLOOR_ANSWER_METHOD, b"x"),
        ):
            stubs: list[Any] = [channel.unary_unary(method) for channel in channels]
            calls: list[Call] = [
                functools.partial(stub, request, timeout=CALL_TIMEOUT_S) for stub in stubs
            ]
            phase = await loaded(calls, pid, seconds)
            figures[f"floor_cpu_ms_per_call_{name}"] = round(
                phase.cpu_s * 1000 / max(phase.calls, 1), 3
            )
            figures[f"floor_calls_per_second_{name}"] = round(phase.calls / seconds, 1)
    finally:
        for channel in channels:
            await channel.close()
    return figures


def measure_floor(workdir: Path, seconds: float) -> dict[str, Any]:
    target = f"unix://{workdir}/floor.sock"
    command = [sys.executable, "-OO", str(Path(__file__).with_name("floor_server.py")), target]
    floor, _ = start_and_wait(command, target, probe=floor_serving)
    try:
        return asyncio.run(floor_phases(target, floor.pid, seconds))
    finally:
        floor.terminate()
        floor.wait()


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
        direct = f"127.0.0.1:{free_tcp_port()}"
        env = install_wheel(Path(workdir))
        agent, _ = start_and_wait(
            agent_command(
                "--root", str(fake.root), "--listen", target, "--listen", f"tcp://{direct}"
            ),
            target,
            env=env,
        )
        try:
            figures = asyncio.run(phases(target, direct, agent.pid, seconds))
        finally:
            agent.terminate()
            agent.wait()
        # The stage costs import the agent's code from the same wheel, and this tree's bench.
        figures["stages"] = stage_costs(
            fake.root, {**env, "PYTHONPATH": f"{env['PYTHONPATH']}:{Path.cwd()}"}
        )
        figures.update(measure_floor(Path(workdir), seconds))
    figures["readers"] = READERS
    figures["seconds_per_phase"] = seconds
    figures["targets"] = native_targets(figures)
    return figures
