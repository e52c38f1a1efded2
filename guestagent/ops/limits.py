"""Memory limits: the OCI spec's linux.resources.memory written as cgroup v2 files.

The OCI spec was written for cgroup v1: its `swap` is memory+swap together, where v2's
memory.swap.max counts swap alone. The conversion is a pure function over plain values; the
writes are small, read every file first, and are journalled (ops/limits_journal.py) before
the first change. One rollback serves a call that fails and an agent that died inside one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping

from guestagent.errors import (
    Aborted,
    AgentError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    caused_by,
    quoted,
)
from guestagent.jsonlog import EventLog
from guestagent.linux.abi import LONG_MAX, PAGE_SIZE
from guestagent.linux.cgroup.memory import (
    MEMORY_LOW,
    MEMORY_MAX,
    SWAP_MAX,
    MemoryCgroup,
    same_limit,
)
from guestagent.linux.cgroup.name import CgroupName
from guestagent.linux.cgroup.tree import (
    SUBTREE_CONTROL,
    create_cgroup,
    creation_plan,
    planned_creation,
    undo_create,
)
from guestagent.linux.kernel import Kernel
from guestagent.linux.statestore import StateFileError
from guestagent.ops import limits_journal
from guestagent.ops.limits_journal import FileChange, Journal
from guestagent.records import record

log = EventLog("guestagent.ops.limits")

OCI_UNLIMITED = -1  # The OCI spec's "no limit", written to the kernel as "max".

# One change at a time, so a rollback never puts back values that another call just wrote.
_lock = threading.Lock()
# How long a report waits for a cgroup's limits to be written after its mkdir: an empty
# cgroup's writes take milliseconds; past this it is read as it stands.
MAKING_WAIT_S = 2.0
MAX_BEGUN_KEPT = 1024


class CgroupsBeingMade:
    """The cgroups a SetMemoryLimits call is making, from their mkdir until their limits are
    written or rolled back. cgroup v2 cannot make a cgroup with its limits in one step (nor
    rename one into place), and a watch stream wakes on the mkdir: a report read meanwhile
    would show the new cgroup unlimited. Reports wait for them instead (wait_for), and a
    report whose read a making began during reads again (begun)."""

    def __init__(self) -> None:
        self._names: set[CgroupName] = set()
        self._begun: dict[CgroupName, int] = {}  # Makings begun, per cgroup.
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def making(self, name: CgroupName) -> Iterator[None]:
        with self._changed:
            self._names.add(name)
            if len(self._begun) >= MAX_BEGUN_KEPT:  # A count dropped only costs a read.
                self._begun = {n: c for n, c in self._begun.items() if n in self._names}
            self._begun[name] = self._begun.get(name, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                self._names.discard(name)
                self._changed.notify_all()

    def begun(self, names: Iterable[CgroupName]) -> int:
        """How many makings of `names` have begun: a read that sees this change between its
        start and its end may have caught one between its mkdir and its writes. Without the
        lock, as every report asks twice: making() replaces the dict whole or adds to it."""
        begun = self._begun
        return sum(begun.get(name, 0) for name in names) if begun else 0

    def wait_for(self, names: Iterable[CgroupName], timeout_s: float = MAKING_WAIT_S) -> bool:
        """Until none of `names` is being made; False when `timeout_s` passed first."""
        if not self._names:  # The common case, without the lock.
            return True
        wanted = set(names)
        with self._changed:
            return self._changed.wait_for(lambda: not wanted & self._names, timeout_s)


BEING_MADE = CgroupsBeingMade()


@record
class MemorySpec:
    """linux.resources.memory: None and 0 both mean "not given", as in the OCI spec."""

    limit: int | None = None
    swap: int | None = None  # memory+swap together, as in cgroup v1
    reservation: int | None = None


@record
class CgroupMemoryValues:
    """The text to write to each file; None leaves the file untouched."""

    memory_max: str | None
    swap_max: str | None
    memory_low: str | None


@record
class AppliedLimits:
    memory_max: str  # What the kernel holds after the call, read back: "max" or bytes.
    swap_max: str | None  # None when the kernel has no swap accounting.
    memory_low: str
    untouched: tuple[str, ...]  # Files left as they were, e.g. ("memory.swap.max",).
    created: bool


def _given(value: int | None) -> int | None:
    return None if value is None or value == 0 else value


def _bytes_or_max(value: int, what: str, field: str) -> str:
    if value == OCI_UNLIMITED:
        return "max"
    metadata = {"value": value}
    if value < 0:
        raise InvalidArgument(
            f"{what} {value} is neither bytes nor -1",
            "LIMIT_VALUE_INVALID",
            field=field,
            metadata=metadata,
        )
    # OCI values are int64; the kernel parses u64 and would wrap anything bigger without a word.
    if value > LONG_MAX:
        raise InvalidArgument(
            f"{what} {value} is larger than the int64 the OCI spec allows",
            "LIMIT_VALUE_INVALID",
            field=field,
            metadata=metadata,
        )
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
            "the total minus the memory limit",
            "SWAP_TOTAL_WITHOUT_LIMIT",
            field="memory.swap",
            metadata={"swap": total},
        )
    if limit == OCI_UNLIMITED:
        # Nothing to subtract from: swap is capped at the total as given, not made unlimited.
        return str(total)
    if total < limit:
        raise InvalidArgument(
            f"swap total {total} is less than memory limit {limit}; the total counts memory "
            "and swap together, so it must be at least the limit",
            "SWAP_TOTAL_BELOW_LIMIT",
            field="memory.swap",
            metadata={"swap": total, "limit": limit},
        )
    return str(total - limit)


def cgroup_values(spec: MemorySpec) -> CgroupMemoryValues:
    """What to write to memory.max, memory.swap.max and memory.low for an OCI memory spec."""
    limit, total, reservation = _given(spec.limit), _given(spec.swap), _given(spec.reservation)
    memory_max = _bytes_or_max(limit, "memory limit", "memory.limit") if limit is not None else None
    if total is not None:
        _bytes_or_max(total, "swap total", "memory.swap")
    memory_low = (
        _bytes_or_max(reservation, "memory reservation", "memory.reservation")
        if reservation is not None
        else None
    )
    return CgroupMemoryValues(memory_max, _swap_max(limit, total), memory_low)


@record
class SetLimitsSpec:
    cgroup: CgroupName
    memory: MemorySpec
    create: bool = False


def apply_memory_limits(kernel: Kernel, spec: SetLimitsSpec) -> AppliedLimits:
    """Write the limits of `spec` to its cgroup, all of them or none.

    Lowering memory.max below what the cgroup uses makes the kernel reclaim, and then
    OOM-kill, inside the write: that is what a hard limit means.
    """
    cgroup = spec.cgroup
    values = cgroup_values(spec.memory)
    with _lock, _Journaling(kernel) as journaling:
        # The journal goes down before the first change (a mkdir, or the first write), so an
        # agent killed midway is rolled back when it starts again (recover).
        made, enabled = creation_plan(kernel, cgroup) if spec.create else ((), ())
        with BEING_MADE.making(cgroup) if made else contextlib.nullcontext():
            if made:
                journaling.save(Journal(cgroup, (), made, enabled))
            created = bool(create_cgroup(kernel, cgroup).made) if spec.create else False
            memory = kernel.cgroup(cgroup)
            try:
                writes, untouched = _plan(memory, values)
                if writes:
                    journaling.save(Journal(cgroup, writes, made, enabled))
                _write_all(memory, writes)
                applied = _read_back(memory, tuple(untouched), created)
                _check_read_back(cgroup, writes, applied)
            except AgentError as e:
                if journaling.journal is None:
                    raise
                undone = roll_back(kernel, journaling.journal).describe()
                raise e.reworded(f"{e}; {undone}") from e
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
    comes after the rollback, and tells the caller what it restored. Any other exception
    skipped that rollback, so it runs here. A BaseException (the interpreter going down)
    leaves the journal to the next start.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.journal: Journal | None = None

    def save(self, journal: Journal) -> None:
        try:
            limits_journal.save(self.kernel, journal)
        except StateFileError as e:
            raise FailedPrecondition(
                "cannot write the limits journal before changing cgroup "
                f"{quoted(journal.cgroup)}: {e}",
                "STATE_UNWRITABLE",
                metadata={**caused_by(e), "cgroup": journal.cgroup},
            ) from e
        self.journal = journal

    def __enter__(self) -> _Journaling:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if self.journal is None:
            return
        if kind is not None and not issubclass(kind, AgentError):
            if not issubclass(kind, Exception):
                return
            roll_back_and_log(self.kernel, self.journal)
        limits_journal.discard(self.kernel)


@record
class Rollback:
    """What rolling a journal back did: each file put back, or why it could not be."""

    journal: Journal
    found: dict[str, str | None]  # What each file held before the rollback.
    restored: tuple[FileChange, ...] = ()  # From what the file held to its old value.
    failed: tuple[tuple[FileChange, str], ...] = ()
    undone: str | None = None  # What undo_create said, if the call made cgroups.
    cgroup_gone: bool = False

    def describe(self) -> str:
        said = [f"restored {c.file} to {c.new}" for c in self.restored]
        said += [f"could not restore {c.file}: {error}" for c, error in self.failed]
        if not said and self.journal.changes:
            said.append("nothing had been written")
        if self.undone is not None:
            said.append(self.undone)
        return "; ".join(said)


def rollback_plan(
    journal: Journal, current: Mapping[str, str | None], page_size: int
) -> tuple[FileChange, ...]:
    """The writes that put the old values back, last written first.

    Each is a FileChange from what the file holds now to its old value. Files already holding
    the old value, and files that are gone, are left alone.
    """
    writes = []
    for change in reversed(journal.changes):
        now = current.get(change.file)
        if now is not None and not same_limit(now, change.old, page_size):
            writes.append(FileChange(change.file, now.strip(), change.old))
    return tuple(writes)


def roll_back(kernel: Kernel, journal: Journal) -> Rollback:
    """Put the journal's files back as they were, then remove the cgroups it made."""
    try:
        memory: MemoryCgroup | None = kernel.cgroup(journal.cgroup)
    except NotFound:
        memory = None
    found: dict[str, str | None] = {}
    restored: list[FileChange] = []
    failed: list[tuple[FileChange, str]] = []
    if memory is not None:
        found = {c.file: _read(memory, c.file) for c in journal.changes}
        for write in rollback_plan(journal, found, PAGE_SIZE):
            try:
                memory.set_limit_text(write.file, write.new)
                restored.append(write)
            except AgentError as e:
                failed.append((write, str(e)))
    undone = None
    if journal.made or journal.enabled:
        created = planned_creation(kernel, journal.cgroup, journal.made, journal.enabled)
        undone = undo_create(kernel, created)
    return Rollback(journal, found, tuple(restored), tuple(failed), undone, memory is None)


