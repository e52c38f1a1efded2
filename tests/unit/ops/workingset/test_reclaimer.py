"""The reclaimer's loop over a fake cgroup tree, driven tick by tick with a fake clock."""

import errno
import shutil
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pytest

from guestagent.errors import FailedPrecondition, InvalidArgument, NotFound, kernel_error
from guestagent.linux.cgroup.memory import MemoryCgroup
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.features import Absent
from guestagent.linux.statestore import RECLAIM_POLICIES, check_directory, state_file
from guestagent.ops.idle import Book, IdleState, Layer
from guestagent.ops.workingset.policy import CHUNK_BYTES, EVICT_CHUNK_BYTES, Mode, ReclaimPolicy
from guestagent.ops.workingset.reclaimer import Reclaimer, decode_policies
from guestagent.ops.workingset.status import ReclaimPolicyRequest, overview_without_policies
from guestagent.sizes import MIB
from tests.fakes.root import FakeRoot
from tests.fakes.taskstats import FakeTaskstats, put_procs

SWAPS = "Filename\tType\tSize\tUsed\tPriority\n/dev/vdb\tpartition\t1048572\t0\t-2\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pressure(total_us: int) -> str:
    return (
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={total_us}\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )


def make_target(fake_root: FakeRoot, name: str = "pod", current: int = 100 * MIB) -> Path:
    directory = fake_root.add_cgroup(name, current=current)
    (directory / "memory.reclaim").write_text("")
    (directory / "memory.pressure").write_text(pressure(0))
    return directory


