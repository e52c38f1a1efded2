from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from guestagent.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.abi import LONG_MAX
from guestagent.linux.cgroup.name import CgroupName, cgroup_name
from guestagent.ops.info import InfoSpec, Report, Reporter
from guestagent.ops.limits import (
    AppliedLimits,
    CgroupMemoryValues,
    CgroupsBeingMade,
    MemorySpec,
    SetLimitsSpec,
    apply_memory_limits,
    cgroup_values,
)
from guestagent.sizes import MIB
from tests.fakes.cgroups import FakeCgroupKernel
from tests.fakes.root import FakeRoot, Proceed

GiB = 1024 * MIB
NOTHING = CgroupMemoryValues(None, None, None)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(MemorySpec(), NOTHING, id="nothing given"),
        pytest.param(MemorySpec(0, 0, 0), NOTHING, id="zeros are not given"),
        pytest.param(
            MemorySpec(limit=-1), CgroupMemoryValues("max", "max", None), id="L=-1 S unset"
        ),
        pytest.param(
            MemorySpec(limit=-1, swap=0), CgroupMemoryValues("max", "max", None), id="L=-1 S=0"
        ),
        pytest.param(
            MemorySpec(limit=-1, swap=-1), CgroupMemoryValues("max", "max", None), id="L=-1 S=-1"
        ),
        pytest.param(
            MemorySpec(limit=-1, swap=GiB),
            CgroupMemoryValues("max", str(GiB), None),
            id="L=-1 S>0 keeps S",
        ),
        pytest.param(MemorySpec(swap=-1), CgroupMemoryValues(None, "max", None), id="L unset S=-1"),
        pytest.param(
            MemorySpec(limit=0, swap=-1), CgroupMemoryValues(None, "max", None), id="L=0 S=-1"
        ),
        pytest.param(
            MemorySpec(limit=512 * MIB),
            CgroupMemoryValues(str(512 * MIB), None, None),
            id="L>0 S unset",
        ),
        pytest.param(
            MemorySpec(limit=512 * MIB, swap=-1),
            CgroupMemoryValues(str(512 * MIB), "max", None),
            id="L>0 S=-1",
        ),
        pytest.param(
            MemorySpec(limit=512 * MIB, swap=512 * MIB),
            CgroupMemoryValues(str(512 * MIB), "0", None),
            id="S=L no swap",
        ),
        pytest.param(
            MemorySpec(limit=512 * MIB, swap=GiB),
            CgroupMemoryValues(str(512 * MIB), str(512 * MIB), None),
            id="S>L swap is the difference",
        ),
        pytest.param(MemorySpec(limit=1, swap=1), CgroupMemoryValues("1", "0", None), id="1 byte"),
        pytest.param(
            MemorySpec(limit=LONG_MAX),
            CgroupMemoryValues(str(LONG_MAX), None, None),
            id="int64 max",
        ),
        pytest.param(MemorySpec(reservation=-1), CgroupMemoryValues(None, None, "max"), id="R=-1"),
        pytest.param(
            MemorySpec(reservation=128 * MIB),
            CgroupMemoryValues(None, None, str(128 * MIB)),
            id="R>0",
        ),
        pytest.param(
            MemorySpec(limit=512 * MIB, swap=GiB, reservation=128 * MIB),
            CgroupMemoryValues(str(512 * MIB), str(512 * MIB), str(128 * MIB)),
            id="all three",
        ),
    ],
)
def test_conversion(spec: MemorySpec, expected: CgroupMemoryValues) -> None:
    assert cgroup_values(spec) == expected


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        pytest.param(MemorySpec(limit=-5), ["memory limit -5 is neither bytes nor -1"], id="L=-5"),
        pytest.param(MemorySpec(limit=-2, swap=GiB), ["memory limit -2"], id="L=-2 before S"),
        pytest.param(
            MemorySpec(limit=GiB, swap=-5), ["swap total -5 is neither bytes nor -1"], id="S=-5"
        ),
        pytest.param(MemorySpec(swap=-7), ["swap total -7"], id="S=-7 without L"),
        pytest.param(
            MemorySpec(swap=GiB),
            [f"swap total {GiB}", "needs a memory limit to be worked out"],
            id="S>0 L unset",
        ),
        pytest.param(MemorySpec(limit=0, swap=GiB), ["needs a memory limit"], id="S>0 L=0"),
        pytest.param(
            MemorySpec(limit=512 * MIB, swap=256 * MIB),
            [str(256 * MIB), str(512 * MIB), "less than"],
            id="S<L",
        ),
        pytest.param(
            MemorySpec(limit=2, swap=1), ["swap total 1 is less than memory limit 2"], id="S=L-1"
        ),
        pytest.param(
            MemorySpec(reservation=-3),
            ["memory reservation -3 is neither bytes nor -1"],
            id="R=-3",
        ),
        pytest.param(
            MemorySpec(limit=LONG_MAX + 1), [str(LONG_MAX + 1), "int64"], id="L over int64"
        ),
        pytest.param(MemorySpec(limit=GiB, swap=2**64), [str(2**64), "int64"], id="S over int64"),
        pytest.param(MemorySpec(reservation=2**64), [str(2**64), "int64"], id="R over int64"),
    ],
)
def test_conversion_refuses(spec: MemorySpec, words: list[str]) -> None:
    with pytest.raises(InvalidArgument) as raised:
        cgroup_values(spec)
    for word in words:
        assert word in str(raised.value)


