"""`guestctl give-back --follow` through the Cloud Hypervisor stand-in (tests/standins/: its
documented API over a unix socket, driving this QEMU guest's balloon over QMP, since Cloud
Hypervisor does not run here without KVM): the follow scenario of test_giveback_follow.py,
and every request body the stand-in received checked against the VMM's published schema.
A guest of its own (tests/vm/follow.py says why)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.vm.qemu import GuestVM
from tests.standins.cloud_hypervisor import CloudHypervisorStandIn
from tests.vm.follow import FOLLOW_GUEST, through
from tests.vm.guest import module_guest
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}

vm = module_guest(FOLLOW_GUEST, RESULTS, "giveback_ch")


def test_follow_through_cloud_hypervisor(
    vm: GuestVM, agent: AgentClient, pace: Pace, tmp_path: Path
) -> None:
    figures = through(CloudHypervisorStandIn, "cloud-hypervisor", vm, agent, pace, tmp_path)
    RESULTS["cloud-hypervisor"] = figures
    assert "PUT /api/v1/vm.resize" in figures["requests"], figures["requests"]