@dataclass
class KernelReclaim:
    """memory.reclaim as the kernel answers it: each write is recorded; `yields` says, per
    write, how many pages the kernel scanned and stole (kept in memory.stat pgscan/pgsteal)."""

    writes: list[str] = field(default_factory=list)
    yields: Callable[[int], tuple[int, int]] = lambda pages: (pages, pages)
    refaults: Callable[[int], int] = lambda pages: 0  # Pages refaulted meanwhile, per write.

    def __call__(self, memory: MemoryCgroup, request: str) -> bool:
        directory = Path(memory.directory)
        self.writes.append(request)
        (directory / "memory.reclaim").write_text(request)
        stat_path = directory / "memory.stat"
        stat = dict(line.split() for line in stat_path.read_text().splitlines())
        scanned, stolen = self.yields(int(request.split()[0]) // 4096)
        stat["pgscan"] = str(int(stat.get("pgscan", 0)) + scanned)
        stat["pgsteal"] = str(int(stat.get("pgsteal", 0)) + stolen)
        refaulted = self.refaults(int(request.split()[0]) // 4096)
        stat["workingset_refault_anon"] = str(
            int(stat.get("workingset_refault_anon", 0)) + refaulted
        )
        stat_path.write_text("".join(f"{k} {v}\n" for k, v in stat.items()))
        return True

    def asked(self) -> list[str]:
        writes, self.writes = self.writes, []
        return writes


@pytest.fixture
def kernel() -> KernelReclaim:
    return KernelReclaim()


def chunks(total: int, suffix: str = "") -> list[str]:
    return [f"{CHUNK_BYTES}{suffix}"] * (total // CHUNK_BYTES)


def started_with_baseline(fake_root: FakeRoot, reclaimer: Reclaimer) -> Path:
    """A target on with POLICY, its first reading (the baseline for deltas) taken."""
    directory = make_target(fake_root)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    reclaimer.run_due()
    return directory


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reclaimer(fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim) -> Reclaimer:
    return Reclaimer(fake_root.fs, clock=clock, write=kernel)


POLICY = ReclaimPolicy(stall_target_us=1000, max_step_fraction=0.1)


def test_a_step_each_interval_under_the_target(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    make_target(fake_root)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    assert reclaimer.run_due() == pytest.approx(1.0)  # The baseline reading.
    assert kernel.asked() == []
    clock.now += 1
    reclaimer.run_due()
    # Anon not allowed: the kernel is asked to leave anon alone (Linux 6.12+), a chunk at a
    # time.
    assert kernel.asked() == chunks(10 * MIB, " swappiness=0")
    status = reclaimer.status()[0]
    assert (status.mode, status.reclaimed_total, status.reclaimed_last) == (
        Mode.PROBING,
        10 * MIB,
        10 * MIB,
    )
    assert status.intervals == 1


def test_a_step_stops_where_the_kernel_finds_the_rest_referenced(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    started_with_baseline(fake_root, reclaimer)
    # From the third chunk on the kernel scans 8 pages for each it takes: the working set.
    kernel.yields = lambda pages: (pages, pages) if len(kernel.writes) < 3 else (pages * 8, pages)
    clock.now += 1
    reclaimer.run_due()
    assert len(kernel.asked()) == 4
    status = reclaimer.status()[0]
    assert status.reclaimed_last == 4 * CHUNK_BYTES
    assert "stole 512 of the 4096 pages it scanned in two chunks" in status.why
    # The next interval backs off for it, though no stall or refault showed yet.
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == []
    status = reclaimer.status()[0]
    assert status.mode == Mode.BACKING_OFF and "stopped early" in status.why


def test_a_step_stops_when_what_it_took_refaults(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    started_with_baseline(fake_root, reclaimer)
    # From the second chunk on, half of what the kernel takes comes straight back.
    kernel.refaults = lambda pages: pages // 2 if len(kernel.writes) >= 2 else 0
    clock.now += 1
    reclaimer.run_due()
    # 128 of 512 pages after two chunks is on the line; 256 of 768 after three is over it.
    assert len(kernel.asked()) == 3
    status = reclaimer.status()[0]
    assert "256 pages refaulted while it reclaimed 3145728 B" in status.why


def test_turning_off_mid_step_stops_before_the_next_chunk(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    started_with_baseline(fake_root, reclaimer)

    def host_turns_it_off(pages: int) -> tuple[int, int]:
        if len(kernel.writes) == 2:
            reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), False, POLICY))
        return pages, pages

    kernel.yields = host_turns_it_off
    clock.now += 1
    reclaimer.run_due()
    assert len(kernel.asked()) == 2


def test_a_slow_step_stops_at_its_share_of_the_interval(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    started_with_baseline(fake_root, reclaimer)

    def slow(pages: int) -> tuple[int, int]:
        clock.now += 0.3  # Each chunk takes 300 ms of a 1 s interval.
        return pages, pages

    kernel.yields = slow
    clock.now += 1
    reclaimer.run_due()
    assert len(kernel.asked()) == 4
    status = reclaimer.status()[0]
    assert "memory.reclaim took 1200 ms, over 1000 ms" in status.why
    assert status.mode == Mode.PROBING  # Slow is not the working set: no back-off.


def test_stall_over_the_target_backs_off(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    directory = make_target(fake_root)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    reclaimer.run_due()
    (directory / "memory.pressure").write_text(pressure(5000))
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == []
    status = reclaimer.status([cgroup_name("pod")])[0]
    assert status.mode == Mode.BACKING_OFF
    assert status.last_stall_us == 5000
    assert "stall 5000 us over target 1000 us" in status.why


def test_anon_needs_swap_and_then_writes_the_plain_size(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    make_target(fake_root)
    anon = ReclaimPolicy(stall_target_us=1000, max_step_fraction=0.1, anon=True)
    with pytest.raises(FailedPrecondition, match="no active swap"):
        reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, anon))
    fake_root.write("proc/swaps", SWAPS)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, anon))
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == chunks(10 * MIB)


def test_a_kernel_without_the_swappiness_argument_gets_the_plain_size(
    fake_root: FakeRoot, clock: Clock
) -> None:
    make_target(fake_root)
    writes: list[str] = []

    def before_6_12(memory: MemoryCgroup, request: str) -> bool:
        writes.append(request)
        if " " in request:
            control = Path(memory.directory, "memory.reclaim")
            raise kernel_error("write", control, request, OSError(errno.EINVAL, "Invalid argument"))
        return False  # EAGAIN: the kernel got less than asked.

    reclaimer = Reclaimer(fake_root.fs, clock=clock, write=before_6_12)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    assert writes == [f"{CHUNK_BYTES} swappiness=0", str(CHUNK_BYTES)]
    # Partial: memory.current did not move in the fake tree, so nothing counts as reclaimed,
    # and a step that got nothing is a back-off: what is left is the working set.
    status = reclaimer.status()[0]
    assert status.reclaimed_total == 0
    assert status.mode == Mode.BACKING_OFF and "little cold memory left" in status.why


def test_turning_off_stops_at_once(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock, kernel: KernelReclaim
) -> None:
    started_with_baseline(fake_root, reclaimer)
    status = reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), False, POLICY))
    assert status.mode == Mode.DISABLED and status.why == "turned off"
    clock.now += 1
    assert reclaimer.run_due() is None  # Nothing on: sleep until a policy changes.
    assert kernel.asked() == []


