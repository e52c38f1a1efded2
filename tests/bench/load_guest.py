"""The load section (issue 56): the 200-connection load against the agent of a TCG guest, once
from the host through QEMU's forwarded port and once inside the guest over vsock, where QEMU's
network is not in the way; where a call's CPU goes in that guest; and the issue's targets.

The two runs hit the same agent (the image's, started with --allow-cid 1 so that the guest's
own vsock loopback, CID 1, may call it). In the vsock run the load's client runs in the guest
too, on its one vCPU beside the agent, so its latencies are not the forwarded run's to compare;
what it shows is whether a connection is ever refused or reset on the agent's own path.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.bench.figures import (
    audit_ms,
    cpu_seconds,
    listen_backlog,
    ratio_verdict,
    tcp_ext_counters,
)
from tests.bench.load import CLIENTS, percentile, run_load
from tests.bench.vm import (
    FLOOR,
    GUEST_PYTHON,
    booted,
    call_guest_server,
    guest_agent_figures,
    guest_agent_pid,
    guest_proc,
    start_in_guest,
    stop_in_guest,
)

CGROUPS = 50
VSOCK_PORT = 6464
# The targets for this load: a container start (SetMemoryLimits) waits at most 1 s at
# p99, a report at most 2 s; no connection refused or reset on the vsock path.
SET_LIMITS_P99_S = 1.0
GET_INFO_P99_S = 2.0
CALL_TIMEOUT_S = 120.0
# tests/bench/call_cost.py's stages of a GetMemoryInfo.
STAGES = ("system_files", "cgroup_files", "giveback_sources", "building_the_report", "protobuf")
# Serial calls whose agent CPU is divided among them: the per-call figure without load.
SERIAL_CALLS = 200
# The host's and the guest's counters of connections a full accept queue dropped.
OVERFLOWS = ("ListenOverflows", "ListenDrops")

# The bench's modules the guest needs (the image has the agent and the host side's package,
# not the test tree): copied under this directory as the package `tests.bench`.
GUEST_TREE = "/run/bench"
BENCH_FILES = ("load.py", "figures.py", "call_cost.py")

# Runs in the guest: the load over vsock to the agent through a relay of the client's own,
# as the host client dials vsock (grpcio cannot); prints run_load's figures.
VSOCK_LOAD = f"""
import asyncio, functools, json, os, socket, sys
sys.path[:0] = ["/usr/local/lib/guestctl", "{GUEST_TREE}"]
from guestagent.transport.address import VsockAddress
from guestagent.transport.dial import dial_vsock
from guestagent.transport.relay import SocketRelay
from tests.bench.figures import load_sample
from tests.bench.load import run_load
agent, seconds, cgroups = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].split(",")
path = "/run/bench-relay.sock"
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(socket.SOMAXCONN)
dial = functools.partial(dial_vsock, VsockAddress(1, {VSOCK_PORT}), {CALL_TIMEOUT_S})
relay = SocketRelay(listener, dial=dial, name="bench-relay").start()
def figures():
    proc = f"/proc/{{agent}}/"
    text = [open(proc + name).read() for name in ("status", "smaps_rollup", "stat")]
    return load_sample(*text, os.sysconf("SC_CLK_TCK"))
load = run_load("unix://" + path, cgroups, cgroups, seconds, figures, {CALL_TIMEOUT_S})
print(json.dumps(asyncio.run(load)))
"""


def copy_bench_tree(vm: GuestVM) -> None:
    here = Path(__file__).parent
    vm.exec(f"mkdir -p {GUEST_TREE}/tests/bench")
    for package in ("tests", "tests/bench"):
        vm.exec(f"touch {GUEST_TREE}/{package}/__init__.py")
    for name in BENCH_FILES:
        vm.exec(f"cat > {GUEST_TREE}/tests/bench/{name}", stdin=(here / name).read_text())


def serial_cpu_per_call(
    vm: GuestVM, call: Callable[[], object], calls: int = SERIAL_CALLS
) -> float:
    """The agent's CPU per call, in ms, over `calls` calls one at a time."""
    before = guest_agent_figures(vm)["cpu_s"]
    for _ in range(calls):
        call()
    return round((guest_agent_figures(vm)["cpu_s"] - before) * 1000 / calls, 2)


