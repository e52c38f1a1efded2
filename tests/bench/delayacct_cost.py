"""What delay accounting costs a guest: kernel.task_delayacct off and on, alternating in
windows of one boot, an idle guest's CPU (its /proc/stat, so the share is of its own vCPU
however slow TCG is) and a hot loop's iteration time paced by its reference loop (the
workload of tests/workloads/reclaim.py, no reclaimer on). `python -m tests.bench.run
--sections delayacct_cost --out FILE.json` runs it alone."""

from __future__ import annotations

import statistics
import time
from typing import Any

from guestagent.host.sizing.boot import VMConfig
from guestagent.vm.qemu import GuestVM
from tests.bench.vm import booted
from tests.workloads.reclaim import iteration_log, start_workload, stop_workload

CONFIG = VMConfig(memory_mib=1024)
WINDOW_S = 30.0
ROUNDS = 2  # Each setting this many windows, alternating off, on, off, on.
ANON_MIB, HOT_MIB = 200, 48
# The guest's hot loop may cost at most this much more with delay accounting on.
HOT_LOOP_RATIO_AT_MOST = 1.05


def guest_cpu_ticks(vm: GuestVM) -> tuple[int, int]:
    """(busy, all) ticks of the guest's CPUs so far, from the first line of /proc/stat."""
    fields = [int(f) for f in vm.exec(["head", "-1", "/proc/stat"]).stdout.split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def set_delayacct(vm: GuestVM, on: bool) -> None:
    vm.exec(f"echo {int(on)} > /proc/sys/kernel/task_delayacct")


def idle_windows(vm: GuestVM) -> dict[str, list[float]]:
    """The guest's busy share per window, by setting."""
    shares: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(ROUNDS):
        for on in (False, True):
            set_delayacct(vm, on)
            busy0, all0 = guest_cpu_ticks(vm)
            time.sleep(WINDOW_S)
            busy1, all1 = guest_cpu_ticks(vm)
            shares["on" if on else "off"].append((busy1 - busy0) / max(all1 - all0, 1))
    return shares


def hot_loop_windows(vm: GuestVM, out: str) -> dict[str, list[float]]:
    """The hot loop's median paced iteration (hot / reference) per window, by setting."""
    paced: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(ROUNDS):
        for on in (False, True):
            set_delayacct(vm, on)
            start = float(vm.exec(["date", "+%s.%N"]).stdout)
            time.sleep(WINDOW_S)
            end = float(vm.exec(["date", "+%s.%N"]).stdout)
            window = [i for i in iteration_log(vm, out) if start <= i.stamp < end]
            paced["on" if on else "off"].append(
                statistics.median(i.seconds / i.reference_seconds for i in window)
            )
    return paced


def measure_delayacct_cost() -> dict[str, Any]:
    with booted(CONFIG) as (vm, _):
        idle = idle_windows(vm)
        out = start_workload(vm, "hot", ANON_MIB, HOT_MIB)
        hot = hot_loop_windows(vm, out)
        stop_workload(vm, out)
        set_delayacct(vm, True)  # As the agent leaves it.
    idle_off, idle_on = statistics.median(idle["off"]), statistics.median(idle["on"])
    hot_ratio = statistics.median(hot["on"]) / statistics.median(hot["off"])
    return {
        "window_s": WINDOW_S,
        "rounds": ROUNDS,
        "idle_guest_busy_share": {k: [round(v, 4) for v in vs] for k, vs in idle.items()},
        "idle_guest_busy_share_median": {"off": round(idle_off, 4), "on": round(idle_on, 4)},
        "hot_loop_paced_median": {k: [round(v, 3) for v in vs] for k, vs in hot.items()},
        "hot_loop_on_over_off": round(hot_ratio, 3),
        "targets": {"hot_loop_on_over_off_at_most": HOT_LOOP_RATIO_AT_MOST},
        "verdicts": {
            "hot_loop_within_5_percent": "met" if hot_ratio <= HOT_LOOP_RATIO_AT_MOST else "not met"
        },
    }
