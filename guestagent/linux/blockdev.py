"""Block devices: finding them through libudev, and reading what sysfs and the disk say.

Pure probes (on-disk signatures, /proc/self/mountinfo) are plain functions over bytes and
text; the udev lookup is the only part that needs a live system.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import time
from collections.abc import Iterator
from typing import Any, Protocol

from guestagent.errors import (
    AgentError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    KernelFormat,
    NotFound,
)
from guestagent.linux.abi import PAGE_SIZE
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.fs import KernelFS
from guestagent.linux.udev import open_udev
from guestagent.records import record

# Enough of a disk's start to see every signature below (btrfs sits at 64 KiB).
HEAD_BYTES = 128 * 1024
SWAP_SIGNATURE = "swap"
# The blank check reads both ends whole (where partition tables, superblocks and their
# backups sit) and evenly spaced blocks between: 6 MiB of reads for any disk size.
BLANK_EDGE_BYTES = 1 << 20
BLANK_SAMPLES = 1024
# A sample is one page: a smaller read brings the whole page into the cache anyway.
BLANK_SAMPLE_BYTES = PAGE_SIZE


@record
class BlockDevice:
    devnode: str  # /dev/vdb
    sysname: str  # vdb
    devtype: str  # disk | partition
    major: int
    minor: int
    serial: str | None = None


class DeviceFinder(Protocol):
    def find(self, selector: DeviceSelector) -> BlockDevice | None: ...

    def wait(self, selector: DeviceSelector, timeout_s: float) -> BlockDevice | None: ...


def _signature_at(head: bytes, offset: int, magic: bytes) -> bool:
    return head[offset : offset + len(magic)] == magic


def _has_mbr_partitions(head: bytes) -> bool:
    if head[510:512] != b"\x55\xaa":
        return False
    # A partition entry's type byte is at +4 of each 16-byte entry from offset 446.
    return any(head[446 + 16 * i + 4] != 0 for i in range(4))


def probe_signatures(head: bytes, page_size: int) -> list[str]:
    """Names of the on-disk formats whose magic numbers appear in a disk's first bytes."""
    found: list[str] = []
    if _signature_at(head, page_size - 10, b"SWAPSPACE2") or _signature_at(
        head, page_size - 10, b"SWAP-SPACE"
    ):
        found.append(SWAP_SIGNATURE)
    if _signature_at(head, 1080, struct.pack("<H", 0xEF53)):
        found.append("ext2/3/4")
    if _signature_at(head, 0, b"XFSB"):
        found.append("xfs")
    if _signature_at(head, 65536 + 64, b"_BHRfS_M"):
        found.append("btrfs")
    if _signature_at(head, 0, b"LUKS\xba\xbe"):
        found.append("LUKS")
    if _signature_at(head, 512, b"EFI PART"):
        found.append("GPT partition table")
    elif _has_mbr_partitions(head):
        found.append("MBR partition table")
    if _signature_at(head, 512, b"LABELONE") or _signature_at(head, 0, b"LABELONE"):
        found.append("LVM2 physical volume")
    if _signature_at(head, 4096, struct.pack("<I", 0xA92B4EFC)):
        found.append("Linux RAID member")
    if _signature_at(head, 0, b"hsqs"):
        found.append("squashfs")
    if _signature_at(head, 32769, b"CD001"):
        found.append("iso9660")
    return found


def blank_check_plan(
    size: int,
    edge: int = BLANK_EDGE_BYTES,
    samples: int = BLANK_SAMPLES,
    sample: int = BLANK_SAMPLE_BYTES,
) -> tuple[tuple[int, int], ...]:
    """The (offset, length) reads that decide whether a disk is blank, ascending, disjoint.

    The first and last `edge` bytes, and `samples` blocks of `sample` bytes evenly spaced
    between them, each aligned to `sample` bytes; a disk too small to sample is read whole.
    """
    if size <= 2 * edge + samples * sample:
        return ((0, size),) if size > 0 else ()
    reads = [(0, edge)]
    middle_start, middle_end = edge, size - edge
    stride = (middle_end - middle_start) / samples
    for index in range(samples):
        offset = int(middle_start + index * stride) // sample * sample
        offset = max(offset, reads[-1][0] + reads[-1][1])
        reads.append((offset, min(sample, middle_end - offset)))
    reads.append((middle_end, edge))
    return tuple((offset, length) for offset, length in reads if length > 0)


def first_nonzero(offset: int, data: bytes) -> int | None:
    """The disk offset of the first byte that is not zero in data read at `offset`."""
    zeros = len(data) - len(data.lstrip(b"\0"))
    return offset + zeros if zeros < len(data) else None


