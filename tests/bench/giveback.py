"""What `guestctl give-back --safe` returns to the host against what the working-set reclaimer
returns alone, in one guest and one run, with a plot of QEMU's RSS over time for both, and
the agent's cold estimate against the known cold size.

Each phase starts the same workload in a cgroup of its own (400 MiB touched once, a 100 MiB
hot loop), waits until the agent counts the cold set cold, and then acts: the reclaimer on
for that cgroup (anon allowed, the default policy otherwise), or give-back --safe through the
balloon. QEMU's RSS is sampled every second for WATCH_S after the action.
`python -m tests.bench.giveback --out FILE.json` runs it alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.bench import alone
from tests.bench.plotting import rss_timelines
from tests.bench.vm import booted
from tests.vm.guest import make_cgroup
from tests.workloads.cold_count import COLD_AFTER_MS, counted_cold
from tests.workloads.giveback import (
    COLD_MIB,
    HOT_MIB,
    MIB,
    done,
    full_size,
    give_back,
)
from tests.workloads.reclaim import Sampler, start_workload, stop_workload

CONFIG = VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),))
WATCH_S = 150.0
RECLAIMER = pb.ReclaimPolicy(anon=True)


def wait_cold(agent: AgentClient, cgroup: str) -> tuple[float, int, int]:
    """Seconds until the agent counts the cold set cold (counted_cold), and its figures then."""
    started = time.monotonic()
    guest, cgroup_cold = counted_cold(agent, cgroup, 600, COLD_MIB * MIB)
    return time.monotonic() - started, guest, cgroup_cold


def phase(vm: GuestVM, agent: AgentClient, cgroup: str, act: Any) -> dict[str, Any]:
    """One workload, the action, and QEMU's RSS from the workload's start to WATCH_S after."""
    make_cgroup(vm, cgroup)  # Before the sampler, which reports on it from its first second.
    with Sampler(vm, agent, cgroup) as sampler:
        out = start_workload(vm, cgroup, COLD_MIB + HOT_MIB, HOT_MIB)
        seconds, guest_cold, cgroup_cold = wait_cold(agent, cgroup)
        acted_at = sampler.now()
        before, before_guest = vm.qemu_rss_bytes(), vm.qemu_guest_rss_bytes()
        detail = act()
        time.sleep(max(0.0, WATCH_S - (sampler.now() - acted_at)))
        after, after_guest = vm.qemu_rss_bytes(), vm.qemu_guest_rss_bytes()
    stop_workload(vm, out)
    return {
        "cold_known_mib": COLD_MIB,
        "cold_estimate_cgroup_mib": round(cgroup_cold / MIB, 1),
        "cold_estimate_guest_mib": round(guest_cold / MIB, 1),
        "cold_estimate_vs_known": round(cgroup_cold / (COLD_MIB * MIB), 3),
        "seconds_until_counted_cold": round(seconds, 1),
        "qemu_rss_before_mib": round(before / MIB, 1),
        "qemu_rss_after_mib": round(after / MIB, 1),
        # Without TCG's translated-code buffer (vm.qemu_guest_rss_bytes): what came back.
        "qemu_guest_rss_before_mib": round(before_guest / MIB, 1),
        "qemu_guest_rss_after_mib": round(after_guest / MIB, 1),
        "returned_mib": round((before_guest - after_guest) / MIB, 1),
        "returned_fraction_of_cold": round((before_guest - after_guest) / (COLD_MIB * MIB), 3),
        "detail": detail,
        # Seconds from the action, and QEMU's RSS in MiB.
        "rss_timeline": [
            (round(r["t"] - acted_at, 1), round(r["qemu_guest_rss"] / MIB, 1)) for r in sampler.rows
        ],
    }


def measure_giveback(plot_path: Path | None) -> dict[str, Any]:
    with booted(CONFIG) as (vm, agent):
        agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))

        def reclaimer_on() -> dict[str, Any]:
            agent.set_reclaim_policy("wsr", True, RECLAIMER)
            return {"policy": "anon=true, defaults otherwise"}

        def safe_give_back() -> dict[str, Any]:
            started = time.monotonic()
            result = done(give_back(vm, "--safe", "--via", "balloon"))
            return {
                "command_seconds": round(time.monotonic() - started, 1),
                "step": result["step"],
                "settled": result["settled"],
            }

        reclaimer = phase(vm, agent, "wsr", reclaimer_on)
        agent.set_reclaim_policy("wsr", False)
        safe = phase(vm, agent, "gbs", safe_give_back)
        vm.balloon(full_size(vm))
        absent = [a.feature for a in agent.info().absent]
    figures: dict[str, Any] = {
        "cold_after_ms": COLD_AFTER_MS,
        "watch_s": WATCH_S,
        "absent": absent,
        "reclaimer_alone": reclaimer,
        "give_back_safe": safe,
        "safe_vs_reclaimer_returned": round(safe["returned_mib"] / reclaimer["returned_mib"], 3)
        if reclaimer["returned_mib"] > 0
        else None,
    }
    if plot_path is not None:
        figures["plot"] = plot(figures, plot_path)
    for side in ("reclaimer_alone", "give_back_safe"):
        figures[side] = {k: v for k, v in figures[side].items() if k != "rss_timeline"}
    return figures


def plot(figures: dict[str, Any], path: Path) -> str:
    """QEMU's RSS for both phases on one time axis, 0 at the action; needs matplotlib."""
    lines = [
        (f"{label}: {figures[side]['returned_mib']} MiB back", figures[side]["rss_timeline"])
        for side, label in (
            ("reclaimer_alone", "working-set reclaimer alone"),
            ("give_back_safe", "guestctl give-back --safe (balloon)"),
        )
    ]
    title = f"{COLD_MIB} MiB cold, {HOT_MIB} MiB hot, same guest, same run"
    return rss_timelines(lines, path, title)


def main() -> int:
    args = alone.parser(__doc__, "giveback").parse_args()
    return alone.write(args.out, measure_giveback(args.out.with_suffix(".png")))


if __name__ == "__main__":
    raise SystemExit(main())
