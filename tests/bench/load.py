"""Load: 200 concurrent clients, each on its own connection, mixing GetMemoryInfo, WatchMemory
streams and SetMemoryLimits for a fixed time, against one agent. Counts errors by status code,
p50/p99 per call, and the agent's RssAnon and threads at the start, under load and at the end."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from guestagent.host.client import channel_options
from guestagent.v1 import agent_pb2 as pb
from guestagent.v1 import agent_pb2_grpc as pb_grpc

CLIENTS = 200
WATCHERS = 40  # Of the clients, how many hold a WatchMemory stream.
LIMIT_EVERY = 5  # Every fifth unary client sets limits instead of reading.


def _grpc_target(target: str) -> str:
    return target.removeprefix("tcp://") if target.startswith("tcp://") else target


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1) if ordered else 0


async def run_load(
    target: str,
    read_cgroups: list[str],
    write_cgroups: list[str],
    seconds: float,
    agent_figures: Callable[[], dict[str, float]],
    call_timeout: float = 30.0,
) -> dict[str, Any]:
    """Readers and watchers use read_cgroups, limit writers write_cgroups (all existing).
    Against a fake root keep them apart: a plain file, unlike cgroupfs, can be read between a
    writer's truncate and its write."""
    latencies: dict[str, list[float]] = {"GetMemoryInfo": [], "SetMemoryLimits": []}
    errors: Counter[str] = Counter()
    samples_of_errors: dict[str, str] = {}
    error_seconds: list[float] = []  # How long each failed call took: a timer shows here.
    # A failed connection fails each call on it at once until it reconnects, so a count of
    # calls says more about the client's loop than the agent: these say how many and when.
    clients_with_errors: set[int] = set()
    first_error_at: list[float] = []
    watch_messages = 0
    deadline = time.monotonic() + seconds
    start = agent_figures()

    def note_error(index: int) -> None:
        clients_with_errors.add(index)
        if not first_error_at:
            first_error_at.append(round(seconds - (deadline - time.monotonic()), 1))

    async def unary(index: int, stub: Any) -> None:
        writer = index % LIMIT_EVERY == 0
        pool = write_cgroups if writer else read_cgroups
        cgroup = pool[index % len(pool)]
        limit = (64 + index % 64) << 20
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                if writer:
                    await stub.SetMemoryLimits(
                        pb.SetMemoryLimitsRequest(
                            cgroup=cgroup, memory=pb.LinuxMemory(limit=limit, swap=2 * limit)
                        ),
                        timeout=call_timeout,
                    )
                else:
                    await stub.GetMemoryInfo(
                        pb.GetMemoryInfoRequest(cgroups=[cgroup]), timeout=call_timeout
                    )
            except grpc.aio.AioRpcError as e:
                errors[e.code().name] += 1
                samples_of_errors.setdefault(e.code().name, e.details() or "")
                error_seconds.append(round(time.perf_counter() - started, 2))
                note_error(index)
                continue
            name = "SetMemoryLimits" if writer else "GetMemoryInfo"
            latencies[name].append((time.perf_counter() - started) * 1e6)

    async def watcher(index: int, stub: Any) -> None:
        nonlocal watch_messages
        stream = stub.WatchMemory(
            pb.WatchMemoryRequest(
                interval_ms=200, cgroups=[read_cgroups[index % len(read_cgroups)]]
            )
        )
        try:
            async for _ in stream:
                watch_messages += 1
                if time.monotonic() >= deadline:
                    break
        except grpc.aio.AioRpcError as e:
            errors[f"watch {e.code().name}"] += 1
            samples_of_errors.setdefault(e.code().name, e.details() or "")
            note_error(index)
        finally:
            stream.cancel()

    # Each client its own HTTP/2 connection: by default channels to one target share grpc's
    # global subchannel pool, and 200 "clients" would be one connection to the agent. The
    # rest is AgentClient's: with grpc's default 20 s per connection attempt, a TCG guest
    # answering 200 handshakes was given up on, and each call then failed at once, in a loop
    # that took the host CPU the guest needed (179,275 UNAVAILABLE in 65 s).
    options = [("grpc.use_local_subchannel_pool", 1), *channel_options(call_timeout)]
    channels = [
        grpc.aio.insecure_channel(_grpc_target(target), options=options) for _ in range(CLIENTS)
    ]
    try:
        stubs = [pb_grpc.MemoryAgentStub(channel) for channel in channels]
        tasks = [watcher(i, stubs[i]) for i in range(WATCHERS)]
        tasks += [unary(i, stubs[i]) for i in range(WATCHERS, CLIENTS)]
        started = time.monotonic()
        loaded: list[dict[str, float]] = []

        async def sample_under_load() -> None:
            # Halfway through, every connection is open and busy.
            await asyncio.sleep(seconds / 2)
            loaded.append(await asyncio.to_thread(agent_figures))

        await asyncio.gather(sample_under_load(), *tasks)
        elapsed = time.monotonic() - started
    finally:
        for channel in channels:
            await channel.close()
    end = agent_figures()
    calls = sum(len(samples) for samples in latencies.values()) + watch_messages
    return {
        "clients": CLIENTS,
        "watch_streams": WATCHERS,
        "seconds": round(elapsed, 1),
        "calls": {
            name: {
                "count": len(samples),
                "per_second": round(len(samples) / elapsed, 1),
                "p50_us": percentile(samples, 0.5),
                "p99_us": percentile(samples, 0.99),
                "mean_us": round(statistics.fmean(samples), 1) if samples else 0,
            }
            for name, samples in latencies.items()
        },
        "watch_messages": watch_messages,
        "errors": dict(errors),
        "error_examples": samples_of_errors,
        "error_call_seconds": sorted(error_seconds)[:20],
        "clients_with_errors": len(clients_with_errors),
        "first_error_after_s": first_error_at[0] if first_error_at else None,
        "agent_rss_anon_start": int(start["rss_anon"]),
        "agent_rss_anon_under_load": int(loaded[0]["rss_anon"]),
        "agent_rss_anon_end": int(end["rss_anon"]),
        "agent_rss_anon_growth": int(end["rss_anon"] - start["rss_anon"]),
        "agent_rss_anon_per_connection": int((loaded[0]["rss_anon"] - start["rss_anon"]) / CLIENTS),
        "agent_threads_start": int(start["threads"]),
        "agent_threads_under_load": int(loaded[0]["threads"]),
        "agent_cpu_s": round(end["cpu_s"] - start["cpu_s"], 2),
        "agent_cpu_us_per_message": round((end["cpu_s"] - start["cpu_s"]) * 1e6 / max(calls, 1)),
    }


