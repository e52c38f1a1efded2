import os

import pytest

from guestagent.cgroups import cgroup_dir, validate_cgroup_name
from guestagent.errors import InvalidArgument, NotFound
from tests.fakeroot import FakeRoot


@pytest.mark.parametrize(
    ("name", "parts"),
    [("pod", ("pod",)), ("pod/ctr", ("pod", "ctr")), ("pod/ctr/", ("pod", "ctr"))],
)
def test_valid_names(name: str, parts: tuple[str, ...]) -> None:
    assert validate_cgroup_name(name) == parts


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("/pod", "absolute"),
        ("..", "'..'"),
        ("pod/../../etc", "'..'"),
        ("pod//ctr", "'empty'"),
        ("./pod", "'.'"),
        ("pod\x00x", "NUL"),
    ],
)
def test_refused_names(name: str, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        validate_cgroup_name(name)


def test_symlink_out_of_mount_is_refused(fake_root: FakeRoot) -> None:
    outside = fake_root.root / "outside"
    outside.mkdir()
    os.symlink(outside, fake_root.root / "sys/fs/cgroup/escape")
    with pytest.raises(InvalidArgument, match="outside"):
        cgroup_dir(fake_root.fs, "escape")


def test_missing_cgroup(fake_root: FakeRoot) -> None:
    with pytest.raises(NotFound, match="'nope'"):
        cgroup_dir(fake_root.fs, "nope")