def floor_cpu_per_call(vm: GuestVM) -> float:
    """The grpcio floor server's CPU per call in this guest, in ms (tests/bench/floor_server.py,
    called SERIAL_CALLS times by a client in the guest): what any Python gRPC server pays."""
    script, target, log = "/run/floor_server.py", "unix:///run/floor.sock", "/run/floor.log"
    vm.exec(f"cat > {script}", stdin=FLOOR.script.read_text())
    pid = start_in_guest(vm, f"{GUEST_PYTHON} -OO {script} {target}", log)
    try:
        call_guest_server(vm, FLOOR, target, 20, log)  # Up, and warm.
        ticks = int(vm.exec(["getconf", "CLK_TCK"]).stdout)
        before = cpu_seconds(guest_proc(vm, pid, "stat"), ticks)
        call_guest_server(vm, FLOOR, target, SERIAL_CALLS, log)
        spent = cpu_seconds(guest_proc(vm, pid, "stat"), ticks) - before
    finally:
        stop_in_guest(vm, pid)
    return round(spent * 1000 / SERIAL_CALLS, 2)


def stage_costs(vm: GuestVM, cgroup: str) -> dict[str, Any]:
    """tests/bench/call_cost.py in the guest, over its kernel's files."""
    command = f"cd {GUEST_TREE} && {GUEST_PYTHON} -m tests.bench.call_cost --cgroups {cgroup}"
    costs: dict[str, Any] = json.loads(vm.exec(command, timeout=600).stdout)
    return costs


def where_the_time_goes(vm: GuestVM, agent: AgentClient, cgroup: str) -> dict[str, Any]:
    """The stages in a process of their own, and the agent's whole CPU per call: the rest of
    it is gRPC's (and the servicer's own few lines)."""
    for _ in range(20):  # The contract's code loads with the first calls.
        agent.info([cgroup])
    per_call_ms = serial_cpu_per_call(vm, lambda: agent.info([cgroup]))
    stages = stage_costs(vm, cgroup)
    staged_ms = sum(stages[name]["cpu_us_p50"] for name in STAGES)
    limit = pb.LinuxMemory(limit=256 * MIB, swap=512 * MIB)
    return {
        "agent_cpu_ms_per_call_serial": per_call_ms,
        "stages": stages,
        "grpc_and_the_rest_ms": round(per_call_ms - staged_ms / 1000, 2),
        "agent_cpu_ms_per_health_check_serial": serial_cpu_per_call(vm, agent.health),
        "agent_cpu_ms_per_set_memory_limits_serial": serial_cpu_per_call(
            vm, lambda: agent.set_limits(cgroup, limit), SERIAL_CALLS // 4
        ),
        "floor_cpu_ms_per_call_serial": floor_cpu_per_call(vm),
    }


def locked_mib(vm: GuestVM) -> float:
    """The agent's pages locked in RAM (smaps_rollup's Locked: resident pages of locked
    mappings; VmLck counts whole mappings, touched or not), what --no-lock-memory would leave
    to reclaim."""
    rollup = guest_proc(vm, guest_agent_pid(vm), "smaps_rollup")
    line = next(line for line in rollup.splitlines() if line.startswith("Locked:"))
    return round(int(line.split()[1]) / 1024, 2)


def wait_until_quiet(vm: GuestVM, timeout: float = 300.0) -> float:
    """Until the agent used under a tenth of its vCPU over 5 s (calls queued by a load's
    clients, closed on the host, are still answered after it): how long that took."""
    started = time.monotonic()
    last = guest_agent_figures(vm)["cpu_s"]
    while time.monotonic() - started < timeout:
        time.sleep(5)
        now = guest_agent_figures(vm)["cpu_s"]
        if now - last < 0.5:
            break
        last = now
    return round(time.monotonic() - started, 1)


def host_listen_facts(port: int) -> dict[str, Any]:
    """The host's accept-queue drops (all of the host's sockets: the counters are global) and
    the backlog QEMU's forwarded port listens with."""
    counters = tcp_ext_counters(Path("/proc/net/netstat").read_text())
    listening = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return {
        **{name: counters[name] for name in OVERFLOWS},
        "forwarded_port_backlog": listen_backlog(listening),
    }


def guest_overflows(vm: GuestVM) -> dict[str, int]:
    counters = tcp_ext_counters(vm.exec(["cat", "/proc/net/netstat"]).stdout)
    return {name: counters[name] for name in OVERFLOWS}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in OVERFLOWS}


