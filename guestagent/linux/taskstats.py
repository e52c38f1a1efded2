"""Delay accounting over taskstats: how long a process's tasks waited on memory.

The kernel keeps, per task, the time spent in direct reclaim (`freepages`), waiting on a
refault of a working-set page (`thrashing`, the hook PSI's memstall uses), swapping in
(`swapin`) and in direct compaction (`compact`), and hands them out over the TASKSTATS
generic-netlink family (Documentation/accounting/delay-accounting.rst, taskstats.rst,
include/uapi/linux/taskstats.h). A query by tgid sums the live threads and the threads that
already exited (the kernel folds those into the thread group's signal struct).

Accounting is off at boot unless `delayacct` is on the command line (Linux 5.14 made it so);
the `kernel.task_delayacct` sysctl turns it on at run time, for the tasks started after that
(the kernel gives a task its delay record at fork, and only while accounting is on): a task
older than that reads zero delays. TASKSTATS_CMD_GET needs CAP_NET_ADMIN.

The parsers are pure (bytes in, values out); `TaskstatsClient` is the socket.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Iterator

from guestagent.errors import AgentError, KernelFormat, kernel_error
from guestagent.records import record

FAMILY_NAME = "TASKSTATS"

# <linux/netlink.h>, <linux/genetlink.h>
NETLINK_GENERIC = 16
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLA_TYPE_MASK = 0x3FFF  # Without NLA_F_NESTED and NLA_F_NET_BYTEORDER.
_NLMSGHDR = struct.Struct("=IHHII")
_GENLMSGHDR = struct.Struct("=BBH")
_NLATTR = struct.Struct("=HH")

# <linux/taskstats.h>
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_ATTR_TGID = 2
TASKSTATS_TYPE_TGID = 2
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_TGID = 5


# Byte offsets of the u64 delay totals in struct taskstats, as its C layout places them (its
# aligned(8) members included). Versions only append, and the kernel sends the struct of its
# own version whole, so a field is there exactly when the payload reaches past it: freepages
# came with version 7, thrashing with 9, compact with 11.
SWAPIN_DELAY = 56
ELAPSED_US = 144  # ac_etime: for a thread group, summed over its live threads.
FREEPAGES_DELAY = 320
THRASHING_DELAY = 336
COMPACT_DELAY = 360


@record
class TaskDelays:
    """One thread group's memory delays so far, in ns; None where its kernel has no such field."""

    version: int
    # Microseconds since start, summed over the live threads (what the kernel sends for a
    # thread group): no more than the group's age when it has one thread.
    elapsed_us: int
    swapin_ns: int
    freepages_ns: int | None
    thrashing_ns: int | None
    compact_ns: int | None

    @property
    def memory_ns(self) -> int:
        """The waits PSI counts as a memory stall: direct reclaim, thrashing (a refault of a
        working-set page, file or swapped anon) and compaction. swapin is left out where the
        kernel has thrashing: mm/page_io.c times a working-set swap-in as both, so summing
        both counted each such refault twice (a classic-LRU run read 4.5 ms/s of stall from
        8 refaults/s), and PSI does not count the swap-in of a page outside the working set.
        Before version 9 there is no thrashing, and swapin is the swap-side wait there is."""
        swap = self.thrashing_ns if self.thrashing_ns is not None else self.swapin_ns
        parts = (self.freepages_ns, swap, self.compact_ns)
        return sum(p for p in parts if p is not None)


def _u64(payload: bytes, offset: int) -> int | None:
    if len(payload) < offset + 8:
        return None
    value: int = struct.unpack_from("=Q", payload, offset)[0]
    return value


def parse_taskstats(payload: bytes) -> TaskDelays:
    """struct taskstats, as TASKSTATS_TYPE_STATS carries it, by its version."""
    swapin = _u64(payload, SWAPIN_DELAY)
    version: int = struct.unpack_from("=H", payload)[0] if len(payload) >= 2 else 0
    if swapin is None or version < 1:
        raise KernelFormat(
            f"struct taskstats of {len(payload)} bytes, version {version}, is not one the "
            "kernel sends"
        )
    return TaskDelays(
        version,
        _u64(payload, ELAPSED_US) or 0,
        swapin,
        _u64(payload, FREEPAGES_DELAY),
        _u64(payload, THRASHING_DELAY),
        _u64(payload, COMPACT_DELAY),
    )


def _align(length: int) -> int:
    return (length + 3) & ~3


def attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Netlink attributes (type without its flags, payload) in a message's body."""
    at = 0
    while at + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, at)
        if length < _NLATTR.size or at + length > len(data):
            raise KernelFormat(f"netlink attribute of length {length} at {at} overruns")
        yield kind & NLA_TYPE_MASK, data[at + _NLATTR.size : at + length]
        at += _align(length)


def _attribute(kind: int, payload: bytes) -> bytes:
    header = _NLATTR.pack(_NLATTR.size + len(payload), kind)
    return (header + payload).ljust(_align(_NLATTR.size + len(payload)), b"\0")


def request(family: int, command: int, attribute: bytes, seq: int) -> bytes:
    """One generic-netlink request with one attribute."""
    body = _GENLMSGHDR.pack(command, 1, 0) + attribute
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), family, NLM_F_REQUEST, seq, 0) + body


def family_request(name: str, seq: int) -> bytes:
    return request(
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        _attribute(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0"),
        seq,
    )


def tgid_request(family: int, tgid: int, seq: int) -> bytes:
    return request(
        family, TASKSTATS_CMD_GET, _attribute(TASKSTATS_CMD_ATTR_TGID, struct.pack("=I", tgid)), seq
    )


def reply_body(message: bytes, seq: int) -> bytes:
    """The attributes of the reply to request `seq`; for an error reply, the domain error of
    its errno."""
    if len(message) < _NLMSGHDR.size:
        raise KernelFormat(f"netlink reply of {len(message)} bytes is too short")
    length, kind, _, got_seq, _ = _NLMSGHDR.unpack_from(message)
    if length > len(message) or length < _NLMSGHDR.size:
        raise KernelFormat(f"netlink reply says {length} bytes, has {len(message)}")
    if got_seq != seq:
        raise KernelFormat(f"netlink reply to request {got_seq}, not {seq}")
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("=i", message, _NLMSGHDR.size)[0]
        raise kernel_error("query", "taskstats", None, OSError(code, os.strerror(code)))
    return message[_NLMSGHDR.size + _GENLMSGHDR.size : length]


def parse_family_id(body: bytes) -> int:
    for kind, payload in attributes(body):
        if kind == CTRL_ATTR_FAMILY_ID and len(payload) >= 2:
            family: int = struct.unpack_from("=H", payload)[0]
            return family
    raise KernelFormat("the generic-netlink controller's reply names no family id")


def parse_tgid_stats(body: bytes) -> tuple[int, TaskDelays]:
    """The tgid and its delays from a TASKSTATS_CMD_GET reply by tgid."""
    for kind, payload in attributes(body):
        if kind != TASKSTATS_TYPE_AGGR_TGID:
            continue
        tgid, stats = None, None
        for inner, value in attributes(payload):
            if inner == TASKSTATS_TYPE_TGID and len(value) >= 4:
                tgid = struct.unpack_from("=I", value)[0]
            elif inner == TASKSTATS_TYPE_STATS:
                stats = parse_taskstats(value)
        if tgid is not None and stats is not None:
            return tgid, stats
    raise KernelFormat("the taskstats reply holds no thread group's stats")


class TaskstatsClient:
    """One netlink socket to TASKSTATS, opened on first use; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._family = 0
        self._seq = 0

    def _call(self, make: bytes, seq: int) -> bytes:
        assert self._socket is not None
        self._socket.send(make)
        while True:
            reply = self._socket.recv(65536)
            try:
                return reply_body(reply, seq)
            except KernelFormat:
                # A late answer to a request whose caller gave up: skip it, not ours.
                if len(reply) >= _NLMSGHDR.size and _NLMSGHDR.unpack_from(reply)[3] < seq:
                    continue
                raise

    def _open(self) -> None:
        sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC
        )
        sock.settimeout(2.0)
        sock.bind((0, 0))
        self._socket = sock
        try:
            self._seq += 1
            self._family = parse_family_id(
                self._call(family_request(FAMILY_NAME, self._seq), self._seq)
            )
        except BaseException:
            self.close()
            raise

    def delays(self, tgid: int) -> TaskDelays | None:
        """The thread group's delays; None when it is gone (exited or never was)."""
        with self._lock:
            try:
                if self._socket is None:
                    self._open()
                self._seq += 1
                _, stats = parse_tgid_stats(
                    self._call(tgid_request(self._family, tgid, self._seq), self._seq)
                )
            except AgentError as e:
                if e.errno == errno.ESRCH:
                    return None
                raise
            except OSError as e:
                self.close()
                raise kernel_error("query", "taskstats", None, e) from None
            return stats

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