def test_a_removed_cgroup_is_dropped(
    fake_root: FakeRoot, reclaimer: Reclaimer, clock: Clock
) -> None:
    directory = make_target(fake_root)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    reclaimer.run_due()
    shutil.rmtree(directory)
    clock.now += 1
    reclaimer.run_due()
    assert reclaimer.status() == ()
    # No policy left: no file, so the next start does not load the reclaimer.
    assert not (fake_root.root / "run/guestagent/reclaim-policy.json").exists()


def test_a_reclaimer_only_asked_leaves_no_state(fake_root: FakeRoot, clock: Clock) -> None:
    # GetReclaimStatus builds and starts it; a read must not make every later start load it.
    make_target(fake_root)
    reclaimer = Reclaimer(fake_root.fs, clock=clock)
    reclaimer.start()
    try:
        assert reclaimer.status() == () and reclaimer.known([cgroup_name("pod")]) == ()
    finally:
        reclaimer.stop()
    assert not (fake_root.root / "run/guestagent/reclaim-policy.json").exists()


def test_an_empty_state_an_older_agent_left_is_removed_at_start(
    fake_root: FakeRoot, clock: Clock
) -> None:
    saved = fake_root.root / "run/guestagent/reclaim-policy.json"
    check_directory(fake_root.fs)
    state_file(fake_root.fs, RECLAIM_POLICIES).save({})
    reclaimer = Reclaimer(fake_root.fs, clock=clock)
    reclaimer.start()
    reclaimer.stop()
    assert not saved.exists()


def test_a_removed_cgroup_that_was_turned_off_is_dropped_too(
    fake_root: FakeRoot, reclaimer: Reclaimer
) -> None:
    directory = make_target(fake_root)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), False, POLICY))
    shutil.rmtree(directory)
    assert reclaimer.known([cgroup_name("pod")]) == ()


def test_policies_survive_a_restart(fake_root: FakeRoot, clock: Clock) -> None:
    make_target(fake_root, "pod")
    make_target(fake_root, "other")
    first = Reclaimer(fake_root.fs, clock=clock)
    first.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    first.set_policy(ReclaimPolicyRequest(cgroup_name("other"), False, POLICY))
    second = Reclaimer(fake_root.fs, clock=clock)
    second.start(initial=["pod", "other"])  # The host's settings win over --reclaim.
    try:
        statuses = {s.cgroup: s for s in second.status()}
        assert statuses["pod"].policy == POLICY and statuses["pod"].enabled
        assert not statuses["other"].enabled
    finally:
        second.stop()


def test_the_serve_flag_turns_on_the_default_policy(fake_root: FakeRoot, clock: Clock) -> None:
    make_target(fake_root)
    reclaimer = Reclaimer(fake_root.fs, clock=clock)
    # A missing cgroup, or a name refused, is logged, not fatal; 'pod/' is 'pod'.
    reclaimer.start(initial=["pod", "missing", "../x", "pod/"])
    try:
        [status] = reclaimer.status()
        assert (status.cgroup, status.policy, status.enabled) == ("pod", ReclaimPolicy(), True)
    finally:
        reclaimer.stop()