def roll_back_and_log(kernel: Kernel, journal: Journal) -> Rollback:
    rollback = roll_back(kernel, journal)
    if rollback.cgroup_gone:
        log.warning(
            "limits_journal_dropped",
            cgroup=journal.cgroup,
            reason="the cgroup no longer exists",
            changes=[vars(c) for c in journal.changes],
        )
        return rollback
    restored = [{"file": c.file, "from": c.old, "to": c.new} for c in rollback.restored]
    failed = [
        {"file": c.file, "from": c.old, "to": c.new, "error": error} for c, error in rollback.failed
    ]
    if failed:
        log.error("limits_rollback_failed", cgroup=journal.cgroup, failed=failed)
    log.info(
        "limits_rolled_back",
        cgroup=journal.cgroup,
        restored=restored,
        failed=failed,
        old={c.file: c.old for c in journal.changes},
        new={c.file: c.new for c in journal.changes},
        found={f: v.strip() if v is not None else None for f, v in rollback.found.items()},
        undone=rollback.undone,
    )
    return rollback


def recover(kernel: Kernel) -> Journal | None:
    """At start: roll back the change a dead agent left in flight, log it, drop the journal.

    Returns the journal that was found, if any. Nothing here raises: a rollback that fails is
    logged with its errno, and the agent serves anyway, since refusing to start would leave
    the guest with no agent at all.
    """
    journal = limits_journal.load(kernel)
    if journal is None:
        return None
    roll_back_and_log(kernel, journal)
    try:
        limits_journal.discard(kernel)
    except StateFileError as e:
        log.error("limits_journal_kept", error=str(e))
    return journal


