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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from guestagent.host.client import AgentClient
from tests.bench.figures import elapsed, footprint, load_sample, ratio_verdict
from tests.bench.floor_server import METHOD as FLOOR_METHOD

CALLS = 2000
STARTS = 5
WARMUP = 200


def proc_status(pid: int) -> dict[str, int]:
    proc = Path(f"/proc/{pid}")
    return footprint((proc / "status").read_text(), (proc / "smaps_rollup").read_text())


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


def floor_echo(target: str) -> Callable[[], bytes]:
    """A call to the floor server's one raw-bytes method, over one channel."""
    channel = grpc.insecure_channel(target)
    echo: Any = channel.unary_unary(FLOOR_METHOD)
    return lambda: echo(b"x", timeout=5)


def floor_serving(target: str) -> bool:
    try:
        with grpc.insecure_channel(target) as channel:
            floor: Any = channel.unary_unary(FLOOR_METHOD)
            floor(b"x", timeout=1)
        return True
    except grpc.RpcError:
        return False


def start_and_wait(
    command: list[str],
    target: str,
    env: dict[str, str] | None = None,
    probe: Callable[[str], bool] = serving,
) -> tuple[subprocess.Popen[bytes], float]:
    """Start a server and poll every 10 ms until it serves; the median of STARTS runs."""
    times = []
    for attempt in range(STARTS):
        started = time.monotonic()
        proc = subprocess.Popen(command, stderr=subprocess.DEVNULL, env=env, cwd="/")
        while not probe(target):
            if time.monotonic() - started > 60:
                raise RuntimeError(f"{command} did not serve {target} within 60 s")
            time.sleep(0.01)
        times.append(time.monotonic() - started)
        if attempt < STARTS - 1:
            proc.terminate()
            proc.wait()
    return proc, statistics.median(times)


def memory_after_calls(proc: subprocess.Popen[bytes], call: Callable[[], object]) -> dict[str, int]:
    for _ in range(500):
        call()
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
    compile_optimized(site)
    return {**os.environ, "PYTHONPATH": str(site)}


# What the three servers import from this venv. All of them run with -OO, as the daemon
# does in the guest; without .opt-2.pyc files each would compile its imports at start and
# keep the compiler's allocations (about 6 MiB of RssAnon for grpc alone).
RUNTIME_PACKAGES = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "google/protobuf",
    "pyudev",
    "typing_extensions.py",
)


def compile_optimized(*roots: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-o", "0", "-o", "2", *map(str, roots)],
        check=True,
    )


def compile_runtime_packages() -> None:
    site = Path(grpc.__file__).parents[1]
    compile_optimized(*(site / name for name in RUNTIME_PACKAGES if (site / name).exists()))


def agent_command(*args: str) -> list[str]:
    # Hot-plug onlining off: on this host's root it would act on the host's memory.
    return [sys.executable, "-OO", "-m", "guestagent", "serve", "--online-memory", "off", *args]


def measure_daemons(workdir: Path) -> dict[str, Any]:
    """Three servers side by side, each started STARTS times and then called 500 times: the
    grpcio floor (one raw-bytes method), the bare health server, and the agent."""
    agent_env = install_wheel(workdir)
    compile_runtime_packages()
    results: dict[str, Any] = {}

    target = f"unix://{workdir}/floor.sock"
    floor_command = [sys.executable, "-OO", str(Path(__file__).with_name("floor_server.py"))]
    floor, ready = start_and_wait([*floor_command, target], target, probe=floor_serving)
    try:
        echo = floor_echo(target)
        results["floor"] = {"ready_s": round(ready, 3), **memory_after_calls(floor, echo)}
        results["floor"]["echo"] = latency(echo)
    finally:
        floor.terminate()
        floor.wait()

    target = f"unix://{workdir}/baseline.sock"
    baseline_command = [sys.executable, "-OO", str(Path(__file__).with_name("baseline_server.py"))]
    baseline, ready = start_and_wait([*baseline_command, target], target)
    try:
        with AgentClient(target) as client:
            results["baseline"] = {
                "ready_s": round(ready, 3),
                **memory_after_calls(baseline, client.health),
                "health_check": latency(client.health),
            }
    finally:
        baseline.terminate()
        baseline.wait()

    agent_target = f"unix://{workdir}/agent.sock"
    tcp_target = f"tcp://127.0.0.1:{free_tcp_port()}"
    agent, ready = start_and_wait(
        agent_command("--listen", agent_target, "--listen", tcp_target), agent_target, env=agent_env
    )
    try:
        results["agent"] = {"ready_s": round(ready, 3), "after_start": proc_status(agent.pid)}
        with AgentClient(agent_target) as client:
            results["agent"].update(memory_after_calls(agent, client.info))
            results["agent"]["health_check"] = latency(client.health)
        direct, relayed = relayed_latency(agent_target, tcp_target)
        results["agent"]["get_memory_info_direct"] = direct
        results["agent"]["get_memory_info_relay"] = relayed
        results["agent"]["after_load"] = proc_status(agent.pid)
    finally:
        agent.terminate()
        agent.wait()
    return results


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def relayed_latency(unix_target: str, tcp_target: str) -> list[dict[str, float]]:
    """GetMemoryInfo straight into grpc (the tcp listener) against the agent's own relay
    (its unix listener goes through the relay that vsock uses: accept, splice both ways),
    interleaved. This host has no vsock loopback; the VM section measures vsock itself."""
    with AgentClient(tcp_target) as direct, AgentClient(unix_target) as relayed:
        return latencies(direct.info, relayed.info)


