"""`guestctl give-back --follow` through QEMU against a real guest (issue 37): the cold set
goes back, then the workload grows by 300 MiB and the loop lets the guest have it before any
OOM kill, the balloon ending within the agent's figure and the hot loop kept within 1.2x
paced; SIGTERM stops the loop and leaves the balloon where it is. One guest (1 GiB boot
memory, a balloon, a swap disk). The same loop through the Cloud Hypervisor and Firecracker
stand-ins, which drive QEMU's balloon as this test does: tests/unit/host/test_follow_standins.py."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import module_guest
from tests.vm.pace import Pace
from tests.workloads.giveback import FALL_OF_COLD, grow_after_give_back

pytestmark = pytest.mark.vm

# The hot loop's paced slowdown while the workload grows (issue 37).
HOT_WHILE_GROWING = 1.2

RESULTS: dict[str, Any] = {}

vm = module_guest(
    VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),)),
    RESULTS,
    "giveback_follow",
)


def test_follow_gives_back_the_cold_set_and_lets_the_growth_out(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    figures = grow_after_give_back(vm, agent, pace.scale, "--qmp", str(vm.host_qmp_path))
    RESULTS["qemu"] = figures
    summary = {k: v for k, v in figures.items() if k != "follow_stderr"}
    assert figures["balloon_taken_mib_after_fall"] * MIB > 0, summary
    assert figures["rss_fall_fraction_of_cold"] >= FALL_OF_COLD, summary
    assert figures["oom_kills"] == 0, summary
    # Let out as the guest grew: the loop gave back while the growth went on (the growth
    # itself waited for, so it got its memory), and the balloon ended within the figure
    # (grow_after_give_back waits for that).
    let_out = [d for d in figures["deflates_during_growth"] if d["cause"] != "stopped"]
    assert let_out, summary
    assert figures["hot_slowdown_paced_during_growth"] <= HOT_WHILE_GROWING, summary
    # Stopped cleanly, saying it left the device where it was.
    last = figures["follow_last_event"]
    assert figures["follow_exit"] == 0 and last["event"] == "stopped", summary
    assert "left where it is" in last["note"], summary
