"""The working-set reclaimer: the guest gives back memory its workloads do not use.

One thread serves every target cgroup. It sleeps until the next target is due (or a policy
changes), then for each due target reads the interval's stall (memory.pressure), refaults
(memory.stat) and memory.current, asks reclaim_policy.decide for a step and writes it to
memory.reclaim, a chunk at a time, stopping early once the kernel finds the rest referenced.
When free memory is left in blocks too small for free page reporting, it compacts
(rate-limited, and soon after a burst of reclaim settles). Policies live in
/run/guestagent/reclaim-policy.json, so an agent restart carries on with what the host set.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from guestagent.errors import AgentError, FailedPrecondition, NotFound
from guestagent.jsonlog import EventLog
from guestagent.linux.cgroups import cgroup_dir
from guestagent.linux.fs import KernelFS
from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.meminfo import parse_pressure
from guestagent.linux.statefile import RECLAIM_POLICIES, StateFileError, state_file
from guestagent.ops.compaction import Compactor, parse_buddyinfo
from guestagent.ops.reclaim import write_memory_reclaim
from guestagent.ops.reclaim_policy import (
    CHUNK_BYTES,
    CompactionRule,
    ControllerState,
    Mode,
    ReclaimPolicy,
    Sample,
    compaction_decision,
    decide,
    floor_of,
    stop_step_after_chunk,
    validate_policy,
)
from guestagent.ops.swap import active_swaps

log = EventLog("guestagent.ops.reclaimer")

# How often the compaction rule is looked at while any target is on; the rule itself
# limits how often compaction runs.
COMPACTION_CHECK_S = 10.0


@dataclass(frozen=True)
class TargetStatus:
    cgroup: str
    enabled: bool
    policy: ReclaimPolicy
    mode: Mode
    why: str
    reclaimed_total: int
    reclaimed_last: int
    last_stall_us: int
    last_refault_bytes: int
    intervals: int
    current: int
    floor: int


@dataclass(frozen=True)
class CompactionStatus:
    runs: int = 0
    last_decision: str = "not checked yet"
    last_run_unix_ns: int = 0


@dataclass
class _Target:
    cgroup: str
    directory: Path
    policy: ReclaimPolicy
    enabled: bool
    state: ControllerState = field(default_factory=ControllerState)
    # Bumped by every policy change, so a tick measured under the old one is thrown away.
    generation: int = 0
    due: float = 0.0
    sampled_at: float | None = None
    stall_total_us: int = 0
    refault_pages: int = 0
    reclaimed_total: int = 0
    reclaimed_last: int = 0
    low_yield: str = ""  # Why the last step stopped at the working set, "" if it did not.
    last_stall_us: int = 0
    last_refault_bytes: int = 0
    intervals: int = 0
    current: int = 0
    floor: int = 0

    def status(self) -> TargetStatus:
        mode = self.state.mode if self.enabled else Mode.DISABLED
        return TargetStatus(
            self.cgroup,
            self.enabled,
            self.policy,
            mode,
            self.state.why,
            self.reclaimed_total,
            self.reclaimed_last,
            self.last_stall_us,
            self.last_refault_bytes,
            self.intervals,
            self.current,
            self.floor,
        )


@dataclass(frozen=True)
class _Reading:
    stall_total_us: int
    refault_pages: int
    current: int
    protected: int


def refault_pages_from(stat: dict[str, int]) -> int:
    # Before 5.9 memory.stat had one counter, workingset_refault.
    if "workingset_refault_anon" in stat or "workingset_refault_file" in stat:
        return stat.get("workingset_refault_anon", 0) + stat.get("workingset_refault_file", 0)
    return stat.get("workingset_refault", 0)


def read_target(fs: KernelFS, directory: Path) -> _Reading:
    pressure = parse_pressure(fs.read(directory / "memory.pressure"))
    stat = parse_flat_keyed(fs.read(directory / "memory.stat"))
    protected = max(
        int(fs.read_optional(directory / name) or 0) for name in ("memory.min", "memory.low")
    )
    return _Reading(
        pressure.some.total_us,
        refault_pages_from(stat),
        int(fs.read(directory / "memory.current")),
        protected,
    )


@dataclass(frozen=True)
class _ReclaimCounters:
    """memory.stat's pgscan and pgsteal (how many pages reclaim looked at and took; None on
    a kernel without them) and workingset refaults, read once per chunk of a step."""

    scanned: int | None
    stolen: int | None
    refaults: int


def reclaim_counters(fs: KernelFS, directory: Path) -> _ReclaimCounters:
    stat = parse_flat_keyed(fs.read(directory / "memory.stat"))
    return _ReclaimCounters(stat.get("pgscan"), stat.get("pgsteal"), refault_pages_from(stat))


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


class Reclaimer:
    def __init__(
        self,
        fs: KernelFS,
        clock: Callable[[], float] = time.monotonic,
        compaction_rule: CompactionRule | None = None,
    ) -> None:
        self.fs = fs
        self._clock = clock
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._rule = compaction_rule or CompactionRule()
        self._compactor = Compactor(fs)
        self._targets: dict[str, _Target] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # None: not known yet whether memory.reclaim takes "swappiness=" (Linux 6.12+).
        self._swappiness_arg: bool | None = None
        self._compaction = CompactionStatus()
        self._compaction_checked: float | None = None
        self._compacted_at: float | None = None
        self._system_stall_us: int | None = None
        self._reclaimed_since_compaction = 0
        self._started = False
        self._store = state_file(fs, RECLAIM_POLICIES)

    # The host's side: policies and status.

    def set_policy(
        self, cgroup: str, enabled: bool, policy: ReclaimPolicy, persist: bool = True
    ) -> TargetStatus:
        validate_policy(policy)
        directory = cgroup_dir(self.fs, cgroup)
        if enabled:
            self._check_kernel(directory, policy)
        with self._lock:
            target = self._targets.get(cgroup)
            if target is None:
                target = _Target(cgroup, directory, policy, enabled)
                self._targets[cgroup] = target
            target.policy, target.enabled = policy, enabled
            target.generation += 1
            target.sampled_at = None  # A fresh baseline: the old deltas belong to another policy.
            target.due = self._clock()
            why = "waiting for the first interval's figures" if enabled else "turned off"
            target.state = ControllerState(why=why)
            status = target.status()
            if persist:
                self._save_locked()
        # The reclaimer works best with the multi-gen LRU (README: Working-set reclaimer).
        lru_gen = self.fs.read_optional(self.fs.sys("kernel", "mm", "lru_gen", "enabled"))
        log.info(
            "reclaim_policy",
            cgroup=cgroup,
            enabled=enabled,
            multigen_lru=(lru_gen or "absent").strip(),
            **asdict(policy),
        )
        if enabled:
            self._run_thread()
        self._wake.set()
        return status

    def _check_kernel(self, directory: Path, policy: ReclaimPolicy) -> None:
        for name, why in (
            ("memory.reclaim", "memory.reclaim needs Linux 5.19 or later"),
            ("memory.pressure", "the kernel has no PSI (CONFIG_PSI, psi=1)"),
        ):
            if not self.fs.exists(directory / name):
                raise FailedPrecondition(f"{directory / name} is missing: {why}")
        if policy.anon and not self._swap_active():
            raise FailedPrecondition(
                "anon reclaim asked with no active swap area (/proc/swaps lists none): "
                "enable swap first, or leave anon off"
            )

    def _swap_active(self) -> bool:
        return bool(active_swaps(self.fs))

    def status(self, cgroups: Iterable[str] = ()) -> tuple[TargetStatus, ...]:
        names = tuple(cgroups)
        self._drop_vanished()
        with self._lock:
            missing = [name for name in names if name not in self._targets]
            if missing:
                raise NotFound(f"the reclaimer has no policy for cgroup(s) {', '.join(missing)}")
            chosen = names or tuple(sorted(self._targets))
            return tuple(self._targets[name].status() for name in chosen)

    def known(self, cgroups: Iterable[str]) -> tuple[TargetStatus, ...]:
        """Status of those of the cgroups that are targets (for WatchMemory)."""
        self._drop_vanished()
        with self._lock:
            return tuple(self._targets[n].status() for n in cgroups if n in self._targets)

    @property
    def compaction(self) -> CompactionStatus:
        with self._lock:
            return self._compaction

    # Start, stop, persistence.

    def start(self, initial: Iterable[str] = ()) -> None:
        """Reload the host's policies, turn on `initial` cgroups the host has not set, run."""
        self._load()
        for cgroup in initial:
            if cgroup in self._targets:
                continue
            try:
                self.set_policy(cgroup, True, ReclaimPolicy())
            except AgentError as e:
                log.warning("reclaim_initial_refused", cgroup=cgroup, error=str(e))
        self._started = True
        if any(target.enabled for target in self._targets.values()):
            self._run_thread()

    def _run_thread(self) -> None:
        """The loop's thread starts with the first target turned on (after start()): an
        agent whose host never turns the reclaimer on pays no thread for it."""
        with self._lock:
            if self._thread is not None or not self._started or self._stopping.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="reclaimer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _save_locked(self) -> None:
        state = {
            name: {"enabled": t.enabled, "policy": asdict(t.policy)}
            for name, t in sorted(self._targets.items())
        }
        self._store.save(state)

    def _load(self) -> None:
        try:
            state = self._store.load()
        except StateFileError as e:
            log.warning("reclaim_state_unreadable", error=str(e))
            return
        if not isinstance(state, dict):
            return
        for cgroup, entry in state.items():
            try:
                policy = ReclaimPolicy(**entry["policy"])
                self.set_policy(cgroup, bool(entry["enabled"]), policy, persist=False)
            except (AgentError, TypeError, KeyError) as e:
                log.warning("reclaim_policy_dropped", cgroup=cgroup, error=str(e))
        with self._lock:
            self._save_locked()

    # The loop.

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                wait = self.run_due()
            except Exception:  # A bug must not end reclaim for every cgroup silently.
                log.error("reclaimer_failed", exc=True)
                wait = 1.0
            self._wake.wait(wait)
            self._wake.clear()

    def run_due(self) -> float | None:
        """Serve every due target once; return the seconds until the next is due (None: none
        is on, sleep until a policy changes)."""
        now = self._clock()
        with self._lock:
            due = [t for t in self._targets.values() if t.enabled and t.due <= now]
        for target in due:
            if self._stopping.is_set():
                return None
            self._serve(target)
        if due or self._compaction_checked is None:
            self._maybe_compact()
        with self._lock:
            times = [t.due for t in self._targets.values() if t.enabled]
        if not times:
            return None
        return max(0.0, min(times) - self._clock())

    def _serve(self, target: _Target) -> None:
        started = self._clock()
        try:
            reading = read_target(self.fs, target.directory)
        except AgentError as e:
            if e.errno == errno.ENOENT and not self.fs.is_dir(target.directory):
                self._drop(target, "the cgroup was removed")
                return
            raise
        with self._lock:
            generation, policy = target.generation, target.policy
            interval = policy.interval_ms / 1000
            target.due = started + interval
            if not target.enabled:
                return
            previous = target.sampled_at
            stall = reading.stall_total_us - target.stall_total_us
            refaults = reading.refault_pages - target.refault_pages
            target.sampled_at = started
            target.stall_total_us = reading.stall_total_us
            target.refault_pages = reading.refault_pages
            target.current = reading.current
            target.floor = floor_of(policy, reading.protected)
            if previous is None:
                return  # The first reading is the baseline for the next interval's deltas.
            # A slow interval (a long reclaim write) is judged at the nominal interval's rate.
            scale = min(1.0, interval / max(started - previous, 1e-6))
            sample = Sample(
                int(max(0, stall) * scale),
                int(max(0, refaults) * self._page_size * scale),
                reading.current,
                reading.protected,
                target.reclaimed_last,
                target.low_yield,
            )
            decision = decide(sample, policy, target.state, self._page_size)
            target.state = decision.state
            target.last_stall_us, target.last_refault_bytes = sample.stall_us, sample.refault_bytes
            target.intervals += 1
            target.reclaimed_last, target.low_yield = 0, ""
        if decision.step_bytes:
            reclaimed, stopped, low_yield = self._reclaim(
                target, generation, decision.step_bytes, policy
            )
            with self._lock:
                if target.generation == generation:
                    target.reclaimed_last, target.low_yield = reclaimed, low_yield
                    target.reclaimed_total += reclaimed
                    self._reclaimed_since_compaction += reclaimed
                    if stopped:
                        why = f"{target.state.why}; stopped after {reclaimed} B: {stopped}"
                        target.state = replace(target.state, why=why)

    def _still_on(self, target: _Target, generation: int) -> bool:
        with self._lock:
            return target.generation == generation and target.enabled

    def _reclaim(
        self, target: _Target, generation: int, step: int, policy: ReclaimPolicy
    ) -> tuple[int, str, str]:
        """Ask memory.reclaim for the step a chunk at a time. Returns (bytes reclaimed, why it
        stopped early or "", that why again if it was the working set reached or "")."""
        control = target.directory / "memory.reclaim"
        before = target.current
        started = self._clock()
        done = 0
        yields: list[tuple[int | None, int | None]] = []
        try:
            first = counters = reclaim_counters(self.fs, target.directory)
            while done < step:
                # Turned off (or changed) since the figures were read: stop at once.
                if not self._still_on(target, generation) or self._stopping.is_set():
                    return done, "", ""
                chunk = min(CHUNK_BYTES, step - done)
                if not self._write_chunk(control, chunk, policy.anon):
                    # EAGAIN: the kernel got less than the chunk; memory.current says how much.
                    after = int(self.fs.read_optional(target.directory / "memory.current") or 0)
                    got = max(done, min(step, before - after)) if after else done
                    return got, "the kernel found no more to reclaim", ""
                done += chunk
                if done >= step:
                    break
                latest = reclaim_counters(self.fs, target.directory)
                yields.append(
                    (
                        _delta(latest.scanned, counters.scanned),
                        _delta(latest.stolen, counters.stolen),
                    )
                )
                counters = latest
                why, low_yield = stop_step_after_chunk(
                    tuple(yields),
                    latest.refaults - first.refaults,
                    done,
                    self._clock() - started,
                    policy.interval_ms / 1000,
                    self._page_size,
                )
                if why:
                    return done, why, why if low_yield else ""
        except AgentError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV) or not self.fs.is_dir(target.directory):
                return done, "", ""  # The cgroup went away; the next reading drops it.
            log.warning("reclaim_write_failed", cgroup=target.cgroup, error=str(e))
        return done, "", ""

    def _write_chunk(self, control: Path, size: int, anon: bool) -> bool:
        """One memory.reclaim write; False when the kernel got less (EAGAIN)."""
        if anon or self._swappiness_arg is False:
            return write_memory_reclaim(self.fs, control, str(size))
        try:
            complete = write_memory_reclaim(self.fs, control, f"{size} swappiness=0")
        except AgentError as e:
            if e.errno != errno.EINVAL:
                raise
            # Before 6.12 the kernel takes no arguments. Without anon allowed, only file
            # pages then go unless swap is on; the log says so once.
            self._swappiness_arg = False
            log.warning("reclaim_no_swappiness_arg", control=str(control))
            return write_memory_reclaim(self.fs, control, str(size))
        self._swappiness_arg = True
        return complete

    def _drop_vanished(self) -> None:
        """Turned-off targets are not read each interval; a status call notices them gone."""
        with self._lock:
            gone = [t for t in self._targets.values() if not self.fs.is_dir(t.directory)]
        for target in gone:
            self._drop(target, "the cgroup was removed")

    def _drop(self, target: _Target, why: str) -> None:
        with self._lock:
            if self._targets.get(target.cgroup) is target:
                del self._targets[target.cgroup]
                self._save_locked()
        log.info("reclaim_target_dropped", cgroup=target.cgroup, reason=why)

    def _maybe_compact(self) -> None:
        now = self._clock()
        if self._compaction_checked is not None and now - self._compaction_checked < (
            COMPACTION_CHECK_S
        ):
            return
        with self._lock:
            policies = [t.policy for t in self._targets.values() if t.enabled]
            reclaiming = any(t.state.stepped for t in self._targets.values() if t.enabled)
            reclaimed_since = self._reclaimed_since_compaction
        pressure_text = self.fs.read_optional(self.fs.proc("pressure", "memory"))
        buddy_text = self.fs.read_optional(self.fs.proc("buddyinfo"))
        if not policies or pressure_text is None or buddy_text is None:
            return
        stall_total = parse_pressure(pressure_text).some.total_us
        elapsed = now - self._compaction_checked if self._compaction_checked else None
        previous = self._system_stall_us
        self._compaction_checked, self._system_stall_us = now, stall_total
        if elapsed is None or previous is None:
            return  # The first check is the baseline for the stall delta.
        # The system's calm bar: the strictest target's stall rate over the elapsed time.
        allowed = int(min(p.stall_target_us / p.interval_ms for p in policies) * elapsed * 1000)
        since = now - self._compacted_at if self._compacted_at is not None else None
        run, why = compaction_decision(
            parse_buddyinfo(buddy_text),
            self._page_size,
            stall_total - previous,
            allowed,
            since,
            self._rule,
            reclaimed_since,
            reclaiming,
        )
        runs = self._compaction.runs
        last_run = self._compaction.last_run_unix_ns
        if run:
            try:
                self._compactor.compact_blocking()
            except (AgentError, OSError) as e:
                why = f"compaction failed: {e}"
            else:
                runs, last_run = runs + 1, time.time_ns()
                why = f"ran: {why}"
            self._compacted_at = self._clock()
            with self._lock:
                self._reclaimed_since_compaction = 0
        with self._lock:
            self._compaction = CompactionStatus(runs, why, last_run)
