"""What the idle ages cost and how close they come: the agent's aging thread's CPU (the
page-table walks of every aging are its system time) as a share of one vCPU, at the default
10 s interval, in a 2 GiB guest with 1.5 GiB in use; and the cold figure against the memory
known to be cold. `python -m tests.bench.run --sections idle_aging --out FILE.json` runs it
alone.

The guest's own clock and tick counts are used throughout, so the share is of the guest's vCPU
however slow TCG makes it."""

from __future__ import annotations

import time
from typing import Any

from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.ops.idle import DEFAULT_AGING_INTERVAL_S, THREAD_NAME
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.bench.figures import cpu_seconds, ratio_verdict
from tests.bench.vm import booted, guest_agent_pid
from tests.workloads.reclaim import start_workload, stop_workload

MIB = 1 << 20
CONFIG = VMConfig(memory_mib=2048, disks=(Disk("swap", 2 << 30, serial="swap0"),))
# With the guest's own ~100 MiB, 1.5 GiB in use: touched once, then a hot set looped over.
TOUCHED_MIB, HOT_MIB = 1400, 100
WINDOW_S = 120.0  # Twelve agings at the default interval.
IDLE_S = 90.0  # Before the cold figure is read, as in tests/vm/test_idle.py.
CPU_TARGET = 0.01  # Of one vCPU.

# Prints the guest's uptime, the aging thread's stat and the whole agent's stat, one a line.
SAMPLE = """
pid={pid}
cut -d' ' -f1 /proc/uptime
for t in /proc/$pid/task/*; do
  [ "$(cat $t/comm)" = {name} ] && cat $t/stat
done
cat /proc/$pid/stat
"""


def sample(vm: GuestVM, pid: int, ticks: int) -> tuple[float, float, float]:
    """(guest uptime, aging thread CPU s, agent CPU s)."""
    uptime, thread, process = vm.exec(SAMPLE.format(pid=pid, name=THREAD_NAME)).stdout.splitlines()
    return float(uptime), cpu_seconds(thread, ticks), cpu_seconds(process, ticks)


def measure_idle_aging() -> dict[str, Any]:
    with booted(CONFIG) as (vm, agent):
        agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
        out = start_workload(vm, "bench", TOUCHED_MIB, HOT_MIB)
        touched = time.monotonic()
        pid = guest_agent_pid(vm)
        ticks = int(vm.exec(["getconf", "CLK_TCK"]).stdout)
        used = agent.info().system
        start = sample(vm, pid, ticks)
        time.sleep(WINDOW_S)  # The measured window: the loop ages on its own schedule.
        end = sample(vm, pid, ticks)
        time.sleep(max(0.0, IDLE_S - (time.monotonic() - touched)))
        info = agent.info(["bench"])
        stop_workload(vm, out)
    guest_seconds = end[0] - start[0]
    share = (end[1] - start[1]) / guest_seconds
    (bench,) = info.cgroups
    known = (TOUCHED_MIB - HOT_MIB) * MIB
    return {
        "aging_interval_s": DEFAULT_AGING_INTERVAL_S,
        "guest_mib": CONFIG.memory_mib,
        "in_use_mib": round((used.mem_total_bytes - used.mem_available_bytes) / MIB, 1),
        "window_guest_s": round(guest_seconds, 1),
        "aging_thread_cpu_s": round(end[1] - start[1], 3),
        "agent_cpu_s": round(end[2] - start[2], 3),
        "aging_cpu_share_of_one_vcpu": ratio_verdict(share, CPU_TARGET),
        "cold_mib": round(bench.giveback.cold.bytes / MIB, 1),
        "known_cold_mib": known // MIB,
        "cold_error_fraction": round(bench.giveback.cold.bytes / known - 1, 3),
        "youngest_bin_anon_mib": round(bench.idle.bins[0].anon_bytes / MIB, 1),
        "hot_mib": HOT_MIB,
        "source": bench.idle.source,
    }
