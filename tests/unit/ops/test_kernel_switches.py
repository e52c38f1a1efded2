"""What the agent turns on at start: delay accounting and the multi-gen LRU, and the bound on
the per-CPU free lists, unless kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from guestagent.linux.kernel import Kernel
from guestagent.ops.kernel_switches import (
    KEEP,
    ON,
    PCP_HIGH_FRACTION,
    Switch,
    delayacct_switch,
    mglru_switch,
    pcp_switch,
    switch_delayacct,
    switch_mglru,
    switch_pcp_lists,
)


@pytest.mark.parametrize(
    ("mode", "before", "turn", "why"),
    [
        (ON, False, True, ""),
        (ON, True, False, ""),  # Already on.
        (KEEP, False, False, "--delayacct keep"),
        (ON, None, False, "no such sysctl"),
    ],
)
def test_delayacct_switch(mode: str, before: bool | None, turn: bool, why: str) -> None:
    decided, reason = delayacct_switch(mode, before)
    assert decided == turn and why in reason and bool(reason) == bool(why)


@pytest.mark.parametrize(
    ("mode", "before", "turn", "why"),
    [
        (ON, "0x0000", True, ""),
        (ON, "0x0007", False, ""),
        (ON, "0x0001", False, ""),  # The core is on: whoever set the rest chose so.
        (KEEP, "0x0000", False, "--mglru keep"),
        (ON, None, False, "no multi-gen LRU"),
    ],
)
def test_mglru_switch(mode: str, before: str | None, turn: bool, why: str) -> None:
    decided, reason = mglru_switch(mode, before)
    assert decided == turn and why in reason and bool(reason) == bool(why)


@pytest.mark.parametrize(
    ("mode", "before", "turn", "why"),
    [
        (ON, 0, True, ""),  # The kernel's default: as large as the low watermark.
        (ON, PCP_HIGH_FRACTION, False, ""),  # Already bounded so.
        (ON, 8, False, "set to 8 already"),  # Whoever set it chose so.
        (KEEP, 0, False, "--pcp-lists keep"),
        (ON, None, False, "no such sysctl"),
    ],
)
def test_pcp_switch(mode: str, before: int | None, turn: bool, why: str) -> None:
    decided, reason = pcp_switch(mode, before)
    assert decided == turn and why in reason and bool(reason) == bool(why)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/task_delayacct").write_text("0\n")
    (tmp_path / "proc/sys/vm").mkdir(parents=True)
    (tmp_path / "proc/sys/vm/percpu_pagelist_high_fraction").write_text("0\n")
    (tmp_path / "sys/kernel/mm/lru_gen").mkdir(parents=True)
    (tmp_path / "sys/kernel/mm/lru_gen/enabled").write_text("0x0000\n")
    return tmp_path


def test_on_turns_both_on(tree: Path) -> None:
    fs = Kernel(tree)
    assert switch_delayacct(fs, ON) == Switch("kernel.task_delayacct", "0", "1")
    assert (tree / "proc/sys/kernel/task_delayacct").read_text() == "1"
    # A test tree is a plain file: it holds what was written, where the kernel shows bits.
    assert switch_mglru(fs, ON) == Switch("lru_gen/enabled", "0x0000", "y")
    bounded = Switch("vm.percpu_pagelist_high_fraction", "0", str(PCP_HIGH_FRACTION))
    assert switch_pcp_lists(fs, ON) == bounded


def test_keep_leaves_both_as_found(tree: Path) -> None:
    fs = Kernel(tree)
    kept = switch_delayacct(fs, KEEP)
    assert kept == Switch("kernel.task_delayacct", "0", "0", "--delayacct keep")
    assert not kept.changed
    assert (tree / "proc/sys/kernel/task_delayacct").read_text() == "0\n"
    assert switch_mglru(fs, KEEP).left_because == "--mglru keep"
    assert (tree / "sys/kernel/mm/lru_gen/enabled").read_text() == "0x0000\n"
    assert switch_pcp_lists(fs, KEEP).left_because == "--pcp-lists keep"
    assert (tree / "proc/sys/vm/percpu_pagelist_high_fraction").read_text() == "0\n"


def test_a_kernel_without_either_is_left_saying_why(tmp_path: Path) -> None:
    fs = Kernel(tmp_path)
    assert "no such sysctl" in switch_delayacct(fs, ON).left_because
    assert "no multi-gen LRU" in switch_mglru(fs, ON).left_because
    assert "no such sysctl" in switch_pcp_lists(fs, ON).left_because
