"""The reclaimer's RPCs through the real daemon over a fake tree, and guestctl reclaim."""

import grpc
import pytest

from guestagent.host.client import AgentClient
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.agentproc import AgentProcess, guestctl
from tests.fakes.root import FakeRoot


@pytest.fixture
def pod(fake_root: FakeRoot, agent: AgentProcess) -> None:
    (fake_root.root / "sys/fs/cgroup/pod/ctr/memory.reclaim").write_text("")


@pytest.mark.usefixtures("pod")
def test_policy_on_status_and_off(agent: AgentProcess) -> None:
    with AgentClient(agent.unix_target) as client:
        on = client.set_reclaim_policy("pod/ctr", True, pb.ReclaimPolicy(interval_ms=500))
        assert on.enabled and on.policy.interval_ms == 500
        assert on.policy.stall_target_us == 2000  # Unset fields take the defaults.
        info = client.info(["pod/ctr"])
        assert [t.cgroup for t in info.reclaim] == ["pod/ctr"]
        status = client.reclaim_status()
        assert [t.cgroup for t in status.targets] == ["pod/ctr"]
        off = client.set_reclaim_policy("pod/ctr", False)
        assert off.state == pb.RECLAIM_STATE_DISABLED and off.reason == "turned off"


@pytest.mark.usefixtures("pod")
def test_status_before_any_policy_then_after_one(agent: AgentProcess) -> None:
    """Before a policy the daemon answers without building the reclaimer (agent/daemon.py):
    nothing, an unchecked trigger, NOT_FOUND naming a cgroup asked for; then the reclaimer's."""
    with AgentClient(agent.unix_target) as client:
        before = client.reclaim_status()
        assert list(before.targets) == []
        assert before.compaction.runs == 0 and before.compaction.last_decision == "not checked yet"
        with pytest.raises(grpc.RpcError) as caught:
            client.reclaim_status(["pod/ctr"])
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no policy for cgroup(s) pod/ctr" in (caught.value.details() or "")
        client.set_reclaim_policy("pod/ctr", True)
        assert [t.cgroup for t in client.reclaim_status(["pod/ctr"]).targets] == ["pod/ctr"]


@pytest.mark.usefixtures("pod")
@pytest.mark.parametrize(
    ("cgroup", "policy", "code", "words"),
    [
        ("pod/none", pb.ReclaimPolicy(), grpc.StatusCode.NOT_FOUND, "'pod/none'"),
        (
            "pod/ctr",
            pb.ReclaimPolicy(max_step_fraction=0.9),
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_step_fraction 0.9 is outside [0.0001, 0.5]",
        ),
        ("pod/ctr", pb.ReclaimPolicy(anon=True), grpc.StatusCode.FAILED_PRECONDITION, "swap"),
        ("pod", pb.ReclaimPolicy(), grpc.StatusCode.FAILED_PRECONDITION, "memory.reclaim"),
    ],
)
def test_refusals_are_clear(
    agent: AgentProcess, cgroup: str, policy: pb.ReclaimPolicy, code: grpc.StatusCode, words: str
) -> None:
    with AgentClient(agent.unix_target) as client, pytest.raises(grpc.RpcError) as caught:
        client.set_reclaim_policy(cgroup, True, policy)
    assert caught.value.code() == code
    assert words in (caught.value.details() or "")


@pytest.mark.usefixtures("pod")
def test_guestctl_reclaim_on_status_off(agent: AgentProcess) -> None:
    on = guestctl("--target", agent.unix_target, "reclaim", "on", "--cgroup", "pod/ctr")
    assert on.returncode == 0, on.stderr
    assert "reclaim pod/ctr:" in on.stdout
    status = guestctl("--target", agent.unix_target, "reclaim", "status")
    assert status.returncode == 0, status.stderr
    assert "pod/ctr" in status.stdout and "compaction:" in status.stdout
    off = guestctl("--target", agent.unix_target, "reclaim", "off", "--cgroup", "pod/ctr")
    assert "disabled (turned off)" in off.stdout
    missing = guestctl("--target", agent.unix_target, "reclaim", "now", "--cgroup", "pod/ctr")
    assert missing.returncode == 2 and "--bytes" in missing.stderr


def test_the_workloads_policy_through_the_daemon(fake_root: FakeRoot, agent: AgentProcess) -> None:
    """Contract revision 4: the agent finds the workloads itself (the fake tree's one top-level
    cgroup, "pod"), and a request naming a cgroup too is refused naming it."""
    fake_root.add_cgroup("pod")
    (fake_root.root / "sys/fs/cgroup/pod/memory.reclaim").write_text("")
    with AgentClient(agent.unix_target) as client:
        assert client.agent_info().contract_revision == 4
        on = client.set_workload_reclaim(True)
        assert on.cgroup == "" and on.enabled and "workloads: pod " in on.reason, on
        assert [t.cgroup for t in client.reclaim_status().targets] == ["pod"]
        with pytest.raises(grpc.RpcError) as caught:
            client.stub.SetReclaimPolicy(
                pb.SetReclaimPolicyRequest(cgroup="pod", workloads=True, enabled=True)
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        said = caught.value.details() or ""
        assert "cgroup 'pod' and workloads both name what to reclaim" in said
        off = client.set_workload_reclaim(False)
        assert not off.enabled and list(client.reclaim_status().targets) == []
    workloads = guestctl("--target", agent.unix_target, "reclaim", "on", "--workloads")
    assert workloads.returncode == 0 and "workloads: pod" in workloads.stdout, workloads
