"""The memory controller's files: its limits (and how the kernel stores what is written to
them), memory.reclaim, and what the reclaimer reads of a cgroup."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from guestagent.errors import AgentError
from guestagent.linux.abi import LONG_MAX
from guestagent.linux.fs import KernelFS, parsed
from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.meminfo import parse_pressure

MEMORY_MAX = "memory.max"
SWAP_MAX = "memory.swap.max"
MEMORY_LOW = "memory.low"
LIMIT_FILES = (MEMORY_MAX, SWAP_MAX, MEMORY_LOW)
MEMORY_RECLAIM = "memory.reclaim"
MEMORY_PRESSURE = "memory.pressure"


def kernel_pages(text: str, page_size: int) -> int:
    """What the kernel stores for a limit's text: whole pages, "max" as its largest count
    (LONG_MAX / PAGE_SIZE; any larger number written is stored as that)."""
    largest = LONG_MAX // page_size
    value = text.strip()
    return largest if value == "max" else min(int(value) // page_size, largest)


def same_limit(a: str, b: str, page_size: int) -> bool:
    """True when the kernel holds the same limit for both texts (4097 and 4096 are one page)."""
    try:
        return kernel_pages(a, page_size) == kernel_pages(b, page_size)
    except ValueError:
        return a.strip() == b.strip()


@dataclass(frozen=True)
class ReclaimReading:
    """What the reclaimer reads of a cgroup each interval."""

    stall_total_us: int  # memory.pressure `some` total, or delay accounting's (delayacct.py).
    refault_pages: int
    current: int
    protected: int  # max(memory.min, memory.low): the kernel's own floor for the cgroup.


@dataclass(frozen=True)
class ReclaimCounters:
    """memory.stat's pgscan and pgsteal (how many pages reclaim looked at and took; None on
    a kernel without them) and workingset refaults, read once per chunk of a step."""

    scanned: int | None
    stolen: int | None
    refaults: int


def refault_pages_from(stat: dict[str, int]) -> int:
    # Before 5.9 memory.stat had one counter, workingset_refault.
    if "workingset_refault_anon" in stat or "workingset_refault_file" in stat:
        return stat.get("workingset_refault_anon", 0) + stat.get("workingset_refault_file", 0)
    return stat.get("workingset_refault", 0)


def read_psi_stall_total_us(fs: KernelFS, directory: Path) -> int:
    """memory.pressure's `some` total: the wall time any of the cgroup's tasks stalled."""
    return fs.read_parsed(directory / MEMORY_PRESSURE, parse_pressure).some.total_us


def read_reclaim_reading(
    fs: KernelFS, directory: Path, stall_total_us: Callable[[], int] | None = None
) -> ReclaimReading:
    """`stall_total_us` reads the stall where it is not PSI's (delay accounting)."""
    stall = (
        stall_total_us() if stall_total_us is not None else read_psi_stall_total_us(fs, directory)
    )
    stat = fs.read_parsed(directory / "memory.stat", parse_flat_keyed)
    protected = max(
        parsed(directory / name, fs.read_optional(directory / name) or "0", int)
        for name in ("memory.min", "memory.low")
    )
    return ReclaimReading(
        stall,
        refault_pages_from(stat),
        fs.read_int(directory / "memory.current"),
        protected,
    )


def read_reclaim_counters(fs: KernelFS, directory: Path) -> ReclaimCounters:
    stat = fs.read_parsed(directory / "memory.stat", parse_flat_keyed)
    return ReclaimCounters(stat.get("pgscan"), stat.get("pgsteal"), refault_pages_from(stat))


def read_current_optional(fs: KernelFS, directory: Path) -> int:
    """memory.current, 0 when it cannot be read (the cgroup went away)."""
    path = directory / "memory.current"
    return parsed(path, fs.read_optional(path) or "0", int)


def reclaim_control(directory: Path) -> Path:
    return directory / MEMORY_RECLAIM


def write_memory_reclaim(fs: KernelFS, directory: Path, request: str) -> bool:
    """Write one request to a cgroup's memory.reclaim; False when the kernel got less
    (EAGAIN), which is a partial result, not an error. Other errors are raised as they are."""
    try:
        fs.write(directory / MEMORY_RECLAIM, request)
    except AgentError as e:
        if e.errno != errno.EAGAIN:
            raise
        return False
    return True
