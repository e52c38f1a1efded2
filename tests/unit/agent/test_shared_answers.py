"""GetMemoryInfo's answer encoded once for the callers whose readings are the same, and each
field what a report built afresh from those readings says."""

from __future__ import annotations

from typing import Any

import pytest

from guestagent.agent import wire
from guestagent.agent.rpc import MemoryAgentServicer
from guestagent.agent.shared_answers import SharedAnswers
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.ops.info import InfoSpec, Readings, Reporter
from guestagent.v1 import agent_pb2 as pb
from tests.fakes.root import FakeRoot
from tests.fakes.servicer import FakeContext, make_servicer


def counting(encoded: bytes, counts: list[bytes]) -> Any:
    def encode() -> bytes:
        counts.append(encoded)
        return encoded

    return encode


def test_the_same_readings_are_encoded_once(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod")
    reporter = Reporter(fake_root.fs)
    spec = InfoSpec((cgroup_name("pod"),))
    answers = SharedAnswers()
    encodes: list[bytes] = []
    shared = reporter.readings(spec)
    assert answers.answer(spec, shared, counting(b"first", encodes)) == b"first"
    # Another caller within the window takes the same readings: the same bytes, not encoded.
    again = reporter.readings(spec)
    assert again.snapshot is shared.snapshot
    assert answers.answer(spec, again, counting(b"second", encodes)) == b"first"
    # Readings taken afresh (a reading that must have started after now) are new objects.
    afresh = reporter.readings(spec, False, float("inf"))
    assert answers.answer(spec, afresh, counting(b"third", encodes)) == b"third"
    assert encodes == [b"first", b"third"]


def test_other_statuses_or_specs_are_encoded_anew(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("pod")
    reporter = Reporter(fake_root.fs)
    spec = InfoSpec((cgroup_name("pod"),))
    answers = SharedAnswers()
    readings = reporter.readings(spec)
    answers.answer(spec, readings, lambda: b"none")
    # The reclaimer's status is read live for each call: one that moved is a new answer.
    status: Any = ("pod", "a status")  # Compared for equality only.
    same_status: Any = ("pod", "a status")
    moved = Readings(
        readings.snapshot, readings.cgroups, readings.removed, (status,), readings.ages
    )
    assert answers.answer(spec, moved, lambda: b"moved") == b"moved"
    equal = Readings(readings.snapshot, readings.cgroups, readings.removed, (same_status,), None)
    assert answers.answer(spec, equal, lambda: b"equal") == b"moved"
    other = InfoSpec()
    assert answers.answer(other, reporter.readings(other), lambda: b"other") == b"other"
    assert len(answers) == 2


def test_the_oldest_specs_are_dropped_past_the_bound(fake_root: FakeRoot) -> None:
    names = [f"c{i}" for i in range(3)]
    for name in names:
        fake_root.add_cgroup(name)
    reporter = Reporter(fake_root.fs)
    answers = SharedAnswers(max_specs=2)
    specs = [InfoSpec((cgroup_name(name),)) for name in names]
    readings = [reporter.readings(spec) for spec in specs]
    for spec, reading in zip(specs, readings, strict=True):
        answers.answer(spec, reading, lambda: b"kept")
    assert len(answers) == 2
    # The first spec's answer was dropped: encoded again, the others kept.
    assert answers.answer(specs[0], readings[0], lambda: b"again") == b"again"
    assert answers.answer(specs[2], readings[2], lambda: b"again") == b"kept"


@pytest.fixture
def servicer(fake_root: FakeRoot) -> MemoryAgentServicer:
    fake_root.add_cgroup("pod")
    return make_servicer(fake_root)


async def test_callers_within_the_window_get_the_same_bytes(
    servicer: MemoryAgentServicer,
) -> None:
    context: Any = FakeContext()
    request = pb.GetMemoryInfoRequest(cgroups=["pod"])
    first = await servicer.GetMemoryInfo(request, context)
    second = await servicer.GetMemoryInfo(request, context)
    assert second is first
    # Every field is what a report built afresh from the same readings says.
    spec = InfoSpec((cgroup_name("pod"),))
    readings = servicer.reporter.readings(spec)
    built = wire.report_pb(servicer.reporter.report_from(spec, readings))
    assert pb.MemoryInfo.FromString(first) == built


async def test_a_change_is_answered_anew(servicer: MemoryAgentServicer) -> None:
    context: Any = FakeContext()
    request = pb.GetMemoryInfoRequest(cgroups=["pod"])
    before = await servicer.GetMemoryInfo(request, context)
    limits = pb.SetMemoryLimitsRequest(cgroup="pod", memory=pb.LinuxMemory(limit=256 << 20))
    await servicer.SetMemoryLimits(limits, context)
    after = await servicer.GetMemoryInfo(request, context)
    assert after is not before
    assert pb.MemoryInfo.FromString(after).cgroups[0].max.bytes == 256 << 20
