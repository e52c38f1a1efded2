"""The follow scenario (`guestctl give-back --follow`, tests/workloads/giveback.py) as the
QEMU test and the Cloud Hypervisor and Firecracker stand-ins' tests run it: one guest each,
the same checks, and for a stand-in, what it received checked against the VMM's schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.standins import schema
from tests.standins.server import StandIn
from tests.vm.pace import Pace
from tests.workloads.giveback import FALL_OF_COLD, grow_after_give_back

# 1 GiB boot memory, a balloon, a swap disk: a guest of its own for each VMM, since in one
# guest the second run's fall stayed under 90 % of the cold set for over ten minutes, twice
# (2026-12-04), as the first run's freed pages had been reported back.
FOLLOW_GUEST = VMConfig(memory_mib=1024, disks=(Disk("swap", 1 << 30, serial="swap0"),))
# The hot loop's paced slowdown while the workload grows (issue 37).
HOT_WHILE_GROWING = 1.2


def enable_swap(agent: AgentClient) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))


def check(figures: dict[str, Any]) -> None:
    """The scenario's assertions, shared with the stand-ins' test."""
    summary = {k: v for k, v in figures.items() if k != "follow_stderr"}
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


def through(
    kind: type[StandIn], vmm: str, vm: GuestVM, agent: AgentClient, pace: Pace, tmp_path: Path
) -> dict[str, Any]:
    """The scenario through the stand-in, checked; its figures, with what the stand-in
    received (every body valid by the VMM's published schema)."""
    enable_swap(agent)
    with kind(tmp_path / "api.sock", vm.host_qmp_path) as stand_in:
        api = ["--vmm", vmm, "--api", str(stand_in.api_path)]
        figures = grow_after_give_back(vm, agent, pace.scale, *api)
    figures["requests"] = sorted({f"{r.method} {r.path}" for r in stand_in.received})
    figures["schema_errors"] = [
        e for r in stand_in.received for e in schema.request_errors(vmm, r.method, r.path, r.body)
    ]
    figures["bodies"] = [r.body for r in stand_in.received if r.body is not None][:20]
    assert figures["schema_errors"] == []
    check(figures)
    return figures