def _read(memory: MemoryCgroup, file: str) -> str | None:
    try:
        return memory.limit_text_if_any(file)
    except AgentError:
        return None


def _plan(
    memory: MemoryCgroup, values: CgroupMemoryValues
) -> tuple[tuple[FileChange, ...], list[str]]:
    """The writes to make, each with the value to put back; refused before anything changes."""
    cgroup = memory.name
    if not memory.has_limits():
        raise FailedPrecondition(
            f"cgroup {quoted(cgroup)} has no {MEMORY_MAX}: the memory controller is not enabled in "
            f"{os.path.join(os.path.dirname(memory.directory), SUBTREE_CONTROL)}",
            "MEMORY_CONTROLLER_OFF",
            metadata={"cgroup": cgroup},
        )
    writes: list[FileChange] = []
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
        before = memory.limit_text_if_any(file)
        if before is not None:
            writes.append(FileChange(file, before, value))
        elif file == SWAP_MAX and value in ("max", "0"):
            # No swap accounting (CONFIG_MEMCG_SWAP off, or swapaccount=0): with no swap to
            # limit, "max" and "0" already hold and are skipped; a number of bytes cannot be.
            untouched.append(file)
        elif file == SWAP_MAX:
            raise FailedPrecondition(
                f"kernel has no swap accounting; cannot set {file} to {value} "
                f"for cgroup {quoted(cgroup)}",
                "SWAP_ACCOUNTING_ABSENT",
                metadata={"cgroup": cgroup, "file": file, "value": value},
            )
        else:
            raise FailedPrecondition(
                f"cgroup {quoted(cgroup)} has {MEMORY_MAX} but no {file}",
                "LIMIT_FILE_MISSING",
                metadata={"cgroup": cgroup, "file": file},
            )
    return tuple(writes), untouched


