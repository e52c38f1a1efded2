"""The working-set reclaimer's figures from one guest run, and their plot: QEMU's RSS over
time with the policy off (the control) and then on, the hot set's iteration time and the
pod's stall per interval. `python -m tests.bench.reclaimer --out FILE.json` runs it alone;
`--cmdline "psi=0"` boots the same image with more kernel arguments (docs/measurements.md)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import DEFAULT_IMAGE_DIR, GuestVM
from tests.bench.plotting import NOT_DRAWN, pyplot, save
from tests.workloads.reclaim import (
    CONFIG,
    MIB,
    STALL_TARGET_US,
    no_thrash,
    off_then_on,
    without_timelines,
)


def measure_reclaimer(plot_path: Path | None, cmdline: str = "") -> dict[str, Any]:
    # GUESTAGENT_IMAGE_DIR, as for the VM tests: a kept copy measures one image across runs.
    image = Path(os.environ.get("GUESTAGENT_IMAGE_DIR", DEFAULT_IMAGE_DIR))
    with (
        GuestVM(replace(CONFIG, extra_cmdline=cmdline), image_dir=image) as vm,
        AgentClient(vm.agent_target, timeout=600) as agent,
    ):
        agent.wait_ready(60)
        scenario = off_then_on(vm, agent)
        thrash = no_thrash(vm, agent)
    figures: dict[str, Any] = {
        "kernel_cmdline_added": cmdline,
        "off_then_on": without_timelines(scenario),
        "no_thrash": without_timelines(thrash),
        "targets": {
            "returned_fraction_within_120_s": 0.8,
            "swap_file_at_most_mib": round(scenario["cold_anon_mib"] * 1.1, 1),
            "hot_slowdown_paced_at_most": 1.5,
            "no_thrash_hot_slowdown_paced_at_most": 1.2,
            "stall_us_per_s_at_most": STALL_TARGET_US,
        },
    }
    if plot_path is not None:
        figures["plot"] = plot(scenario, plot_path)
    return figures


def plot(scenario: dict[str, Any], path: Path) -> str:
    """Draw the run as a PNG; needs the bench extra (matplotlib), else says so."""
    plt = pyplot()
    if plt is None:
        return NOT_DRAWN
    rows = scenario["timeline"]
    t = [r["t"] for r in rows]
    on_at = scenario["policy_on_at_s"]
    figure, (rss, hot, stall) = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    rss.plot(t, [r["qemu_guest_rss"] / MIB for r in rows], label="QEMU RSS less TCG code")
    rss.plot(t, [r["current"] / MIB for r in rows], label="pod memory.current")
    rss.set_ylabel("MiB")
    rss.legend(loc="upper right")
    rss.set_title(
        f"{scenario['cold_mib']} MiB cold, {scenario['returned_fraction']:.0%} back to the host"
    )
    hot_rows = [(s, ms) for s, ms in scenario["hot_timeline"] if s >= 0]
    hot.plot([s for s, _ in hot_rows], [ms * 1000 for _, ms in hot_rows], ".", markersize=2)
    hot.set_ylabel("hot loop iteration (ms)")
    deltas = [
        (b["t"], (b["stall_total_us"] - a["stall_total_us"]) / max(b["t"] - a["t"], 1e-6))
        for a, b in itertools.pairwise(rows)
        if a["stall_total_us"] is not None and b["stall_total_us"] is not None
    ]
    stall.plot([x for x, _ in deltas], [y for _, y in deltas], label="pod stall (some)")
    stall.axhline(STALL_TARGET_US, color="red", linestyle="--", label="target")
    stall.set_ylabel("stall us per s")
    stall.set_xlabel("seconds")
    stall.legend(loc="upper right")
    for axis in (rss, hot, stall):
        axis.axvline(on_at, color="grey", linestyle=":")
    rss.annotate("policy on", (on_at, rss.get_ylim()[1]), va="top", ha="left")
    return save(plt, figure, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("tests/bench/results/reclaimer.json"))
    parser.add_argument("--cmdline", default="", help="kernel arguments added, e.g. psi=0")
    args = parser.parse_args()
    figures = measure_reclaimer(args.out.with_suffix(".png"), args.cmdline)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
