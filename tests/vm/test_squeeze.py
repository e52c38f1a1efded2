"""The agent keeps answering while workloads squeeze the whole guest until the OOM killer fires.

The agent runs in its own cgroup (/guestagent, memory.min covering its footprint), so the
kernel reclaims and swaps the workloads' memory and not the agent's. Measured here: the
GetMemoryInfo latency seen from the host, idle and then while workloads fill the guest's
memory (their cgroup may take all but HEADROOM_MIB of it) and swap until the OOM killer fires
in their cgroup; the p99 of the second stays within 10x the first, in the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.ops.self_cgroup import MEMORY_MIN
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot, read_guest, start_filler, wait_until

pytestmark = pytest.mark.vm

WORKLOAD = "squeeze"
IDLE_CALLS = 200
# More than the workload cgroup's memory and the swap together (about 380 + 256 MiB).
FILLERS = 3
FILLER_MIB = 250
# What the workloads leave to everything else: the kernel, init, udev, testexec and the agent.
HEADROOM_MIB = 96
RESULTS: dict[str, object] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=512, disks=(Disk("swap", 256 * MIB, serial="swap0"),))
    yield from boot(config, image, tmp_path_factory)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "squeeze.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def timed_info(agent: AgentClient) -> tuple[float, pb.MemoryInfo]:
    started = time.perf_counter()
    info = agent.info([WORKLOAD])
    return time.perf_counter() - started, info


def events(vm: GuestVM, cgroup: str) -> dict[str, int]:
    text = read_guest(vm, f"/sys/fs/cgroup/{cgroup}/memory.events")
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def agent_pid(vm: GuestVM) -> str:
    return vm.exec(["pgrep", "-x", "guestagent"]).stdout.strip()


def test_the_agent_answers_through_an_oom(vm: GuestVM, agent: AgentClient) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    procs = read_guest(vm, "/sys/fs/cgroup/guestagent/cgroup.procs").split()
    pid = agent_pid(vm)
    assert pid in procs, (pid, procs)  # It moved itself into its own cgroup.
    assert read_guest(vm, "/sys/fs/cgroup/guestagent/memory.min").strip() == str(MEMORY_MIN)
    total = agent.info().system.mem_total_bytes
    limit = total - HEADROOM_MIB * MIB
    agent.set_limits(WORKLOAD, pb.LinuxMemory(limit=limit, swap=-1), create=True)

    idle = [timed_info(agent)[0] for _ in range(IDLE_CALLS)]
    agent_before = int(read_guest(vm, "/sys/fs/cgroup/guestagent/memory.current"))

    for n in range(FILLERS):
        start_filler(vm, WORKLOAD, FILLER_MIB, name=f"squeeze{n}")
    squeezed: list[float] = []
    oom_kills = 0
    deadline = time.monotonic() + 900
    while oom_kills == 0:
        assert time.monotonic() < deadline, "no OOM kill in the workload cgroup after 900 s"
        latency, info = timed_info(agent)
        squeezed.append(latency)
        oom_kills = info.cgroups[0].events.oom_kill
    # A little longer: the kill itself and what the kernel does after it.
    until = time.monotonic() + 5
    while time.monotonic() < until:
        squeezed.append(timed_info(agent)[0])

    vm.exec(["sh", "-c", f"echo 1 > /sys/fs/cgroup/{WORKLOAD}/cgroup.kill"])
    wait_until(
        lambda: read_guest(vm, f"/sys/fs/cgroup/{WORKLOAD}/cgroup.procs").strip() == "",
        120,
        "the workloads to go",
    )
    agent_events = events(vm, "guestagent")
    # memory.peak (Linux >= 5.19): the most the agent's cgroup held, squeeze included.
    peak = vm.exec(["cat", "/sys/fs/cgroup/guestagent/memory.peak"], check=False).stdout.strip()
    RESULTS.update(
        idle_calls=len(idle),
        idle_p99_ms=round(p99(idle) * 1000, 1),
        idle_median_ms=round(sorted(idle)[len(idle) // 2] * 1000, 1),
        squeeze_calls=len(squeezed),
        squeeze_p99_ms=round(p99(squeezed) * 1000, 1),
        squeeze_median_ms=round(sorted(squeezed)[len(squeezed) // 2] * 1000, 1),
        squeeze_max_ms=round(max(squeezed) * 1000, 1),
        workload_mib=FILLERS * FILLER_MIB,
        mem_total_mib=total // MIB,
        workload_limit_mib=limit // MIB,
        workload_oom_kill=oom_kills,
        agent_memory_current_mib_idle=round(agent_before / MIB, 1),
        agent_memory_peak_mib=round(int(peak) / MIB, 1) if peak.isdigit() else None,
        agent_memory_events=agent_events,
        swap_total_mib=agent.info().system.swap_total_bytes // MIB,
    )
    print(f"\n{json.dumps(RESULTS)}")

    assert oom_kills > 0
    assert agent_pid(vm) == pid  # The same process answered throughout: it survived.
    assert agent_events["oom_kill"] == 0
    assert p99(squeezed) <= 10 * p99(idle), RESULTS