def forwarded_load(vm: GuestVM, cgroups: list[str], seconds: float) -> dict[str, Any]:
    started = guest_time(vm)
    host_before, guest_before = host_listen_facts(vm.host_port), guest_overflows(vm)
    load = asyncio.run(
        run_load(
            vm.agent_target,
            cgroups,
            cgroups,
            seconds,
            lambda: guest_agent_figures(vm),
            CALL_TIMEOUT_S,
        )
    )
    host_after = host_listen_facts(vm.host_port)
    load["set_memory_limits_in_the_servicer"] = audit_durations(vm, "SetMemoryLimits", started)
    load["accept_queue"] = {
        "forwarded_port_backlog": host_before["forwarded_port_backlog"],
        "host_drops": delta(host_after, host_before),
        "guest_drops": delta(guest_overflows(vm), guest_before),
    }
    return load


def vsock_load(vm: GuestVM, cgroups: list[str], seconds: float) -> dict[str, Any]:
    started = guest_time(vm)
    script = f"{GUEST_TREE}/vsock_load.py"
    vm.exec(f"cat > {script}", stdin=VSOCK_LOAD)
    # Each connection costs the client a socket and its relay six: past a soft limit of 1024.
    command = f"ulimit -n $(ulimit -Hn) && exec {GUEST_PYTHON} {script}"
    command += f" {guest_agent_pid(vm)} {seconds} {','.join(cgroups)}"
    output = vm.exec(command, timeout=seconds + 2 * CALL_TIMEOUT_S + 120)
    load: dict[str, Any] = json.loads(output.stdout)
    load["set_memory_limits_in_the_servicer"] = audit_durations(vm, "SetMemoryLimits", started)
    return load


AGENT_LOG = "/var/log/guestagent.log"


def guest_time(vm: GuestVM) -> float:
    """The guest's clock (its log's), which runs apart from the host's under TCG."""
    return float(vm.exec(["date", "+%s.%N"]).stdout)


def audit_durations(vm: GuestVM, method: str, since_unix: float) -> dict[str, Any]:
    """The agent's own time in the calls of `method` since then, from its audit lines (the
    image's init keeps its log in AGENT_LOG): what is left of a caller's wait came before the
    servicer ran (grpc taking the call up) or after (sending the answer)."""
    durations = audit_ms(vm.exec(["cat", AGENT_LOG], timeout=120).stdout, method, since_unix)
    return {
        "calls": len(durations),
        "p50_ms": percentile(durations, 0.5),
        "p99_ms": percentile(durations, 0.99),
    }


def p99_seconds(load: dict[str, Any], method: str) -> float:
    return float(load["calls"][method]["p99_us"]) / 1e6


def load_targets(forwarded: dict[str, Any], vsock: dict[str, Any]) -> dict[str, Any]:
    """Issue 56's targets for the 200-connection load: p99s through the forwarded port (the
    host's own view, as the issue measured it), no errors on the vsock path."""
    refused = sum(vsock["errors"].values())
    return {
        "set_memory_limits_p99_s": ratio_verdict(
            p99_seconds(forwarded, "SetMemoryLimits"), SET_LIMITS_P99_S
        ),
        "get_memory_info_p99_s": ratio_verdict(
            p99_seconds(forwarded, "GetMemoryInfo"), GET_INFO_P99_S
        ),
        "vsock_errors": {"value": refused, "target": 0, "met": refused == 0},
        "forwarded_port_errors": sum(forwarded["errors"].values()),
    }


def measure_load(seconds: float) -> dict[str, Any]:
    config = VMConfig(memory_mib=1024, agent_args=("--allow-cid", "1"))
    results: dict[str, Any] = {"clients": CLIENTS}
    with booted(config) as (vm, agent):
        results["boot_to_serving_s"] = round(vm.boot_seconds or 0.0, 1)
        cgroups = [f"load/c{i}" for i in range(CGROUPS)]
        for name in cgroups:
            agent.set_limits(name, pb.LinuxMemory(limit=-1), create=True)
        copy_bench_tree(vm)
        results["agent_locked_mib_start"] = locked_mib(vm)
        results["where_the_time_goes"] = where_the_time_goes(vm, agent, cgroups[0])
        results["forwarded_port"] = forwarded_load(vm, cgroups, seconds)
        results["quiet_after_forwarded_s"] = wait_until_quiet(vm)
        results["vsock_in_guest"] = vsock_load(vm, cgroups, seconds)
        results["agent_rss_anon_mib_end"] = round(guest_agent_figures(vm)["rss_anon"] / MIB, 2)
        results["agent_locked_mib_end"] = locked_mib(vm)
    results["targets"] = load_targets(results["forwarded_port"], results["vsock_in_guest"])
    return results
