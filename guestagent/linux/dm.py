"""Device-mapper through /dev/mapper/control, for the one target the agent maps: dm-crypt.

The agent drives the ioctls itself rather than through dmsetup or cryptsetup, which a guest
need not have. The layouts are include/uapi/linux/dm-ioctl.h's; the crypt table is
Documentation/admin-guide/device-mapper/dm-crypt.rst's plain mode. Packing and parsing are
pure functions over bytes; the mappings that exist are read from sysfs (dm_mappings.py).

The key is made in a bytearray, written as hex straight into the ioctl buffer, and both are
overwritten once the kernel has the table: no str or bytes copy of it is ever made, and the
load asks the kernel to wipe its own copy (DM_SECURE_DATA_FLAG).
"""

from __future__ import annotations

import errno
import os
import struct

from guestagent.errors import AgentError, FailedPrecondition, errno_text
from guestagent.linux import syscalls
from guestagent.linux.fs import KernelFS
from guestagent.records import record

# struct dm_ioctl: version[3], data_size, data_start, target_count, open_count, flags,
# event_nr, padding, dev, name[128], uuid[129], data[7].
DM_IOCTL = struct.Struct("=3I4Ii2IQ128s129s7x")
# struct dm_target_spec: sector_start, length, status, next, target_type[16].
DM_TARGET_SPEC = struct.Struct("=QQiI16s")
# struct dm_target_versions: next, version[3], then the name.
DM_TARGET_VERSIONS = struct.Struct("=4I")
DM_NAME_LEN = 128
DM_UUID_LEN = 129
# Interface 4: the kernel takes any request whose major matches and minor is not newer.
DM_VERSION = (4, 0, 0)

DM_VERSION_CMD = 0
DM_DEV_CREATE_CMD = 3
DM_DEV_REMOVE_CMD = 4
DM_DEV_SUSPEND_CMD = 6
DM_TABLE_LOAD_CMD = 9
DM_LIST_VERSIONS_CMD = 13

DM_BUFFER_FULL_FLAG = 1 << 8
DM_SECURE_DATA_FLAG = 1 << 15

CRYPT_TARGET = "crypt"
CRYPT_CIPHER = b"aes-xts-plain64"
# aes-xts with a 512-bit key: two AES-256 keys, one for the data and one for the tweak.
CRYPT_KEY_BYTES = 64
SECTOR = 512
CRYPT_SECTOR = 4096
_HEX = b"0123456789abcdef"


def dm_request(command: int) -> int:
    """_IOWR(0xfd, command, struct dm_ioctl)."""
    return (3 << 30) | (DM_IOCTL.size << 16) | (0xFD << 8) | command


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _fixed(text: str, size: int, what: str) -> bytes:
    raw = text.encode()
    if len(raw) >= size:
        raise ValueError(f"device-mapper {what} {text!r} is {len(raw)} bytes; at most {size - 1}")
    return raw


def pack_ioctl(
    name: str = "",
    uuid: str = "",
    flags: int = 0,
    data_size: int = DM_IOCTL.size,
    target_count: int = 0,
) -> bytearray:
    """A request buffer of data_size bytes: struct dm_ioctl, then room for data."""
    buffer = bytearray(max(data_size, DM_IOCTL.size))
    DM_IOCTL.pack_into(
        buffer,
        0,
        *DM_VERSION,
        len(buffer),
        DM_IOCTL.size,
        target_count,
        0,
        flags,
        0,
        0,
        0,
        _fixed(name, DM_NAME_LEN, "name"),
        _fixed(uuid, DM_UUID_LEN, "uuid"),
    )
    return buffer


@record
class IoctlHeader:
    data_size: int
    data_start: int
    flags: int


def unpack_ioctl(buffer: bytes | bytearray) -> IoctlHeader:
    fields = DM_IOCTL.unpack_from(buffer)
    return IoctlHeader(fields[3], fields[4], fields[7])


@record
class CryptTable:
    """One crypt target over a whole disk, all but the key (which only the ioctl buffer holds)."""

    length_sectors: int  # In 512-byte sectors, as every device-mapper table counts.
    major: int
    minor: int
    sector_size: int  # The unit dm-crypt encrypts: 4096 where the disk allows, else 512.

    def params_around_key(self) -> tuple[bytes, bytes]:
        """The target's parameters before and after the key's hex digits: cipher, key,
        iv_offset, device, offset, then the optional arguments (allow_discards, so freed
        blocks still reach the host's sparse file)."""
        options = [b"allow_discards"]
        if self.sector_size != SECTOR:
            options.append(b"sector_size:%d" % self.sector_size)
        after = b" 0 %d:%d 0 %d %s" % (self.major, self.minor, len(options), b" ".join(options))
        return CRYPT_CIPHER + b" ", after


