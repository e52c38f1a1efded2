"""The swiotlb (the kernel's software IO TLB): the bounce buffer it sets aside at boot, part of
the reserve a VM's containers cannot use.

A confidential guest must have one (devices cannot reach its encrypted memory) and sizes it
with its memory (arch/x86/mm/mem_encrypt.c: 6 % of RAM, 64 MiB to 1 GiB); a plain x86 guest
has 64 MiB only when it has RAM, or a memory hotplug region, above 4 GiB. Two places show its
size:

- debugfs, kernel/dma/swiotlb.c: /sys/kernel/debug/swiotlb/io_tlb_nslabs, in slabs of
  IO_TLB_SIZE (2 KiB). The directory without that file is a kernel with no pool.
- the boot log, swiotlb_print_info: "software IO TLB: mapped [mem START-END] (64MB)", the
  pool spanning START to END. Read from /dev/kmsg, the kernel's own log device: no dmesg, no
  syslog daemon. Absence of the line means no pool only when the log still starts at boot
  (its first record's sequence number is 0); a busy guest's ring buffer may have lost it.
"""

from __future__ import annotations

import errno
import os
import re

from guestagent.errors import AgentError, KernelFormat, kernel_error
from guestagent.linux.features import Absent
from guestagent.linux.fs import KernelFS
from guestagent.linux.lru_gen import debugfs
from guestagent.records import record

SWIOTLB = "swiotlb"
SLAB_BYTES = 1 << 11  # IO_TLB_SHIFT
DEBUGFS_SOURCE = "debugfs"
BOOT_LOG_SOURCE = "boot log"
_MAPPED = re.compile(r"software IO TLB: mapped \[mem (0x[0-9a-fA-F]+)-(0x[0-9a-fA-F]+)\]")
_TORN_DOWN = "software IO TLB: tearing down default memory pool"
# /dev/kmsg returns one record per read; one is at most a few KiB (printk's record limit).
_RECORD_BYTES = 16384


@record
class Swiotlb:
    size: int  # bytes; 0 when the kernel set no pool up
    source: str  # DEBUGFS_SOURCE or BOOT_LOG_SOURCE


def parse_nslabs(text: str) -> int:
    """io_tlb_nslabs, in bytes."""
    try:
        return int(text.strip()) * SLAB_BYTES
    except ValueError:
        raise KernelFormat(f"swiotlb io_tlb_nslabs {text.strip()!r} is not a number") from None


def parse_boot_log(kmsg: str) -> Swiotlb | Absent:
    """The pool the boot log shows, from /dev/kmsg records ("prio,seq,usec,flags;text", then
    " KEY=value" lines): the last mapping, or 0 once torn down or never mapped in a log that
    still starts at boot."""
    first_seq: int | None = None
    size: int | None = None
    for line in kmsg.splitlines():
        header, sep, text = line.partition(";")
        if not sep or line.startswith(" "):
            continue
        fields = header.split(",")
        if first_seq is None and len(fields) > 1 and fields[1].isdigit():
            first_seq = int(fields[1])
        if mapped := _MAPPED.search(text):
            size = int(mapped.group(2), 16) - int(mapped.group(1), 16)
        elif _TORN_DOWN in text:
            size = 0
    if size is not None:
        return Swiotlb(size, BOOT_LOG_SOURCE)
    if first_seq == 0:
        return Swiotlb(0, BOOT_LOG_SOURCE)
    if first_seq is None:
        return Absent(SWIOTLB, "the boot log is empty")
    return Absent(
        SWIOTLB,
        f"the boot log no longer starts at boot (its first record is number {first_seq}) and "
        "holds no software IO TLB line",
    )


def read_kmsg(fs: KernelFS) -> str:
    """Every record /dev/kmsg still holds, read without blocking until there are no more."""
    path = fs.dev("kmsg")
    fd = fs.open(path, os.O_RDONLY | os.O_NONBLOCK, "read")
    records = []
    try:
        while True:
            try:
                record = os.read(fd, _RECORD_BYTES)
            except BlockingIOError:
                break  # No more records: /dev/kmsg's end.
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue  # Records overwritten while reading: go on with the next.
                raise kernel_error("read", path, None, e) from e
            if not record:
                break  # A plain file (a test's tree) ends.
            records.append(record)
    finally:
        os.close(fd)
    return b"".join(records).decode("utf-8", errors="replace")


def _read_debugfs(fs: KernelFS) -> Swiotlb | None:
    """The pool debugfs shows; None when it shows no swiotlb directory."""
    directory = fs.sys("kernel", "debug", SWIOTLB)
    with debugfs(fs, directory):
        if not fs.is_dir(directory):
            return None
        text = fs.read_optional(os.path.join(directory, "io_tlb_nslabs"))
        # No file in a directory still there is no pool; with the directory gone, another
        # user of debugfs (the idle ages) unmounted it meanwhile, and that says nothing.
        if text is None and not fs.is_dir(directory):
            return None
    return Swiotlb(0 if text is None else parse_nslabs(text), DEBUGFS_SOURCE)


def read_swiotlb(fs: KernelFS) -> Swiotlb | Absent:
    """From debugfs (the live figure) where it can be read, else from the boot log; Absent
    saying why neither showed it."""
    try:
        found = _read_debugfs(fs)
        why_not_debugfs = "debugfs has no swiotlb directory"
    except AgentError as e:
        found, why_not_debugfs = None, f"debugfs: {e}"
    if found is not None:
        return found
    try:
        logged = parse_boot_log(read_kmsg(fs))
    except AgentError as e:
        return Absent(SWIOTLB, f"{why_not_debugfs}; boot log: {e}")
    if isinstance(logged, Absent):
        return Absent(SWIOTLB, f"{why_not_debugfs}; {logged.reason}")
    return logged