def agent_figures(pid: int) -> dict[str, float]:
    """RssAnon and CPU seconds used so far: the agent's side of the load, apart from the
    client's, which shares this machine's two cores."""
    proc = Path(f"/proc/{pid}")
    return load_sample(
        (proc / "status").read_text(),
        (proc / "smaps_rollup").read_text(),
        (proc / "stat").read_text(),
        os.sysconf("SC_CLK_TCK"),
    )


def measure_local_load(workdir: Path, seconds: float, through: str) -> dict[str, Any]:
    """The load mix against an agent over a fake root: the agent's own cost, no kernel's.
    through="relay": 200 connections to its unix listener, which goes through the relay
    vsock uses; "direct": to its tcp listener, straight into grpc."""
    from tests.bench.load import run_load
    from tests.fakes.root import make_fake_root

    fake = make_fake_root(workdir / f"root-{through}")
    readers = [f"load/r{i}" for i in range(50)]
    writers = [f"load/w{i}" for i in range(50)]
    for name in readers + writers:
        fake.add_cgroup(name)
    unix_target = f"unix://{workdir}/load-{through}.sock"
    tcp_target = f"tcp://127.0.0.1:{free_tcp_port()}"
    agent, _ = start_and_wait(
        agent_command("--root", str(fake.root), "--listen", unix_target, "--listen", tcp_target),
        unix_target,
        env=install_wheel(workdir / f"load-wheel-{through}"),
    )
    target = unix_target if through == "relay" else tcp_target
    try:
        return asyncio.run(
            run_load(target, readers, writers, seconds, lambda: agent_figures(agent.pid))
        )
    finally:
        agent.terminate()
        agent.wait()


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    """The footprint issue's targets: against the grpcio floor for memory, against the bare
    health server for start-up (both measured in this run), and the relay against unix."""
    floor, base, agent = results["floor"], results["baseline"], results["agent"]
    relay = agent["get_memory_info_relay"]["p99_us"] / agent["get_memory_info_direct"]["p99_us"]
    return {
        "rss_anon_vs_floor": ratio_verdict(agent["RssAnon"] / floor["RssAnon"], 1.15),
        "vm_rss_vs_floor": ratio_verdict(agent["VmRSS"] / floor["VmRSS"], 1.15),
        "ready_vs_health_server": ratio_verdict(agent["ready_s"] / base["ready_s"], 1.3),
        "relay_p99_vs_direct": ratio_verdict(relay, 1.5),
    }


def measure_floor_load(workdir: Path, seconds: float) -> dict[str, Any]:
    """The 200 connections against the grpcio floor server: the per-connection cost that
    comes with grpcio, whatever the server does."""
    from tests.bench.load import run_floor_load

    target = f"unix://{workdir}/floor-load.sock"
    floor_command = [sys.executable, "-OO", str(Path(__file__).with_name("floor_server.py"))]
    floor, _ = start_and_wait([*floor_command, target], target, probe=floor_serving)
    try:
        return asyncio.run(
            run_floor_load(target, FLOOR_METHOD, seconds, lambda: agent_figures(floor.pid))
        )
    finally:
        floor.terminate()
        floor.wait()


def load_verdicts(load_local: dict[str, Any]) -> dict[str, Any]:
    """The 200-connection targets: no errors, at most 12 threads, RssAnon growth <= 4 MiB
    (and, beside it, what the floor server grew under the same connections)."""
    verdicts = {}
    for through in ("relay", "direct"):
        load = load_local[through]
        growth = load["agent_rss_anon_growth"]
        verdicts[through] = {
            "errors": {"value": sum(load["errors"].values()), "target": 0},
            "threads": ratio_verdict(load["agent_threads_under_load"], 12),
            "rss_anon_growth_mib": ratio_verdict(growth / (1 << 20), 4.0),
            "floor_rss_anon_growth_mib": round(
                load_local["floor"]["rss_anon_growth"] / (1 << 20), 1
            ),
        }
        verdicts[through]["errors"]["met"] = verdicts[through]["errors"]["value"] == 0
    return verdicts