def _write_all(memory: MemoryCgroup, writes: tuple[FileChange, ...]) -> None:
    for write in writes:
        try:
            memory.set_limit_text(write.file, write.new)
        except AgentError as e:
            raise Aborted(
                f"setting limits of cgroup {quoted(memory.name)} failed: {e}",
                "LIMIT_WRITE_FAILED",
                metadata={
                    **caused_by(e),
                    "cgroup": memory.name,
                    "file": write.file,
                    "value": write.new,
                },
            ) from e


def _check_read_back(cgroup: str, writes: tuple[FileChange, ...], applied: AppliedLimits) -> None:
    """Refuse if a file does not hold what was written: something else wrote it meanwhile,
    and the call has not done what it says (the caller's rollback puts the old values back)."""
    held = {
        MEMORY_MAX: applied.memory_max,
        SWAP_MAX: applied.swap_max,
        MEMORY_LOW: applied.memory_low,
    }
    for write in writes:
        now = held[write.file]
        if now is None or not same_limit(now, write.new, PAGE_SIZE):
            raise Aborted(
                f"{write.file} of cgroup {quoted(cgroup)} reads back {now} "
                f"after writing {write.new}",
                "LIMIT_CHANGED_MEANWHILE",
                metadata={"cgroup": cgroup, "file": write.file, "value": write.new, "read": now},
            )


def _read_back(memory: MemoryCgroup, untouched: tuple[str, ...], created: bool) -> AppliedLimits:
    # The kernel rounds bytes down to whole pages, so what it holds can differ from the text.
    return AppliedLimits(
        memory_max=memory.limit_text(MEMORY_MAX),
        swap_max=memory.limit_text_if_any(SWAP_MAX),
        memory_low=memory.limit_text(MEMORY_LOW),
        untouched=untouched,
        created=created,
    )
