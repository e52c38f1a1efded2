import struct

import pytest

from guestagent.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.blockdev import (
    BlockDevice,
    DeviceSelector,
    parse_mountinfo,
    probe_signatures,
    refuse_unsafe_device,
    resolve_device,
)
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


class FakeFinder:
    def __init__(self, devices: list[BlockDevice], appear: BlockDevice | None = None) -> None:
        self.devices = devices
        self.appear = appear
        self.waited: float | None = None

    def find(self, selector: DeviceSelector) -> BlockDevice | None:
        return next(
            (
                d
                for d in self.devices
                if selector.serial in (d.serial,) or selector.path == d.devnode
            ),
            None,
        )

    def wait(self, selector: DeviceSelector, timeout_s: float) -> BlockDevice | None:
        self.waited = timeout_s
        return self.appear


VDB = BlockDevice("/dev/vdb", "vdb", "disk", 254, 16, "swap0")


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
