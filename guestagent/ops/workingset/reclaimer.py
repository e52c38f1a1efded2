"""The working-set reclaimer: the guest gives back memory its workloads do not use.

One thread serves every target cgroup. It sleeps until the next target is due (or a policy
changes), then for each due target reads the interval's stall (memory.pressure, or delay
accounting where the guest has no PSI: linux/delayacct.py), refaults
(memory.stat) and memory.current, and, where the idle ager reads the multi-gen LRU's ages,
what of the cgroup has been idle past the policy's cold_after_ms (cold.py). policy.decide
says the step: evict that cold memory, or probe; the writer (writer.py) gives it to the
multi-gen LRU's eviction command or to memory.reclaim. The compaction trigger
(compaction.py) runs after. Policies are kept in a state file under /run, so an agent
restart carries on with what the host set.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

from guestagent.errors import AgentError, FailedPrecondition, quoted
from guestagent.jsonlog import EventLog
from guestagent.linux.abi import PAGE_SIZE
from guestagent.linux.cgroup.memory import MemoryCgroup, ReclaimReading
from guestagent.linux.cgroup.name import CgroupName, cgroup_name
from guestagent.linux.cgroup.procs import read_own_cgroup
from guestagent.linux.cgroup.tree import top_level_cgroups
from guestagent.linux.delayacct import DELAYACCT_STALL, PSI_STALL, DelayStallMeter
from guestagent.linux.features import (
    MGLRU,
    Absent,
    read_cgroup_psi_absence,
    read_mglru_absence,
)
from guestagent.linux.kernel import Kernel
from guestagent.linux.lru_gen import (
    Eviction,
    Lruvec,
    debugfs,
    read_lruvecs,
    write_eviction,
)
from guestagent.linux.mm import read_lru_gen
from guestagent.linux.statestore import RECLAIM_POLICIES, StateFileError, state_file
from guestagent.linux.swaps import active_swaps
from guestagent.linux.syscalls import name_thread
from guestagent.ops.giveback_figures import cgroup_swap_room
from guestagent.ops.idle import IdleState, in_subtree
from guestagent.ops.workingset.cold import (
    ColdBounds,
    booked_cold,
    cooling_bytes,
    eviction_plan,
)
from guestagent.ops.workingset.compaction_trigger import (
    CompactionRule,
    CompactionStatus,
    CompactionTrigger,
)
from guestagent.ops.workingset.policy import (
    ControllerState,
    Mode,
    ReclaimPolicy,
    Sample,
    StepKind,
    decide,
    floor_of,
    validate_policy,
)
from guestagent.ops.workingset.status import (
    GUARDS,
    ReclaimOverview,
    ReclaimPolicyRequest,
    TargetStatus,
    WorkloadReclaimRequest,
    no_reclaim_policy,
)
from guestagent.ops.workingset.workloads import workload_cgroups
from guestagent.ops.workingset.writer import StepWriter, WriteReclaim
from guestagent.records import record

log = EventLog("guestagent.ops.workingset")
# The workloads policy's key among the saved policies: the empty name, which no cgroup has.
WORKLOADS_KEY = ""
# How often the workloads are looked for again while that policy is on: a container that
# starts is reclaimed from within this.
WORKLOAD_SCAN_SECONDS = 2.0


@record
class Progress:
    """What a target's last intervals did, as its status shows them."""

    reclaimed_total: int = 0
    reclaimed_last: int = 0
    # What each way has taken: evicting what the ages call cold, and probing.
    evicted_cold_total: int = 0
    probed_total: int = 0
    last_step: StepKind | None = None  # Which way the last step went; None before the first.
    last_step_us: int = 0  # How long its writes took.
    # Why the last step stopped at the working set, "" if it did not.
    low_yield: str = ""
    last_stall_us: int = 0
    last_refault_bytes: int = 0
    intervals: int = 0
    current: int = 0
    floor: int = 0


@record
class _Baseline:
    """The last reading, against which the next interval's deltas are taken."""

    at: float
    stall_total_us: int
    refault_pages: int


