"""`make bench`: the agent's costs beside a bare gRPC server measured in the same run.

Writes one JSON document. Targets (from the foundation issue): the agent's RssAnon within
1.3x of the baseline's, ready within 1.5x, and a relayed call's p99 within 1.5x of a direct
unix call's. The VM section adds figures only a real guest can give.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from guestagent.host.client import AgentClient
from guestagent.transport import SocketRelay, dial_unix

CALLS = 2000
STARTS = 5
WARMUP = 200


def proc_status(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "calls": len(samples),
        "p50_us": round(percentile(samples, 0.50), 1),
        "p99_us": round(percentile(samples, 0.99), 1),
        "mean_us": round(statistics.fmean(samples), 1),
    }


def latencies(*calls: Any, count: int = CALLS) -> list[dict[str, float]]:
    """Time the calls interleaved, so this machine's noise falls on each of them alike."""
    for _ in range(WARMUP):
        for call in calls:
            call()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(count):
        for call, bucket in zip(calls, samples, strict=True):
            start = time.perf_counter()
            call()
            bucket.append((time.perf_counter() - start) * 1e6)
    return [summary(bucket) for bucket in samples]


def latency(call: Any, count: int = CALLS) -> dict[str, float]:
    return latencies(call, count=count)[0]


def serving(target: str) -> bool:
    # A fresh channel each time: a reused one would wait out grpc's reconnect backoff.
    try:
        with AgentClient(target, timeout=1) as client:
            return client.health() == "SERVING"
    except grpc.RpcError:
        return False


def start_and_wait(
    command: list[str], target: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], float]:
    """Start a server and poll every 10 ms until it serves; the median of STARTS runs."""
    times = []
    for attempt in range(STARTS):
        started = time.monotonic()
        proc = subprocess.Popen(command, stderr=subprocess.DEVNULL, env=env, cwd="/")
        while not serving(target):
            if time.monotonic() - started > 60:
                raise RuntimeError(f"{command} did not serve {target} within 60 s")
            time.sleep(0.01)
        times.append(time.monotonic() - started)
        if attempt < STARTS - 1:
            proc.terminate()
            proc.wait()
    return proc, statistics.median(times)


def memory_after_calls(proc: subprocess.Popen[bytes], target: str, call: str) -> dict[str, int]:
    with AgentClient(target) as client:
        for _ in range(500):
            client.info() if call == "info" else client.health()
    time.sleep(1)
    return proc_status(proc.pid)


def install_wheel(workdir: Path) -> dict[str, str]:
    """The agent as the image has it: from the built wheel, byte-compiled (rootfs.sh does the
    same), not the editable checkout, whose import hook and uncompiled sources would be
    measured instead. Returns the environment that runs it."""
    wheels = sorted(Path("dist").glob("guestagent-*.whl"))
    if not wheels:
        raise SystemExit("no dist/guestagent-*.whl: run `make wheel` (make bench does)")
    site = workdir / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheels[-1]),
        ],
        check=True,
    )
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(site)], check=True)
    return {**os.environ, "PYTHONPATH": str(site)}


def agent_command(*args: str) -> list[str]:
    # Hot-plug onlining off: on this host's root it would act on the host's memory.
    return [sys.executable, "-m", "guestagent", "serve", "--online-memory", "off", *args]