def test_the_thread_waits_for_the_interval_and_wakes_on_a_change(fake_root: FakeRoot) -> None:
    directory = make_target(fake_root)
    reclaimer = Reclaimer(fake_root.fs)
    reclaimer.start()
    try:
        reclaimer.set_policy(
            ReclaimPolicyRequest(
                cgroup_name("pod"), True, ReclaimPolicy(interval_ms=100, max_step_fraction=0.1)
            )
        )
        done = threading.Event()
        for _ in range(100):
            if (directory / "memory.reclaim").read_text():
                done.set()
                break
            done.wait(0.05)
        assert done.is_set(), "the reclaimer thread never wrote memory.reclaim"
    finally:
        reclaimer.stop()


@pytest.mark.parametrize(
    ("cgroup", "policy", "setup", "error", "words"),
    [
        ("nope", POLICY, None, NotFound, "'nope' does not exist"),
        ("pod", ReclaimPolicy(interval_ms=50), None, InvalidArgument, "interval_ms 50"),
        ("pod", POLICY, "memory.reclaim", FailedPrecondition, "memory.reclaim is missing"),
        (
            "pod",
            POLICY,
            "memory.pressure",
            FailedPrecondition,
            "needs a stall signal.*PSI: .*delay accounting",
        ),
    ],
)
def test_refusals(
    fake_root: FakeRoot,
    reclaimer: Reclaimer,
    cgroup: str,
    policy: ReclaimPolicy,
    setup: str | None,
    error: type[Exception],
    words: str,
) -> None:
    directory = make_target(fake_root)
    if setup:
        (directory / setup).unlink()
    with pytest.raises(error, match=words):
        reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name(cgroup), True, policy))
    assert reclaimer.status() == ()


@pytest.mark.parametrize(
    ("cmdline", "words"),
    [("psi=0\n", "booted with psi=0; boot with psi=1 instead"), ("\n", "boot with psi=1")],
)
def test_without_psi_it_refuses_saying_how_to_get_it(
    fake_root: FakeRoot, reclaimer: Reclaimer, cmdline: str, words: str
) -> None:
    (make_target(fake_root) / "memory.pressure").unlink()
    (fake_root.root / "proc/pressure/memory").unlink()
    fake_root.write("proc/cmdline", cmdline)
    with pytest.raises(FailedPrecondition, match=f"needs a stall signal.*PSI: .*{words}"):
        reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    assert reclaimer.status() == ()


def test_status_says_what_it_runs_on_and_without(fake_root: FakeRoot, reclaimer: Reclaimer) -> None:
    make_target(fake_root)
    status = reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    assert status.signals == ("psi_stall", "refaults", "reclaim_yield")
    assert [a.feature for a in status.absent] == ["mglru"]  # The fake tree has no lru_gen.
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    assert reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY)).absent == ()


def test_status_of_an_unknown_target_is_not_found(reclaimer: Reclaimer) -> None:
    with pytest.raises(NotFound, match="no policy for cgroup"):
        reclaimer.status([cgroup_name("pod")])


def without_psi(fake_root: FakeRoot, kernel: FakeTaskstats) -> Path:
    """A target whose cgroup has no memory.pressure, process 10 in it, on a guest with delay
    accounting on."""
    directory = make_target(fake_root)
    (directory / "memory.pressure").unlink()
    put_procs(directory, 10)
    kernel.memory_ns[10] = 0
    fake_root.write("proc/sys/kernel/task_delayacct", "1\n")
    return directory