@dataclass
class _Target:
    cgroup: CgroupName
    memory: MemoryCgroup
    policy: ReclaimPolicy
    enabled: bool
    state: ControllerState = field(default_factory=ControllerState)
    # Bumped by every policy change, so a tick measured under the old one is thrown away.
    generation: int = 0
    due: float = 0.0
    baseline: _Baseline | None = None
    progress: Progress = field(default_factory=Progress)
    absent: tuple[Absent, ...] = ()
    stall_source: str = PSI_STALL

    def status(self) -> TargetStatus:
        mode = self.state.mode if self.enabled else Mode.DISABLED
        f = self.progress
        return TargetStatus(
            self.cgroup,
            self.enabled,
            self.policy,
            mode,
            self.state.why,
            f.reclaimed_total,
            f.reclaimed_last,
            f.last_stall_us,
            f.last_refault_bytes,
            f.intervals,
            f.current,
            f.floor,
            (self.stall_source, *GUARDS),
            self.absent,
            f.last_step.value if f.last_step is not None else "",
            f.last_step_us,
            f.evicted_cold_total,
            f.probed_total,
        )


def _saved(enabled: bool, policy: ReclaimPolicy) -> dict[str, object]:
    return {"enabled": enabled, "policy": asdict(policy)}


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "bool": bool,
}


@record
class SavedPolicies:
    targets: dict[CgroupName, tuple[bool, ReclaimPolicy]]
    workloads: tuple[bool, ReclaimPolicy] | None = None


def decode_policies(value: object) -> SavedPolicies:
    """The saved policies by canonical cgroup name, and the workloads policy; TypeError or an
    AgentError for a value that is not what _save_locked writes (the loader then moves the
    file aside). A field an older agent did not save takes its default."""
    if not isinstance(value, dict):
        raise TypeError(f"policies are {type(value).__name__}, not an object")
    fields = {f.name: f.type for f in dataclasses.fields(ReclaimPolicy)}
    decoded: dict[str, tuple[bool, ReclaimPolicy]] = {}
    for cgroup, entry in value.items():
        if not isinstance(entry, dict) or set(entry) != {"enabled", "policy"}:
            raise TypeError(f"entry for {quoted(str(cgroup))} is not enabled and policy")
        enabled, given = entry["enabled"], entry["policy"]
        if not isinstance(enabled, bool) or not isinstance(given, dict) or set(given) - set(fields):
            raise TypeError(f"entry for {quoted(str(cgroup))} has the wrong fields or types")
        for name in given:
            text = fields[name]
            wanted = _JSON_TYPES[str(text)]
            if not isinstance(given[name], wanted) or (
                text != "bool" and isinstance(given[name], bool)
            ):
                raise TypeError(f"{name} of {quoted(str(cgroup))} is not a {text}")
        name = WORKLOADS_KEY if cgroup == WORKLOADS_KEY else cgroup_name(cgroup)
        decoded[name] = (enabled, validate_policy(ReclaimPolicy(**given)))
    workloads = decoded.pop(WORKLOADS_KEY, None)
    return SavedPolicies({cgroup_name(k): v for k, v in decoded.items()}, workloads)


