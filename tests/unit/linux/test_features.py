"""Kernel features that may be absent (PSI, the multi-gen LRU): each rule as a table, then the
reads over a fake tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from guestagent.linux.features import (
    MGLRU,
    PSI,
    Absent,
    idle_ages_absence,
    mglru_absence,
    psi_absence,
    read_absent,
    read_cgroup_psi_absence,
)
from guestagent.linux.fs import KernelFS
from tests.fakes.root import FakeRoot, make_fake_root


@pytest.mark.parametrize(
    ("present", "cmdline", "words"),
    [
        (True, None, None),
        (True, "psi=0", None),  # The file is what counts.
        (False, "console=ttyS0 psi=0 quiet\n", "booted with psi=0"),
        (False, "console=ttyS0\n", "psi=1"),  # CONFIG_PSI_DEFAULT_DISABLED or no CONFIG_PSI.
        (False, None, 'kernel_params = "psi=1"'),
        (False, "apsi=0", "CONFIG_PSI"),  # Not the psi=0 argument.
    ],
)
def test_psi_absence(present: bool, cmdline: str | None, words: str | None) -> None:
    absent = psi_absence(present, cmdline)
    if words is None:
        assert absent is None
    else:
        assert absent is not None and absent.feature == PSI and words in absent.reason


@pytest.mark.parametrize(
    ("enabled", "words"),
    [
        ("0x0007\n", None),
        ("0x0001\n", None),
        ("y\n", None),
        ("0x0000\n", "off (lru_gen/enabled 0x0000)"),
        ("0x0006\n", "echo y > /sys/kernel/mm/lru_gen/enabled"),  # Only the core bit counts.
        ("n\n", "off"),
        (None, "CONFIG_LRU_GEN"),
    ],
)
def test_mglru_absence(enabled: str | None, words: str | None) -> None:
    assert_mglru_absent(mglru_absence(enabled), words)


def assert_mglru_absent(absent: Absent | None, words: str | None) -> None:
    """None words: present; else absent, saying them."""
    if words is None:
        assert absent is None
    else:
        assert absent is not None and absent.feature == MGLRU and words in absent.reason


@pytest.mark.parametrize(
    ("enabled", "words"),
    [
        ("0x0007\n", None),
        ("0x0003\n", None),
        ("y\n", None),
        # The core on, the page-table walk off (or a CPU with no hardware accessed bit): the
        # reclaimer works, the idle ages would not.
        ("0x0001\n", "walks no page tables (lru_gen/enabled 0x0001"),
        ("0x0005\n", "0x0002 off"),
        ("0x0000\n", "off (lru_gen/enabled 0x0000)"),
        (None, "CONFIG_LRU_GEN"),
    ],
)
def test_idle_ages_need_the_page_table_walk(enabled: str | None, words: str | None) -> None:
    assert_mglru_absent(idle_ages_absence(enabled), words)
    assert mglru_absence("0x0001\n") is None  # The multi-gen LRU itself is on.


def test_read_absent_names_each_missing_feature(tmp_path: Path) -> None:
    fake = make_fake_root(tmp_path / "root", psi=False)
    fake.write("proc/cmdline", "psi=0\n")
    fs = KernelFS(fake.root)
    assert [(a.feature, "psi=0" in a.reason) for a in read_absent(fs)] == [
        (PSI, True),
        (MGLRU, False),
    ]
    fake.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    fake.write("proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert read_absent(fs) == ()


def test_a_cgroup_without_memory_pressure_under_a_kernel_with_psi(fake_root: FakeRoot) -> None:
    fs = KernelFS(fake_root.root)
    with_psi = fake_root.add_cgroup("a")
    without = fake_root.add_cgroup("b", psi=False)
    assert read_cgroup_psi_absence(fs, str(with_psi)) is None
    absent = read_cgroup_psi_absence(fs, str(without))
    assert absent is not None and "cgroup.pressure is 0" in absent.reason
