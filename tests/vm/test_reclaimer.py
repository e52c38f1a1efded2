"""The working-set reclaimer in a real guest: what QEMU's RSS gives back with the policy off
and on, that it does not thrash a workload whose hot set is most of its memory, and that it
follows the host's turns (off stops it, a removed cgroup is dropped)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import boot, wait_until
from tests.workloads.reclaim import (
    ANON_MIB,
    CONFIG,
    HOT_MIB,
    STALL_TARGET_US,
    no_thrash,
    off_then_on,
    start_workload,
    stop_workload,
    without_timelines,
)

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    yield from boot(CONFIG, image, tmp_path_factory)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "reclaimer.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def test_cold_memory_goes_back_to_the_host_only_with_the_policy_on(
    vm: GuestVM, agent: AgentClient
) -> None:
    figures = off_then_on(vm, agent)
    RESULTS["off_then_on"] = figures
    summary = without_timelines(figures)
    # Off: QEMU keeps (nearly) all of it; on: at least 80 % of the cold bytes leave within 120 s.
    assert figures["control_returned_fraction"] < 0.2, summary
    assert figures["seconds_to_80_percent"] is not None, summary
    assert figures["swap_file_allocated_mib"] <= (ANON_MIB - HOT_MIB) * 1.1, summary
    assert figures["oom_kills"] == 0, summary
    assert figures["hot_slowdown_paced"] <= 1.5, summary
    assert figures["stall_us_per_s_on"] <= STALL_TARGET_US, summary


def test_no_thrash_when_the_hot_set_is_most_of_the_memory(vm: GuestVM, agent: AgentClient) -> None:
    figures = no_thrash(vm, agent)
    RESULTS["no_thrash"] = figures
    summary = without_timelines(figures)
    # Backed off: reclaimed bytes flat, few refaults, stall within the target, measured over
    # the last 20 s. Finding the edge of the hot set costs a stall once (recorded as
    # stall_ms_whole_window: 268 and 351 ms in two runs under TCG): the price of finding it by
    # probing.
    assert figures["reclaimed_mib_last_20_s"] <= 32, summary  # A plateau, not a slope.
    assert figures["majfaults_per_s_last_20_s"] <= 2048, summary  # Under 8 MiB/s of swap-in.
    assert figures["stall_us_per_s_last_20_s"] <= STALL_TARGET_US, summary
    # The hot loop in units of the guest's pace (see tests/workloads/reclaim.py, WORKLOAD): the raw
    # medians went 122.8 -> 154.9 ms (1.26x) in a stressed run with the reclaimer idle and
    # 1 major fault/s, the host's pace changing between the windows.
    assert figures["hot_slowdown_paced"] <= 1.2, summary


def test_turns_with_the_host(vm: GuestVM, agent: AgentClient) -> None:
    # A slow policy on mostly cold memory, so it is mid-way when turned off.
    slow = pb.ReclaimPolicy(anon=True, max_step_fraction=0.01)
    out = start_workload(vm, "turns", 200, 8)
    agent.set_reclaim_policy("turns", True, slow)
    wait_until(
        lambda: agent.reclaim_status(["turns"]).targets[0].reclaimed_total_bytes > 4 * MIB,
        60,
        "the reclaimer to be under way",
    )
    off = agent.set_reclaim_policy("turns", False)
    assert off.state == pb.RECLAIM_STATE_DISABLED
    time.sleep(1.5)  # One interval (1 s) for a write already under way to finish.
    after_one = agent.reclaim_status(["turns"]).targets[0].reclaimed_total_bytes
    current_after_one = agent.info(["turns"]).cgroups[0].current_bytes
    time.sleep(3)
    later = agent.reclaim_status(["turns"]).targets[0]
    current_later = agent.info(["turns"]).cgroups[0].current_bytes
    RESULTS["turns"] = {
        "reclaimed_at_off_mib": round(off.reclaimed_total_bytes / MIB, 1),
        "reclaimed_one_interval_later_mib": round(after_one / MIB, 1),
        "reclaimed_four_intervals_later_mib": round(later.reclaimed_total_bytes / MIB, 1),
        "current_one_interval_later_mib": round(current_after_one / MIB, 1),
        "current_four_intervals_later_mib": round(current_later / MIB, 1),
    }
    assert later.reclaimed_total_bytes == after_one, RESULTS["turns"]
    assert current_later >= current_after_one - 2 * MIB, RESULTS["turns"]

    # Removing the cgroup drops its target, on or off.
    agent.set_reclaim_policy("turns", True, slow)
    stop_workload(vm, out)
    vm.exec(["rmdir", "/sys/fs/cgroup/turns"])
    started = time.monotonic()
    wait_until(
        lambda: "turns" not in [t.cgroup for t in agent.reclaim_status().targets],
        30,
        "the removed cgroup's target to be dropped",
    )
    RESULTS["turns"]["dropped_after_s"] = round(time.monotonic() - started, 1)