def test_without_psi_it_runs_on_delay_accounting(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    delays = FakeTaskstats()
    without_psi(fake_root, delays)
    meter = DelayStallMeter(fake_root.fs, delays, clock)
    reclaimer = Reclaimer(fake_root.fs, clock=clock, write=kernel, stall=meter)
    status = reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    assert status.signals == ("delayacct_stall", "refaults", "reclaim_yield")
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == chunks(10 * MIB, " swappiness=0")
    # The workload stalls 1.5 ms in the next interval, over the 1 ms target: it backs off.
    delays.stall(10, 1500)
    clock.now += 1
    reclaimer.run_due()
    status = reclaimer.status()[0]
    assert kernel.asked() == []
    assert status.mode == Mode.BACKING_OFF and status.last_stall_us == 1500
    assert "stall 1500 us over target 1000 us" in status.why


def test_delay_accounting_can_be_preferred_where_there_is_psi(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    make_target(fake_root)
    meter = DelayStallMeter(fake_root.fs, FakeTaskstats({1: 0}), clock, preferred=True)
    reclaimer = Reclaimer(fake_root.fs, clock=clock, write=kernel, stall=meter)
    status = reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    assert status.signals[0] == "delayacct_stall"


def test_with_neither_stall_signal_it_is_refused_naming_both(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    delays = FakeTaskstats()
    without_psi(fake_root, delays)
    fake_root.write("proc/sys/kernel/task_delayacct", "0\n")
    meter = DelayStallMeter(fake_root.fs, delays, clock)
    reclaimer = Reclaimer(fake_root.fs, clock=clock, write=kernel, stall=meter)
    with pytest.raises(
        FailedPrecondition,
        match=r"needs a stall signal.*PSI: .*memory.pressure is missing.*"
        r"delay accounting: delay accounting is off \(kernel.task_delayacct 0\)",
    ):
        reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))
    assert reclaimer.status() == ()


def test_the_overview_without_policies_is_a_new_reclaimers(fake_root: FakeRoot) -> None:
    """What GetReclaimStatus answers before the reclaimer is built (agent/daemon.py) is what
    the reclaimer would have answered, built then: no targets and an unchecked trigger, and
    the same refusal for a cgroup named."""
    new = Reclaimer(fake_root.fs)
    assert overview_without_policies(()) == new.overview(())
    for names in ((cgroup_name("pod"),), (cgroup_name("pod"), cgroup_name("other/ctr"))):
        with pytest.raises(NotFound) as built:
            new.overview(names)
        with pytest.raises(NotFound) as unbuilt:
            overview_without_policies(names)
        assert (str(unbuilt.value), unbuilt.value.reason) == (str(built.value), built.value.reason)
        assert unbuilt.value.metadata == built.value.metadata


# The pod's generations as the kernel lists them (mm/vmscan.c lru_gen_seq_show): its oldest
# holds a cold set (8,000 anon and 4,000 file pages), the youngest two its hot loop.
POD_LRU_GEN = """\
memcg     1 /
 node     0
          3      40000       1000       2000
          4      30000          0          0
          5      10000          0          0
memcg     5 /pod
 node     0
         10      40000       8000       4000
         11      30000          0          0
         12      20000       2000          0
         13          0          0          0
"""
# The idle ager's books for them: the oldest generation idle 45 s at the last aging.
POD_BOOKS = {
    (5, "/pod", 0): Book(
        0, {10: (Layer(45_000, 8000, 4000),), 11: (), 12: (Layer(0, 2000, 0),), 13: ()}
    )
}
COLD_POLICY = replace(POLICY, cold_after_ms=30_000)


@dataclass
class Generations:
    """The multi-gen LRU's debugfs file as the kernel answers eviction commands: each is
    recorded, and what it evicts counts in the pod's memory.stat pgsteal."""

    directory: Path
    commands: list[str] = field(default_factory=list)
    # Pages the kernel evicts for a command asking for `pages`, and pages refaulted meanwhile.
    evicts: Callable[[int], int] = lambda pages: pages
    refaults: Callable[[int], int] = lambda pages: 0

    def __call__(self, path: Path, value: str, proceed: Callable[[str], None]) -> None:
        if path.name != "lru_gen" or not value.startswith("-"):
            proceed(value)
            return
        self.commands.append(value)
        stat_path = self.directory / "memory.stat"
        stat = dict(line.split() for line in stat_path.read_text().splitlines())
        evicted = self.evicts(int(value.split()[-1]))
        for counter in ("pgscan", "pgsteal"):
            stat[counter] = str(int(stat.get(counter, 0)) + evicted)
        refaulted = int(stat.get("workingset_refault_file", 0)) + self.refaults(evicted)
        stat["workingset_refault_file"] = str(refaulted)
        stat_path.write_text("".join(f"{k} {v}\n" for k, v in stat.items()))


@dataclass
class Ages:
    """The idle ager's books as the reclaimer asks for them; a test ages them by setting."""

    state: IdleState

    def __call__(self) -> IdleState:
        return self.state


def lru_now(directory: Path, anon_pages: int, file_pages: int) -> None:
    """The pod's LRU as memory.stat counts it now, with its pgscan and pgsteal counters."""
    stat = directory / "memory.stat"
    kept = [line for line in stat.read_text().splitlines() if "active_" not in line]
    lru = [f"inactive_anon {anon_pages * 4096}", f"inactive_file {file_pages * 4096}"]
    counters = [] if any("pgsteal" in line for line in kept) else ["pgscan 0", "pgsteal 0"]
    stat.write_text("\n".join(kept + lru + counters) + "\n")


def with_ages(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim, ages: IdleState
) -> tuple[Reclaimer, Generations, Ages]:
    """A reclaimer on the pod with the multi-gen LRU on, swap, and the ager's books, whose
    LRU now holds what the books do."""
    directory = make_target(fake_root)
    lru_now(directory, 10_000, 4_000)
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    fake_root.write("sys/kernel/debug/lru_gen", POD_LRU_GEN)
    fake_root.write("proc/swaps", SWAPS)
    generations = Generations(directory)
    fake_root.kernel.on("write", generations)
    now = Ages(ages)
    return Reclaimer(fake_root.fs, clock=clock, write=kernel, ages=now), generations, now


def cold_pod_on(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> tuple[Reclaimer, Generations]:
    """The pod on with COLD_POLICY (no anon) and the books of POD_BOOKS, its baseline read."""
    reclaimer, generations, _ = with_ages(fake_root, clock, kernel, IdleState(POD_BOOKS, None))
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, COLD_POLICY))
    reclaimer.run_due()
    return reclaimer, generations


