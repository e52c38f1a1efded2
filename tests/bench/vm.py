"""The benchmark figures only a real guest gives: EnableSwap latency by area size, the share
of swap blocks and of freed RAM handed back to the host, and the vsock relay's cost."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import Disk, GuestVM, VMConfig
from tests.vm.guest import allocate_free_and_compact
from tests.vm.test_swap import fill_and_release

MIB = 1 << 20
RELAY_CALLS = 300

# Runs in the guest: GetMemoryInfo over vsock (through the agent's relay) and over the
# agent's unix socket, interleaved; prints p50/p99 of each in microseconds.
RELAY_SCRIPT = f"""
import json, time
from guestagent.host.client import AgentClient
def pct(xs, f): xs = sorted(xs); return round(xs[min(len(xs) - 1, int(f * len(xs)))], 1)
with AgentClient("vsock://1:1025") as relayed, AgentClient("unix:///run/bench.sock") as direct:
    for c in (relayed, direct):
        c.wait_ready(60)
        for _ in range(30): c.info()
    samples = {{"vsock_relay": [], "unix": []}}
    for _ in range({RELAY_CALLS}):
        for name, c in (("vsock_relay", relayed), ("unix", direct)):
            t = time.perf_counter(); c.info(); samples[name].append((time.perf_counter() - t) * 1e6)
summary = {{k: {{"p50_us": pct(v, .5), "p99_us": pct(v, .99)}} for k, v in samples.items()}}
print(json.dumps(summary))
"""


def enable_latency(agent: AgentClient, serial: str) -> float:
    started = time.monotonic()
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial=serial)))
    elapsed = time.monotonic() - started
    agent.disable_swap(pb.DeviceSelector(serial=serial))
    return round(elapsed, 3)


def relay_latency(vm: GuestVM) -> dict[str, Any]:
    vm.exec(
        "/opt/guestagent/bin/guestagent serve --online-memory off --allow-cid 1 "
        "--listen vsock://:1025 --listen unix:///run/bench.sock </dev/null >/dev/null 2>&1 & "
        "echo $! > /run/bench.pid"
    )
    try:
        output = vm.exec(["/opt/guestagent/bin/python", "-c", RELAY_SCRIPT], timeout=600).stdout
    finally:
        vm.exec("kill $(cat /run/bench.pid); true")
    figures: dict[str, Any] = json.loads(output)
    ratio = figures["vsock_relay"]["p99_us"] / figures["unix"]["p99_us"]
    figures["relay_p99_ratio"] = {"value": round(ratio, 3), "target": 1.5, "met": ratio <= 1.5}
    figures["calls"] = RELAY_CALLS
    return figures


def guest_agent_figures(vm: GuestVM) -> dict[str, float]:
    pid = vm.exec("pgrep -o -x guestagent").stdout.strip()
    rss = threads = 0
    for line in vm.exec(["cat", f"/proc/{pid}/status"]).stdout.splitlines():
        if line.startswith("RssAnon:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    fields = vm.exec(["cat", f"/proc/{pid}/stat"]).stdout.rsplit(")", 1)[1].split()
    ticks = int(vm.exec(["getconf", "CLK_TCK"]).stdout)
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return {"rss_anon": rss, "threads": threads, "cpu_s": cpu}


def guest_footprint(vm: GuestVM) -> dict[str, int]:
    """The image's agent as it runs in the guest: VmRSS, RssAnon, Threads, and Pss (its RSS
    with shared library pages split among their users)."""
    pid = vm.exec("pgrep -o -x guestagent").stdout.strip()
    figures = {}
    for line in vm.exec(["cat", f"/proc/{pid}/status"]).stdout.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            figures[key] = int(rest.split()[0]) * 1024
        elif key == "Threads":
            figures[key] = int(rest)
    for line in vm.exec(["cat", f"/proc/{pid}/smaps_rollup"]).stdout.splitlines():
        if line.startswith("Pss:"):
            figures["Pss"] = int(line.split()[1]) * 1024
    return figures


def vm_load(vm: GuestVM, agent: AgentClient, seconds: float) -> dict[str, Any]:
    from tests.bench.load import run_load

    cgroups = [f"load/c{i}" for i in range(50)]
    for name in cgroups:
        agent.set_limits(name, pb.LinuxMemory(limit=-1), create=True)
    return asyncio.run(
        run_load(vm.agent_target, cgroups, cgroups, seconds, lambda: guest_agent_figures(vm), 120)
    )


def measure_vm(load_seconds: float) -> dict[str, Any]:
    config = VMConfig(
        memory_mib=1024,
        disks=(
            Disk("swap", 1 << 30, serial="swap0"),
            Disk("swap8", 8 << 30, serial="swap8"),
        ),
    )
    results: dict[str, Any] = {}
    with GuestVM(config) as vm, AgentClient(vm.agent_target, timeout=600) as agent:
        results["boot_to_serving_s"] = round(vm.boot_seconds or 0.0, 1)
        agent.wait_ready(60)
        footprint = {"after_boot": guest_footprint(vm)}
        for _ in range(500):
            agent.info()
        footprint["after_500_calls"] = guest_footprint(vm)
        results["agent_in_guest"] = footprint
        results["enable_swap_s"] = {
            "1GiB": enable_latency(agent, "swap0"),
            "8GiB": enable_latency(agent, "swap8"),
        }
        agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
        results["swap_discard"] = fill_and_release(vm, "swap")
        agent.disable_swap(pb.DeviceSelector(serial="swap0"))
        results["free_page_reporting"] = allocate_free_and_compact(vm, agent.compact, 600)
        results["relay_in_guest"] = relay_latency(vm)
        results["load"] = vm_load(vm, agent, load_seconds)
    return results
