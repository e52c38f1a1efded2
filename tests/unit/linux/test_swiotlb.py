"""The swiotlb's size from debugfs and from the boot log, on text captured from the guest."""

from __future__ import annotations

import errno

import pytest

from guestagent.errors import KernelFormat
from guestagent.linux.features import Absent
from guestagent.linux.swiotlb import (
    BOOT_LOG_SOURCE,
    DEBUGFS_SOURCE,
    SWIOTLB,
    Swiotlb,
    parse_boot_log,
    parse_nslabs,
    read_kmsg,
    read_swiotlb,
)
from guestagent.sizes import MIB
from tests.fakes.root import FakeRoot

# Records of /dev/kmsg (`timeout 3 cat /dev/kmsg`) in the Debian 12 guest, 6.1.0-57-cloud-amd64
# under QEMU TCG, 2026-12-04. With a memory hotplug region (slots=4, maxmem=2048M, placed
# above 4 GiB) the kernel maps the default 64 MiB pool:
WITH_POOL = """\
5,0,0,-;Linux version 6.1.0-57-cloud-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian \
12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian \
6.1.192-3 (2026-11-26)
6,83,0,-;software IO TLB: area num 1.
6,192,907124,-;acpi PNP0A03:00: _OSC: not requesting OS control; OS requires [ExtendedConfig \
ASPM ClockPM MSI]
 SUBSYSTEM=acpi
 DEVICE=+acpi:PNP0A03:00
6,306,1612821,-;PCI-DMA: Using software bounce buffering for IO (SWIOTLB)
6,307,1612877,-;software IO TLB: mapped [mem 0x000000001b200000-0x000000001f200000] (64MB)
5,308,1618991,-;Initialise system trusted keyrings
"""
# ... and a 306 MiB guest without one maps none (its whole log has no software IO TLB line).
WITHOUT_POOL = """\
5,0,0,-;Linux version 6.1.0-57-cloud-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian \
12.2.0-14+deb12u1) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian \
6.1.192-3 (2026-11-26)
6,157,565579,-;DMA: preallocated 128 KiB GFP_KERNEL pool for atomic allocations
6,158,566564,-;DMA: preallocated 128 KiB GFP_KERNEL|GFP_DMA pool for atomic allocations
6,159,566871,-;DMA: preallocated 128 KiB GFP_KERNEL|GFP_DMA32 pool for atomic allocations
"""


@pytest.mark.parametrize(
    ("kmsg", "expected"),
    [
        (WITH_POOL, Swiotlb(64 * MIB, BOOT_LOG_SOURCE)),
        (WITHOUT_POOL, Swiotlb(0, BOOT_LOG_SOURCE)),  # the log starts at boot (record 0)
        # A pool torn down later (an IOMMU took over) is gone.
        (
            WITH_POOL + "6,900,9000000,-;software IO TLB: tearing down default memory pool\n",
            Swiotlb(0, BOOT_LOG_SOURCE),
        ),
    ],
)
def test_boot_log(kmsg: str, expected: Swiotlb) -> None:
    assert parse_boot_log(kmsg) == expected


def test_boot_log_that_lost_its_start_says_so() -> None:
    # The ring buffer wrapped: record 0 is gone, and with it whatever boot printed.
    rotated = "\n".join(WITHOUT_POOL.splitlines()[1:])
    absent = parse_boot_log(rotated)
    assert isinstance(absent, Absent) and absent.feature == SWIOTLB
    assert "first record is number 157" in absent.reason
    assert parse_boot_log("") == Absent(SWIOTLB, "the boot log is empty")


def test_nslabs_are_two_kib_slabs() -> None:
    assert parse_nslabs("32768\n") == 64 * MIB  # what the guest above shows
    with pytest.raises(KernelFormat, match="io_tlb_nslabs 'x'"):
        parse_nslabs("x")


def test_debugfs_comes_first(fake_root: FakeRoot) -> None:
    fake_root.write("sys/kernel/debug/swiotlb/io_tlb_nslabs", "131072\n")
    fake_root.write("sys/kernel/debug/swiotlb/io_tlb_used", "0\n")
    fake_root.write("dev/kmsg", WITH_POOL)
    assert read_swiotlb(fake_root.fs) == Swiotlb(256 * MIB, DEBUGFS_SOURCE)


def test_debugfs_directory_without_a_pool_is_none(fake_root: FakeRoot) -> None:
    # 6.1 makes the directory but leaves it empty when there is no pool.
    (fake_root.root / "sys/kernel/debug/swiotlb").mkdir(parents=True)
    assert read_swiotlb(fake_root.fs) == Swiotlb(0, DEBUGFS_SOURCE)


def test_boot_log_when_debugfs_has_no_swiotlb(fake_root: FakeRoot) -> None:
    fake_root.write("dev/kmsg", WITH_POOL)
    assert read_kmsg(fake_root.fs) == WITH_POOL
    assert read_swiotlb(fake_root.fs) == Swiotlb(64 * MIB, BOOT_LOG_SOURCE)


def test_absent_names_both_reasons(fake_root: FakeRoot) -> None:
    absent = read_swiotlb(fake_root.fs)
    assert isinstance(absent, Absent) and absent.feature == SWIOTLB
    assert absent.reason.startswith("debugfs has no swiotlb directory; boot log: ")
    assert "kmsg" in absent.reason and errno.errorcode[errno.ENOENT] in absent.reason
