"""The "kata-fc" kernel configuration: PSI built but off (booted psi=0) and the multi-gen LRU
built but off at boot, as Kata's and Firecracker's guest kernels ship (tests/vm/kernels.py).
The agent turns the multi-gen LRU and delay accounting on as it starts and bounds the per-CPU
free lists, each on record. The reclaimer's scenarios on delay accounting run on the "apple"
boot, the same kernel with the classic LRU (tests/vm/kernels.py says why that one)."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.host.client import AgentClient
from guestagent.ops.kernel_switches import PCP_HIGH_FRACTION
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import module_guest
from tests.vm.kernels import KATA_FC, absent, audit_lines

pytestmark = pytest.mark.vm

RESULTS: dict[str, Any] = {"kernel_cmdline_added": KATA_FC.extra_cmdline}

vm = module_guest(KATA_FC, RESULTS, "kata_fc")


def test_the_agent_turned_on_delay_accounting_and_the_multigen_lru(
    vm: GuestVM, agent: AgentClient
) -> None:
    """... and bounded the per-CPU free lists."""
    assert vm.exec(["cat", "/proc/sys/kernel/task_delayacct"]).stdout.strip() == "1"
    enabled = vm.exec(["cat", "/sys/kernel/mm/lru_gen/enabled"]).stdout.strip()
    assert int(enabled, 16) & 1, enabled
    fraction = vm.exec(["cat", "/proc/sys/vm/percpu_pagelist_high_fraction"]).stdout.strip()
    assert fraction == str(PCP_HIGH_FRACTION)
    # The init left all three as the kernel boots, so each change is on record.
    for setting, before in (
        ("kernel.task_delayacct", "0"),
        ("lru_gen/enabled", "0x0000"),
        ("vm.percpu_pagelist_high_fraction", "0"),
    ):
        (line,) = audit_lines(vm, setting)
        assert line["request"]["before"] == before and line["code"] == "OK", line
    reasons = absent(agent.info())
    assert set(reasons) == {"psi"}, reasons
    RESULTS["lru_gen_enabled"] = enabled
