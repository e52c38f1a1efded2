"""Memory limits: the OCI spec's linux.resources.memory written as cgroup v2 files.

The OCI spec was written for cgroup v1: its `swap` is memory+swap together, where v2's
memory.swap.max counts swap alone. The conversion is a pure function over plain values; the
writes are small, read every file first, and put back what they changed if one fails.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from guestagent.errors import (
    Aborted,
    AgentError,
    FailedPrecondition,
    InvalidArgument,
    errno_text,
)
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroups import (
    SUBTREE_CONTROL,
    CreatedCgroup,
    cgroup_dir,
    create_cgroup,
    undo_create,
)
from guestagent.linux.fs import KernelFS
from guestagent.ops import limits_journal

log = EventLog("guestagent.ops.limits")

MEMORY_MAX = "memory.max"
SWAP_MAX = "memory.swap.max"
MEMORY_LOW = "memory.low"
OCI_UNLIMITED = -1  # The OCI spec's "no limit", written to the kernel as "max".
# OCI values are int64; the kernel parses u64 and would wrap anything bigger without a word.
INT64_MAX = 2**63 - 1

# One change at a time, so a rollback never puts back values that another call just wrote.
_lock = threading.Lock()


@dataclass(frozen=True)
class MemorySpec:
    """linux.resources.memory: None and 0 both mean "not given", as in the OCI spec."""

    limit: int | None = None
    swap: int | None = None  # memory+swap together, as in cgroup v1
    reservation: int | None = None


@dataclass(frozen=True)
class CgroupMemoryValues:
    """The text to write to each file; None leaves the file untouched."""

    memory_max: str | None
    swap_max: str | None
    memory_low: str | None


@dataclass(frozen=True)
class AppliedLimits:
    memory_max: str  # What the kernel holds after the call, read back: "max" or bytes.
    swap_max: str | None  # None when the kernel has no swap accounting.
    memory_low: str
    untouched: tuple[str, ...]  # Files left as they were, e.g. ("memory.swap.max",).
    created: bool


@dataclass(frozen=True)
class _Write:
    file: str
    value: str
    before: str


def _given(value: int | None) -> int | None:
    return None if value is None or value == 0 else value


def _bytes_or_max(value: int, what: str) -> str:
    if value == OCI_UNLIMITED:
        return "max"
    if value < 0:
        raise InvalidArgument(f"{what} {value} is neither bytes nor -1")
    if value > INT64_MAX:
        raise InvalidArgument(f"{what} {value} is larger than the int64 the OCI spec allows")
    return str(value)


def _swap_max(limit: int | None, total: int | None) -> str | None:
    """memory.swap.max from the OCI memory+swap total; both already checked one by one."""
    if total is None:
        # As runc: unlimited memory means unlimited memory+swap, as it had to in cgroup v1,
        # where the memory limit may not exceed the memory+swap limit.
        return "max" if limit == OCI_UNLIMITED else None
    if total == OCI_UNLIMITED:
        # An unlimited total needs nothing subtracted, so it stands without a memory limit,
        # as in runc (opencontainers/cgroups ConvertMemorySwapToCgroupV2Value).
        return "max"
    if limit is None:
        raise InvalidArgument(
            f"swap total {total} needs a memory limit to be worked out: memory.swap.max is "
            "the total minus the memory limit"
        )
    if limit == OCI_UNLIMITED:
        # Nothing to subtract from: swap is capped at the total as given, not made unlimited.
        return str(total)
    if total < limit:
        raise InvalidArgument(
            f"swap total {total} is less than memory limit {limit}; the total counts memory "
            "and swap together, so it must be at least the limit"
        )
    return str(total - limit)


def cgroup_values(spec: MemorySpec) -> CgroupMemoryValues:
    """What to write to memory.max, memory.swap.max and memory.low for an OCI memory spec."""
    limit, total, reservation = _given(spec.limit), _given(spec.swap), _given(spec.reservation)
    memory_max = _bytes_or_max(limit, "memory limit") if limit is not None else None
    if total is not None:
        _bytes_or_max(total, "swap total")
    memory_low = (
        _bytes_or_max(reservation, "memory reservation") if reservation is not None else None
    )
    return CgroupMemoryValues(memory_max, _swap_max(limit, total), memory_low)


def apply_memory_limits(
    fs: KernelFS, cgroup: str, spec: MemorySpec, create: bool = False
) -> AppliedLimits:
    """Write the limits of `spec` to `cgroup`, all of them or none.

    Lowering memory.max below what the cgroup uses makes the kernel reclaim, and then
    OOM-kill, inside the write: that is what a hard limit means.
    """
    values = cgroup_values(spec)
    with _lock, _Journaling(fs, cgroup) as journaling:
        # The journal goes down before the first change (a mkdir, or the first write), so an
        # agent killed midway is rolled back when it starts again (limits_journal.recover).
        made, enabled = limits_journal.creation_plan(fs, cgroup) if create else ((), ())
        if made:
            journaling.save(limits_journal.Journal(cgroup, (), made, enabled))
        created = create_cgroup(fs, cgroup) if create else CreatedCgroup(cgroup_dir(fs, cgroup))
        try:
            writes, untouched = _plan(fs, created.path, cgroup, values)
            if writes:
                changes = tuple(
                    limits_journal.FileChange(w.file, w.before, w.value) for w in writes
                )
                journaling.save(limits_journal.Journal(cgroup, changes, made, enabled))
            _write_all(fs, created.path, cgroup, writes)
            applied = _read_back(fs, created.path, tuple(untouched), bool(created.made))
            _check_read_back(fs, created.path, cgroup, writes, applied)
        except AgentError as e:
            if not created.made:
                raise
            raise type(e)(f"{e}; {undo_create(fs, created)}") from e
    log.info(
        "memory_limits_applied",
        cgroup=cgroup,
        memory_max=applied.memory_max,
        swap_max=applied.swap_max,
        memory_low=applied.memory_low,
        untouched=list(applied.untouched),
        created=applied.created,
    )
    return applied


class _Journaling:
    """The journal of one call: saved before each change, settled when the call ends.

    A call that ends, or fails with an AgentError, has its journal discarded: that error
    comes after the in-process rollback, and tells the caller what it restored. Any other
    exception skipped that rollback, so the journal's rollback runs at once. A BaseException
    (the interpreter going down) leaves the journal to the next start.
    """

    def __init__(self, fs: KernelFS, cgroup: str) -> None:
        self.fs = fs
        self.cgroup = cgroup
        self.saved = False

    def save(self, journal: limits_journal.Journal) -> None:
        try:
            limits_journal.save(self.fs, journal)
        except OSError as e:
            raise FailedPrecondition(
                f"cannot write the limits journal {limits_journal.journal_path(self.fs)} "
                f"before changing cgroup {self.cgroup!r}: {errno_text(e)}"
            ) from e
        self.saved = True

    def __enter__(self) -> _Journaling:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if not self.saved:
            return
        if kind is None or issubclass(kind, AgentError):
            limits_journal.discard(self.fs)
        elif issubclass(kind, Exception):
            limits_journal.recover(self.fs)


def _plan(
    fs: KernelFS, directory: Path, cgroup: str, values: CgroupMemoryValues
) -> tuple[list[_Write], list[str]]:
    """The writes to make, each with the value to put back; refused before anything changes."""
    if not fs.exists(directory / MEMORY_MAX):
        raise FailedPrecondition(
            f"cgroup {cgroup!r} has no {MEMORY_MAX}: the memory controller is not enabled in "
            f"{directory.parent / SUBTREE_CONTROL}"
        )
    writes: list[_Write] = []
    untouched: list[str] = []
    # memory.swap.max goes first. The two limits are independent in cgroup v2 (the kernel
    # stores swap.max without checking it against memory.max), but a write to memory.max
    # reclaims down to the new limit before it returns, swapping pages out under whatever
    # swap.max holds at that moment, and a lowered swap.max lets swap usage stay above it
    # for a long time (the kernel frees those entries only gradually). With swap first, that
    # reclaim already obeys the new swap limit. memory.low, a protection
    # rather than a limit, goes last.
    order = ((SWAP_MAX, values.swap_max), (MEMORY_MAX, values.memory_max))
    for file, value in (*order, (MEMORY_LOW, values.memory_low)):
        if value is None:
            untouched.append(file)
            continue
        before = fs.read_optional(directory / file)
        if before is not None:
            writes.append(_Write(file, value, before.strip()))
        elif file == SWAP_MAX and value in ("max", "0"):
            # No swap accounting (CONFIG_MEMCG_SWAP off, or swapaccount=0): with no swap to
            # limit, "max" and "0" already hold and are skipped; a number of bytes cannot be.
            untouched.append(file)
        elif file == SWAP_MAX:
            raise FailedPrecondition(
                f"kernel has no swap accounting; cannot set {file} to {value} for cgroup {cgroup!r}"
            )
        else:
            raise FailedPrecondition(f"cgroup {cgroup!r} has {MEMORY_MAX} but no {file}")
    return writes, untouched


def _write_all(fs: KernelFS, directory: Path, cgroup: str, writes: list[_Write]) -> None:
    done: list[_Write] = []
    for write in writes:
        try:
            fs.write(directory / write.file, write.value)
        except AgentError as e:
            raise Aborted(
                f"setting limits of cgroup {cgroup!r} failed: {e}; {_restore(fs, directory, done)}"
            ) from e
        done.append(write)


def _restore(fs: KernelFS, directory: Path, done: list[_Write]) -> str:
    """Put back what was written, last first; say what was restored and what was not."""
    said: list[str] = []
    for write in reversed(done):
        try:
            fs.write(directory / write.file, write.before)
            said.append(f"restored {write.file} to {write.before}")
        except AgentError as e:
            said.append(f"could not restore {write.file}: {e}")
    return "; ".join(said) or "nothing had been written"


def _check_read_back(
    fs: KernelFS, directory: Path, cgroup: str, writes: list[_Write], applied: AppliedLimits
) -> None:
    """Refuse, and put back the old values, if a file does not hold what was written.

    Something else wrote the file meanwhile: the call has not done what it says.
    """
    held = {
        MEMORY_MAX: applied.memory_max,
        SWAP_MAX: applied.swap_max,
        MEMORY_LOW: applied.memory_low,
    }
    page_size = limits_journal.page_size()
    for write in writes:
        now = held[write.file]
        if now is None or not limits_journal.same_limit(now, write.value, page_size):
            raise Aborted(
                f"{write.file} of cgroup {cgroup!r} reads back {now} after writing "
                f"{write.value}; {_restore(fs, directory, writes)}"
            )


def _read_back(
    fs: KernelFS, directory: Path, untouched: tuple[str, ...], created: bool
) -> AppliedLimits:
    # The kernel rounds bytes down to whole pages, so what it holds can differ from the text.
    swap = fs.read_optional(directory / SWAP_MAX)
    return AppliedLimits(
        memory_max=fs.read(directory / MEMORY_MAX).strip(),
        swap_max=swap.strip() if swap is not None else None,
        memory_low=fs.read(directory / MEMORY_LOW).strip(),
        untouched=untouched,
        created=created,
    )
