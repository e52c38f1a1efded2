"""GetAgentInfo: the version, the contract revision and every feature, present or not."""

from __future__ import annotations

from typing import Any

from guestagent import __version__
from guestagent.linux.delayacct import DelayStallMeter
from guestagent.linux.features import FEATURE_READERS
from guestagent.ops.agent_info import agent_info
from guestagent.ops.idle import IdleAger
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot, make_fake_root
from tests.fakes.servicer import FakeContext, make_servicer
from tests.fakes.taskstats import FakeTaskstats


async def ask(root: FakeRoot) -> pb.AgentInfo:
    context: Any = FakeContext()
    return await make_servicer(root).GetAgentInfo(pb.GetAgentInfoRequest(), context)


async def test_it_names_every_feature_with_why_when_absent(fake_root: FakeRoot) -> None:
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    info = await ask(fake_root)
    assert (info.version, info.contract_revision, info.error_domain) == (
        __version__,
        4,
        "guestagent",
    )
    features = {f.name: f for f in info.features}
    assert list(features) == [*FEATURE_READERS, "delayacct"]
    assert features["psi"].present and features["psi"].reason == ""
    assert features["mglru"].present and features["idle_ages"].present
    # The fake tree has no device-mapper and no virtio_mem driver: absent, each with why.
    assert not features["swap_encryption"].present
    assert "device-mapper" in features["swap_encryption"].reason
    assert not features["virtio_mem"].present and "virtio_mem" in features["virtio_mem"].reason
    # The servicer made here has no delay-accounting meter.
    assert not features["delayacct"].present


async def test_a_kernel_without_psi_says_so(tmp_path: Any) -> None:
    root = make_fake_root(tmp_path / "root", psi=False)
    root.write("proc/cmdline", "console=ttyS0 psi=0\n")
    root.write("sys/bus/virtio/drivers/virtio_mem/bind", "")
    features = {f.name: f for f in (await ask(root)).features}
    assert not features["psi"].present and "psi=0" in features["psi"].reason
    assert not features["mglru"].present and not features["idle_ages"].present
    assert features["virtio_mem"].present


def test_delay_accounting_is_what_the_meter_says(fake_root: FakeRoot) -> None:
    fake_root.write("proc/sys/kernel/task_delayacct", "1\n")
    info = agent_info(fake_root.fs, DelayStallMeter(fake_root.fs, FakeTaskstats({1: 0})))
    assert dict(info.features)["delayacct"] is None
    fake_root.write("proc/sys/kernel/task_delayacct", "0\n")
    info = agent_info(fake_root.fs, DelayStallMeter(fake_root.fs, FakeTaskstats({1: 0})))
    off = dict(info.features)["delayacct"]
    assert off is not None and "task_delayacct" in off.reason


def test_idle_ages_are_absent_when_the_agent_ages_nothing(fake_root: FakeRoot) -> None:
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    assert (
        dict(agent_info(fake_root.fs, idle=IdleAger(fake_root.fs).state).features)["idle_ages"]
        is None
    )  # Not aged yet: the kernel has them, so they come.
    off = dict(agent_info(fake_root.fs, idle=IdleAger(fake_root.fs, 0).state).features)
    assert off["idle_ages"] is not None and "--idle-aging 0" in off["idle_ages"].reason