class Reclaimer:
    def __init__(
        self,
        kernel: Kernel,
        clock: Callable[[], float] = time.monotonic,
        compaction_rule: CompactionRule | None = None,
        write: WriteReclaim = MemoryCgroup.reclaim,
        stall: DelayStallMeter | None = None,
        ages: Callable[[], IdleState] | None = None,
    ) -> None:
        """`write` is the one memory.reclaim write (tests give a fake kernel's); `stall` the
        agent's delay-accounting meter, the stall source where PSI is not (None: PSI only);
        `ages` the idle ager's last books (None: no ages, probing only)."""
        self.kernel = kernel
        self._stall = stall
        self._ages = ages
        # The targets whose cold memory could not be planned, said once each.
        self._cold_unread: set[CgroupName] = set()
        self._clock = clock
        self._writer = StepWriter(clock, PAGE_SIZE, write)
        self._compaction = CompactionTrigger(kernel, clock, PAGE_SIZE, compaction_rule, stall)
        self._store = state_file(kernel, RECLAIM_POLICIES)
        self._targets: dict[CgroupName, _Target] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        # The workloads policy (enabled, policy), the targets it made, those it was refused
        # (said once), and when the workloads were last looked for.
        self._workloads: tuple[bool, ReclaimPolicy] | None = None
        self._from_workloads: set[CgroupName] = set()
        self._refused_workloads: set[CgroupName] = set()
        self._workloads_scanned_at = float("-inf")

    # The host's side: policies and status.

    def set_policy(
        self, request: ReclaimPolicyRequest | WorkloadReclaimRequest, persist: bool = True
    ) -> TargetStatus:
        """A cgroup's policy (a host's explicit one wins over the workloads policy for that
        cgroup), or the workloads policy."""
        if isinstance(request, WorkloadReclaimRequest):
            return self._set_workloads(request, persist)
        status = self._apply(request, persist)
        with self._lock:
            self._from_workloads.discard(request.cgroup)
        return status

    def _apply(self, request: ReclaimPolicyRequest, persist: bool) -> TargetStatus:
        cgroup, enabled, policy = request.cgroup, request.enabled, request.policy
        validate_policy(policy)
        memory = self.kernel.cgroup(cgroup)
        source, absent = self._check_kernel(memory, policy) if enabled else (PSI_STALL, ())
        with self._lock:
            if persist:
                # Saved first, then applied: a policy that could not be saved is not turned
                # on either, so the caller's error means nothing changed.
                self._save_locked({**self._saved_locked(), cgroup: _saved(enabled, policy)})
            target = self._targets.get(cgroup)
            if target is None:
                target = _Target(cgroup, memory, policy, enabled)
                self._targets[cgroup] = target
            target.policy, target.enabled, target.absent = policy, enabled, absent
            target.stall_source = source
            target.generation += 1
            target.baseline = None  # A fresh baseline: the old deltas belong to another policy.
            target.due = self._clock()
            why = "waiting for the first interval's figures" if enabled else "turned off"
            target.state = ControllerState(why=why)
            status = target.status()
        # The reclaimer works best with the multi-gen LRU (docs/design-reclaimer.md).
        log.info(
            "reclaim_policy",
            cgroup=cgroup,
            enabled=enabled,
            stall_source=source if enabled else None,
            multigen_lru=read_lru_gen(self.kernel),
            absent={a.feature: a.reason for a in absent},
            **asdict(policy),
        )
        if enabled:
            self._run_thread()
        self._wake.set()
        return status

    def _check_kernel(
        self, memory: MemoryCgroup, policy: ReclaimPolicy
    ) -> tuple[str, tuple[Absent, ...]]:
        """Refuse what cannot run; return its stall source and the features it runs without."""
        memory.require_reclaim()
        source = self._stall_source(memory.directory)
        self._check_swap(policy)
        mglru = read_mglru_absence(self.kernel)
        return source, (mglru,) if mglru is not None else ()

    def _check_swap(self, policy: ReclaimPolicy) -> None:
        if policy.anon and not active_swaps(self.kernel):
            raise FailedPrecondition(
                "anon reclaim asked with no active swap area (/proc/swaps lists none): "
                "enable swap first, or leave anon off",
                "NO_ACTIVE_SWAP",
            )

    def _set_workloads(self, request: WorkloadReclaimRequest, persist: bool) -> TargetStatus:
        """The workloads policy, saved first as a cgroup's is; its targets follow at once and
        as workloads come (run_due)."""
        enabled, policy = request.enabled, request.policy
        validate_policy(policy)
        if enabled:
            self._check_swap(policy)
        with self._lock:
            if persist:
                saved = self._saved_locked()
                self._save_locked({**saved, WORKLOADS_KEY: _saved(enabled, policy)})
            self._workloads = (enabled, policy)
            self._refused_workloads.clear()
        names = self._sync_workloads()
        log.info("reclaim_workloads", enabled=enabled, cgroups=list(names), **asdict(policy))
        if enabled:
            self._run_thread()
        self._wake.set()
        found = ", ".join(names) or "none yet"
        why = (
            f"on for the guest's workloads: {found} (looked for every {WORKLOAD_SCAN_SECONDS:g} s)"
            if enabled
            else "turned off for the guest's workloads"
        )
        mode = Mode.PROBING if enabled else Mode.DISABLED
        return TargetStatus("", enabled, policy, mode, why, 0, 0, 0, 0, 0, 0, 0)

    def _sync_workloads(self) -> tuple[CgroupName, ...]:
        """Bring the workload targets in line with the workloads policy and the cgroups there
        are now; the workload cgroups under it."""
        self._workloads_scanned_at = self._clock()
        with self._lock:
            workloads = self._workloads
            made = set(self._from_workloads)
            explicit = {n for n in self._targets if n not in made}
        if workloads is None:
            return ()
        enabled, policy = workloads
        if not enabled:
            for name in made:
                with self._lock:
                    target = self._targets.get(name)
                if target is not None:
                    self._drop(target, "the workloads policy was turned off")
            return ()
        try:
            names = workload_cgroups(top_level_cgroups(self.kernel), read_own_cgroup(self.kernel))
        except AgentError as e:
            log.warning("reclaim_workloads_unread", error=str(e))
            return tuple(sorted(made))
        for name in names:
            with self._lock:
                target = self._targets.get(name)
            if name in explicit or (target is not None and target.policy == policy):
                continue
            try:
                self._apply(ReclaimPolicyRequest(name, True, policy), persist=False)
            except AgentError as e:
                if name not in self._refused_workloads:
                    self._refused_workloads.add(name)
                    log.warning("reclaim_workload_refused", cgroup=name, error=str(e))
                continue
            with self._lock:
                self._from_workloads.add(name)
        with self._lock:
            return tuple(sorted(self._from_workloads))

    def _stall_source(self, directory: str) -> str:
        """PSI where the cgroup has it (unless delay accounting is preferred), else delay
        accounting; neither is refused: without its stall budget the reclaimer slowed a hot
        set past the bound (docs/design-reclaimer.md: Without PSI)."""
        psi = read_cgroup_psi_absence(self.kernel, directory)
        if psi is None and not (self._stall and self._stall.stands_in(True)):
            return PSI_STALL
        delay = self._stall.absence() if self._stall is not None else None
        if self._stall is not None and delay is None:
            return DELAYACCT_STALL
        psi_why = psi.reason if psi is not None else "present, but --stall-signal delayacct"
        delay_why = delay.reason if delay is not None else "not read by this agent"
        raise FailedPrecondition(
            "the working-set reclaimer needs a stall signal for its budget, and has neither: "
            f"PSI: {psi_why}; delay accounting: {delay_why}",
            "STALL_SIGNAL_ABSENT",
            metadata={"features": "psi,delayacct"},
        )

    def status(self, cgroups: Iterable[CgroupName] = ()) -> tuple[TargetStatus, ...]:
        names = tuple(cgroups)
        self._drop_vanished()
        with self._lock:
            missing = [name for name in names if name not in self._targets]
            if missing:
                raise no_reclaim_policy(missing)
            chosen = names or tuple(sorted(self._targets))
            return tuple(self._targets[name].status() for name in chosen)

    def overview(self, cgroups: Iterable[CgroupName] = ()) -> ReclaimOverview:
        return ReclaimOverview(self.status(cgroups), self.compaction)

    def known(self, cgroups: Iterable[CgroupName]) -> tuple[TargetStatus, ...]:
        """Status of those of the cgroups that are targets (for WatchMemory)."""
        self._drop_vanished()
        with self._lock:
            return tuple(self._targets[n].status() for n in cgroups if n in self._targets)

    @property
    def compaction(self) -> CompactionStatus:
        return self._compaction.status

    # Start, stop, persistence.

    def start(self, initial: Iterable[str] = ()) -> None:
        """Reload the host's policies, turn on `initial` cgroups the host has not set, run.
        `initial` are --reclaim's names as given: one refused is logged, and the rest run."""
        self._load()
        for given in initial:
            try:
                cgroup = cgroup_name(given)
                if cgroup not in self._targets:
                    self.set_policy(ReclaimPolicyRequest(cgroup, True))
            except AgentError as e:
                log.warning("reclaim_initial_refused", cgroup=given, error=str(e))
        self._started = True
        workloads_on = self._workloads is not None and self._workloads[0]
        if workloads_on or any(target.enabled for target in self._targets.values()):
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

    def _saved_locked(self) -> dict[str, dict[str, object]]:
        """The policies to save: each a host set for a cgroup, and the workloads policy (the
        targets it made are made again from it)."""
        saved: dict[str, dict[str, object]] = {
            name: _saved(t.enabled, t.policy)
            for name, t in self._targets.items()
            if name not in self._from_workloads
        }
        if self._workloads is not None:
            saved[WORKLOADS_KEY] = _saved(*self._workloads)
        return saved

    def _save_locked(self, state: dict[str, dict[str, object]] | None = None) -> None:
        state = self._saved_locked() if state is None else state
        self._store.save_or_remove(dict(sorted(state.items())))

    def _load(self) -> None:
        saved = self._store.load_valid(decode_policies) or SavedPolicies({})
        for cgroup, (enabled, policy) in saved.targets.items():
            try:
                self.set_policy(ReclaimPolicyRequest(cgroup, enabled, policy), persist=False)
            except AgentError as e:
                log.warning("reclaim_policy_dropped", cgroup=cgroup, error=str(e))
        if saved.workloads is not None:
            try:
                self.set_policy(WorkloadReclaimRequest(*saved.workloads), persist=False)
            except AgentError as e:
                log.warning("reclaim_policy_dropped", cgroup=WORKLOADS_KEY, error=str(e))
        with self._lock:
            try:
                self._save_locked()
            except StateFileError as e:
                log.warning("reclaim_state_unsaved", error=str(e))

    # The loop.

    def _run(self) -> None:
        name_thread("reclaimer")  # Its CPU and wakeups apart from the agent's in /proc.
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
        workloads_on = self._workloads is not None and self._workloads[0]
        if workloads_on and now - self._workloads_scanned_at >= WORKLOAD_SCAN_SECONDS:
            self._sync_workloads()
        with self._lock:
            due = [t for t in self._targets.values() if t.enabled and t.due <= now]
        for target in due:
            if self._stopping.is_set():
                return None
            self._serve(target)
        if due or not self._compaction.checked:
            with self._lock:
                on = [t for t in self._targets.values() if t.enabled]
            self._compaction.maybe_compact([t.policy for t in on], any(t.state.stepped for t in on))
        with self._lock:
            times = [t.due for t in self._targets.values() if t.enabled]
        if workloads_on:
            times.append(self._workloads_scanned_at + WORKLOAD_SCAN_SECONDS)
        if not times:
            return None
        return max(0.0, min(times) - self._clock())

    def _serve(self, target: _Target) -> None:
        started = self._clock()
        try:
            reading = target.memory.reclaim_reading(self._stall_reader(target))
        except AgentError as e:
            if e.errno == errno.ENOENT and not target.memory.exists():
                self._drop(target, "the cgroup was removed")
                return
            raise
        plan, cooling = self._age_figures(target, reading)
        with self._lock:
            generation, policy = target.generation, target.policy
            interval = policy.interval_ms / 1000
            target.due = started + interval
            if not target.enabled:
                return
            previous = target.baseline
            target.baseline = _Baseline(started, reading.stall_total_us, reading.refault_pages)
            progress = replace(
                target.progress,
                current=reading.current,
                floor=floor_of(policy, reading.protected),
            )
            target.progress = progress
            if previous is None:
                return  # The first reading is the baseline for the next interval's deltas.
            stall = reading.stall_total_us - previous.stall_total_us
            refaults = reading.refault_pages - previous.refault_pages
            # A slow interval (a long reclaim write) is judged at the nominal interval's rate.
            scale = min(1.0, interval / max(started - previous.at, 1e-6))
            sample = Sample(
                int(max(0, stall) * scale),
                int(max(0, refaults) * PAGE_SIZE * scale),
                reading.current,
                reading.protected,
                progress.reclaimed_last,
                progress.low_yield,
                sum(e.pages for e in plan) * PAGE_SIZE,
                cooling,
            )
            decision = decide(sample, policy, target.state, PAGE_SIZE)
            target.state = decision.state
            target.progress = replace(
                progress,
                last_stall_us=sample.stall_us,
                last_refault_bytes=sample.refault_bytes,
                intervals=progress.intervals + 1,
                reclaimed_last=0,
                low_yield="",
            )
        if decision.step_bytes:
            still_on = functools.partial(self._still_on, target, generation)
            step_started = self._clock()
            if decision.kind == StepKind.EVICT_COLD:
                with debugfs(self.kernel) as path:
                    result = self._writer.evict_step(
                        target.memory,
                        plan,
                        decision.step_bytes,
                        policy,
                        still_on,
                        functools.partial(write_eviction, self.kernel, path),
                    )
            else:
                result = self._writer.write_step(
                    target.memory, decision.step_bytes, reading.current, policy, still_on
                )
            took_us = int((self._clock() - step_started) * 1e6)
            with self._lock:
                if target.generation == generation:
                    f = target.progress
                    evicted = result.reclaimed if decision.kind == StepKind.EVICT_COLD else 0
                    target.progress = replace(
                        f,
                        reclaimed_last=result.reclaimed,
                        low_yield=result.low_yield,
                        reclaimed_total=f.reclaimed_total + result.reclaimed,
                        evicted_cold_total=f.evicted_cold_total + evicted,
                        probed_total=f.probed_total + result.reclaimed - evicted,
                        last_step=decision.kind,
                        last_step_us=took_us,
                    )
                    self._compaction.reclaimed(result.reclaimed)
                    if result.stopped:
                        why = f"{target.state.why}; stopped after {result.reclaimed} B: "
                        target.state = replace(target.state, why=why + result.stopped)

    def _age_figures(
        self, target: _Target, reading: ReclaimReading
    ) -> tuple[tuple[Eviction, ...], int | None]:
        """What the idle ages say of the target: the evictions for what is cold (cold.py),
        and the bytes a probe may still find (None: no ages, at the first reading, or the
        cgroup not aged yet). No evictions in a hold or when the books show nothing cold
        (then the generations are not read either)."""
        if (
            self._ages is None
            or target.baseline is None
            or any(a.feature == MGLRU for a in target.absent)
        ):
            return (), None
        ages = self._ages()
        view = ages.view(target.cgroup)
        if view is None:
            return (), None
        cooling = cooling_bytes(view, reading.lru, PAGE_SIZE)
        policy = target.policy
        headroom = reading.current - floor_of(policy, reading.protected)
        if (
            headroom < PAGE_SIZE
            or target.state.hold > 0
            or not booked_cold(ages.books, target.cgroup, policy.cold_after_ms)
        ):
            return (), cooling
        try:
            with debugfs(self.kernel) as path:
                lruvecs = read_lruvecs(self.kernel, path)
            bounds = ColdBounds(
                headroom // PAGE_SIZE,
                self._swap_room_pages(target),
                self._protected_below(target, lruvecs),
                ages.swap_barred,
            )
        except AgentError as e:
            if target.cgroup not in self._cold_unread:
                self._cold_unread.add(target.cgroup)
                log.warning("reclaim_cold_unread", cgroup=target.cgroup, error=str(e))
            return (), cooling
        plan = eviction_plan(lruvecs, ages.books, target.cgroup, policy.cold_after_ms, bounds)
        return plan, cooling

    def _swap_room_pages(self, target: _Target) -> int | None:
        """Room for anon in swap, in pages, as the cold figure counts it: the active areas'
        free space cut to the target's memory.swap.max; None without anon or swap."""
        if not target.policy.anon:
            return None
        areas = active_swaps(self.kernel)
        if not areas:
            return None
        room = cgroup_swap_room(
            sum(max(0, a.size_bytes - a.used_bytes) for a in areas), target.memory.swap()
        )
        return None if room is None else room // PAGE_SIZE

    def _protected_below(self, target: _Target, lruvecs: tuple[Lruvec, ...]) -> dict[str, int]:
        """Pages each protected memcg below the target holds above its memory.min/low: the
        eviction command applies neither (cold.py)."""
        top = "/" + target.cgroup
        found = {}
        paths = {v.path for v in lruvecs if v.path != top and in_subtree(v.path, target.cgroup)}
        for path in sorted(paths):
            try:
                memory = self.kernel.cgroup(cgroup_name(path.lstrip("/")))
                protection = memory.protection()
                current = memory.current_or_zero() if protection else 0
            except AgentError:
                continue  # Gone meanwhile: the kernel refuses its evictions.
            if protection == 0:
                continue
            above = 0 if protection is None else max(0, current - protection)
            found[path] = above // PAGE_SIZE
        return found

    def _stall_reader(self, target: _Target) -> Callable[[], int] | None:
        if target.stall_source != DELAYACCT_STALL or self._stall is None:
            return None
        meter, directory = self._stall, target.memory.directory
        return lambda: meter.total_us(directory)

    def _still_on(self, target: _Target, generation: int) -> bool:
        with self._lock:
            return (
                target.generation == generation and target.enabled and not self._stopping.is_set()
            )

    def _drop_vanished(self) -> None:
        """Turned-off targets are not read each interval; a status call notices them gone."""
        with self._lock:
            gone = [t for t in self._targets.values() if not t.memory.exists()]
        for target in gone:
            self._drop(target, "the cgroup was removed")

    def _drop(self, target: _Target, why: str) -> None:
        with self._lock:
            if self._targets.get(target.cgroup) is target:
                del self._targets[target.cgroup]
                self._from_workloads.discard(target.cgroup)
                self._save_locked()
        log.info("reclaim_target_dropped", cgroup=target.cgroup, reason=why)