def first_data_offset(fd: int, page_size: int = PAGE_SIZE) -> int | None:
    """Where a disk holds data, sampled by blank_check_plan; None when every read is zeros.

    Once a sample holds data, the gap since the previous read is read whole, so data that
    starts between two samples and runs into the second is reported where it starts.
    """
    size = os.lseek(fd, 0, os.SEEK_END)
    plan = blank_check_plan(size, sample=page_size)
    # The samples are scattered: readahead around each would read far more than is used.
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    # Ask for every sample up front, so the device gets them queued together rather than
    # one synchronous read at a time (1024 round trips to the host otherwise).
    for offset, length in plan:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    checked = 0  # Everything below this offset was read and is zeros.
    for offset, length in plan:
        found = first_nonzero(offset, os.pread(fd, length, offset))
        if found is not None:
            for start in range(checked, offset, BLANK_EDGE_BYTES):
                chunk = os.pread(fd, min(BLANK_EDGE_BYTES, offset - start), start)
                earlier = first_nonzero(start, chunk)
                if earlier is not None:
                    return earlier
            return found
        checked = offset + length
    return None


@record
class Mount:
    major: int
    minor: int
    mount_point: str
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    mounts: list[Mount] = []
    for line in text.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        major, _, minor = fields[2].partition(":")
        try:
            mounts.append(Mount(int(major), int(minor), fields[4], tail[0], tail[1]))
        except ValueError:
            raise KernelFormat(f"mountinfo line {line!r} has no major:minor") from None
    return mounts


def block_dir(fs: KernelFS, device: BlockDevice) -> str:
    return fs.sys("class", "block", device.sysname)


def partitions_of(fs: KernelFS, device: BlockDevice) -> list[str]:
    directory = fs.sys("block", device.sysname)
    if not fs.is_dir(directory):
        return []
    return [
        name
        for name in fs.listdir(directory)
        if fs.exists(os.path.join(directory, name, "partition"))
    ]


def holders_of(fs: KernelFS, device: BlockDevice) -> list[str]:
    directory = os.path.join(block_dir(fs, device), "holders")
    return fs.listdir(directory) if fs.is_dir(directory) else []


def size_bytes(fs: KernelFS, device: BlockDevice) -> int:
    # sysfs counts 512-byte sectors whatever the device's block size.
    return fs.read_int(os.path.join(block_dir(fs, device), "size")) * 512


def queue_value(fs: KernelFS, device: BlockDevice, name: str) -> str | None:
    text = fs.read_optional(os.path.join(block_dir(fs, device), "queue", name))
    return text.strip() if text is not None else None


def write_queue_value(fs: KernelFS, device: BlockDevice, name: str, value: str) -> None:
    fs.write(os.path.join(block_dir(fs, device), "queue", name), value)


def refuse_unsafe_device(fs: KernelFS, device: BlockDevice) -> None:
    """Refuse a device that is not a whole, unused disk: these checks never format data."""
    node = fs.host_path(device.devnode)
    where = {"device": device.devnode}
    try:
        mode = os.stat(node).st_mode
    except FileNotFoundError:
        raise NotFound(
            f"{device.devnode} does not exist", "DEVICE_NOT_FOUND", metadata=where
        ) from None
    if not stat.S_ISBLK(mode):
        raise FailedPrecondition(
            f"{device.devnode} is not a block device", "DEVICE_UNSUITABLE", metadata=where
        )
    if device.devtype != "disk":
        raise FailedPrecondition(
            f"{device.devnode} is a {device.devtype}, not a whole disk",
            "DEVICE_UNSUITABLE",
            metadata=where,
        )
    partitions = partitions_of(fs, device)
    if partitions:
        raise FailedPrecondition(
            f"{device.devnode} has partitions: {', '.join(partitions)}",
            "DEVICE_HOLDS_DATA",
            metadata={**where, "partitions": ",".join(partitions)},
        )
    mounts = [
        m
        for m in parse_mountinfo(fs.read(fs.proc("self", "mountinfo")))
        if (m.major, m.minor) == (device.major, device.minor)
    ]
    if mounts:
        points = ", ".join(f"{m.mount_point} ({m.fstype})" for m in mounts)
        raise FailedPrecondition(
            f"{device.devnode} is mounted on {points}",
            "DEVICE_IN_USE",
            metadata={**where, "mountPoints": ",".join(m.mount_point for m in mounts)},
        )
    holders = holders_of(fs, device)
    if holders:
        raise FailedPrecondition(
            f"{device.devnode} is held by {', '.join(holders)}",
            "DEVICE_IN_USE",
            metadata={**where, "holders": ",".join(holders)},
        )


