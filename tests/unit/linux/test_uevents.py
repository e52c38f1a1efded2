"""Uevents as the kernel and udevd send them, parsed without libudev."""

from __future__ import annotations

import socket
import struct

import pytest

from guestagent.linux.uevents import (
    LIBUDEV_MAGIC,
    is_memory_added,
    read_uevents,
    uevent_properties,
)

# A DIMM's block as the kernel announces it: "ACTION@DEVPATH", then KEY=value strings
# (lib/kobject_uevent.c).
KERNEL_ADD = (
    b"add@/devices/system/memory/memory40\0ACTION=add\0DEVPATH=/devices/system/memory/memory40\0"
    b"SUBSYSTEM=memory\0SEQNUM=2101\0"
)
PROPERTIES = b"ACTION=add\0DEVPATH=/devices/system/memory/memory40\0SUBSYSTEM=memory\0SEQNUM=7\0"


def libudev_message(properties: bytes, magic: int = LIBUDEV_MAGIC) -> bytes:
    """udevd's framing: prefix, magic in network order, header size, properties offset and
    length, four filter hashes (systemd's struct monitor_netlink_header)."""
    header_size = 8 + 4 * 8
    header = struct.pack(
        "=8sIIIIIIII",
        b"libudev\0",
        socket.htonl(magic),
        header_size,
        header_size,
        len(properties),
        0,
        0,
        0,
        0,
    )
    return header + properties


@pytest.mark.parametrize("message", [KERNEL_ADD, libudev_message(PROPERTIES)])
def test_a_memory_block_add_is_seen_in_either_framing(message: bytes) -> None:
    properties = uevent_properties(message)
    assert properties["DEVPATH"] == "/devices/system/memory/memory40"
    assert is_memory_added(properties)


@pytest.mark.parametrize(
    "message",
    [
        b"remove@/devices/system/memory/memory40\0ACTION=remove\0SUBSYSTEM=memory\0",
        b"add@/devices/virtual/block/loop0\0ACTION=add\0SUBSYSTEM=block\0",
        libudev_message(PROPERTIES, magic=0x12345678),  # Another framing version.
        libudev_message(PROPERTIES)[:30],  # Cut short.
        b"ACTION=add\0SUBSYSTEM=memory\0",  # Neither framing.
        b"",
    ],
)
def test_anything_else_is_not_a_memory_add(message: bytes) -> None:
    assert not is_memory_added(uevent_properties(message))


def test_reading_drains_what_is_waiting() -> None:
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with reader, writer:
        reader.setblocking(False)
        assert read_uevents(reader) == ([], False)
        writer.send(KERNEL_ADD)
        writer.send(libudev_message(PROPERTIES))
        events, lost = read_uevents(reader)
    assert [is_memory_added(e) for e in events] == [True, True] and not lost
