"""Compaction on request: gather free pages into high orders before the host takes them.

A balloon or free page reporting hands back whole free blocks (reporting works on
order >= pageblock_order, 2 MiB on x86), so compacting first makes the freed memory worth
taking. The kernel's write blocks until compaction ends; concurrent callers share one run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from guestagent.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, KernelFormat
from guestagent.jsonlog import EventLog
from guestagent.linux.fs import KernelFS
from guestagent.linux.keyed import parse_flat_keyed

log = EventLog("guestagent.ops.compaction")

# Free page reporting and THP work on pageblocks: order 9, 2 MiB with x86-64's 4 KiB pages.
HUGE_ORDER = 9


@dataclass(frozen=True)
class CompactResult:
    node: int | None
    duration_s: float
    free_blocks_before: tuple[int, ...]  # Free blocks per order, summed over zones.
    free_blocks_after: tuple[int, ...]
    counters: dict[str, int]  # /proc/vmstat compact_* deltas.
    huge_block_bytes: int  # The size of an order-HUGE_ORDER block.
    free_huge_bytes_before: int  # Free bytes in blocks of huge_block_bytes or more.
    free_huge_bytes_after: int
    shared: bool = False  # This caller joined a run already under way.


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


def counter_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def free_bytes_at_or_above(free_blocks: tuple[int, ...], order: int, page_size: int) -> int:
    return sum(count * (page_size << o) for o, count in enumerate(free_blocks) if o >= order)


class Compactor:
    """Runs one compaction per node at a time; callers arriving meanwhile share its result."""

    def __init__(self, fs: KernelFS, page_size: int | None = None) -> None:
        self.fs = fs
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self._running: dict[int | None, asyncio.Task[CompactResult]] = {}

    def _trigger_path(self, node: int | None) -> Path:
        if node is None:
            path = self.fs.proc("sys", "vm", "compact_memory")
        else:
            if node < 0:
                raise InvalidArgument(f"NUMA node {node} is negative")
            if not self.fs.is_dir(self.fs.sys("devices", "system", "node", f"node{node}")):
                raise InvalidArgument(f"NUMA node {node} does not exist")
            path = self.fs.sys("devices", "system", "node", f"node{node}", "compact")
        if not self.fs.exists(path):
            raise FailedPrecondition(f"{path} is missing: the kernel has no CONFIG_COMPACTION")
        return path

    def _compact(self, node: int | None, path: Path) -> CompactResult:
        buddy_before = parse_buddyinfo(self.fs.read(self.fs.proc("buddyinfo")), node)
        vmstat_before = parse_flat_keyed(self.fs.read(self.fs.proc("vmstat")), "compact_")
        started = time.monotonic()
        self.fs.write(path, "1")
        duration = time.monotonic() - started
        buddy_after = parse_buddyinfo(self.fs.read(self.fs.proc("buddyinfo")), node)
        result = CompactResult(
            node=node,
            duration_s=duration,
            free_blocks_before=buddy_before,
            free_blocks_after=buddy_after,
            counters=counter_deltas(
                vmstat_before, parse_flat_keyed(self.fs.read(self.fs.proc("vmstat")), "compact_")
            ),
            huge_block_bytes=self.page_size << HUGE_ORDER,
            free_huge_bytes_before=free_bytes_at_or_above(buddy_before, HUGE_ORDER, self.page_size),
            free_huge_bytes_after=free_bytes_at_or_above(buddy_after, HUGE_ORDER, self.page_size),
        )
        log.info("compacted", node=node, duration_s=round(duration, 3), **result.counters)
        return result

    def compact_blocking(self, node: int | None = None) -> CompactResult:
        """One run on the caller's thread (the reclaimer's), not shared with RPC callers."""
        return self._compact(node, self._trigger_path(node))

    async def compact(self, node: int | None, timeout_s: float | None) -> CompactResult:
        path = self._trigger_path(node)
        task = self._running.get(node)
        shared = task is not None
        if task is None:
            task = asyncio.ensure_future(asyncio.to_thread(self._compact, node, path))
            self._running[node] = task
            task.add_done_callback(lambda _: self._running.pop(node, None))
        try:
            # Shielded: a caller that gives up must not cancel the run others wait for.
            result = await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(
                f"compaction {'of node ' + str(node) if node is not None else ''} still running "
                f"after {timeout_s:.2f} s; it goes on in the kernel and the next call shares it"
            ) from None
        if shared:
            return dataclasses.replace(result, shared=True)
        return result
