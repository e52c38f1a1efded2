"""Device events straight off the uevent netlink socket, without libudev: what the memory
hot-plug watcher needs is "a memory block was added", which is two properties of any event.

Where udevd runs the events are udev's (its multicast group, sent once its rules ran, in
libudev's framing); where it does not, the kernel's own (its group, plain text), as
guestagent.linux.udev chooses for pyudev. Only root in the initial network namespace can
send to either group (the kernel grants NETLINK_KOBJECT_UEVENT no unprivileged sending), and
an event here only starts a rescan of sysfs.
"""

from __future__ import annotations

import errno
import socket
import struct

from guestagent.linux.fs import KernelFS
from guestagent.linux.udev import udevd_running

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1
UDEV_GROUP = 2
# A virtio-mem plug of a few GiB adds hundreds of blocks at once; a fuller buffer drops
# events (ENOBUFS), which the reader reports as "rescan".
RECEIVE_BUFFER_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 1 << 16
# libudev's framing (systemd's device-monitor.c, struct monitor_netlink_header): "libudev\0",
# a magic number, the header's size, then the properties' offset and length.
LIBUDEV_PREFIX = b"libudev\0"
LIBUDEV_MAGIC = 0xFEEDCAFE
_LIBUDEV_HEADER = struct.Struct("=8sIIII")


def uevent_properties(message: bytes) -> dict[str, str]:
    """A uevent's KEY=value properties, from the kernel's text ("add@/devpath" first) or
    libudev's framing; {} for anything else."""
    if message.startswith(LIBUDEV_PREFIX):
        if len(message) < _LIBUDEV_HEADER.size:
            return {}
        _, magic, _, offset, length = _LIBUDEV_HEADER.unpack_from(message)
        if socket.ntohl(magic) != LIBUDEV_MAGIC or offset + length > len(message):
            return {}
        fields = message[offset : offset + length].split(b"\0")
    elif b"@/" in message.split(b"\0", 1)[0]:
        fields = message.split(b"\0")[1:]
    else:
        return {}
    properties = {}
    for field in fields:
        key, sep, value = field.partition(b"=")
        if sep:
            properties[key.decode(errors="replace")] = value.decode(errors="replace")
    return properties


def is_memory_added(properties: dict[str, str]) -> bool:
    return properties.get("SUBSYSTEM") == "memory" and properties.get("ACTION") == "add"


def open_uevents(fs: KernelFS) -> socket.socket:
    """A non-blocking socket on udev's events where udevd runs, the kernel's otherwise."""
    group = UDEV_GROUP if udevd_running(fs) else KERNEL_GROUP
    sock = socket.socket(
        socket.AF_NETLINK,
        socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
        NETLINK_KOBJECT_UEVENT,
    )
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        sock.bind((0, group))
    except OSError:
        sock.close()
        raise
    return sock


def read_uevents(sock: socket.socket) -> tuple[list[dict[str, str]], bool]:
    """Every event waiting on sock, and whether some were lost (the buffer overflowed)."""
    events: list[dict[str, str]] = []
    lost = False
    while True:
        try:
            message = sock.recv(MAX_MESSAGE_BYTES)
        except BlockingIOError:
            return events, lost
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
            lost = True
            continue
        events.append(uevent_properties(message))
