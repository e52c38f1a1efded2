"""A bounded soak of hostile load (issue 25) against one agent on a fake tree, under a service's
RLIMIT_NOFILE of 1024, while a client measures GetMemoryInfo. Afterwards the agent's RSS,
descriptors and threads must be back within 10% of what they were before the soak, the
measuring client's p99 during it within 10x of idle, and the agent must not have died.

`python -m tests.bench.hostile --seconds 60 --out FILE.json` runs it alone (10 minutes by
default, as in `make bench`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.bench.figures import footprint
from tests.fakes.agentproc import AgentProcess
from tests.fakes.root import make_fake_root

CGROUPS = 256
NOFILE = 1024
IDLE_SECONDS = 10.0
SETTLE_SECONDS = 10.0
PROBE_EVERY_SECONDS = 0.02


def process_figures(pid: int) -> dict[str, int]:
    proc = Path(f"/proc/{pid}")
    figures = footprint((proc / "status").read_text(), (proc / "smaps_rollup").read_text())
    return {
        "rss_kib": figures["VmRSS"] // 1024,
        "threads": figures["Threads"],
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


class Probe(threading.Thread):
    """GetMemoryInfo on one cgroup every PROBE_EVERY_SECONDS, on its own connection; each
    latency is filed under the load running when the call started (`phase`)."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.samples: list[float] = []
        self.by_phase: dict[str, list[float]] = {}
        self.phase = "idle"
        self.failures: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with AgentClient(self.target, timeout=10) as client:
            while not self.stop.is_set():
                started, phase = time.monotonic(), self.phase
                try:
                    client.info(["pod/ctr"])
                    self.samples.append(time.monotonic() - started)
                    self.by_phase.setdefault(phase, []).append(self.samples[-1])
                except grpc.RpcError as e:
                    why = f"{e.code().name}: {(e.details() or '')[:80]}"
                    self.failures[why] = self.failures.get(why, 0) + 1
                self.stop.wait(PROBE_EVERY_SECONDS)


def idle_flood(agent: AgentProcess) -> None:
    """300 connections that never speak, held a second (150 used up 1024 descriptors)."""
    held = []
    try:
        for _ in range(300):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            with contextlib.suppress(OSError):
                sock.connect(str(agent.unix_path))
            held.append(sock)
        time.sleep(1)
    finally:
        for sock in held:
            sock.close()


def stream_flood(agent: AgentProcess) -> None:
    """200 WatchMemory streams on distinct cgroups (an inotify instance each, before)."""
    clients = [AgentClient(agent.unix_target, timeout=10) for _ in range(4)]
    try:
        streams = [clients[i % 4].watch([f"w/c{i}"], interval_ms=1000) for i in range(200)]
        time.sleep(2)
        for stream in streams:
            stream.cancel()
    finally:
        for client in clients:
            client.close()


def big_requests(agent: AgentProcess) -> None:
    """Over the names bound (refused at once), at it, and a stream at its cost bound."""
    names = [f"w/c{i % CGROUPS}" for i in range(1024)]
    with AgentClient(agent.unix_target, timeout=30) as client:
        with contextlib.suppress(grpc.RpcError):
            client.info([f"x{i}" for i in range(100_000)])
        client.info(names)
        stream = client.watch(names[:100], interval_ms=100)
        for _, _message in zip(range(10), stream, strict=False):
            pass
        stream.cancel()


def garbage(agent: AgentProcess) -> None:
    """Undecodable requests, a 1 MiB metadata header, aliases of one cgroup."""
    with grpc.insecure_channel(f"unix:{agent.unix_path}") as channel:
        call: grpc.UnaryUnaryMultiCallable = channel.unary_unary(
            "/guestagent.v1.MemoryAgent/SetMemoryLimits"
        )
        for _ in range(50):
            with contextlib.suppress(grpc.RpcError):
                call(b"\xff\xff\xff\xff", timeout=5)
    with AgentClient(agent.unix_target, timeout=10) as client:
        metadata: tuple[tuple[str, str | bytes], ...] = (("x-junk", "j" * (1 << 20)),)
        with contextlib.suppress(grpc.RpcError):
            client.stub.GetMemoryInfo(pb.GetMemoryInfoRequest(), metadata=metadata, timeout=5)
        for alias in ("pod/ctr", "pod/ctr/", "pod//ctr//"):
            client.set_reclaim_policy(alias, alias == "pod/ctr/")


