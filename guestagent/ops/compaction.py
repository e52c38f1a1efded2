"""Compaction on request: gather free pages into high orders before the host takes them.

A balloon or free page reporting hands back whole free blocks (reporting works on
order >= pageblock_order, 2 MiB on x86), so compacting first makes the freed memory worth
taking. The kernel's write blocks until compaction ends; concurrent callers share one run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from guestagent.errors import DeadlineExceeded
from guestagent.jsonlog import EventLog
from guestagent.linux.abi import PAGE_SIZE, huge_order
from guestagent.linux.kernel import Kernel
from guestagent.linux.mm import (
    compaction_trigger,
    read_compaction_counters,
    read_free_blocks,
    trigger_compaction,
)
from guestagent.records import record

log = EventLog("guestagent.ops.compaction")


@record
class CompactResult:
    node: int | None
    duration_s: float
    free_blocks_before: tuple[int, ...]  # Free blocks per order, summed over zones.
    free_blocks_after: tuple[int, ...]
    counters: dict[str, int]  # /proc/vmstat compact_* deltas.
    huge_block_bytes: int  # The size of a THP-sized block (huge_order).
    free_huge_bytes_before: int  # Free bytes in blocks of huge_block_bytes or more.
    free_huge_bytes_after: int
    shared: bool = False  # This caller joined a run already under way.


def counter_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def free_bytes_at_or_above(free_blocks: tuple[int, ...], order: int, page_size: int) -> int:
    return sum(count * (page_size << o) for o, count in enumerate(free_blocks) if o >= order)


class Compactor:
    """Runs one compaction per node at a time; callers arriving meanwhile share its result."""

    def __init__(self, kernel: Kernel, page_size: int | None = None) -> None:
        self.kernel = kernel
        self.page_size = page_size or PAGE_SIZE
        self._running: dict[int | None, asyncio.Task[CompactResult]] = {}

    def _compact(self, node: int | None, path: str) -> CompactResult:
        buddy_before = read_free_blocks(self.kernel, node)
        counters_before = read_compaction_counters(self.kernel)
        started = time.monotonic()
        trigger_compaction(self.kernel, path)
        duration = time.monotonic() - started
        buddy_after = read_free_blocks(self.kernel, node)
        order = huge_order(self.page_size)
        result = CompactResult(
            node=node,
            duration_s=duration,
            free_blocks_before=buddy_before,
            free_blocks_after=buddy_after,
            counters=counter_deltas(counters_before, read_compaction_counters(self.kernel)),
            huge_block_bytes=self.page_size << order,
            free_huge_bytes_before=free_bytes_at_or_above(buddy_before, order, self.page_size),
            free_huge_bytes_after=free_bytes_at_or_above(buddy_after, order, self.page_size),
        )
        log.info("compacted", node=node, duration_s=round(duration, 3), **result.counters)
        return result

    def compact_blocking(self, node: int | None = None) -> CompactResult:
        """One run on the caller's thread (the reclaimer's), not shared with RPC callers."""
        return self._compact(node, compaction_trigger(self.kernel, node))

    async def compact(self, node: int | None, timeout_s: float | None) -> CompactResult:
        path = compaction_trigger(self.kernel, node)
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
                f"after {timeout_s:.2f} s; it goes on in the kernel and the next call shares it",
                "COMPACTION_STILL_RUNNING",
                metadata={"timeoutSeconds": f"{timeout_s:.2f}"},
            ) from None
        if shared:
            return dataclasses.replace(result, shared=True)
        return result
