"""The benchmark figures only a real guest gives: the agent's footprint beside the grpcio floor
and the health server run in the same guest, EnableSwap latency by area size, the share of swap
blocks and of freed RAM handed back to the host, and the vsock relay's cost."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import DEFAULT_IMAGE_DIR, GuestCommandError, GuestVM
from tests.bench.figures import footprint, load_sample, mib_verdict, ratios
from tests.bench.floor_server import METHOD as FLOOR_METHOD
from tests.vm.guest import allocate_free_and_compact, fill_and_release

RELAY_CALLS = 300

# Runs in the guest: GetMemoryInfo over vsock (through the agent's relay) and over the
# agent's unix socket, interleaved; prints p50/p99 of each in microseconds.
RELAY_SCRIPT = f"""
import json, sys, time
sys.path.insert(0, "/usr/local/lib/guestctl")  # the test image's copy of the host side
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


GUEST_PYTHON = "/opt/guestagent/bin/python"
CALLS = 500
VM_RSS_TARGET_MIB = 30  # The footprint issue's: the agent's VmRSS in the guest.


@dataclass(frozen=True)
class GuestServer:
    """A yardstick server from tests/bench/ as the guest runs it, and the raw-bytes call that
    warms it. The image has grpcio but not the test tree, so the script goes in by stdin."""

    label: str
    script: Path
    flags: tuple[str, ...]
    method: str
    request: bytes
    reply: bytes


FLOOR_SCRIPT = Path(__file__).with_name("floor_server.py")
FLOOR = GuestServer("floor", FLOOR_SCRIPT, ("-OO",), FLOOR_METHOD, b"x", b"x")
# The agent's console script runs the interpreter without -OO: the floor the same way too, so
# one ratio compares code alone.
FLOOR_AS_AGENT = GuestServer("floor_as_agent_runs", FLOOR_SCRIPT, (), FLOOR_METHOD, b"x", b"x")
# An empty HealthCheckRequest is no bytes (service "", the server as a whole); the reply is
# field 1 (status) = 1 (SERVING).
HEALTH = GuestServer(
    "health",
    Path(__file__).with_name("baseline_server.py"),
    ("-OO",),
    "/grpc.health.v1.Health/Check",
    b"",
    b"\x08\x01",
)

# Runs in the guest: one channel, calls to one method on raw bytes, every reply checked; the
# first call waits for the server to listen.
CALL_SCRIPT = """
import sys, grpc
target, method, request, reply, calls = sys.argv[1:]
with grpc.insecure_channel(target) as channel:
    call = channel.unary_unary(method)
    for _ in range(int(calls)):
        got = call(bytes.fromhex(request), timeout=120, wait_for_ready=True)
        if got != bytes.fromhex(reply):
            sys.exit(f"{method} answered {got!r}")
"""


@contextmanager
def booted(config: VMConfig) -> Iterator[tuple[GuestVM, AgentClient]]:
    """A guest of the image with `config` and a client of its agent, once it serves. The image
    is GUESTAGENT_IMAGE_DIR's, as for the VM tests: a kept copy measures one image across runs."""
    image = Path(os.environ.get("GUESTAGENT_IMAGE_DIR", DEFAULT_IMAGE_DIR))
    with (
        GuestVM(config, image_dir=image) as vm,
        AgentClient(vm.agent_target, timeout=600) as agent,
    ):
        agent.wait_ready(60)
        yield vm, agent


def enable_latency(agent: AgentClient, serial: str) -> float:
    started = time.monotonic()
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial=serial)))
    elapsed = time.monotonic() - started
    agent.disable_swap(pb.DeviceSelector(serial=serial))
    return round(elapsed, 3)


def start_in_guest(vm: GuestVM, command: str, log: str) -> int:
    """Start a shell command in the guest's background; its pid."""
    return int(vm.exec(f"{command} </dev/null >{log} 2>&1 & echo $!").stdout)


def stop_in_guest(vm: GuestVM, pid: int) -> None:
    # A zombie's exe link no longer resolves, so the wait ends whether or not PID 1 reaps it.
    vm.exec(f"kill {pid}; while [ -e /proc/{pid}/exe ]; do sleep 0.1; done", timeout=60)


def relay_latency(vm: GuestVM) -> dict[str, Any]:
    pid = start_in_guest(
        vm,
        "/opt/guestagent/bin/guestagent serve --online-memory off --allow-cid 1 "
        "--listen vsock://:1025 --listen unix:///run/bench.sock",
        "/dev/null",
    )
    try:
        output = vm.exec([GUEST_PYTHON, "-c", RELAY_SCRIPT], timeout=600).stdout
    finally:
        stop_in_guest(vm, pid)
    figures: dict[str, Any] = json.loads(output)
    ratio = figures["vsock_relay"]["p99_us"] / figures["unix"]["p99_us"]
    figures["relay_p99_ratio"] = {"value": round(ratio, 3), "target": 1.5, "met": ratio <= 1.5}
    figures["calls"] = RELAY_CALLS
    return figures


