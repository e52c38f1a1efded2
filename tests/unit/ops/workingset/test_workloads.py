"""The guest's workloads for SetReclaimPolicy's `workloads`: which cgroups they are, and the
reclaimer keeping a policy on each as they come and go, saved as one policy."""

from __future__ import annotations

import json
import shutil

import pytest

from guestagent.errors import FailedPrecondition
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.statestore import RECLAIM_POLICIES
from guestagent.ops.workingset.policy import Mode, ReclaimPolicy
from guestagent.ops.workingset.reclaimer import WORKLOAD_SCAN_SECONDS, Reclaimer
from guestagent.ops.workingset.status import ReclaimPolicyRequest, WorkloadReclaimRequest
from guestagent.ops.workingset.workloads import workload_cgroups
from tests.fakes.root import FakeRoot
from tests.unit.ops.workingset.test_reclaimer import SWAPS, Clock, make_target


@pytest.mark.parametrize(
    ("top", "own", "workloads"),
    [
        # Kata's agent with the cgroupfs driver; the agent in its own cgroup.
        (["kubepods", "guestagent"], "/guestagent", ["kubepods"]),
        # A systemd guest: systemd's own, and the agent's service under system.slice.
        (
            ["init.scope", "system.slice", "user.slice", "kubepods.slice", "machine.slice"],
            "/system.slice/guestagent.service",
            ["kubepods.slice", "machine.slice"],
        ),
        # No cgroup2 for the agent (None), or the agent in the root.
        (["pod", "ctr"], None, ["ctr", "pod"]),
        (["pod"], "/", ["pod"]),
        ([], "/guestagent", []),
    ],
)
def test_which_cgroups_are_workloads(top: list[str], own: str | None, workloads: list[str]) -> None:
    assert workload_cgroups(top, own) == tuple(cgroup_name(n) for n in workloads)


POLICY = ReclaimPolicy(stall_target_us=1000, max_step_fraction=0.1)


def test_the_workloads_are_followed_as_they_come_and_go(fake_root: FakeRoot) -> None:
    clock = Clock()
    make_target(fake_root, "kubepods")
    make_target(fake_root, "system.slice")
    fake_root.add_cgroup("nomemory").joinpath("memory.current").unlink()  # Not reached.
    reclaimer = Reclaimer(fake_root.fs, clock=clock)
    answer = reclaimer.set_policy(WorkloadReclaimRequest(True, POLICY))
    assert (answer.cgroup, answer.enabled, answer.mode) == ("", True, Mode.PROBING)
    assert "on for the guest's workloads: kubepods" in answer.why
    assert [(s.cgroup, s.enabled, s.policy) for s in reclaimer.status()] == [
        ("kubepods", True, POLICY)
    ]
    # A container's cgroup that comes is taken within a scan; one that goes is dropped.
    make_target(fake_root, "pod-2")
    clock.now += WORKLOAD_SCAN_SECONDS
    reclaimer.run_due()
    assert [s.cgroup for s in reclaimer.status()] == ["kubepods", "pod-2"]
    shutil.rmtree(fake_root.root / "sys/fs/cgroup/pod-2")
    clock.now += WORKLOAD_SCAN_SECONDS
    reclaimer.run_due()
    assert [s.cgroup for s in reclaimer.status()] == ["kubepods"]
    # Saved as one policy, not one per cgroup: a restarted agent finds them again.
    saved = json.loads((fake_root.root / "run/guestagent" / RECLAIM_POLICIES).read_text())
    assert list(saved) == [""] and saved[""]["enabled"] is True
    again = Reclaimer(fake_root.fs, clock=clock)
    again.start()
    try:
        assert [s.cgroup for s in again.status()] == ["kubepods"]
    finally:
        again.stop()
    off = reclaimer.set_policy(WorkloadReclaimRequest(False, POLICY))
    assert (off.enabled, off.mode) == (False, Mode.DISABLED)
    assert reclaimer.status() == ()


def test_a_hosts_own_policy_for_a_workload_wins(fake_root: FakeRoot) -> None:
    clock = Clock()
    make_target(fake_root, "kubepods")
    reclaimer = Reclaimer(fake_root.fs, clock=clock)
    reclaimer.set_policy(WorkloadReclaimRequest(True, POLICY))
    mine = ReclaimPolicy(max_step_fraction=0.01)
    reclaimer.set_policy(ReclaimPolicyRequest(cgroup_name("kubepods"), True, mine))
    clock.now += WORKLOAD_SCAN_SECONDS
    reclaimer.run_due()
    assert [s.policy for s in reclaimer.status()] == [mine]
    saved = json.loads((fake_root.root / "run/guestagent" / RECLAIM_POLICIES).read_text())
    assert sorted(saved) == ["", "kubepods"]
    # Turning the workloads off leaves the host's own policy.
    reclaimer.set_policy(WorkloadReclaimRequest(False, POLICY))
    assert [s.cgroup for s in reclaimer.status()] == ["kubepods"]


def test_anon_for_the_workloads_needs_swap(fake_root: FakeRoot) -> None:
    make_target(fake_root, "kubepods")
    reclaimer = Reclaimer(fake_root.fs, clock=Clock())
    anon = ReclaimPolicy(anon=True)
    with pytest.raises(FailedPrecondition, match="no active swap area"):
        reclaimer.set_policy(WorkloadReclaimRequest(True, anon))
    assert reclaimer.status() == ()
    fake_root.write("proc/swaps", SWAPS)
    reclaimer.set_policy(WorkloadReclaimRequest(True, anon))
    assert [s.policy.anon for s in reclaimer.status()] == [True]
