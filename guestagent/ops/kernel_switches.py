"""What the agent turns on in the guest's kernel when it starts, unless told to keep it.

Every runtime's guest kernel boots with both off (docs/kernel-features.md):
- delay accounting (kernel.task_delayacct, off at boot since 5.14): the reclaimer's stall
  signal, and the watch streams' pressure trigger, where PSI is off or absent;
- the multi-gen LRU (/sys/kernel/mm/lru_gen/enabled, built but off in Kata's and
  Firecracker's kernels): the reclaimer's cheap probes and the idle ages.
And one it bounds: the per-CPU free lists (vm.percpu_pagelist_high_fraction). By default each
holds up to the zone's low watermark, which transparent huge pages raise (khugepaged's
recommended min_free_kbytes): a 1 GiB guest kept 47 MiB of freed pages there, which free
page reporting never sees (it takes blocks off the buddy allocator's lists), so they stayed
in QEMU's RSS after the reclaimer had emptied the cold set (2026-12-07).
Set here rather than by the image, because a Kata extension or a PID-1 init agent runs no
tmpfiles or sysctl.d. `keep` leaves each as found (and the figures that need it absent).
"""

from __future__ import annotations

from collections.abc import Callable

from guestagent.errors import AgentError
from guestagent.linux.delayacct import read_task_delayacct, write_task_delayacct
from guestagent.linux.features import (
    MGLRU_CORE,
    lru_gen_caps,
    read_lru_gen_enabled,
    write_lru_gen_enabled,
)
from guestagent.linux.kernel import Kernel
from guestagent.linux.mm import read_pcp_high_fraction, write_pcp_high_fraction
from guestagent.records import record

ON, KEEP = "on", "keep"
MODES = (ON, KEEP)
DELAYACCT_SETTING = "kernel.task_delayacct"
MGLRU_SETTING = "lru_gen/enabled"
PCP_SETTING = "vm.percpu_pagelist_high_fraction"
# The per-CPU lists hold at most 1/1000 of each zone between them: the part of the low
# watermark that watermark_scale_factor's default (10, 0.1 %) gives, so never more than the
# kernel's default holds; 1 MiB a CPU at least (the kernel's floor, 4 batches).
PCP_HIGH_FRACTION = 1000


@record
class Switch:
    """One setting at start: what it was, what it is now, and why it was left if it was."""

    setting: str
    before: str
    after: str
    left_because: str = ""  # "" when it was turned on, or already on

    @property
    def changed(self) -> bool:
        return self.before != self.after


def delayacct_switch(mode: str, before: bool | None) -> tuple[bool, str]:
    """Whether to turn delay accounting on, or why not."""
    if before is None:
        return False, (
            "no such sysctl: the kernel has no run-time switch (before 5.14, or no "
            "CONFIG_TASK_DELAY_ACCT)"
        )
    if before:
        return False, ""
    if mode == KEEP:
        return False, "--delayacct keep"
    return True, ""


def mglru_switch(mode: str, before: str | None) -> tuple[bool, str]:
    """Whether to turn the multi-gen LRU on ("y": every part this CPU has), or why not."""
    if before is None:
        return False, "the kernel has no multi-gen LRU (CONFIG_LRU_GEN)"
    if lru_gen_caps(before.strip()) & MGLRU_CORE:
        return False, ""
    if mode == KEEP:
        return False, "--mglru keep"
    return True, ""


def pcp_switch(mode: str, before: int | None) -> tuple[bool, str]:
    """Whether to bound the per-CPU free lists (PCP_HIGH_FRACTION), or why not."""
    if before is None:
        return False, "no such sysctl: the kernel has no run-time bound (before 5.14)"
    if before == PCP_HIGH_FRACTION:
        return False, ""
    if before:
        return False, f"set to {before} already, by whoever set it"
    if mode == KEEP:
        return False, "--pcp-lists keep"
    return True, ""


def _shown(value: bool | None) -> str:
    return "absent" if value is None else str(int(value))


def _switched(
    setting: str,
    shown: str,
    decision: tuple[bool, str],
    write: Callable[[], None],
    read_after: Callable[[], str],
) -> Switch:
    """A decision carried out: the setting written and read back, or left and why (the
    decision's reason, or the kernel's refusal)."""
    turn, why = decision
    if not turn:
        return Switch(setting, shown, shown, why)
    try:
        write()
    except AgentError as e:
        return Switch(setting, shown, shown, str(e))
    return Switch(setting, shown, read_after())


def switch_delayacct(kernel: Kernel, mode: str) -> Switch:
    before = read_task_delayacct(kernel)
    return _switched(
        DELAYACCT_SETTING,
        _shown(before),
        delayacct_switch(mode, before),
        lambda: write_task_delayacct(kernel, True),
        lambda: _shown(read_task_delayacct(kernel)),
    )


def switch_mglru(kernel: Kernel, mode: str) -> Switch:
    before = read_lru_gen_enabled(kernel)
    return _switched(
        MGLRU_SETTING,
        (before or "absent").strip(),
        mglru_switch(mode, before),
        lambda: write_lru_gen_enabled(kernel, "y"),
        lambda: (read_lru_gen_enabled(kernel) or "absent").strip(),
    )


def switch_pcp_lists(kernel: Kernel, mode: str) -> Switch:
    before = read_pcp_high_fraction(kernel)
    return _switched(
        PCP_SETTING,
        "absent" if before is None else str(before),
        pcp_switch(mode, before),
        lambda: write_pcp_high_fraction(kernel, PCP_HIGH_FRACTION),
        lambda: str(read_pcp_high_fraction(kernel)),
    )
