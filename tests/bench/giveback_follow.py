"""The grow-after-give-back scenario (issue 37) three ways in one guest and one run: free page
reporting alone (the balloon device reports free pages and is never inflated), a one-shot
`guestctl give-back --safe`, and `give-back --follow`. Each phase starts the workload of
tests/bench/giveback.py in a cgroup of its own (400 MiB touched once, a 100 MiB hot loop),
waits until the agent counts the cold set cold, acts, and GROW_AFTER_S later starts 300 MiB
more in the same cgroup; the host samples QEMU's RSS (without TCG's code), the guest's stall
and its OOM kills every second until WATCH_AFTER_S after the growth. The hot loop's paced
slowdown is taken before the action (baseline), in the minute after the growth and in
the last minute.
`python -m tests.bench.giveback_follow --out FILE.json` runs it alone; the plot lands beside."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.bench import alone
from tests.bench.giveback import CONFIG, wait_cold
from tests.bench.plotting import rss_timelines
from tests.bench.vm import booted
from tests.vm.guest import filler_ready, make_cgroup, start_filler, stop_filler, wait_until
from tests.workloads.giveback import (
    COLD_MIB,
    GROW_MIB,
    HOT_MIB,
    MIB,
    FollowProcess,
    balloon_taken,
    done,
    full_size,
    give_back,
)
from tests.workloads.reclaim import (
    Sampler,
    guest_time,
    iteration_log,
    slowdown,
    start_workload,
    stop_workload,
    within,
)

GROW_AFTER_S = 90.0
WATCH_AFTER_S = 90.0
ARMS = (
    ("reporting_alone", "free page reporting alone"),
    ("one_shot", "give-back --safe once"),
    ("follow", "give-back --follow"),
)


def phase(
    vm: GuestVM, agent: AgentClient, cgroup: str, act: Callable[[], Any], end: Callable[[], Any]
) -> dict[str, Any]:
    make_cgroup(vm, cgroup)
    with Sampler(vm, agent, cgroup) as sampler:
        out = start_workload(vm, cgroup, COLD_MIB + HOT_MIB, HOT_MIB)
        baseline_from = guest_time(vm)
        wait_cold(agent, cgroup)
        baseline_until = guest_time(vm)
        acted_at = sampler.now()
        detail = act()
        time.sleep(max(0.0, GROW_AFTER_S - (sampler.now() - acted_at)))
        grown_at_host = sampler.now()
        grow_from = guest_time(vm)
        taken_before = balloon_taken(vm)
        marker = start_filler(vm, cgroup, GROW_MIB, name=f"grow-{cgroup}")
        ready = wait_until(
            lambda: filler_ready(vm, marker) and sampler.now(), 600, "the growth", every=1.0
        )
        time.sleep(max(0.0, WATCH_AFTER_S - (sampler.now() - grown_at_host)))
        until = guest_time(vm)
        detail = {"act": detail, "end": end()}
        log = iteration_log(vm, out)
        taken_after = balloon_taken(vm)
        stop_filler(vm, f"grow-{cgroup}")
        stop_workload(vm, out)
    vm.balloon(full_size(vm))
    rows = sampler.rows
    before = [r for r in rows if r["t"] <= acted_at]
    grown = [r for r in rows if r["t"] >= grown_at_host]
    baseline = within(log, baseline_from, baseline_until)
    return {
        "qemu_guest_rss_at_action_mib": round(before[-1]["qemu_guest_rss"] / MIB, 1),
        "qemu_guest_rss_before_growth_mib": round(grown[0]["qemu_guest_rss"] / MIB, 1),
        "qemu_guest_rss_end_mib": round(rows[-1]["qemu_guest_rss"] / MIB, 1),
        "qemu_guest_rss_mean_mib": round(
            sum(r["qemu_guest_rss"] for r in rows if r["t"] >= acted_at)
            / MIB
            / max(1, len([r for r in rows if r["t"] >= acted_at])),
            1,
        ),
        "balloon_taken_before_growth_mib": round(taken_before / MIB, 1),
        "balloon_taken_end_mib": round(taken_after / MIB, 1),
        "growth_seconds": round(float(ready) - grown_at_host, 1),
        "hot_slowdown_paced_first_minute_of_growth": slowdown(
            baseline, within(log, grow_from, grow_from + 60)
        ),
        "hot_slowdown_paced_last_minute": slowdown(baseline, within(log, until - 60, until)),
        "oom_kills": rows[-1]["oom_kill"] - rows[0]["oom_kill"],
        "stall_us_per_s_after_growth": stall_rate(grown),
        "detail": detail,
        "rss_timeline": [
            (round(r["t"] - acted_at, 1), round(r["qemu_guest_rss"] / MIB, 1)) for r in rows
        ],
        "grow_at_s": round(grown_at_host - acted_at, 1),
    }


def stall_rate(rows: list[dict[str, Any]]) -> float | None:
    if len(rows) < 2 or rows[0]["stall_total_us"] is None:
        return None
    span = rows[-1]["t"] - rows[0]["t"]
    return round((rows[-1]["stall_total_us"] - rows[0]["stall_total_us"]) / max(span, 1e-6))


def measure_follow(plot_path: Path | None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with booted(CONFIG) as (vm, agent):
        agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
        qmp = ("--qmp", str(vm.host_qmp_path))
        follow: list[FollowProcess] = []

        def one_shot() -> dict[str, Any]:
            result = done(give_back(vm, "--safe", "--via", "balloon"))
            return {"step": result["step"], "settled": result["settled"]}

        def start_follow() -> str:
            follow.append(FollowProcess.start(vm.agent_target, *qmp))
            return "started"

        def stop_follow() -> dict[str, Any]:
            rc, err = follow[0].stop()
            changes = [e for e in follow[0].events if e["event"] in ("inflate", "deflate")]
            return {"exit": rc, "changes": changes, "stderr": err[-500:]}

        def nothing() -> None:
            return None

        results["reporting_alone"] = phase(vm, agent, "fpr", nothing, nothing)
        results["one_shot"] = phase(vm, agent, "once", one_shot, nothing)
        results["follow"] = phase(vm, agent, "follow", start_follow, stop_follow)
    figures: dict[str, Any] = {
        "grow_after_s": GROW_AFTER_S,
        "watch_after_s": WATCH_AFTER_S,
        "cold_mib": COLD_MIB,
        "hot_mib": HOT_MIB,
        "grow_mib": GROW_MIB,
        **results,
    }
    if plot_path is not None:
        figures["plot"] = plot(figures, plot_path)
    for side, _ in ARMS:
        figures[side] = {k: v for k, v in figures[side].items() if k != "rss_timeline"}
    return figures


def plot(figures: dict[str, Any], path: Path) -> str:
    lines = [
        (f"{label} ({figures[side]['oom_kills']} OOM kills)", figures[side]["rss_timeline"])
        for side, label in ARMS
    ]
    return rss_timelines(
        lines,
        path,
        f"{COLD_MIB} MiB cold, {HOT_MIB} MiB hot, then +{GROW_MIB} MiB; one guest",
        xlabel="seconds from the action (dashed: the workload grows by 300 MiB)",
        marks=[figures["follow"]["grow_at_s"]],
    )


def main() -> int:
    args = alone.parser(__doc__, "giveback_follow").parse_args()
    return alone.write(args.out, measure_follow(args.out.with_suffix(".png")))


if __name__ == "__main__":
    raise SystemExit(main())