def guest_proc(vm: GuestVM, pid: int, name: str) -> str:
    return vm.exec(["cat", f"/proc/{pid}/{name}"]).stdout


def guest_agent_pid(vm: GuestVM) -> int:
    return int(vm.exec("pgrep -o -x guestagent").stdout)


def guest_agent_figures(vm: GuestVM) -> dict[str, float]:
    pid = guest_agent_pid(vm)
    ticks = int(vm.exec(["getconf", "CLK_TCK"]).stdout)
    status, rollup = guest_proc(vm, pid, "status"), guest_proc(vm, pid, "smaps_rollup")
    return load_sample(status, rollup, guest_proc(vm, pid, "stat"), ticks)


def guest_footprint(vm: GuestVM, pid: int) -> dict[str, int]:
    """A guest process as it runs there: VmRSS, RssAnon, Threads, and Pss."""
    return footprint(guest_proc(vm, pid, "status"), guest_proc(vm, pid, "smaps_rollup"))


def call_guest_server(vm: GuestVM, server: GuestServer, target: str, calls: int, log: str) -> None:
    argv = [GUEST_PYTHON, "-c", CALL_SCRIPT, target, server.method]
    argv += [server.request.hex(), server.reply.hex(), str(calls)]
    try:
        vm.exec(argv, timeout=300)
    except GuestCommandError as error:
        output = vm.exec(["cat", log], check=False).stdout
        raise GuestCommandError(f"{error}\n{server.label} server's output:\n{output}") from error


def run_guest_server(vm: GuestVM, server: GuestServer, calls: int) -> dict[str, int]:
    """Start the server, make the calls, read its footprint, stop it."""
    script = f"/run/{server.script.name}"
    vm.exec(f"cat > {script}", stdin=server.script.read_text())
    target, log = f"unix:///run/{server.label}.sock", f"/run/{server.label}.log"
    pid = start_in_guest(vm, " ".join([GUEST_PYTHON, *server.flags, script, target]), log)
    try:
        call_guest_server(vm, server, target, calls, log)
        return guest_footprint(vm, pid)
    finally:
        stop_in_guest(vm, pid)


def guest_server_footprint(vm: GuestVM, server: GuestServer) -> dict[str, int]:
    # The image's bytecode is for the plain interpreter only: under -OO a first start compiles
    # what it imports (keeping the compiler's allocations) and writes .opt-2.pyc files, so a
    # start that is not measured comes first, as the host bench compiles them beforehand.
    run_guest_server(vm, server, 1)
    return run_guest_server(vm, server, CALLS)


def side_by_side(vm: GuestVM, agent: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The floor and the health server in the agent's guest, each after CALLS calls, beside
    the agent after as many; and the footprint issue's target, VmRSS <= 30 MiB."""
    servers = {s.label: guest_server_footprint(vm, s) for s in (FLOOR, FLOOR_AS_AGENT, HEALTH)}
    after_calls = agent["after_500_calls"]
    return {
        **servers,
        "agent": after_calls,
        "calls": CALLS,
        "agent_vs_floor": ratios(after_calls, servers["floor"]),
        "agent_vs_floor_as_agent_runs": ratios(after_calls, servers["floor_as_agent_runs"]),
        "vm_rss_at_most_30_mib": {
            "agent_after_boot": mib_verdict(agent["after_boot"]["VmRSS"], VM_RSS_TARGET_MIB),
            "agent_after_500_calls": mib_verdict(after_calls["VmRSS"], VM_RSS_TARGET_MIB),
            **{
                label: mib_verdict(figures["VmRSS"], VM_RSS_TARGET_MIB)
                for label, figures in servers.items()
            },
        },
    }


def measure_vm() -> dict[str, Any]:
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
        pid = guest_agent_pid(vm)
        in_guest = {"after_boot": guest_footprint(vm, pid)}
        for _ in range(CALLS):
            agent.info()
        in_guest["after_500_calls"] = guest_footprint(vm, pid)
        results["agent_in_guest"] = in_guest
        results["in_guest_side_by_side"] = side_by_side(vm, in_guest)
        results["enable_swap_s"] = {
            "1GiB": enable_latency(agent, "swap0"),
            "8GiB": enable_latency(agent, "swap8"),
        }
        agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
        results["swap_discard"] = fill_and_release(vm, "swap")
        agent.disable_swap(pb.DeviceSelector(serial="swap0"))
        results["free_page_reporting"] = allocate_free_and_compact(vm, agent.compact, 600)
        results["relay_in_guest"] = relay_latency(vm)
    return results