def files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def ctr(fake_root: FakeRoot) -> Path:
    return fake_root.add_cgroup("pod/ctr")


@pytest.fixture
def kernel(fake_root: FakeRoot) -> FakeCgroupKernel:
    return FakeCgroupKernel(fake_root).install()


def test_writes_and_reads_back(fake_root: FakeRoot, ctr: Path) -> None:
    applied = apply_memory_limits(
        fake_root.fs,
        SetLimitsSpec(
            cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB, reservation=128 * MIB)
        ),
    )
    assert applied == AppliedLimits(
        memory_max=str(512 * MIB),
        swap_max=str(512 * MIB),
        memory_low=str(128 * MIB),
        untouched=(),
        created=False,
    )
    assert (ctr / "memory.max").read_text() == str(512 * MIB)
    assert (ctr / "memory.swap.max").read_text() == str(512 * MIB)
    assert (ctr / "memory.low").read_text() == str(128 * MIB)


def test_reports_what_the_kernel_holds(fake_root: FakeRoot, ctr: Path) -> None:
    def rounding(path: Path, value: str, proceed: Proceed) -> None:
        # The kernel keeps whole pages: 1000 bytes reads back as 0.
        proceed(str(int(value) // 4096 * 4096) if value.isdigit() else value)

    fake_root.kernel.on("write", rounding)
    applied = apply_memory_limits(
        fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=4096 + 1000))
    )
    assert applied.memory_max == "4096"


def test_untouched_files_keep_their_values(fake_root: FakeRoot, ctr: Path) -> None:
    applied = apply_memory_limits(
        fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB))
    )
    assert applied.untouched == ("memory.swap.max", "memory.low")
    assert (applied.swap_max, applied.memory_low) == ("max", "0")
    assert (ctr / "memory.swap.max").read_text() == "max\n"
    assert (ctr / "memory.low").read_text() == "0\n"


def test_empty_spec_changes_nothing(fake_root: FakeRoot, ctr: Path) -> None:
    before = files(ctr)
    applied = apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec()))
    assert applied.untouched == ("memory.swap.max", "memory.max", "memory.low")
    assert files(ctr) == before


def test_unlimited_memory_also_lifts_swap(fake_root: FakeRoot, ctr: Path) -> None:
    (ctr / "memory.max").write_text(f"{512 * MIB}\n")
    (ctr / "memory.swap.max").write_text("0\n")
    applied = apply_memory_limits(
        fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=-1))
    )
    assert (applied.memory_max, applied.swap_max) == ("max", "max")


def test_missing_cgroup_is_not_found_without_create(fake_root: FakeRoot) -> None:
    with pytest.raises(NotFound, match="'pod/nope'"):
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name("pod/nope"), MemorySpec(limit=GiB))
        )
    assert not (fake_root.root / "sys/fs/cgroup/pod").exists()


