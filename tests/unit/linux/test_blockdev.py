import os
import struct
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.blockdev import (
    BLANK_EDGE_BYTES,
    BLANK_SAMPLE_BYTES,
    BLANK_SAMPLES,
    blank_check_plan,
    first_data_offset,
    first_nonzero,
    parse_mountinfo,
    probe_signatures,
    refuse_unsafe_device,
    resolve_device,
)
from guestagent.linux.device_selector import DeviceSelector
from guestagent.sizes import MIB
from tests.fakes.devices import VDB, FakeFinder
from tests.fakes.root import FakeRoot

PAGE = 4096
HEAD = 128 * 1024


def head_with(*writes: tuple[int, bytes]) -> bytes:
    head = bytearray(HEAD)
    for offset, data in writes:
        head[offset : offset + len(data)] = data
    return bytes(head)


def mbr_with_partition() -> tuple[int, bytes]:
    entry = bytes([0x80, 0, 0, 0, 0x83]) + bytes(11)  # bootable, type 0x83 (Linux)
    return 446, entry + bytes(48) + b"\x55\xaa"


@pytest.mark.parametrize(
    ("writes", "expected"),
    [
        ((), []),
        (((PAGE - 10, b"SWAPSPACE2"),), ["swap"]),
        (((1080, struct.pack("<H", 0xEF53)),), ["ext2/3/4"]),
        (((0, b"XFSB"),), ["xfs"]),
        (((65536 + 64, b"_BHRfS_M"),), ["btrfs"]),
        (((0, b"LUKS\xba\xbe"),), ["LUKS"]),
        (((512, b"EFI PART"), (510, b"\x55\xaa")), ["GPT partition table"]),
        ((mbr_with_partition(),), ["MBR partition table"]),
        # A boot signature with an empty partition table is not a partitioned disk.
        (((510, b"\x55\xaa"),), []),
        (((512, b"LABELONE"),), ["LVM2 physical volume"]),
        (((4096, struct.pack("<I", 0xA92B4EFC)),), ["Linux RAID member"]),
        (((PAGE - 10, b"SWAPSPACE2"), (1080, struct.pack("<H", 0xEF53))), ["swap", "ext2/3/4"]),
    ],
)
def test_probe_signatures(writes: tuple[tuple[int, bytes], ...], expected: list[str]) -> None:
    assert probe_signatures(head_with(*writes), PAGE) == expected


def test_mountinfo() -> None:
    text = (
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
        "30 22 0:26 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    mounts = parse_mountinfo(text)
    assert (mounts[0].major, mounts[0].minor, mounts[0].mount_point) == (254, 0, "/")
    assert mounts[1].fstype == "cgroup2"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({}, "exactly one"),
        ({"path": "/dev/vdb", "serial": "swap0"}, "exactly one"),
        ({"path": "vdb"}, "not under /dev"),
        ({"path": "/dev/../etc/passwd"}, "not under /dev"),
        ({"serial": ""}, "empty"),
        ({"serial": "a/b"}, "'/'"),
    ],
)
def test_selector_refusals(kwargs: dict[str, str], reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        DeviceSelector(**kwargs)


def test_resolve_waits_for_a_hot_plugged_disk() -> None:
    finder = FakeFinder([], appear=VDB)
    assert resolve_device(finder, DeviceSelector(serial="swap0"), 2500) == VDB
    assert finder.waited == 2.5


def test_resolve_deadline_names_the_selector() -> None:
    with pytest.raises(DeadlineExceeded, match=r"serial 'swap9'.*300 ms"):
        resolve_device(FakeFinder([]), DeviceSelector(serial="swap9"), 300)


def test_resolve_without_wait_is_not_found() -> None:
    with pytest.raises(NotFound, match="serial 'swap9'"):
        resolve_device(FakeFinder([]), DeviceSelector(serial="swap9"), 0)


def test_a_regular_file_is_not_a_block_device(fake_root: FakeRoot) -> None:
    fake_root.write("dev/vdb", "data")
    with pytest.raises(FailedPrecondition, match="/dev/vdb is not a block device"):
        refuse_unsafe_device(fake_root.fs, VDB)


GiB = 1 << 30
# Most the blank check reads, whatever the disk's size.
PLAN_BYTES = 2 * BLANK_EDGE_BYTES + BLANK_SAMPLES * BLANK_SAMPLE_BYTES


@pytest.mark.parametrize(
    ("size", "reads"),
    [
        (0, ()),
        (4096, ((0, 4096),)),
        (PLAN_BYTES, ((0, PLAN_BYTES),)),
        (64 * MIB, None),
        (8 * GiB, None),
    ],
)
def test_blank_check_plan(size: int, reads: tuple[tuple[int, int], ...] | None) -> None:
    plan = blank_check_plan(size)
    if reads is not None:
        assert plan == reads
        return
    assert len(plan) == BLANK_SAMPLES + 2
    assert plan[0] == (0, MIB) and plan[-1] == (size - MIB, MIB)
    samples = plan[1:-1]
    assert all(length == 4096 and offset % 4096 == 0 for offset, length in samples)
    # Evenly spaced: the gaps differ by at most one alignment step.
    gaps = {b[0] - a[0] for a, b in pairwise(samples)}
    assert max(gaps) - min(gaps) <= 4096


@given(size=st.integers(0, 1 << 44))
def test_blank_check_plan_covers_both_ends_in_order(size: int) -> None:
    plan = blank_check_plan(size)
    assert sum(length for _, length in plan) <= PLAN_BYTES
    if size == 0:
        assert plan == ()
        return
    assert plan[0][0] == 0 and plan[-1][0] + plan[-1][1] == size
    for (offset, length), (next_offset, _) in pairwise(plan):
        assert length > 0 and offset + length <= next_offset


@pytest.mark.parametrize(
    ("offset", "data", "found"),
    [
        (0, b"", None),
        (0, bytes(4096), None),
        (0, b"x" + bytes(10), 0),
        (MIB, bytes(100) + b"\x01", MIB + 100),
    ],
)
def test_first_nonzero(offset: int, data: bytes, found: int | None) -> None:
    assert first_nonzero(offset, data) == found


def disk_with(path: Path, size: int, *writes: tuple[int, bytes]) -> int:
    with open(path, "wb") as f:
        f.truncate(size)  # Sparse, as a runtime's swap disk is.
        for offset, data in writes:
            f.seek(offset)
            f.write(data)
    return os.open(path, os.O_RDONLY)


@pytest.mark.parametrize(
    ("writes", "found"),
    [
        ((), None),
        # 16 bytes of text at 0 and 4 MiB of random bytes at 1 MiB: issue 13's example.
        (((0, b"precious text 16"), (MIB, os.urandom(4 * MIB))), 0),
        # Random bytes whose first is not zero (os.urandom's is, one time in 256).
        (((40 * MIB, b"\xff" + os.urandom(MIB - 1)),), 40 * MIB),
        (((63 * MIB + 5, b"tail"),), 63 * MIB + 5),
        # Between two samples, not reaching the next: sampling misses it, by design.
        (((40 * MIB + 8, b"x" * 16),), None),
    ],
)
def test_first_data_offset(
    tmp_path: Path, writes: tuple[tuple[int, bytes], ...], found: int | None
) -> None:
    fd = disk_with(tmp_path / "disk", 64 * MIB, *writes)
    try:
        assert first_data_offset(fd) == found
    finally:
        os.close(fd)
