import errno
import os

import pytest

from guestagent.errors import FailedPrecondition, InvalidArgument
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.ops.reclaim import ReclaimSpec, reclaim
from tests.fakes.root import FakeRoot


@pytest.mark.parametrize(
    ("bytes_", "drop", "reason"), [(0, 0, "positive"), (-5, 0, "positive"), (1, 4, "level 4")]
)
def test_reclaim_refusals(fake_root: FakeRoot, bytes_: int, drop: int, reason: str) -> None:
    fake_root.add_cgroup("c")
    with pytest.raises(InvalidArgument, match=reason):
        reclaim(fake_root.fs, ReclaimSpec(cgroup_name("c"), bytes_, drop))


def test_reclaim_writes_the_size_and_reports_current(fake_root: FakeRoot) -> None:
    directory = fake_root.add_cgroup("c", current=100)
    (directory / "memory.reclaim").write_text("")
    result = reclaim(fake_root.fs, ReclaimSpec(cgroup_name("c"), 64 << 20))
    assert (directory / "memory.reclaim").read_text() == str(64 << 20)
    assert (result.current_before, result.complete) == (100, True)


def test_reclaim_eagain_is_partial(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = fake_root.add_cgroup("c")
    (directory / "memory.reclaim").write_text("")

    def eagain(fd: int, data: bytes) -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "write", eagain)
    assert not reclaim(fake_root.fs, ReclaimSpec(cgroup_name("c"), 1 << 20)).complete


def test_reclaim_needs_a_new_kernel(fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("c")
    with pytest.raises(FailedPrecondition, match=r"5\.19"):
        reclaim(fake_root.fs, ReclaimSpec(cgroup_name("c"), 1 << 20))