def measure_daemons(workdir: Path) -> dict[str, Any]:
    agent_env = install_wheel(workdir)
    baseline_target = f"unix://{workdir}/baseline.sock"
    agent_target = f"unix://{workdir}/agent.sock"
    results: dict[str, Any] = {}

    baseline, ready = start_and_wait(
        [sys.executable, str(Path(__file__).with_name("baseline_server.py")), baseline_target],
        baseline_target,
    )
    try:
        results["baseline"] = {
            "ready_s": round(ready, 3),
            **memory_after_calls(baseline, baseline_target, "health"),
        }
        with AgentClient(baseline_target) as client:
            results["baseline"]["health_check"] = latency(client.health)
    finally:
        baseline.terminate()
        baseline.wait()

    agent, ready = start_and_wait(
        agent_command("--listen", agent_target),
        agent_target,
        env=agent_env,
    )
    try:
        results["agent"] = {
            "ready_s": round(ready, 3),
            **memory_after_calls(agent, agent_target, "info"),
        }
        with AgentClient(agent_target) as client:
            results["agent"]["health_check"] = latency(client.health)
        direct, relayed = relayed_latency(workdir, agent_target)
        results["agent"]["get_memory_info_unix"] = direct
        results["agent"]["get_memory_info_relay"] = relayed
        results["agent"]["after_load"] = proc_status(agent.pid)
    finally:
        agent.terminate()
        agent.wait()
    return results


def relayed_latency(workdir: Path, agent_target: str) -> list[dict[str, float]]:
    """Direct unix calls against the vsock relay's code path (accept, splice both ways)
    between two unix sockets, interleaved. This host has no vsock loopback; the VM section
    measures the same relay over vsock."""
    front = str(workdir / "relay.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(front)
    listener.listen()
    upstream = agent_target.removeprefix("unix://")
    relay = SocketRelay(listener, dial=lambda: dial_unix(upstream)).start()
    try:
        with AgentClient(agent_target) as direct, AgentClient(f"unix://{front}") as relayed:
            return latencies(direct.info, relayed.info)
    finally:
        relay.close()


def agent_figures(pid: int) -> dict[str, float]:
    """RssAnon and CPU seconds used so far: the agent's side of the load, apart from the
    client's, which shares this machine's two cores."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {"rss_anon": proc_status(pid)["RssAnon"], "cpu_s": cpu}


def measure_local_load(workdir: Path, seconds: float) -> dict[str, Any]:
    """The load mix against an agent over a fake root: the agent's own cost, no kernel's."""
    from tests.bench.load import run_load
    from tests.fakes.root import make_fake_root

    fake = make_fake_root(workdir / "root")
    readers = [f"load/r{i}" for i in range(50)]
    writers = [f"load/w{i}" for i in range(50)]
    for name in readers + writers:
        fake.add_cgroup(name)
    target = f"unix://{workdir}/load.sock"
    agent, _ = start_and_wait(
        agent_command("--root", str(fake.root), "--listen", target),
        target,
        env=install_wheel(workdir / "load-wheel"),
    )
    try:
        return asyncio.run(
            run_load(target, readers, writers, seconds, lambda: agent_figures(agent.pid))
        )
    finally:
        agent.terminate()
        agent.wait()


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    base, agent = results["baseline"], results["agent"]
    rss_anon = agent["RssAnon"] / base["RssAnon"]
    ready = agent["ready_s"] / base["ready_s"]
    relay = agent["get_memory_info_relay"]["p99_us"] / agent["get_memory_info_unix"]["p99_us"]
    return {
        "rss_anon_ratio": {"value": round(rss_anon, 3), "target": 1.3, "met": rss_anon <= 1.3},
        "ready_ratio": {"value": round(ready, 3), "target": 1.5, "met": ready <= 1.5},
        "relay_p99_ratio": {"value": round(relay, 3), "target": 1.5, "met": relay <= 1.5},
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-vm", action="store_true", help="skip the QEMU section")
    parser.add_argument("--load-seconds", type=float, default=60.0)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    with tempfile.TemporaryDirectory() as workdir:
        report["daemon"] = measure_daemons(Path(workdir))
        report["load_local"] = measure_local_load(Path(workdir), args.load_seconds)
    report["targets"] = verdicts(report["daemon"])
    if not args.no_vm:
        from tests.bench.vm import measure_vm

        report["vm"] = measure_vm(args.load_seconds)
        from tests.bench.reclaimer import measure_reclaimer

        # The plot sits beside the JSON: latest.json -> latest-reclaimer.png.
        report["reclaimer"] = measure_reclaimer(
            args.out.with_name(f"{args.out.stem}-reclaimer.png")
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
