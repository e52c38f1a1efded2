"""`guestctl give-back --follow` through QEMU against a real guest (issue 37): the cold set
goes back, then the workload grows by 300 MiB and the loop lets the guest have it before any
OOM kill, the balloon ending within the agent's figure and the hot loop kept within 1.2x
paced; SIGTERM stops the loop and leaves the balloon where it is. Then (issue 56) the VM goes
away under a loop that holds balloon memory: QEMU is killed, and the loop ends by itself with
its `gone` line and exit 3 within its --gone-after bound. One guest (1 GiB boot memory, a
balloon, a swap disk), killed by the last test. The same loop through the Cloud Hypervisor and
Firecracker stand-ins, which drive QEMU's balloon as this test does:
tests/unit/host/test_follow_standins.py."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.giveback.follow import GONE
from guestagent.host.sizing.boot import Disk, VMConfig
from guestagent.host.streams import backoff_delay
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import module_guest, wait_until
from tests.vm.pace import Pace
from tests.workloads.giveback import (
    FALL_OF_COLD,
    FOLLOW_ARGS,
    FollowProcess,
    full_size,
    grow_after_give_back,
)

pytestmark = pytest.mark.vm

# The hot loop's paced slowdown while the workload grows (issue 37).
HOT_WHILE_GROWING = 1.2
# --gone-after for the loop whose VM goes away (30 s by default): shorter, so the test is.
GONE_AFTER_S = 10.0
# What the loop holds in the balloon when its VM goes away.
HELD_MIB = 256

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


def test_follow_ends_when_its_vm_is_gone(vm: GuestVM, agent: AgentClient, pace: Pace) -> None:
    """The module's last test: it kills the guest's QEMU under a loop holding balloon memory.
    The loop hears that through both its stream (the agent is gone with the VM) and its QMP
    connection; either way it must end by itself, saying so, within --gone-after and the
    longest delay before it opens the stream again."""
    full = full_size(vm)
    vm.balloon(full - HELD_MIB * MIB)
    wait_until(
        lambda: vm.qmp("query-balloon")["actual"] == full - HELD_MIB * MIB,
        pace.scale(120),
        f"the balloon to take {HELD_MIB} MiB",
    )
    gone_after = ("--gone-after", f"{GONE_AFTER_S:g}")
    follow = FollowProcess.start(
        vm.agent_target,
        "--qmp",
        str(vm.host_qmp_path),
        follow_args=(*FOLLOW_ARGS, *gone_after),
    )
    try:
        wait_until(
            lambda: follow.alive() and follow.changes("following"),
            pace.scale(60),
            "the loop to start following",
        )
        assert follow.changes("following")[0]["asked"] == HELD_MIB * MIB
        killed_at = time.monotonic()
        os.kill(vm.pid, signal.SIGKILL)
        # The loop sees the agent gone when a reopened stream fails, and reopens after a
        # delay that doubles up to backoff_delay's cap: it ends at most that long after
        # --gone-after, with a few seconds for the host's own work.
        bound = GONE_AFTER_S + backoff_delay(32) + 5
        rc = follow.process.wait(timeout=bound + 60)
        took = time.monotonic() - killed_at
    finally:
        if follow.process.poll() is None:
            follow.stop()
    assert follow.process.stderr is not None
    stderr = follow.process.stderr.read()
    last = follow.events[-1] if follow.events else None
    RESULTS["vm_gone"] = {
        "exit": rc,
        "seconds_to_end": round(took, 1),
        "bound_s": bound,
        "last_event": last,
        "stderr_tail": stderr[-3000:],
    }
    assert rc == GONE, RESULTS["vm_gone"]
    assert last is not None and last["event"] == "gone", RESULTS["vm_gone"]
    assert "has not answered" in last["why"], RESULTS["vm_gone"]
    assert took <= bound, RESULTS["vm_gone"]