def unary_burst(agent: AgentProcess) -> None:
    """1000 GetMemoryInfo calls at once on one connection (the cap is 512)."""
    with AgentClient(agent.unix_target, timeout=30) as client:
        request = pb.GetMemoryInfoRequest(cgroups=["pod/ctr"])
        futures = [client.stub.GetMemoryInfo.future(request, timeout=30) for _ in range(1000)]
        for future in futures:
            with contextlib.suppress(grpc.RpcError):
                future.result()


def never_reads(agent: AgentProcess) -> None:
    """A client that speaks HTTP/2's preface and then neither sends nor reads (slowloris)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(agent.unix_path))
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        time.sleep(2)
    except OSError:
        pass
    finally:
        sock.close()


LOADS: dict[str, Callable[[AgentProcess], None]] = {
    "idle_flood": idle_flood,
    "stream_flood": stream_flood,
    "big_requests": big_requests,
    "garbage": garbage,
    "unary_burst": unary_burst,
    "never_reads": never_reads,
}


def probe_for(agent: AgentProcess, seconds: float) -> Probe:
    probe = Probe(agent.unix_target)
    probe.start()
    time.sleep(seconds)
    probe.stop.set()
    probe.join()
    return probe


def measure_hostile(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hostile-soak-") as scratch:
        fake = make_fake_root(Path(scratch) / "root")
        fake.add_cgroup("pod/ctr")
        (fake.root / "sys/fs/cgroup/pod/ctr/memory.reclaim").write_text("")
        for i in range(CGROUPS):
            fake.add_cgroup(f"w/c{i}")
        agent = AgentProcess(
            fake.root, Path(scratch), wrapper=("prlimit", f"--nofile={NOFILE}:{NOFILE}", "--")
        )
        agent.start()
        try:
            # One round of each load first: what grpc and the allocator keep after the first
            # use of each path is the baseline, not growth.
            for load in LOADS.values():
                load(agent)
            time.sleep(SETTLE_SECONDS)
            before = process_figures(agent.pid)
            idle = probe_for(agent, IDLE_SECONDS)
            rounds = {name: 0 for name in LOADS}
            errors: dict[str, int] = {}
            probe = Probe(agent.unix_target)
            probe.start()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for name, load in LOADS.items():
                    probe.phase = name
                    try:
                        load(agent)
                    except (grpc.RpcError, OSError) as e:
                        errors[name] = errors.get(name, 0) + 1
                        print(f"{name}: {e}")
                    rounds[name] += 1
                    if time.monotonic() >= end:
                        break
            probe.stop.set()
            probe.join()
            time.sleep(SETTLE_SECONDS)
            alive = agent.proc is not None and agent.proc.poll() is None
            after = process_figures(agent.pid) if alive else {}
        finally:
            agent.kill()
        events = agent.log_events()
    idle_p99 = percentile(idle.samples, 0.99)
    soak_p99 = percentile(probe.samples, 0.99)
    growth = {k: round(after[k] / before[k], 3) for k in before} if after else {}
    return {
        "seconds": seconds,
        "rounds": rounds,
        "load_errors": errors,
        "before": before,
        "after": after,
        "after_over_before": growth,
        "idle_ms": {
            "p50": round(percentile(idle.samples, 0.5) * 1000, 2),
            "p99": round(idle_p99 * 1000, 2),
        },
        "soak_ms": {
            "calls": len(probe.samples),
            "p50": round(percentile(probe.samples, 0.5) * 1000, 2),
            "p99": round(soak_p99 * 1000, 2),
            "max": round(max(probe.samples, default=0) * 1000, 2),
            "failures": probe.failures,
            # Which attack the slow calls met.
            "p99_by_load": {
                name: round(percentile(samples, 0.99) * 1000, 2)
                for name, samples in sorted(probe.by_phase.items())
            },
        },
        "crashes": 0 if alive else 1,
        "tracebacks": sum("exception" in e for e in events),
        "log_lines": len(events),
        "log_events": dict(Counter(str(e["event"]) for e in events).most_common(12)),
        "verdicts": {
            "resources_within_10_percent": bool(growth) and all(g <= 1.1 for g in growth.values()),
            "p99_within_10x_idle": soak_p99 <= 10 * idle_p99,
            "no_crash": alive,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    figures = measure_hostile(args.seconds)
    text = json.dumps({"hostile": figures}, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if all(figures["verdicts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
