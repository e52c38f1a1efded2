import errno
import os

import pytest

from guestagent.errors import FailedPrecondition, KernelFormat
from guestagent.linux.abi import PAGE_SIZE
from guestagent.linux.cgroup.memory import (
    MEMORY_HIGH,
    MEMORY_MAX,
    CgroupSwap,
    MemoryCgroup,
    memory_stat_from,
    same_limit,
)
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.kernel import Kernel
from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.vmstat import vmstat_from
from guestagent.sizes import MIB
from tests.fakes.root import FakeRoot

PAGE = 4096


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("max", "max", True),
        ("max\n", "max", True),
        ("4096", "4097", True),  # the kernel keeps whole pages
        ("4096", "8191", True),
        ("4096", "8192", False),
        ("0", "max", False),
        (str(2**63 - 1), "max", True),  # as large as the kernel counts: it shows "max"
        (str(2**64), "max", True),
        (str(64 * MIB), "max", False),
    ],
)
def test_same_limit(a: str, b: str, same: bool) -> None:
    assert same_limit(a, b, PAGE) is same
    assert same_limit(b, a, PAGE) is same


@pytest.mark.parametrize(
    ("stat", "refaults"),
    [
        ("workingset_refault_anon 3\nworkingset_refault_file 4\n", 7),
        ("workingset_refault 5\n", 5),  # Before 5.9: one counter.
        ("anon 1\n", 0),
    ],
)
def test_memory_stat_counts_refaults_by_one_rule(stat: str, refaults: int) -> None:
    assert memory_stat_from(parse_flat_keyed(stat)).refaults == refaults
    assert sum(vmstat_from(parse_flat_keyed(stat)).__dict__[k] for k in REFAULT_FIELDS) == refaults


REFAULT_FIELDS = ("workingset_refault_anon", "workingset_refault_file")


def handle(fake_root: FakeRoot, **files: str) -> MemoryCgroup:
    fake_root.add_cgroup("pod")
    for name, text in files.items():
        fake_root.write(f"sys/fs/cgroup/pod/{name.replace('_', '.')}", text)
    return Kernel(fake_root.root).cgroup(cgroup_name("pod"))


@pytest.mark.parametrize(
    ("low", "min_", "protection"),
    [("0\n", "0\n", 0), ("100\n", "40\n", 100), ("max\n", "40\n", None), ("0\n", "max\n", None)],
)
def test_protection_reads_max_as_none(
    fake_root: FakeRoot, low: str, min_: str, protection: int | None
) -> None:
    assert handle(fake_root, memory_low=low, memory_min=min_).protection() == protection


def test_a_missing_protection_file_protects_nothing(fake_root: FakeRoot) -> None:
    memory = handle(fake_root, memory_low="100\n")
    os.unlink(os.path.join(memory.directory, "memory.min"))
    assert memory.protection() == 100


def test_max_is_none_for_every_limit_and_written_back_as_max(fake_root: FakeRoot) -> None:
    memory = handle(fake_root, memory_max="max\n", memory_high="1048576\n")
    cgroup = memory.read()
    assert (cgroup.max, cgroup.high, cgroup.swap) == (None, 1048576, CgroupSwap(4096, None))
    memory.set_limit(MEMORY_MAX, None)
    memory.set_limit(MEMORY_HIGH, 4096)
    assert (memory.limit_text(MEMORY_MAX), memory.limit_text(MEMORY_HIGH)) == ("max", "4096")


def test_a_bad_value_names_the_file_and_the_text(fake_root: FakeRoot) -> None:
    memory = handle(fake_root, memory_high="lots\n")
    with pytest.raises(KernelFormat, match=r"memory\.high holds 'lots'") as raised:
        memory.read()
    assert raised.value.metadata["value"] == "lots\n"


def test_without_swap_accounting_nothing_is_barred(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod", swap=False)
    memory = Kernel(fake_root.root).cgroup(cgroup_name("pod"))
    assert (memory.swap(), memory.swap_barred()) == (None, False)
    fake_root.write("sys/fs/cgroup/pod/memory.swap.max", "0\n")
    assert memory.swap_barred()


def test_the_reclaim_control_is_required_and_eagain_is_partial(fake_root: FakeRoot) -> None:
    memory = handle(fake_root)
    with pytest.raises(FailedPrecondition, match=r"Linux 5\.19"):
        memory.require_reclaim()
    fake_root.write("sys/fs/cgroup/pod/memory.reclaim", "")
    memory.require_reclaim()
    assert memory.reclaim("4096")
    fake_root.fs.kernel.fail("write", "memory.reclaim", errno.EAGAIN)
    assert not MemoryCgroup(fake_root.fs, memory.directory, "pod").reclaim("4096")


def test_the_report_carries_full_protection_as_the_kernels_largest_value(
    fake_root: FakeRoot,
) -> None:
    """memory.low "max" (systemd's MemoryLow=infinity) is a protection the report shows as
    the number the kernel stores for it, not a format error that fails the whole report."""
    assert handle(fake_root, memory_low="max\n").read().low == (2**63 - 1) // PAGE_SIZE * PAGE_SIZE
    assert handle(fake_root, memory_low="8192\n").read().low == 8192