async def run_floor_load(
    target: str, method: str, seconds: float, server_figures: Callable[[], dict[str, float]]
) -> dict[str, Any]:
    """The same 200 connections against the grpcio floor server (one raw-bytes method), each
    calling it in a loop: what grpcio itself costs per connection, measured beside the agent."""
    errors: Counter[str] = Counter()
    calls = 0
    deadline = time.monotonic() + seconds
    start = server_figures()
    options = [("grpc.use_local_subchannel_pool", 1), *channel_options(30.0)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(CLIENTS)]

    async def caller(channel: grpc.aio.Channel) -> None:
        nonlocal calls
        echo: Any = channel.unary_unary(method)
        while time.monotonic() < deadline:
            try:
                await echo(b"x" * 200, timeout=30.0)
                calls += 1
            except grpc.aio.AioRpcError as e:
                errors[e.code().name] += 1

    loaded: list[dict[str, float]] = []

    async def sample_under_load() -> None:
        await asyncio.sleep(seconds / 2)
        loaded.append(await asyncio.to_thread(server_figures))

    try:
        await asyncio.gather(sample_under_load(), *(caller(c) for c in channels))
    finally:
        for channel in channels:
            await channel.close()
    end = server_figures()
    return {
        "clients": CLIENTS,
        "calls": calls,
        "errors": dict(errors),
        "rss_anon_start": int(start["rss_anon"]),
        "rss_anon_under_load": int(loaded[0]["rss_anon"]),
        "rss_anon_end": int(end["rss_anon"]),
        "rss_anon_growth": int(end["rss_anon"] - start["rss_anon"]),
        "rss_anon_per_connection": int((loaded[0]["rss_anon"] - start["rss_anon"]) / CLIENTS),
        "threads_start": int(start["threads"]),
        "threads_under_load": int(loaded[0]["threads"]),
    }