def test_what_the_ages_call_cold_is_evicted_at_once_file_first_then_probing(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    reclaimer, generations, ages = with_ages(fake_root, clock, kernel, IdleState(POD_BOOKS, None))
    anon = replace(COLD_POLICY, anon=True)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, anon))
    reclaimer.run_due()  # The baseline.
    clock.now += 1
    reclaimer.run_due()
    # 12,000 cold pages of a 100 MiB pod: all of it (the probe would have been 10 MiB), in
    # writes of EVICT_CHUNK_BYTES, the file pages first.
    chunk = EVICT_CHUNK_BYTES // 4096
    assert generations.commands == [f"- 5 0 10 0 {chunk}"] * 3 + [
        f"- 5 0 10 0 {4000 - 3 * chunk}"
    ] + [f"- 5 0 10 200 {chunk}"] * 7 + [f"- 5 0 10 200 {8000 - 7 * chunk}"]
    assert kernel.asked() == []
    status = reclaimer.status()[0]
    assert (status.last_step, status.evicted_cold_total, status.probed_total) == (
        "evict_cold",
        12000 * 4096,
        0,
    )
    assert status.reclaimed_total == 12000 * 4096
    assert "idle at least 30 s" in status.why
    # The kernel has taken the generation: what is left, the hot loop, was in use at the
    # last aging, so there is nothing for a probe to find either.
    fake_root.write("sys/kernel/debug/lru_gen", POD_LRU_GEN.replace("8000       4000", "0 0"))
    lru_now(fake_root.root / "sys/fs/cgroup/pod", 2_000, 0)
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == [] and len(generations.commands) == 12
    assert "nothing worth a probe" in reclaimer.status()[0].why
    # The next aging finds 1,000 pages of it unused for 10 s: cooling, and a probe looks
    # for no more than that.
    ages.state = IdleState(
        {(5, "/pod", 0): Book(0, {12: (Layer(10_000, 1_000, 0),), 13: (Layer(0, 1_000, 0),)})},
        None,
    )
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == [str(CHUNK_BYTES)] * 3 + [str(1_000 * 4096 - 3 * CHUNK_BYTES)]
    status = reclaimer.status()[0]
    assert (status.last_step, status.probed_total) == ("probe", 1_000 * 4096)