@pytest.mark.parametrize(("name", "create"), [("escape", False), ("escape/new", True)])
def test_symlink_escape_writes_nothing(fake_root: FakeRoot, name: str, create: bool) -> None:
    outside = fake_root.root / "outside"
    outside.mkdir()
    (outside / "memory.max").write_text("max\n")
    os.symlink(outside, fake_root.root / "sys/fs/cgroup/escape")
    with pytest.raises(InvalidArgument, match="outside"):
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name(name), MemorySpec(limit=GiB), create=create)
        )
    assert (outside / "memory.max").read_text() == "max\n"
    assert not (outside / "new").exists()


def test_invalid_spec_writes_nothing(fake_root: FakeRoot, ctr: Path) -> None:
    before = files(ctr)
    with pytest.raises(InvalidArgument, match="less than"):
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=GiB, swap=MIB))
        )
    assert files(ctr) == before


def test_invalid_spec_creates_nothing(fake_root: FakeRoot, kernel: FakeCgroupKernel) -> None:
    with pytest.raises(InvalidArgument):
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name("pod"), MemorySpec(limit=-3), create=True)
        )
    assert not (fake_root.root / "sys/fs/cgroup/pod").exists()


def test_memory_controller_not_enabled(fake_root: FakeRoot) -> None:
    (fake_root.root / "sys/fs/cgroup/bare").mkdir()
    with pytest.raises(FailedPrecondition) as raised:
        apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("bare"), MemorySpec(limit=GiB)))
    assert "'bare'" in str(raised.value)
    assert "cgroup.subtree_control" in str(raised.value)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(MemorySpec(limit=512 * MIB, swap=512 * MIB), id="swap 0"),
        pytest.param(MemorySpec(limit=512 * MIB, swap=-1), id="swap max"),
        pytest.param(MemorySpec(limit=-1), id="unlimited"),
    ],
)
def test_no_swap_accounting_skips_max_and_zero(fake_root: FakeRoot, spec: MemorySpec) -> None:
    ctr = fake_root.add_cgroup("ctr", swap=False)
    applied = apply_memory_limits(fake_root.fs, SetLimitsSpec(cgroup_name("ctr"), spec))
    assert applied.swap_max is None
    assert "memory.swap.max" in applied.untouched
    assert applied.memory_max == cgroup_values(spec).memory_max
    assert not (ctr / "memory.swap.max").exists()


def test_no_swap_accounting_refuses_a_swap_size(fake_root: FakeRoot) -> None:
    ctr = fake_root.add_cgroup("ctr", swap=False)
    before = files(ctr)
    with pytest.raises(FailedPrecondition) as raised:
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name("ctr"), MemorySpec(limit=512 * MIB, swap=GiB))
        )
    assert str(raised.value) == (
        f"kernel has no swap accounting; cannot set memory.swap.max to {512 * MIB} for cgroup 'ctr'"
    )
    assert files(ctr) == before


def failing_write(fake_root: FakeRoot, fails: dict[str, int]) -> list[tuple[str, str]]:
    """Make writes to the named files fail with the given errno; record the ones that pass."""
    written: list[tuple[str, str]] = []

    def record(path: Path, value: str, proceed: Proceed) -> None:
        proceed(value)
        written.append((path.name, value))

    fake_root.kernel.on("write", record)
    for name, number in fails.items():
        fake_root.kernel.fail("write", name, number)
    return written


def test_failed_memory_max_restores_swap(fake_root: FakeRoot, ctr: Path) -> None:
    written = failing_write(fake_root, {"memory.max": errno.EBUSY})
    with pytest.raises(Aborted) as raised:
        apply_memory_limits(
            fake_root.fs,
            SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB)),
        )
    message = str(raised.value)
    assert f"cgroup 'pod/ctr' failed: write '{512 * MIB}' to {ctr / 'memory.max'}:" in message
    assert "EBUSY (Device or resource busy)" in message
    assert "restored memory.swap.max to max" in message
    assert (ctr / "memory.swap.max").read_text() == "max"
    assert written == [("memory.swap.max", str(512 * MIB)), ("memory.swap.max", "max")]


