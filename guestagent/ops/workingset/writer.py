"""The working-set reclaimer's writer: one step written a chunk at a time, to memory.reclaim (a
probe) or as eviction commands for the multi-gen LRU's cold generations (cold.py), stopped
early once the kernel finds the rest of the cgroup referenced or what it took comes back
(policy's `stop_step_after_chunk` judges each chunk for both).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable
from dataclasses import replace

from guestagent.errors import AgentError
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.memory import MemoryCgroup
from guestagent.linux.lru_gen import Eviction
from guestagent.ops.workingset.policy import (
    CHUNK_BYTES,
    EVICT_CHUNK_BYTES,
    ReclaimPolicy,
    stop_step_after_chunk,
)
from guestagent.records import record

log = EventLog("guestagent.ops.workingset")

# One write to a cgroup's memory.reclaim: False when the kernel got less (EAGAIN).
WriteReclaim = Callable[[MemoryCgroup, str], bool]
# One eviction command to the multi-gen LRU: False when the kernel refused it (linux/lru_gen.py).
WriteEviction = Callable[[Eviction], bool]


@record
class StepResult:
    reclaimed: int
    stopped: str = ""  # Why the step stopped early, "" if it did not.
    working_set: bool = False  # Whether it stopped because it reached the working set.

    @property
    def low_yield(self) -> str:
        """The why, when it was the working set reached: the next decision's input."""
        return self.stopped if self.working_set else ""


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


class _Chunks:
    """A step's chunks as the cgroup's memory.stat counts them, and the verdict after each
    (policy's stop_step_after_chunk)."""

    def __init__(
        self,
        memory: MemoryCgroup,
        clock: Callable[[], float],
        policy: ReclaimPolicy,
        page_size: int,
    ) -> None:
        self._memory, self._clock, self._page_size = memory, clock, page_size
        self._interval_s = policy.interval_ms / 1000
        self._started = clock()
        self._first = self._counters = memory.stat()
        self._yields: list[tuple[int | None, int | None]] = []

    def measure(self) -> int | None:
        """Read what the last chunk did; the pages the kernel stole in it (None: the kernel
        does not count them)."""
        latest = self._memory.stat()
        scanned = _delta(latest.scanned, self._counters.scanned)
        stolen = _delta(latest.stolen, self._counters.stolen)
        self._yields.append((scanned, stolen))
        self._counters = latest
        return stolen

    def verdict(self, done: int) -> tuple[str, bool]:
        """Why to stop after `done` bytes ("" to go on), and whether it is the working set."""
        return stop_step_after_chunk(
            tuple(self._yields),
            self._counters.refaults - self._first.refaults,
            done,
            self._clock() - self._started,
            self._interval_s,
            self._page_size,
        )


def _failed(memory: MemoryCgroup, error: AgentError, event: str) -> None:
    """A write that failed: a cgroup that went away is the next reading's to drop; anything
    else is logged."""
    if error.errno not in (errno.ENOENT, errno.ENODEV) and memory.exists():
        log.warning(event, cgroup=memory.name, error=str(error))


class StepWriter:
    def __init__(
        self,
        clock: Callable[[], float],
        page_size: int,
        write: WriteReclaim = MemoryCgroup.reclaim,
    ) -> None:
        self._clock = clock
        self._page_size = page_size
        self._write = write
        # None: not known yet whether memory.reclaim takes "swappiness=" (Linux 6.12+).
        self._swappiness_arg: bool | None = None

    def write_step(
        self,
        memory: MemoryCgroup,
        step: int,
        current: int,
        policy: ReclaimPolicy,
        still_on: Callable[[], bool],
    ) -> StepResult:
        """Ask memory.reclaim for `step` bytes a chunk at a time; `current` is memory.current
        before it, and `still_on` says whether the target is still on, with the same policy."""
        done = 0
        try:
            chunks = _Chunks(memory, self._clock, policy, self._page_size)
            while done < step:
                # Turned off (or changed) since the figures were read: stop at once.
                if not still_on():
                    return StepResult(done)
                chunk = min(CHUNK_BYTES, step - done)
                if not self._write_chunk(memory, chunk, policy.anon):
                    # EAGAIN: the kernel got less than the chunk; memory.current says how much.
                    after = memory.current_or_zero()
                    got = max(done, min(step, current - after)) if after else done
                    return StepResult(got, "the kernel found no more to reclaim")
                done += chunk
                if done >= step:
                    break
                chunks.measure()
                why, working_set = chunks.verdict(done)
                if why:
                    return StepResult(done, why, working_set)
        except AgentError as e:
            _failed(memory, e, "reclaim_write_failed")
        return StepResult(done)

    def evict_step(
        self,
        memory: MemoryCgroup,
        plan: Iterable[Eviction],
        step: int,
        policy: ReclaimPolicy,
        still_on: Callable[[], bool],
        evict: WriteEviction,
    ) -> StepResult:
        """Write the plan's evictions, in order, up to `step` bytes, EVICT_CHUNK_BYTES a
        write; `memory` is the target's, whose memory.stat (its subtree's pgsteal) says what
        each write took. An eviction ends early when its write takes less than it asked: the
        generations it names have no more (an aging folded them meanwhile, or what was left
        was found in use), and the next interval plans again from the ages then."""
        done = 0
        chunk_pages = EVICT_CHUNK_BYTES // self._page_size
        try:
            chunks = _Chunks(memory, self._clock, policy, self._page_size)
            for eviction in plan:
                left = eviction.pages
                while left > 0 and done < step:
                    if not still_on():
                        return StepResult(done)
                    pages = min(chunk_pages, left, -(-(step - done) // self._page_size))
                    if not evict(replace(eviction, pages=pages)):
                        break  # The memcg died, or its generations moved on.
                    stolen = chunks.measure() or 0
                    done += stolen * self._page_size
                    left -= pages
                    why, working_set = chunks.verdict(done)
                    if why:
                        return StepResult(done, why, working_set)
                    if stolen < pages:
                        break
        except AgentError as e:
            _failed(memory, e, "reclaim_evict_failed")
        return StepResult(done)

    def _write_chunk(self, memory: MemoryCgroup, size: int, anon: bool) -> bool:
        """One memory.reclaim write; False when the kernel got less (EAGAIN)."""
        if anon or self._swappiness_arg is False:
            return self._write(memory, str(size))
        try:
            complete = self._write(memory, f"{size} swappiness=0")
        except AgentError as e:
            if e.errno != errno.EINVAL:
                raise
            # Before 6.12 the kernel takes no arguments. Without anon allowed, only file
            # pages then go unless swap is on; the log says so once.
            self._swappiness_arg = False
            log.warning("reclaim_no_swappiness_arg", cgroup=memory.name)
            return self._write(memory, str(size))
        self._swappiness_arg = True
        return complete