def crypt_table(size_bytes: int, logical_block_size: int, major: int, minor: int) -> CryptTable:
    """The crypt table for a disk: 4 KiB crypto sectors when the disk's logical blocks and its
    size allow them (fewer, larger requests), else the disk's own 512."""
    if logical_block_size > CRYPT_SECTOR or size_bytes % logical_block_size:
        raise FailedPrecondition(
            f"a disk of {size_bytes} bytes with {logical_block_size}-byte logical blocks cannot "
            "be mapped through dm-crypt",
            "DEVICE_UNSUITABLE",
            metadata={"sizeBytes": size_bytes, "logicalBlockSize": logical_block_size},
        )
    if size_bytes < CRYPT_SECTOR:
        raise FailedPrecondition(
            f"a disk of {size_bytes} bytes is too small for swap",
            "DEVICE_UNSUITABLE",
            metadata={"sizeBytes": size_bytes},
        )
    sector = CRYPT_SECTOR if size_bytes % CRYPT_SECTOR == 0 else SECTOR
    return CryptTable(size_bytes // SECTOR, major, minor, sector)


def write_hex(buffer: bytearray, offset: int, key: bytearray) -> None:
    """The key as lower-case hex digits, written into buffer in place (no str made)."""
    for index, byte in enumerate(key):
        buffer[offset + 2 * index] = _HEX[byte >> 4]
        buffer[offset + 2 * index + 1] = _HEX[byte & 15]


def pack_table_load(name: str, table: CryptTable, key: bytearray) -> bytearray:
    """A DM_TABLE_LOAD request for one crypt target holding key; the caller wipes it."""
    before, after = table.params_around_key()
    params_size = len(before) + 2 * len(key) + len(after) + 1  # NUL-terminated.
    spec_size = _align8(DM_TARGET_SPEC.size + params_size)
    buffer = pack_ioctl(
        name,
        flags=DM_SECURE_DATA_FLAG,
        data_size=DM_IOCTL.size + spec_size,
        target_count=1,
    )
    target_type = CRYPT_TARGET.encode()
    DM_TARGET_SPEC.pack_into(
        buffer, DM_IOCTL.size, 0, table.length_sectors, 0, spec_size, target_type
    )
    offset = DM_IOCTL.size + DM_TARGET_SPEC.size
    buffer[offset : offset + len(before)] = before
    write_hex(buffer, offset + len(before), key)
    tail = offset + len(before) + 2 * len(key)
    buffer[tail : tail + len(after)] = after
    return buffer


def wipe(buffer: bytearray) -> None:
    buffer[:] = bytes(len(buffer))


def parse_target_versions(buffer: bytes | bytearray) -> dict[str, tuple[int, int, int]]:
    """The targets the kernel has, from a DM_LIST_VERSIONS answer: name -> version."""
    header = unpack_ioctl(buffer)
    targets: dict[str, tuple[int, int, int]] = {}
    offset = header.data_start
    end = min(header.data_size, len(buffer))
    while offset + DM_TARGET_VERSIONS.size <= end:
        step, major, minor, patch = DM_TARGET_VERSIONS.unpack_from(buffer, offset)
        name_start = offset + DM_TARGET_VERSIONS.size
        name_end = buffer.find(b"\0", name_start, end)
        if name_end < 0:
            break
        targets[bytes(buffer[name_start:name_end]).decode(errors="replace")] = (major, minor, patch)
        if step == 0:
            break
        offset += step
    return targets


class DeviceMapper:
    """The ioctls on /dev/mapper/control; each failure names the call, the mapping and errno."""

    def __init__(self, fs: KernelFS) -> None:
        self.fs = fs

    def _call(self, command: int, buffer: bytearray, what: str) -> None:
        control = self.fs.dev("mapper", "control")
        try:
            fd = self.fs.open(control, os.O_RDWR)
        except AgentError as e:
            if e.errno == errno.ENOENT:
                raise FailedPrecondition(
                    f"the kernel has no device-mapper ({control} is missing): load dm_mod",
                    "ENCRYPTION_UNAVAILABLE",
                    metadata={"path": control},
                ) from e
            raise
        try:
            syscalls.ioctl_in_place(fd, dm_request(command), buffer, what)
        finally:
            os.close(fd)

    def targets(self) -> dict[str, tuple[int, int, int]]:
        size = 16384
        while True:
            buffer = pack_ioctl(data_size=size)
            self._call(DM_LIST_VERSIONS_CMD, buffer, "DM_LIST_VERSIONS")
            if not unpack_ioctl(buffer).flags & DM_BUFFER_FULL_FLAG:
                return parse_target_versions(buffer)
            size *= 2

    def create(self, name: str) -> None:
        """A new, empty, suspended mapping (sysfs then names its device: read_mappings)."""
        self._call(DM_DEV_CREATE_CMD, pack_ioctl(name), f"DM_DEV_CREATE {name}")

    def load_crypt(self, name: str, table: CryptTable) -> None:
        """Load a crypt table with a fresh random key, which exists only in the kernel after."""
        key = bytearray(CRYPT_KEY_BYTES)
        buffer = bytearray()
        try:
            syscalls.getrandom_into(key)
            buffer = pack_table_load(name, table, key)
            self._call(DM_TABLE_LOAD_CMD, buffer, f"DM_TABLE_LOAD {name}")
        finally:
            wipe(key)
            wipe(buffer)

    def resume(self, name: str) -> None:
        """Make the loaded table live (DM_DEV_SUSPEND without DM_SUSPEND_FLAG)."""
        self._call(DM_DEV_SUSPEND_CMD, pack_ioctl(name), f"DM_DEV_SUSPEND (resume) {name}")

    def remove(self, name: str) -> None:
        """Remove a mapping and its table: with it goes the key."""
        self._call(DM_DEV_REMOVE_CMD, pack_ioctl(name), f"DM_DEV_REMOVE {name}")


def has_crypt_target(mapper: DeviceMapper) -> str | None:
    """None when dm-crypt is usable, else why not (naming the module to load)."""
    try:
        targets = mapper.targets()
    except FailedPrecondition as e:
        return str(e)
    except OSError as e:
        return f"listing device-mapper targets failed: {errno_text(e)}"
    if CRYPT_TARGET not in targets:
        return (
            "the kernel has no dm-crypt target (module dm_crypt is not loaded; the agent loads "
            "no modules: load dm_crypt, xts and ecb at boot); its targets: "
            + ", ".join(sorted(targets))
        )
    return None
