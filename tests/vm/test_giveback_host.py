"""`guestctl give-back` from the host against a real guest and its QEMU: the balloon to the
agent's safe figure takes the cold set and spares the hot loop, virtio-mem to its safe figure
keeps a holder's memory, and a size below the safe one is refused with nothing changed. One
guest (1 GiB boot memory, a balloon, a 1 GiB virtio-mem device, a swap disk) runs the three
in order; each leaves the guest as it found it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import Disk, VirtioMem, VMConfig
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import (
    boot_and_record,
    filler_ready,
    kb_field,
    make_cgroup,
    oom_kills,
    start_filler,
    stop_filler,
    wait_until,
)
from tests.vm.pace import Pace
from tests.workloads.cold_count import COLD_AFTER_MS, counted_cold
from tests.workloads.giveback import (
    COLD_MIB,
    HOT_MIB,
    done,
    full_size,
    give_back,
    guest_rss,
)
from tests.workloads.reclaim import (
    guest_time,
    iteration_log,
    slowdown,
    start_workload,
    stop_workload,
    within,
)

pytestmark = pytest.mark.vm

BOOT_MIB = 1024
DEVICE_MIB = 1024
HOLDER_MIB = 400
# The guest must keep working this long after the balloon has settled (issue 23).
AFTER_SECONDS = 60.0
# QEMU's RSS (without TCG's translated code) falls by at least this much of the cold set
# (issue 23); measured 0.987 on 2026-12-04.
FALL_OF_COLD = 0.9
# And stays down: 60 s later the guest has taken back at most 5 % of the set, from the memory
# the balloon left it (the test's own commands and the loop's log; 11-13 MiB in the runs of
# 2026-12-06).
FALL_OF_COLD_LATER = 0.85
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def vm(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVM]:
    config = VMConfig(
        memory_mib=BOOT_MIB,
        disks=(Disk("swap", 1 << 30, serial="swap0"),),
        virtio_mem=VirtioMem(max_mib=DEVICE_MIB),
    )
    yield from boot_and_record(config, image, tmp_path_factory, RESULTS, "giveback_host")


def test_safe_balloon_takes_the_cold_set_and_spares_the_hot_loop(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    kills = oom_kills(vm)
    out = start_workload(vm, "gb", COLD_MIB + HOT_MIB, HOT_MIB)
    baseline_from = guest_time(vm)
    guest_cold, cgroup_cold = counted_cold(
        agent, "gb", pace.scale(COLD_AFTER_MS / 1000 * 4), COLD_MIB * MIB
    )
    during_from = guest_time(vm)
    run = give_back(vm, "--safe", "--via", "balloon")
    after_from = guest_time(vm)
    try:
        result = done(run)
        # Keeps working: the hot loop goes on, and the agent and a command answer, for 60 s.
        # QEMU drops each page as the guest hands it over, and the guest may still be handing
        # pages over when the command stops watching: the fall is the lowest RSS in the 60 s.
        lowest_rss = guest_rss(result["rss_after"])
        deadline = time.monotonic() + AFTER_SECONDS
        while time.monotonic() < deadline:
            assert agent.health() == "SERVING"
            vm.exec(["true"])
            lowest_rss = min(lowest_rss, vm.qemu_guest_rss_bytes())
            time.sleep(5)
        after_until = guest_time(vm)
        rss_later, guest_rss_later = vm.qemu_rss_bytes(), vm.qemu_guest_rss_bytes()
        log = iteration_log(vm, out)
    finally:
        full = full_size(vm)
        vm.balloon(full)
        stop_workload(vm, out)
        wait_until(
            lambda: vm.qmp("query-balloon")["actual"] == full,
            pace.scale(120),
            "the balloon to deflate",
        )
    baseline = within(log, baseline_from, during_from)
    during = within(log, during_from, after_from)
    after = within(log, after_from, after_until)
    # RSS without TCG's translated-code buffer, which grew by up to 550 MiB in that minute
    # whatever the guest held (2026-12-04): the guest's memory and QEMU's own.
    before_rss, after_rss = guest_rss(result["rss_before"]), guest_rss(result["rss_after"])
    figures = {
        "step": result["step"],
        "settled": result["settled"],
        # Set when the balloon stood still short of the step: the guest as it did.
        "at_stop": result.get("at_stop"),
        "cold_mib_cgroup": round(cgroup_cold / MIB, 1),
        "cold_mib_guest": round(guest_cold / MIB, 1),
        "qemu_vmrss_before_mib": round(result["rss_before"]["rss_bytes"] / MIB, 1),
        "qemu_vmrss_60_s_later_mib": round(rss_later / MIB, 1),
        "qemu_rss_before_mib": round(before_rss / MIB, 1),
        "qemu_rss_after_mib": round(after_rss / MIB, 1),
        "qemu_rss_lowest_mib": round(lowest_rss / MIB, 1),
        "qemu_rss_60_s_later_mib": round(guest_rss_later / MIB, 1),
        "rss_fall_fraction_of_cold": round((before_rss - lowest_rss) / (COLD_MIB * MIB), 3),
        "rss_fall_fraction_of_cold_60_s_later": round(
            (before_rss - guest_rss_later) / (COLD_MIB * MIB), 3
        ),
        "hot_iterations": [len(baseline), len(during), len(after)],
        "hot_slowdown_paced_during": slowdown(baseline, during),
        "hot_slowdown_paced_after": slowdown(baseline, after),
        "oom_kills": oom_kills(vm) - kills,
        "output": run.stdout,
    }
    RESULTS["balloon"] = figures
    summary = {k: v for k, v in figures.items() if k != "output"}
    assert figures["hot_slowdown_paced_during"] <= 1.10, summary
    assert figures["hot_slowdown_paced_after"] <= 1.10, summary
    assert figures["oom_kills"] == 0, summary
    assert figures["rss_fall_fraction_of_cold"] >= FALL_OF_COLD, summary
    assert figures["rss_fall_fraction_of_cold_60_s_later"] >= FALL_OF_COLD_LATER, summary


def test_a_size_below_the_safe_one_is_refused_and_nothing_changes(vm: GuestVM) -> None:
    dry = done(give_back(vm, "--safe", "--dry-run"))
    # The step is in bytes the balloon takes; --to and the refusal speak QEMU's terms.
    safe = dry["step"]["ram"] - dry["step"]["value"]
    actual = vm.qmp("query-balloon")["actual"]
    below = safe - 64 * MIB
    run = give_back(vm, "--to", str(below))
    # The figure moves by a few pages between two reports: read the one the refusal names.
    named = re.search(r"below the safe balloon size (\d+)", run.stderr)
    RESULTS["refusal"] = {"safe": safe, "asked": below, "rc": run.returncode, "err": run.stderr}
    assert dry["dry_run"] and "compact" not in dry, dry
    assert run.returncode == 2, RESULTS["refusal"]
    assert f"--to {below} " in run.stderr and named is not None, RESULTS["refusal"]
    assert abs(int(named[1]) - safe) < 16 * MIB, RESULTS["refusal"]
    assert vm.qmp("query-balloon")["actual"] == actual


def test_safe_virtio_mem_keeps_the_holder(vm: GuestVM, agent: AgentClient, pace: Pace) -> None:
    kills = oom_kills(vm)
    vm.set_virtio_mem_requested(DEVICE_MIB * MIB)
    wait_until(
        lambda: agent.info().hotplug.virtio_mem[0].plugged_bytes == DEVICE_MIB * MIB,
        pace.scale(120),
        f"{DEVICE_MIB} MiB plugged and onlined",
    )
    make_cgroup(vm, "holder")
    marker = start_filler(vm, "holder", HOLDER_MIB, name="holder")
    wait_until(lambda: filler_ready(vm, marker), pace.scale(600), "the holder's allocation")
    try:
        result = done(give_back(vm, "--safe", "--via", "virtio-mem"))
        pid = vm.exec(["cat", "/run/holder.pid"]).stdout.strip()
        holder_rss = kb_field(vm.exec(["cat", f"/proc/{pid}/status"]).stdout, "VmRSS")
        plugged, requested = vm.virtio_mem_sizes()
    finally:
        stop_filler(vm, "holder")
    step = result["step"]
    RESULTS["virtio_mem"] = {
        "step": step,
        "settled": result["settled"],
        "plugged_after_mib": plugged // MIB,
        "requested_after_mib": requested // MIB,
        "holder_rss_mib": holder_rss // MIB,
        "qemu_rss_before_mib": round(guest_rss(result["rss_before"]) / MIB, 1),
        "qemu_rss_after_mib": round(guest_rss(result["rss_after"]) / MIB, 1),
        "oom_kills": oom_kills(vm) - kills,
    }
    said = RESULTS["virtio_mem"]
    # Honoured: asked for the safe figure (whole blocks) and the guest went no lower.
    assert step["value"] == step["safe"] and plugged >= step["safe"], said
    assert holder_rss >= HOLDER_MIB * MIB, said
    assert said["oom_kills"] == 0, said
    assert agent.health() == "SERVING"