def test_failed_memory_low_restores_in_reverse_order(fake_root: FakeRoot, ctr: Path) -> None:
    (ctr / "memory.max").write_text(f"{GiB}\n")
    written = failing_write(fake_root, {"memory.low": errno.EINVAL})
    with pytest.raises(Aborted, match="EINVAL") as raised:
        apply_memory_limits(
            fake_root.fs,
            SetLimitsSpec(
                cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB, reservation=MIB)
            ),
        )
    assert str(raised.value).endswith(
        f"restored memory.max to {GiB}; restored memory.swap.max to max"
    )
    assert written[2:] == [("memory.max", str(GiB)), ("memory.swap.max", "max")]
    assert (ctr / "memory.max").read_text() == str(GiB)


def test_failed_first_write_had_nothing_to_restore(fake_root: FakeRoot, ctr: Path) -> None:
    failing_write(fake_root, {"memory.swap.max": errno.EACCES})
    with pytest.raises(Aborted, match=r"EACCES.*nothing had been written"):
        apply_memory_limits(
            fake_root.fs,
            SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB)),
        )
    assert (ctr / "memory.max").read_text() == "max\n"


def test_failed_restore_is_reported(fake_root: FakeRoot, ctr: Path) -> None:
    fake_root.kernel.fail("write", "memory.max", errno.EIO)
    fake_root.kernel.fail("write", "memory.swap.max", errno.EIO, after=1)  # Its restore fails.
    with pytest.raises(Aborted) as raised:
        apply_memory_limits(
            fake_root.fs,
            SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB)),
        )
    assert "could not restore memory.swap.max: write 'max' to" in str(raised.value)
    assert str(raised.value).endswith("memory.swap.max: EIO (Input/output error)")


def test_create_makes_the_cgroup_and_enables_memory_in_parents(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu\n")
    applied = apply_memory_limits(
        fake_root.fs,
        SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB), create=True),
    )
    assert applied.created
    assert (applied.memory_max, applied.swap_max) == (str(512 * MIB), str(512 * MIB))
    cgroup_root = fake_root.root / "sys/fs/cgroup"
    assert (cgroup_root / "cgroup.subtree_control").read_text() == "+memory"
    assert (cgroup_root / "pod/cgroup.subtree_control").read_text() == "+memory"
    assert (cgroup_root / "pod/ctr/cgroup.subtree_control").read_text() == ""
    assert (cgroup_root / "pod/ctr/memory.max").read_text() == str(512 * MIB)


def test_create_of_an_existing_cgroup_just_writes(
    fake_root: FakeRoot, ctr: Path, kernel: FakeCgroupKernel
) -> None:
    applied = apply_memory_limits(
        fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=GiB), create=True)
    )
    assert not applied.created
    assert (ctr / "memory.max").read_text() == str(GiB)


def test_a_report_waits_for_the_limits_of_a_cgroup_being_made(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    """A stream wakes on the mkdir; what it reads must be the cgroup with its limits."""
    reports: list[Report] = []
    reader: list[threading.Thread] = []

    def read_meanwhile(path: Path, value: str, proceed: Proceed) -> None:
        if path.name == "memory.max" and not reader:
            spec = InfoSpec((cgroup_name("pod//ctr/"),))  # The same cgroup, spelled otherwise.
            reader.append(
                threading.Thread(target=lambda: reports.append(Reporter(fake_root.fs).report(spec)))
            )
            reader[0].start()
            reader[0].join(0.3)
            assert reader[0].is_alive(), "the report did not wait for the limits"
        proceed(value)

    fake_root.kernel.on("write", read_meanwhile)
    apply_memory_limits(
        fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=GiB), create=True)
    )
    reader[0].join(5)
    assert [r.report.cgroups[0].max for r in reports] == [GiB]


