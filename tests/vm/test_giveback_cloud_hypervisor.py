"""`guestctl give-back --follow` through the Cloud Hypervisor stand-in (tests/standins/: its
documented API over a unix socket, driving this QEMU guest's balloon over QMP, since Cloud
Hypervisor does not run here without KVM): the follow scenario of test_giveback_follow.py,
and every request body the stand-in received checked against the VMM's published schema.
A guest of its own (1 GiB boot memory, a balloon, a swap disk), as test_giveback_firecracker
has: run second in one guest, the scenario's fall stayed under 90 % of the cold set for over
ten minutes, twice (2026-12-04), as the first one's freed pages had been reported back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import Disk, GuestVM, VMConfig
from tests.standins import schema
from tests.standins.cloud_hypervisor import CloudHypervisorStandIn
from tests.standins.server import StandIn
from tests.vm.guest import boot_and_record
from tests.vm.pace import Pace
from tests.vm.test_giveback_follow import check
from tests.workloads.giveback import grow_after_give_back

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),))
    yield from boot_and_record(config, image, tmp_path_factory, RESULTS, "giveback_ch")


def through(
    kind: type[StandIn], vmm: str, vm: GuestVM, agent: AgentClient, pace: Pace, tmp_path: Path
) -> dict[str, Any]:
    """The scenario through the stand-in; its figures, with what the stand-in received."""
    with kind(tmp_path / "api.sock", vm.host_qmp_path) as stand_in:
        api = ["--vmm", vmm, "--api", str(stand_in.api_path)]
        figures = grow_after_give_back(vm, agent, pace.scale, *api)
    figures["requests"] = sorted({f"{r.method} {r.path}" for r in stand_in.received})
    figures["schema_errors"] = [
        e for r in stand_in.received for e in schema.request_errors(vmm, r.method, r.path, r.body)
    ]
    figures["bodies"] = [r.body for r in stand_in.received if r.body is not None][:20]
    return figures


def test_follow_through_cloud_hypervisor(
    vm: GuestVM, agent: AgentClient, pace: Pace, tmp_path: Path
) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    figures = through(CloudHypervisorStandIn, "cloud-hypervisor", vm, agent, pace, tmp_path)
    RESULTS["cloud-hypervisor"] = figures
    assert "PUT /api/v1/vm.resize" in figures["requests"], figures["requests"]
    assert figures["schema_errors"] == []
    check(figures)
