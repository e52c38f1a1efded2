"""The memory controller: one handle per cgroup (MemoryCgroup) with typed reads and writes of
the memory.* files the agent uses, one rule for "max" (parse_limit: None), one memory.stat
parse per read, and errors that name the file and the value (fs.parsed). Callers never
assemble a file name."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import fields
from typing import TypeVar

from guestagent.errors import AgentError, FailedPrecondition, KernelFormat, quoted
from guestagent.linux.abi import LONG_MAX, PAGE_SIZE
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.cgroup.tree import cgroup_dir
from guestagent.linux.fs import KernelFS, parsed
from guestagent.linux.keyed import parse_flat_keyed, workingset_refaults
from guestagent.linux.psi import Pressure, parse_pressure, read_pressure
from guestagent.records import record

MEMORY_MAX = "memory.max"
SWAP_MAX = "memory.swap.max"
MEMORY_LOW = "memory.low"
MEMORY_MIN = "memory.min"
MEMORY_HIGH = "memory.high"
LIMIT_FILES = (MEMORY_MAX, SWAP_MAX, MEMORY_LOW)
_CURRENT = "memory.current"
_RECLAIM = "memory.reclaim"

Parsed = TypeVar("Parsed")


def parse_limit(text: str) -> int | None:
    """A cgroup limit or protection file: "max" is None (no number at all), else bytes."""
    value = text.strip()
    if value == "max":
        return None
    try:
        return int(value)
    except ValueError:
        raise KernelFormat(f"limit {value!r} is neither 'max' nor bytes") from None


def limit_text(value: int | None) -> str:
    return "max" if value is None else str(value)


def kernel_pages(text: str, page_size: int) -> int:
    """What the kernel stores for a limit's text: whole pages, "max" as its largest count
    (LONG_MAX / PAGE_SIZE; any larger number written is stored as that)."""
    largest = LONG_MAX // page_size
    value = parse_limit(text)
    return largest if value is None else min(value // page_size, largest)


def protection_bytes(value: int | None) -> int:
    """A protection (memory.low) as bytes: "max" is what the kernel stores for it, its
    largest count of whole pages, since the report carries a protection as a number."""
    return (LONG_MAX // PAGE_SIZE) * PAGE_SIZE if value is None else value


def same_limit(a: str, b: str, page_size: int) -> bool:
    """True when the kernel holds the same limit for both texts (4097 and 4096 are one page)."""
    try:
        return kernel_pages(a, page_size) == kernel_pages(b, page_size)
    except KernelFormat:
        return a.strip() == b.strip()


@record
class MemoryEvents:
    low: int = 0
    high: int = 0
    max: int = 0
    oom: int = 0
    oom_kill: int = 0


def memory_events_from(values: dict[str, int]) -> MemoryEvents:
    return MemoryEvents(**{f.name: values.get(f.name, 0) for f in fields(MemoryEvents)})


@record
class MemoryStat:
    """memory.stat, from one read."""

    anon: int
    file: int
    lru_anon: int  # The LRU's pages (shmem with anon, as the LRU has it).
    lru_file: int
    refaults: int  # Workingset refaults, anon and file.
    scanned: int | None  # pgscan and pgsteal; None on a kernel without them.
    stolen: int | None


def memory_stat_from(values: dict[str, int]) -> MemoryStat:
    return MemoryStat(
        anon=values.get("anon", 0),
        file=values.get("file", 0),
        lru_anon=values.get("active_anon", 0) + values.get("inactive_anon", 0),
        lru_file=values.get("active_file", 0) + values.get("inactive_file", 0),
        refaults=sum(workingset_refaults(values)),
        scanned=values.get("pgscan"),
        stolen=values.get("pgsteal"),
    )


@record
class CgroupSwap:
    current: int
    max: int | None


@record
class CgroupMemory:
    path: str
    current: int
    max: int | None
    high: int | None
    low: int
    # None when the kernel does no swap accounting (no memory.swap.* files).
    swap: CgroupSwap | None
    events: MemoryEvents
    pressure: Pressure | None
    anon: int
    file: int
    # The subtree's LRU pages as memory.stat counts them, for the give-back figures.
    lru_anon: int = 0
    lru_file: int = 0
    # Delay accounting's stall total (delayacct.py), where there is no PSI; else None.
    delay_stall_us: int | None = None


@record
class ReclaimReading:
    """What the reclaimer reads of a cgroup each interval."""

    stall_total_us: int  # memory.pressure `some` total, or delay accounting's (delayacct.py).
    refault_pages: int
    current: int
    protected: int  # max(memory.min, memory.low): the kernel's own floor for the cgroup.
    # The subtree's LRU pages now, anon and file, in bytes (memory.stat).
    lru: tuple[int, int] = (0, 0)


@record
class MemoryCgroup:
    """A handle on one cgroup directory's memory controller."""

    fs: KernelFS
    directory: str
    name: str  # As named relative to the mount, for errors and reports.

    def _path(self, file: str) -> str:
        return os.path.join(self.directory, file)

    def _read(self, file: str, parse: Callable[[str], Parsed]) -> Parsed:
        return self.fs.read_parsed(self._path(file), parse)

    def _optional(self, file: str, parse: Callable[[str], Parsed]) -> Parsed | None:
        """A file whose absence means a feature is off (swap accounting, an old kernel)."""
        text = self.fs.read_optional(self._path(file))
        return parsed(self._path(file), text, parse) if text is not None else None

    def exists(self) -> bool:
        return self.fs.is_dir(self.directory)

    def current(self) -> int:
        """memory.current, or why the cgroup has none."""
        current = self._optional(_CURRENT, int)
        if current is None:
            raise FailedPrecondition(
                f"cgroup {quoted(self.name)} has no {_CURRENT}: the memory controller is not "
                "enabled in its parent's cgroup.subtree_control",
                "MEMORY_CONTROLLER_OFF",
                metadata={"cgroup": self.name},
            )
        return current

    def current_or_zero(self) -> int:
        """memory.current, 0 when it cannot be read (the cgroup went away)."""
        return self._optional(_CURRENT, int) or 0

    def limit(self, file: str) -> int | None:
        return self._read(file, parse_limit)

    def limit_text(self, file: str) -> str:
        """A limit file's text as the kernel shows it ("max" or bytes), for a journal."""
        return self.fs.read(self._path(file)).strip()

    def limit_text_if_any(self, file: str) -> str | None:
        """As limit_text; None when the file is absent (memory.swap.max: no swap accounting)."""
        text = self.fs.read_optional(self._path(file))
        return text.strip() if text is not None else None

    def has_limits(self) -> bool:
        return self.fs.exists(self._path(MEMORY_MAX))

    def set_limit(self, file: str, value: int | None) -> None:
        self.fs.write(self._path(file), limit_text(value))

    def set_limit_text(self, file: str, text: str) -> None:
        """A limit as limit_text read it (a journal holds it so), by the same "max" rule."""
        self.set_limit(file, parse_limit(text))

    def protection(self) -> int | None:
        """max(memory.min, memory.low): None is "max" (all it uses); a missing file is 0."""
        low, min_ = (
            parsed(self._path(file), self.limit_text_if_any(file) or "0", parse_limit)
            for file in (MEMORY_LOW, MEMORY_MIN)
        )
        return None if low is None or min_ is None else max(low, min_)

    def stat(self) -> MemoryStat:
        return self._read("memory.stat", lambda text: memory_stat_from(parse_flat_keyed(text)))

    @property
    def events_file(self) -> str:
        """memory.events, which the kernel notifies (inotify IN_MODIFY) when it changes."""
        return self._path("memory.events")

    def events(self) -> MemoryEvents:
        return self._read("memory.events", lambda text: memory_events_from(parse_flat_keyed(text)))

    def pressure(self) -> Pressure | None:
        return read_pressure(self.fs, self._path("memory.pressure"))

    def swap(self) -> CgroupSwap | None:
        """None without swap accounting (no memory.swap.* files)."""
        current = self._optional("memory.swap.current", int)
        text = self.limit_text_if_any(SWAP_MAX)
        if current is None or text is None:
            return None
        return CgroupSwap(current, parsed(self._path(SWAP_MAX), text, parse_limit))

    def swap_barred(self) -> bool:
        """memory.swap.max is 0 (kubelet's NoSwap, systemd's MemorySwapMax=0)."""
        return self.limit_text_if_any(SWAP_MAX) == "0"

    def require_reclaim(self) -> None:
        if not self.fs.exists(self._path(_RECLAIM)):
            raise FailedPrecondition(
                f"{self._path(_RECLAIM)} is missing: memory.reclaim needs Linux 5.19 or later",
                "MEMORY_RECLAIM_ABSENT",
                metadata={"path": self._path(_RECLAIM)},
            )

    def reclaim(self, request: str) -> bool:
        """Write one request to memory.reclaim; False when the kernel got less (EAGAIN),
        which is a partial result, not an error. Other errors are raised as they are."""
        try:
            self.fs.write(self._path(_RECLAIM), request)
        except AgentError as e:
            if e.errno != errno.EAGAIN:
                raise
            return False
        return True

    def read(self) -> CgroupMemory:
        """What the memory report shows of the cgroup."""
        current = self.current()
        stat = self.stat()
        return CgroupMemory(
            path=self.name,
            current=current,
            max=self.limit(MEMORY_MAX),
            high=self.limit(MEMORY_HIGH),
            low=protection_bytes(self.limit(MEMORY_LOW)),
            swap=self.swap(),
            events=self.events(),
            pressure=self.pressure(),
            anon=stat.anon,
            file=stat.file,
            lru_anon=stat.lru_anon,
            lru_file=stat.lru_file,
        )

    def reclaim_reading(self, stall_total_us: Callable[[], int] | None = None) -> ReclaimReading:
        """`stall_total_us` reads the stall where it is not PSI's (delay accounting)."""
        if stall_total_us is not None:
            stall = stall_total_us()
        else:
            stall = self._read("memory.pressure", parse_pressure).some.total_us
        stat = self.stat()
        protected = self.protection()
        current = self._read(_CURRENT, int)
        return ReclaimReading(
            stall,
            stat.refaults,
            current,
            current if protected is None else protected,
            (stat.lru_anon, stat.lru_file),
        )


def memory_cgroup(fs: KernelFS, name: CgroupName) -> MemoryCgroup:
    """The handle of an existing cgroup; the lookup refuses a symlink out of the mount."""
    return MemoryCgroup(fs, cgroup_dir(fs, name), name)