def test_without_ages_or_with_nothing_cold_it_probes_as_before(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    no_ages = IdleState({}, Absent("mglru", "the agent ages no generations (--idle-aging 0)"))
    reclaimer, generations, _ = with_ages(fake_root, clock, kernel, no_ages)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, COLD_POLICY))
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == chunks(10 * MIB, " swappiness=0")
    assert generations.commands == []
    # Ages that call nothing cold yet: the generations are not even read.
    fake_root.write("sys/kernel/debug/lru_gen", "not what the kernel prints\n")
    young = IdleState(POD_BOOKS, None)
    reclaimer = Reclaimer(fake_root.fs, clock=clock, write=kernel, ages=lambda: young)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, POLICY))  # 60 s.
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    assert kernel.asked() == chunks(10 * MIB, " swappiness=0")
    assert reclaimer.status()[0].last_step == "probe"


def test_without_anon_only_cold_file_pages_are_evicted(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    reclaimer, generations = cold_pod_on(fake_root, clock, kernel)
    clock.now += 1
    reclaimer.run_due()
    assert {c.split()[4] for c in generations.commands} == {"0"}
    assert reclaimer.status()[0].evicted_cold_total == 4000 * 4096


def test_an_eviction_stops_when_what_it_took_comes_back(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    reclaimer, generations = cold_pod_on(fake_root, clock, kernel)
    generations.refaults = lambda pages: pages  # All it takes comes straight back.
    clock.now += 1
    reclaimer.run_due()
    assert len(generations.commands) == 1
    status = reclaimer.status()[0]
    assert "it reached the working set" in status.why
    clock.now += 1
    reclaimer.run_due()
    assert reclaimer.status()[0].mode == Mode.BACKING_OFF
    assert len(generations.commands) == 1


def test_turning_off_mid_eviction_stops_before_the_next_write(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    reclaimer, generations = cold_pod_on(fake_root, clock, kernel)

    def host_turns_it_off(pages: int) -> int:
        if len(generations.commands) == 2:
            reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), False, COLD_POLICY))
        return pages

    generations.evicts = host_turns_it_off
    clock.now += 1
    reclaimer.run_due()
    assert len(generations.commands) == 2


def test_a_generation_that_moved_on_ends_its_eviction(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    # An aging folded generation 10 into 11 after the plan was made: the kernel evicts
    # nothing at or below 10, so the step ends and the next interval plans again.
    reclaimer, generations = cold_pod_on(fake_root, clock, kernel)
    generations.evicts = lambda pages: 0
    clock.now += 1
    reclaimer.run_due()
    assert len(generations.commands) == 1
    assert reclaimer.status()[0].evicted_cold_total == 0


def test_a_policy_saved_before_cold_after_ms_takes_its_default() -> None:
    older = {k: v for k, v in asdict(POLICY).items() if k != "cold_after_ms"}
    saved = decode_policies({"pod": {"enabled": True, "policy": older}})
    assert saved.targets[cgroup_name("pod")] == (True, POLICY)
    with pytest.raises(TypeError, match="wrong fields"):
        decode_policies({"pod": {"enabled": True, "policy": {**older, "colder": 1}}})


def test_a_protected_cgroup_below_the_target_keeps_its_protection(
    fake_root: FakeRoot, clock: Clock, kernel: KernelReclaim
) -> None:
    # The container holds 24 MiB, 16 of them under memory.low: only 8 MiB of its cold
    # 4,000 file pages may go, whatever the books say.
    ctr_books = {(6, "/pod/ctr", 0): Book(0, {10: (Layer(45_000, 0, 4_000),)})}
    reclaimer, generations, _ = with_ages(
        fake_root, clock, kernel, IdleState({**POD_BOOKS, **ctr_books}, None)
    )
    ctr = fake_root.add_cgroup("pod/ctr", current=24 * MIB)
    (ctr / "memory.low").write_text(f"{16 * MIB}\n")
    fake_root.write(
        "sys/kernel/debug/lru_gen",
        POD_LRU_GEN + "memcg     6 /pod/ctr\n node     0\n 10 40000 0 4000\n 11 0 0 0\n 12 0 0 0\n",
    )
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("pod"), True, COLD_POLICY))
    reclaimer.run_due()
    clock.now += 1
    reclaimer.run_due()
    asked = [c.split() for c in generations.commands]
    assert sum(int(c[5]) for c in asked if c[1] == "6") == 8 * MIB // 4096
    assert sum(int(c[5]) for c in asked if c[1] == "5") == 4_000  # The pod's own: not bound.
