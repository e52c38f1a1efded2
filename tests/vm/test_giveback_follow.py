"""`guestctl give-back --follow` through QEMU against a real guest (issue 37): the cold set
goes back, then the workload grows by 300 MiB and the loop lets the guest have it before any
OOM kill, the balloon ending within the agent's figure and the hot loop kept within 1.2x
paced; SIGTERM stops the loop and leaves the balloon
where it is. One guest (1 GiB boot memory, a balloon, a swap disk)."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM
from tests.vm.follow import FOLLOW_GUEST, check, enable_swap
from tests.vm.guest import module_guest
from tests.vm.pace import Pace
from tests.workloads.giveback import grow_after_give_back

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}

vm = module_guest(FOLLOW_GUEST, RESULTS, "giveback_follow")


def test_follow_gives_back_the_cold_set_and_lets_the_growth_out(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    enable_swap(agent)
    figures = grow_after_give_back(vm, agent, pace.scale, "--qmp", str(vm.host_qmp_path))
    RESULTS["qemu"] = figures
    assert figures["balloon_taken_mib_after_fall"] * MIB > 0
    check(figures)
