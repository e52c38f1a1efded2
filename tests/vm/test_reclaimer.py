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
from tests.vm.pace import Pace
from tests.workloads.reclaim import (
    CONFIG,
    COUNTED_WITHIN_S,
    SETTLE_S,
    WITHIN_S,
    assert_cold_evicted_bounds,
    assert_no_thrash_bounds,
    assert_off_then_on_bounds,
    no_thrash,
    off_then_on,
    start_workload,
    stop_workload,
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
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    # 80 % ends the window: what stays past it is not the pod's (docs/measurements.md).
    RESULTS["off_then_on"] = figures = off_then_on(
        vm,
        agent,
        within_s=pace.scale(WITHIN_S),
        until=0.8,
        counted_within_s=pace.scale(COUNTED_WITHIN_S),
    )
    assert_off_then_on_bounds(figures, pace.factor)
    assert_cold_evicted_bounds(figures, pace.factor)


def test_no_thrash_when_the_hot_set_is_most_of_the_memory(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    RESULTS["no_thrash"] = figures = no_thrash(vm, agent, settle_within_s=pace.scale(SETTLE_S))
    assert_no_thrash_bounds(figures, pace.factor)


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
