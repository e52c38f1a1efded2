"""The memory stall from delay accounting: the growth rules, the meter over a fake cgroup tree,
why it is absent, and the polled stand-in for a PSI trigger."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import AgentError
from guestagent.linux.delayacct import (
    DelayStallMeter,
    StallWindow,
    TaskSample,
    cgroup_procs,
    delayacct_absence,
    read_subtree_tgids,
    read_task_delayacct,
    stall_growth_ns,
)
from guestagent.linux.features import DELAYACCT
from guestagent.linux.fs import KernelFS
from tests.fakes.taskstats import FakeTaskstats, put_procs

MS = 1_000_000  # ns


@pytest.mark.parametrize(
    ("previous", "now", "since_us", "grown"),
    [
        ({1: 5 * MS}, {1: TaskSample(7 * MS, 10**9)}, 1_000_000, 2 * MS),  # Seen twice: growth.
        # Born within the interval: all of its delay is from it.
        ({}, {2: TaskSample(3 * MS, 500_000)}, 1_000_000, 3 * MS),
        # Older than the interval, first seen now: moved in; its past is another cgroup's.
        ({}, {2: TaskSample(3 * MS, 5_000_000)}, 1_000_000, 0),
        ({1: 5 * MS}, {}, 1_000_000, 0),  # Exited: what it stalled since the last read is lost.
        # A total that went down (a recycled pid) is no negative stall.
        ({1: 9 * MS}, {1: TaskSample(2 * MS, 10**9)}, 1_000_000, 0),
        (
            {1: 1 * MS, 2: 1 * MS},
            {1: TaskSample(2 * MS, 10**9), 2: TaskSample(4 * MS, 10**9)},
            1_000_000,
            4 * MS,
        ),
    ],
)
def test_stall_growth(
    previous: dict[int, int], now: dict[int, TaskSample], since_us: int, grown: int
) -> None:
    assert stall_growth_ns(previous, now, since_us) == grown


@given(
    st.dictionaries(st.integers(1, 50), st.integers(0, 10**12)),
    st.dictionaries(
        st.integers(1, 50), st.builds(TaskSample, st.integers(0, 10**12), st.integers(0, 10**10))
    ),
    st.integers(0, 10**9),
)
def test_growth_is_never_negative_nor_more_than_what_the_tasks_hold(
    previous: dict[int, int], now: dict[int, TaskSample], since_us: int
) -> None:
    grown = stall_growth_ns(previous, now, since_us)
    assert 0 <= grown <= sum(s.memory_ns for s in now.values())


def test_cgroup_procs() -> None:
    assert cgroup_procs("1\n22\n333\n") == (1, 22, 333)
    assert cgroup_procs("") == ()


def test_a_subtree_holds_the_processes_of_every_descendant(tmp_path: Path) -> None:
    root = tmp_path / "sys/fs/cgroup"
    put_procs(root / "pod", 10)
    put_procs(root / "pod/a", 11, 12)
    put_procs(root / "pod/a/b", 13)
    (root / "pod/memory.max").write_text("max\n")  # Files are not children.
    fs = KernelFS(tmp_path)
    assert sorted(read_subtree_tgids(fs, str(root / "pod"))) == [10, 11, 12, 13]
    with pytest.raises(AgentError):
        read_subtree_tgids(fs, str(root / "gone"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    put_procs(tmp_path / "sys/fs/cgroup/pod", 10, 11)
    put_procs(tmp_path / "sys/fs/cgroup/other", 20)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/task_delayacct").write_text("1\n")
    return tmp_path


def test_the_meter_keeps_a_monotonic_total_per_cgroup(tree: Path) -> None:
    kernel, clock = FakeTaskstats({10: 4 * MS, 11: 0, 20: 50 * MS}), Clock()
    meter = DelayStallMeter(KernelFS(tree), kernel, clock)
    pod = str(tree / "sys/fs/cgroup/pod")
    assert meter.total_us(pod) == 4000  # First read: what its processes hold.
    clock.now += 1
    kernel.stall(10, 1500)
    kernel.stall(11, 500)
    kernel.stall(20, 9999)  # Another cgroup's.
    assert meter.total_us(pod) == 6000
    # Process 10 exits; 12 is born (younger than the interval) having stalled 700 us; 13 moves
    # in with an old history.
    put_procs(Path(pod), 11, 12, 13)
    kernel.memory_ns.update({12: 700_000, 13: 90 * MS})
    kernel.elapsed_us.update({12: 200_000})
    del kernel.memory_ns[10]
    clock.now += 1
    assert meter.total_us(pod) == 6700
    clock.now += 1
    kernel.stall(13, 100)
    assert meter.total_us(pod) == 6800


def test_a_removed_cgroup_is_an_error_and_forgotten(tree: Path) -> None:
    meter = DelayStallMeter(KernelFS(tree), FakeTaskstats({10: 0, 11: 0}), Clock())
    pod = str(tree / "sys/fs/cgroup/pod")
    meter.total_us(pod)
    os.unlink(os.path.join(pod, "cgroup.procs"))
    os.rmdir(pod)
    with pytest.raises(AgentError):
        meter.total_us(pod)


def test_absence_follows_the_sysctl_and_taskstats(tree: Path) -> None:
    fs = KernelFS(tree)
    kernel = FakeTaskstats({1: 0})
    meter = DelayStallMeter(fs, kernel)
    assert read_task_delayacct(fs) is True and meter.absence() is None
    (tree / "proc/sys/kernel/task_delayacct").write_text("0\n")
    absent = meter.absence()
    assert absent is not None and absent.feature == DELAYACCT
    assert "kernel.task_delayacct 0" in absent.reason and "--delayacct keep" in absent.reason
    (tree / "proc/sys/kernel/task_delayacct").unlink()  # A kernel before 5.14: no switch.
    assert read_task_delayacct(fs) is None and meter.absence() is None
    # Once taskstats has answered it is not asked again: neither build nor capability change.
    asked = kernel.queries
    assert meter.absence() is None and kernel.queries == asked


def test_a_taskstats_query_refused_is_why_it_is_absent(tree: Path) -> None:
    kernel = FakeTaskstats(down="query taskstats: EPERM (Operation not permitted)")
    absent = DelayStallMeter(KernelFS(tree), kernel).absence()
    assert absent is not None and "CAP_NET_ADMIN" in absent.reason and "EPERM" in absent.reason


@pytest.mark.parametrize(
    ("switch", "cmdline", "taskstats", "words"),
    [
        (True, "", "", None),
        (None, "", "", None),
        (False, "", "", "kernel.task_delayacct 0"),
        (None, "ro nodelayacct", "", "booted with nodelayacct"),
        (None, "", "query taskstats: ENOENT", "CONFIG_TASKSTATS"),
    ],
)
def test_delayacct_absence(
    switch: bool | None, cmdline: str, taskstats: str, words: str | None
) -> None:
    absent = delayacct_absence(switch, cmdline, taskstats)
    if words is None:
        assert absent is None
    else:
        assert absent is not None and words in absent.reason


def test_the_stall_window_fires_as_a_psi_trigger_does() -> None:
    window = StallWindow(stall_us=150_000, window_us=1_000_000)
    assert not window.add(0, 0)
    assert not window.add(250_000, 100_000)  # 100 ms within the window: under 150.
    assert window.add(500_000, 160_000)  # 160 ms: fires.
    assert not window.add(750_000, 400_000)  # Over again, but within the same window.
    # A window later the stall within it (since the reading at 500 ms) is what counts.
    assert window.add(1_500_000, 600_000)
    assert not window.add(2_600_000, 650_000)  # 50 ms in the last window: quiet.


@given(st.lists(st.tuples(st.integers(1, 200_000), st.integers(0, 300_000)), max_size=40))
def test_the_stall_window_fires_at_most_once_a_window(steps: list[tuple[int, int]]) -> None:
    window = StallWindow(stall_us=100_000, window_us=1_000_000)
    at, total, fired = 0, 0, []
    for dt, grown in steps:
        at, total = at + dt, total + grown
        if window.add(at, total):
            fired.append(at)
    assert all(b - a >= 1_000_000 for a, b in itertools.pairwise(fired))


def test_the_agents_own_reclaim_is_no_stall_of_the_guest(tmp_path: Path) -> None:
    """Its memory.reclaim writes are direct reclaim to delay accounting, not to PSI."""
    own = os.getpid()
    put_procs(tmp_path / "sys/fs/cgroup", 1)
    put_procs(tmp_path / "sys/fs/cgroup/guestagent", own)
    kernel, clock = FakeTaskstats({1: 0, own: 0}), Clock()
    meter = DelayStallMeter(KernelFS(tmp_path), kernel, clock)
    root = str(tmp_path / "sys/fs/cgroup")
    assert meter.total_us(root) == 0
    kernel.stall(own, 80_000)
    kernel.stall(1, 300)
    clock.now += 1
    assert meter.total_us(root) == 300
