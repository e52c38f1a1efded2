"""The working-set reclaimer's writer: one step written to memory.reclaim a chunk at a time,
stopped early once the kernel finds the rest of the cgroup referenced (policy's
`stop_step_after_chunk` judges each chunk).
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from guestagent.errors import AgentError
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroup.memory import MemoryCgroup
from guestagent.ops.workingset.policy import CHUNK_BYTES, ReclaimPolicy, stop_step_after_chunk
from guestagent.records import record

log = EventLog("guestagent.ops.workingset")

# One write to a cgroup's memory.reclaim: False when the kernel got less (EAGAIN).
WriteReclaim = Callable[[MemoryCgroup, str], bool]


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
        started = self._clock()
        done = 0
        yields: list[tuple[int | None, int | None]] = []
        try:
            first = counters = memory.stat()
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
                latest = memory.stat()
                yields.append(
                    (
                        _delta(latest.scanned, counters.scanned),
                        _delta(latest.stolen, counters.stolen),
                    )
                )
                counters = latest
                why, working_set = stop_step_after_chunk(
                    tuple(yields),
                    latest.refaults - first.refaults,
                    done,
                    self._clock() - started,
                    policy.interval_ms / 1000,
                    self._page_size,
                )
                if why:
                    return StepResult(done, why, working_set)
        except AgentError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV) or not memory.exists():
                return StepResult(done)  # The cgroup went away; the next reading drops it.
            log.warning("reclaim_write_failed", cgroup=memory.name, error=str(e))
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
