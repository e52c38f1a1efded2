"""The "apple" kernel configuration: no PSI (booted psi=0) and the classic LRU (the multi-gen
LRU left off, the agent started with --mglru keep), as on Apple's containerization kernel,
which builds neither (tests/vm/kernels.py). Delay accounting is the stall signal: the
reclaimer gives cold memory back on it within the PSI run's bounds, and an explicit pressure
trigger is served by it. Plus one smoke of everything that reads neither PSI nor the
multi-gen LRU (docs/kernel-features.md)."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import (
    filler_ready,
    make_cgroup,
    module_guest,
    plug_dimm_and_wait_online,
    start_filler,
    stop_filler,
    wait_until,
)
from tests.vm.kernels import (
    APPLE,
    RuntimeKernelScenarios,
    absent,
    audit_lines,
)
from tests.vm.pace import Pace

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {
    "kernel_cmdline_added": APPLE.extra_cmdline,
    "agent_args": list(APPLE.agent_args),
}

vm = module_guest(APPLE, RESULTS, "apple")


def test_the_report_says_psi_and_the_multigen_lru_are_absent(
    vm: GuestVM, agent: AgentClient
) -> None:
    assert vm.exec(["test", "-e", "/proc/pressure/memory"], check=False).rc != 0
    # --mglru keep: left as the init left it, and the audit line says why.
    assert vm.exec(["cat", "/sys/kernel/mm/lru_gen/enabled"]).stdout.strip() == "0x0000"
    (kept,) = audit_lines(vm, "lru_gen/enabled")
    assert kept["code"] == "UNCHANGED" and kept["error"] == "--mglru keep", kept
    assert vm.exec(["cat", "/proc/sys/kernel/task_delayacct"]).stdout.strip() == "1"
    make_cgroup(vm, "plain")
    info = agent.info(["plain"])
    reasons = absent(info)
    assert "booted with psi=0" in reasons["psi"], reasons
    assert "multi-gen LRU is off" in reasons["mglru"], reasons
    assert "delayacct" not in reasons, reasons
    # Unset, never a zero stall: delay accounting's stall is its own field, with its source.
    assert not info.HasField("pressure") and not info.cgroups[0].HasField("pressure")
    assert info.delay_stall.source == "delayacct_stall"
    assert info.cgroups[0].delay_stall.source == "delayacct_stall"


def test_the_reclaimer_runs_on_delay_accounting_without_the_multigen_lru(
    agent: AgentClient, vm: GuestVM
) -> None:
    make_cgroup(vm, "cold")
    status = agent.set_reclaim_policy("cold", True)
    assert list(status.signals) == ["delayacct_stall", "refaults", "reclaim_yield"]
    assert "multi-gen LRU is off" in absent(status)["mglru"]
    agent.set_reclaim_policy("cold", False)


class TestOnAppleKernel(RuntimeKernelScenarios):
    results = RESULTS


def test_swap_limits_reclaim_compaction_and_hotplug_still_work(
    vm: GuestVM, agent: AgentClient, pace: Pace
) -> None:
    """One smoke of everything that reads neither PSI nor the multi-gen LRU."""
    agent.enable_swap(pb.EnableSwapRequest(device=pb.DeviceSelector(serial="swap0")))
    assert [a.device for a in agent.list_swaps()]
    applied = agent.set_limits(
        "pod/ctr", pb.LinuxMemory(limit=64 * MIB, swap=192 * MIB), create=True
    )
    assert applied.memory_max == str(64 * MIB) and applied.swap_max == str(128 * MIB)
    marker = start_filler(vm, "pod/ctr", 128, name="swapper")
    try:
        wait_until(lambda: filler_ready(vm, marker), pace.scale(300), "128 MiB over a 64 MiB limit")
        (ctr,) = agent.info(["pod/ctr"]).cgroups
        assert ctr.swap_current_bytes > 32 * MIB and ctr.events.oom_kill == 0
        result = agent.reclaim("pod/ctr", 16 * MIB)
        assert result.current_before_bytes - result.current_after_bytes > 8 * MIB
    finally:
        stop_filler(vm, "swapper")
    compacted = agent.compact()
    assert len(compacted.free_blocks_after) > 0
    before, grown = plug_dimm_and_wait_online(vm, agent, 128)
    RESULTS["smoke"] = {
        "swap_current_mib": round(ctr.swap_current_bytes / MIB, 1),
        "reclaimed_mib": round((result.current_before_bytes - result.current_after_bytes) / MIB),
        "compaction_us": compacted.duration_us,
        "hotplug_mem_total_mib": [before // MIB, grown // MIB],
    }
