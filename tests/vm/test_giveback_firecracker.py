"""`guestctl give-back --follow` through the Firecracker stand-in (tests/standins/: its
documented API over a unix socket, driving this QEMU guest's balloon over QMP, since
Firecracker does not run here without KVM): the follow scenario of test_giveback_follow.py,
the balloon read back through `GET /balloon/statistics`, and every request body the stand-in
received checked against the VMM's published schema. A guest of its own (1 GiB boot memory,
a balloon, a swap disk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import Disk, GuestVM, VMConfig
from tests.standins.firecracker import FirecrackerStandIn
from tests.vm.guest import boot_and_record
from tests.vm.pace import Pace
from tests.vm.test_giveback_cloud_hypervisor import through
from tests.vm.test_giveback_follow import check

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),))
    yield from boot_and_record(config, image, tmp_path_factory, RESULTS, "giveback_fc")


def test_follow_through_firecracker(
    vm: GuestVM, agent: AgentClient, pace: Pace, tmp_path: Path
) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    figures = through(FirecrackerStandIn, "firecracker", vm, agent, pace, tmp_path)
    RESULTS["firecracker"] = figures
    assert "PATCH /balloon" in figures["requests"], figures["requests"]
    assert "GET /balloon/statistics" in figures["requests"], figures["requests"]
    assert figures["schema_errors"] == []
    check(figures)
