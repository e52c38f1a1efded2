"""The memory manager's system-wide files: free blocks per order (/proc/buddyinfo), pages
present (/proc/zoneinfo), compaction, the per-CPU free lists' bound, drop_caches, the multi-gen
LRU switch and this process's own footprint."""

from __future__ import annotations

import os

from guestagent.errors import FailedPrecondition, InvalidArgument, KernelFormat, NotFound
from guestagent.linux.features import read_lru_gen_enabled
from guestagent.linux.fs import KernelFS
from guestagent.linux.keyed import parse_flat_keyed


def parse_buddyinfo(text: str, node: int | None = None) -> tuple[int, ...]:
    """Free blocks per order summed over zones (and nodes, unless one is named)."""
    totals: list[int] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] != "Node":
            continue
        try:
            if node is not None and int(fields[1].rstrip(",")) != node:
                continue
            counts = [int(f) for f in fields[4:]]
        except ValueError:
            raise KernelFormat(f"buddyinfo line {line!r} is malformed") from None
        totals.extend([0] * (len(counts) - len(totals)))
        for order, count in enumerate(counts):
            totals[order] += count
    return tuple(totals)


def zoneinfo_sum(text: str, key: str) -> int:
    """One per-zone page count (a "key value" line: "present", "high"), summed over zones;
    the per-cpu pagesets' "high:" lines do not match "high"."""
    try:
        return sum(
            int(fields[1])
            for fields in (line.split() for line in text.splitlines())
            if len(fields) == 2 and fields[0] == key
        )
    except ValueError:
        raise KernelFormat(f"zoneinfo has a {key!r} line that is not a page count") from None


def parse_zoneinfo_present(text: str) -> int:
    """Pages present in all zones: the RAM the kernel manages, online hot-plugged memory
    included. Counting whole memory blocks instead would round a 306 MiB guest up to 384."""
    return zoneinfo_sum(text, "present")


def rss_bytes(status_text: str) -> int:
    """VmRSS from a /proc/PID/status text, in bytes; 0 when the line is absent."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                raise KernelFormat(f"status line {line!r} is malformed") from None
    return 0


def read_free_blocks(fs: KernelFS, node: int | None = None) -> tuple[int, ...]:
    return fs.read_parsed(fs.proc("buddyinfo"), lambda text: parse_buddyinfo(text, node))


def read_free_blocks_optional(fs: KernelFS) -> tuple[int, ...] | None:
    """Free blocks per order, None on a kernel without /proc/buddyinfo."""
    text = fs.read_optional(fs.proc("buddyinfo"))
    return parse_buddyinfo(text) if text is not None else None


def read_compaction_counters(fs: KernelFS) -> dict[str, int]:
    """/proc/vmstat's compact_* counters."""
    return fs.read_parsed(fs.proc("vmstat"), lambda text: parse_flat_keyed(text, "compact_"))


def compaction_trigger(fs: KernelFS, node: int | None) -> str:
    """The file whose write compacts all memory, or one NUMA node's."""
    if node is None:
        path = fs.proc("sys", "vm", "compact_memory")
    else:
        if node < 0:
            raise InvalidArgument(f"NUMA node {node} is negative", "NODE_INVALID", field="node")
        directory = fs.sys("devices", "system", "node", f"node{node}")
        if not fs.is_dir(directory):
            raise NotFound(
                f"NUMA node {node} does not exist", "NODE_NOT_FOUND", metadata={"node": node}
            )
        path = os.path.join(directory, "compact")
    if not fs.exists(path):
        raise FailedPrecondition(
            f"{path} is missing: the kernel has no CONFIG_COMPACTION",
            "COMPACTION_ABSENT",
            metadata={"path": path},
        )
    return path


def trigger_compaction(fs: KernelFS, trigger: str) -> None:
    """Compact; the write returns when the kernel has done."""
    fs.write(trigger, "1")


def read_present_bytes(fs: KernelFS, page_size: int) -> int | None:
    """Memory present in all zones, None on a kernel without /proc/zoneinfo."""
    text = fs.read_optional(fs.proc("zoneinfo"))
    return parse_zoneinfo_present(text) * page_size if text is not None else None


def read_own_rss(fs: KernelFS) -> int:
    return rss_bytes(fs.read(fs.proc("self", "status")))


def pcp_high_fraction_path(fs: KernelFS) -> str:
    return fs.proc("sys", "vm", "percpu_pagelist_high_fraction")


def read_pcp_high_fraction(fs: KernelFS) -> int | None:
    """vm.percpu_pagelist_high_fraction (0: the kernel's default, the per-CPU free lists as
    large as the zone's low watermark); None before Linux 5.14, which has no such sysctl."""
    text = fs.read_optional(pcp_high_fraction_path(fs))
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise KernelFormat(f"percpu_pagelist_high_fraction reads {text!r}") from None


def write_pcp_high_fraction(fs: KernelFS, fraction: int) -> None:
    fs.write(pcp_high_fraction_path(fs), str(fraction))


def drop_caches(fs: KernelFS, level: int) -> None:
    fs.write(fs.proc("sys", "vm", "drop_caches"), str(level))


def read_lru_gen(fs: KernelFS) -> str:
    """The multi-gen LRU's switch (a bit mask such as 0x0007), "absent" without one."""
    return (read_lru_gen_enabled(fs) or "absent").strip()
