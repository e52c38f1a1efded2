"""A cgroup's memory stall from delay accounting: the stall signal where PSI is off or absent.

PSI's memory.pressure `some` total is the wall time in which at least one of a cgroup's tasks
waited on memory. Without PSI the same waits are in each task's delay accounting (taskstats.py):
a cgroup's stall over an interval is the growth, over the processes in its cgroup.procs and its
descendants', of their direct reclaim, thrashing and compaction delays. Summed over tasks,
two tasks stalled at once count twice, so with more than one task stalling the figure is above
PSI's, never below it: a budget set in PSI's terms is kept, if anything, more strictly.

What the kernel lets a reader see, and so what is counted:
- A process seen at two reads counts its growth between them, its exited threads included
  (the kernel folds them into the thread group).
- A process first seen at a read counts whole if it is younger than the previous read (the
  delays of a new process are all from this interval), else from that read on (it moved in,
  and its past belongs to another cgroup).
- A process that exits between two reads loses what it stalled since the first: the kernel
  hands a dead process's delays only to a listener registered for every exit in the guest.
- A process started before delay accounting was turned on has no delay record and reads zero:
  the agent turns it on as it starts, before the runtime starts containers.
- The agent itself is left out: its memory.reclaim writes sit in direct reclaim, which delay
  accounting counts as its stall, while PSI has not counted proactive reclaim as pressure
  since 5.8 ("don't count limit-setting reclaim as memory pressure"). Counted, the guest's
  stall would rise with every step the reclaimer takes.

`DelayStallMeter.total_us` keeps one monotonic total per cgroup, shared by every reader (the
reclaimer, reports, watch streams), as PSI's total is: each reader takes differences.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from guestagent.errors import AgentError
from guestagent.linux.features import DELAYACCT, Absent
from guestagent.linux.fs import KernelFS
from guestagent.linux.taskstats import TaskDelays, TaskstatsClient
from guestagent.records import record

# The stall sources a reclaimer target or a report names.
PSI_STALL = "psi_stall"
DELAYACCT_STALL = "delayacct_stall"


class TaskDelaySource(Protocol):
    def delays(self, tgid: int) -> TaskDelays | None: ...


def task_delayacct_path(fs: KernelFS) -> str:
    """kernel.task_delayacct (Linux 5.14+): 1 while delay accounting runs."""
    return fs.proc("sys", "kernel", "task_delayacct")


def read_task_delayacct(fs: KernelFS) -> bool | None:
    """Whether delay accounting runs; None when the kernel has no switch for it."""
    text = fs.read_optional(task_delayacct_path(fs))
    return None if text is None else text.strip() == "1"


def write_task_delayacct(fs: KernelFS, on: bool) -> None:
    fs.write(task_delayacct_path(fs), "1" if on else "0")


def delayacct_absence(switch: bool | None, cmdline: str | None, taskstats: str) -> Absent | None:
    """Delay accounting as a stall signal, from kernel.task_delayacct (None: the kernel has no
    such sysctl, older than 5.14 or built without it), the command line, and why a taskstats
    query failed ("" when it worked)."""
    if switch is False:
        return Absent(
            DELAYACCT,
            "delay accounting is off (kernel.task_delayacct 0): the agent turns it on at start "
            "unless --delayacct keep; or sysctl kernel.task_delayacct=1, or boot with delayacct",
        )
    if switch is None and "nodelayacct" in (cmdline or "").split():
        return Absent(DELAYACCT, "the kernel was booted with nodelayacct")
    if taskstats:
        return Absent(
            DELAYACCT,
            "delay accounting cannot be read over taskstats (the kernel needs "
            f"CONFIG_TASK_DELAY_ACCT and CONFIG_TASKSTATS, the agent CAP_NET_ADMIN): {taskstats}",
        )
    return None


def cgroup_procs(text: str) -> tuple[int, ...]:
    return tuple(int(line) for line in text.split())


def read_subtree_tgids(fs: KernelFS, directory: str) -> tuple[int, ...]:
    """The processes in a cgroup and every cgroup below it. AgentError (ENOENT) when the cgroup
    itself is gone; a child removed meanwhile is passed over."""
    found: list[int] = []
    pending = [directory]
    while pending:
        current = pending.pop()
        try:
            found.extend(cgroup_procs(fs.read(os.path.join(current, "cgroup.procs"))))
            pending.extend(os.path.join(current, name) for name in fs.subdirectories(current))
        except AgentError:
            if current == directory:
                raise
    return tuple(found)


@record
class TaskSample:
    memory_ns: int
    elapsed_us: int


def stall_growth_ns(
    previous: Mapping[int, int], now: Mapping[int, TaskSample], since_us: int
) -> int:
    """What the processes seen now stalled since the previous read, `since_us` ago, whose
    per-process totals were `previous` (the rules in the module's docstring)."""
    grown = 0
    for tgid, sample in now.items():
        before = previous.get(tgid)
        if before is not None:
            grown += max(0, sample.memory_ns - before)
        elif sample.elapsed_us <= since_us:
            grown += sample.memory_ns
    return grown


@dataclass
class _Books:
    at: float
    by_tgid: dict[int, int]
    total_ns: int


class DelayStallMeter:
    """Monotonic memory-stall totals per cgroup from delay accounting, for the whole agent.

    `preferred` (serve --stall-signal delayacct) has it used where PSI is there too, so both
    figures can be seen side by side."""

    def __init__(
        self,
        fs: KernelFS,
        source: TaskDelaySource | None = None,
        clock: Callable[[], float] = time.monotonic,
        preferred: bool = False,
    ) -> None:
        self.fs = fs
        self.preferred = preferred
        self._source = source if source is not None else TaskstatsClient()
        self._clock = clock
        self._own = os.getpid()
        self._answered = False
        self._lock = threading.Lock()
        self._books: dict[str, _Books] = {}

    def stands_in(self, psi_present: bool) -> bool:
        """Whether delay accounting is the stall read here: where there is no PSI, and
        everywhere when preferred. (Whether it can be read is absence()'s question.)"""
        return not psi_present or self.preferred

    def absence(self) -> Absent | None:
        """Why there is no delay-accounting stall in this guest, None when there is one. The
        switch is read every time (anyone may turn it off); taskstats is asked until it has
        answered once, since neither the kernel's build nor the agent's capability changes."""
        switch = read_task_delayacct(self.fs)
        if switch is False:
            return delayacct_absence(switch, None, "")
        if not self._answered:
            try:
                self._source.delays(1)
            except AgentError as e:
                cmdline = self.fs.read_optional(self.fs.proc("cmdline"))
                return delayacct_absence(switch, cmdline, str(e))
            self._answered = True
        return None

    def guest_total_us(self) -> int:
        """total_us of every process in the guest (the root cgroup's subtree)."""
        return self.total_us(self.fs.cgroup_root)

    def total_us(self, directory: str) -> int:
        """The cgroup's stall so far: from its processes' delays when first read, then growing
        by what each read sees. AgentError (ENOENT) when the cgroup is gone."""
        with self._lock:
            try:
                tgids = read_subtree_tgids(self.fs, directory)
            except AgentError:
                self._books.pop(directory, None)
                raise
            samples: dict[int, TaskSample] = {}
            for tgid in tgids:
                if tgid == self._own:
                    continue
                delays = self._source.delays(tgid)
                if delays is not None:
                    samples[tgid] = TaskSample(delays.memory_ns, delays.elapsed_us)
            now = self._clock()
            books = self._books.get(directory)
            if books is None:
                total = sum(s.memory_ns for s in samples.values())
            else:
                since_us = int((now - books.at) * 1_000_000)
                total = books.total_ns + stall_growth_ns(books.by_tgid, samples, since_us)
            self._books[directory] = _Books(
                now, {t: s.memory_ns for t, s in samples.items()}, total
            )
            return total // 1000


@dataclass
class StallWindow:
    """A PSI trigger's rule over polled stall totals: fire when the stall within the last
    `window_us` reaches `stall_us`, at most once per window (as the kernel's triggers do)."""

    stall_us: int
    window_us: int
    samples: list[tuple[int, int]] = field(default_factory=list)  # (at_us, total_us), oldest first
    fired_at_us: int | None = None

    def add(self, at_us: int, total_us: int) -> bool:
        """Take one reading; True when the trigger fires."""
        self.samples.append((at_us, total_us))
        # Keep the newest reading at or before the window's start: the window's baseline.
        start = at_us - self.window_us
        while len(self.samples) > 1 and self.samples[1][0] <= start:
            self.samples.pop(0)
        stalled = total_us - self.samples[0][1]
        if stalled < self.stall_us:
            return False
        if self.fired_at_us is not None and at_us - self.fired_at_us < self.window_us:
            return False
        self.fired_at_us = at_us
        return True