@contextlib.contextmanager
def open_exclusive(fs: KernelFS, device: BlockDevice) -> Iterator[int]:
    """O_EXCL on a block device is the kernel's own claim check: EBUSY if anyone holds it."""
    try:
        fd = fs.open(fs.host_path(device.devnode), os.O_RDWR | os.O_EXCL, "open exclusively")
    except AgentError as e:
        if e.errno == errno.EBUSY:
            raise FailedPrecondition(
                f"{e}: something holds it open",
                "DEVICE_IN_USE",
                metadata={"device": device.devnode},
            ) from e
        raise
    try:
        yield fd
    finally:
        os.close(fd)


class UdevDevices:
    """Block devices as libudev sees them; waits for add events so hot-plugged disks work.
    A disk's serial is udev's ID_SERIAL where udevd runs, sysfs's `serial` where it does not."""

    def __init__(self, fs: KernelFS) -> None:
        self._udev = open_udev(fs)

    def _convert(self, device: Any) -> BlockDevice:
        properties = device.properties
        return BlockDevice(
            devnode=str(device.device_node),
            sysname=str(device.sys_name),
            devtype=str(device.device_type),
            major=int(properties["MAJOR"]),
            minor=int(properties["MINOR"]),
            serial=self._udev.serial(device),
        )

    def _matches(self, device: Any, selector: DeviceSelector) -> bool:
        if selector.serial is not None:
            return bool(
                device.device_type == "disk" and self._udev.serial(device) == selector.serial
            )
        # Not an assert: the daemon may run with -O, which strips asserts.
        if selector.path is None:
            raise InvalidArgument(
                "a device selector needs a path or a serial", "DEVICE_INVALID", field="device"
            )
        return bool(device.device_node == os.path.realpath(selector.path))

    def find(self, selector: DeviceSelector) -> BlockDevice | None:
        if selector.path is not None:
            if not os.path.exists(selector.path):
                return None
            if not stat.S_ISBLK(os.stat(selector.path).st_mode):
                raise FailedPrecondition(
                    f"{selector.path} is not a block device",
                    "DEVICE_UNSUITABLE",
                    metadata={"device": selector.path},
                )
        for device in self._udev.context.list_devices(subsystem="block"):
            if self._matches(device, selector):
                return self._convert(device)
        return None

    def wait(self, selector: DeviceSelector, timeout_s: float) -> BlockDevice | None:
        monitor = self._udev.monitor("block")
        monitor.start()
        found = self.find(selector)  # After start(), so an add event cannot slip between.
        deadline = time.monotonic() + timeout_s
        while found is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            event = monitor.poll(timeout=remaining)
            if (
                event is not None
                and event.action in ("add", "change")
                and self._matches(event, selector)
            ):
                found = self._convert(event)
        return found


def resolve_device(finder: DeviceFinder, selector: DeviceSelector, wait_ms: int) -> BlockDevice:
    device = finder.find(selector)
    if device is None and wait_ms > 0:
        device = finder.wait(selector, wait_ms / 1000)
        if device is None:
            raise DeadlineExceeded(
                f"no block device with {selector} appeared within {wait_ms} ms",
                "DEVICE_WAIT_TIMED_OUT",
                metadata={"device": str(selector), "waitMs": wait_ms},
            )
    if device is None:
        raise NotFound(
            f"no block device with {selector}",
            "DEVICE_NOT_FOUND",
            metadata={"device": str(selector)},
        )
    return device


def device_number(fs: KernelFS, devnode: str) -> tuple[int, int] | None:
    """(major, minor) of a device node as the kernel names it; None where there is none."""
    try:
        rdev = os.stat(fs.host_path(devnode)).st_rdev
    except OSError:
        return None
    return (os.major(rdev), os.minor(rdev)) if rdev else None


def device_for_node(fs: KernelFS, devnode: str) -> BlockDevice | None:
    """The block device behind a /dev node, from sysfs (no udev needed)."""
    number = device_number(fs, devnode)
    if number is None:
        return None
    major, minor = number
    link = fs.sys("dev", "block", f"{major}:{minor}")
    try:
        sysname = os.path.basename(os.readlink(link))
    except OSError:
        return None
    devtype = "partition" if fs.exists(os.path.join(link, "partition")) else "disk"
    return BlockDevice(devnode, sysname, devtype, major, minor)


# <linux/fs.h> BLKDISCARD: _IO(0x12, 119), taking {start, length} in bytes.
BLKDISCARD = 0x1277


def discard_all(fd: int, size: int) -> None:
    """Discard a whole device (OSError EOPNOTSUPP where it cannot)."""
    import fcntl  # Here, not at start: only an encrypted area's DisableSwap needs it.

    fcntl.ioctl(fd, BLKDISCARD, struct.pack("=QQ", 0, size))