def host_sections(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        daemon = measure_daemons(Path(workdir))
        load_local = {
            through: measure_local_load(Path(workdir), args.load_seconds, through)
            for through in ("relay", "direct")
        }
        load_local["floor"] = measure_floor_load(Path(workdir), args.load_seconds)
    targets = {**verdicts(daemon), "load": load_verdicts(load_local)}
    return {"daemon": daemon, "load_local": load_local, "targets": targets}


def vm_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.vm import measure_vm

    return {"vm": measure_vm()}


def native_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.load_native import measure_native

    return {"native": measure_native(args.native_seconds)}


def load_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.load_guest import measure_load

    return {"load": measure_load(args.load_seconds)}


def thrash_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.thrash import measure_thrash_section

    return {"thrash": measure_thrash_section()}


def virtio_mem_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.virtio_mem import measure_virtio_mem

    return {"virtio_mem": measure_virtio_mem()}


def delayacct_cost_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.delayacct_cost import measure_delayacct_cost

    return {"delayacct_cost": measure_delayacct_cost()}


def reclaimer_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.reclaimer import measure_reclaimer

    # The plot sits beside the JSON: latest.json -> latest-reclaimer.png.
    return {"reclaimer": measure_reclaimer(args.out.with_name(f"{args.out.stem}-reclaimer.png"))}


def giveback_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.giveback import measure_giveback

    # latest.json -> latest-giveback.png, as the reclaimer's plot.
    return {"giveback": measure_giveback(args.out.with_name(f"{args.out.stem}-giveback.png"))}


def giveback_follow_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.giveback_follow import measure_follow

    # latest.json -> latest-giveback-follow.png, beside the give-back plot.
    plot = args.out.with_name(f"{args.out.stem}-giveback-follow.png")
    return {"giveback_follow": measure_follow(plot)}


def runtime_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.runtime import measure_runtime

    return {"runtime": measure_runtime()}


def crypt_swap_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.crypt_swap import measure_crypt_swap

    return {"crypt_swap": measure_crypt_swap()}


def idle_aging_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.idle_aging import measure_idle_aging

    return {"idle_aging": measure_idle_aging()}


def node_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.node import measure_node_scale
    from tests.bench.node_guests import measure_node_guests

    # latest.json -> latest-node.png, as the reclaimer's plot.
    plot = args.out.with_name(f"{args.out.stem}-node.png")
    return {"node": {"scale": measure_node_scale(), "guests": measure_node_guests(plot)}}


def footprint_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.footprint import measure_footprint

    return {
        "footprint": measure_footprint(
            args.footprint_idle_seconds, args.footprint_watch_seconds, args.footprint_rounds
        )
    }


def hostile_section(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bench.hostile import measure_hostile

    return {"hostile": measure_hostile(args.hostile_seconds)}


# In the order they run. "host" writes daemon, load_local and targets; each other its own key.
SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "host": host_sections,
    "native": native_section,
    "runtime": runtime_section,
    "footprint": footprint_section,
    "vm": vm_section,
    "load": load_section,
    "thrash": thrash_section,
    "virtio_mem": virtio_mem_section,
    "reclaimer": reclaimer_section,
    "delayacct_cost": delayacct_cost_section,
    "crypt_swap": crypt_swap_section,
    "giveback": giveback_section,
    "giveback_follow": giveback_follow_section,
    "idle_aging": idle_aging_section,
    "hostile": hostile_section,
    "node": node_section,
}


def progress(line: str, bench_started: float) -> None:
    """A line on stderr as a section starts and ends: the JSON alone goes to stdout."""
    print(f"bench: {line} (bench at {elapsed(bench_started)})", file=sys.stderr, flush=True)


def section_list(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(chosen) - SECTIONS.keys())
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'none given'}: sections are {', '.join(SECTIONS)}"
        )
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--sections",
        type=section_list,
        default=list(SECTIONS),
        help=f"comma list of {','.join(SECTIONS)} (default: all); the QEMU ones need `make image`",
    )
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument(
        "--native-seconds",
        type=float,
        default=20.0,
        help="each phase of the native section (alone, readers, health checks; default 20)",
    )
    parser.add_argument(
        "--hostile-seconds",
        type=float,
        default=600.0,
        help="the hostile soak's length (default 10 minutes)",
    )
    parser.add_argument(
        "--footprint-idle-seconds",
        type=float,
        default=60.0,
        help="the footprint section's idle windows, where wakeups are counted (default 60)",
    )
    parser.add_argument(
        "--footprint-watch-seconds",
        type=float,
        default=600.0,
        help="the footprint section's watch stream (default 10 minutes)",
    )
    parser.add_argument("--footprint-rounds", type=int, default=3)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    chosen = [name for name in SECTIONS if name in args.sections]
    bench_started = time.monotonic()
    for number, name in enumerate(chosen, 1):
        progress(f"section {name} ({number}/{len(chosen)}) starts", bench_started)
        started = time.monotonic()
        report.update(SECTIONS[name](args))
        progress(f"section {name} ended after {elapsed(started)}", bench_started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