class MakingDuringTheRead(CgroupsBeingMade):
    """A making that begins after the report's wait and ends at its next one: the read
    between catches the cgroup after its mkdir, before its limit."""

    def __init__(self, finish: Callable[[], object]) -> None:
        super().__init__()
        self.finish, self.waits, self.count = finish, 0, 0

    def begun(self, names: Iterable[CgroupName]) -> int:
        return self.count

    def wait_for(self, names: Iterable[CgroupName], timeout_s: float = 2.0) -> bool:
        self.waits += 1
        if self.waits == 1:
            self.count += 1  # Begins as the wait returns, before the read.
        else:
            self.finish()
        return True


def test_a_report_whose_read_a_making_began_during_reads_again(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    """The wait saw nothing being made, then the mkdir came before the read: the read shows
    the cgroup unlimited, so it is read again once the making is done."""
    ctr = cgroup_name("pod/ctr")
    apply_memory_limits(fake_root.fs, SetLimitsSpec(ctr, MemorySpec(), create=True))
    limit = fake_root.root / "sys/fs/cgroup/pod/ctr/memory.max"
    assert limit.read_text().strip() == "max"
    making = MakingDuringTheRead(lambda: limit.write_text(str(GiB)))
    report = Reporter(fake_root.fs, being_made=making).report(InfoSpec((ctr,)))
    assert [c.max for c in report.report.cgroups] == [GiB]
    assert making.waits == 2


def test_cgroups_being_made() -> None:
    made = CgroupsBeingMade()
    ctr, pod, other = (cgroup_name(name) for name in ("pod/ctr", "pod", "other"))
    assert made.wait_for([ctr], timeout_s=0)
    assert made.begun([ctr]) == 0
    with made.making(ctr):
        assert made.begun([ctr, other]) == 1 and made.begun([other]) == 0
        assert not made.wait_for([ctr], timeout_s=0.01)
        assert made.wait_for([pod, other], timeout_s=0)
        assert not made.wait_for([other, cgroup_name("pod//ctr/")], timeout_s=0.01)
    assert made.wait_for([ctr], timeout_s=0)


def test_create_without_a_memory_controller_removes_the_cgroup(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    kernel.memory = False
    with pytest.raises(FailedPrecondition, match="memory controller is not enabled") as raised:
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=GiB), create=True)
        )
    assert "removed" in str(raised.value)
    assert not (fake_root.root / "sys/fs/cgroup/pod").exists()


def test_create_without_swap_accounting_refuses_and_removes(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    kernel.swap = False
    with pytest.raises(FailedPrecondition, match="no swap accounting"):
        apply_memory_limits(
            fake_root.fs,
            SetLimitsSpec(cgroup_name("pod"), MemorySpec(limit=512 * MIB, swap=GiB), create=True),
        )
    assert not (fake_root.root / "sys/fs/cgroup/pod").exists()


def test_create_then_failed_write_removes_the_cgroup(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    failing_write(fake_root, {"memory.max": errno.EBUSY})
    with pytest.raises(Aborted) as raised:
        apply_memory_limits(
            fake_root.fs,
            SetLimitsSpec(
                cgroup_name("pod/ctr"), MemorySpec(limit=512 * MIB, swap=GiB), create=True
            ),
        )
    message = str(raised.value)
    assert "EBUSY" in message
    assert "restored memory.swap.max to max" in message
    assert "removed" in message
    assert not (fake_root.root / "sys/fs/cgroup/pod").exists()


def test_create_failing_midway_is_aborted(fake_root: FakeRoot, kernel: FakeCgroupKernel) -> None:
    kernel.fail_mkdir = "ctr"
    with pytest.raises(Aborted, match="ENOSPC"):
        apply_memory_limits(
            fake_root.fs, SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=GiB), create=True)
        )
    assert not (fake_root.root / "sys/fs/cgroup/pod").exists()


def test_writes_swap_then_memory_then_low(fake_root: FakeRoot, ctr: Path) -> None:
    written = failing_write(fake_root, {})
    apply_memory_limits(
        fake_root.fs,
        SetLimitsSpec(cgroup_name("pod/ctr"), MemorySpec(limit=GiB, swap=-1, reservation=MIB)),
    )
    assert written == [
        ("memory.swap.max", "max"),
        ("memory.max", str(GiB)),
        ("memory.low", str(MIB)),
    ]
