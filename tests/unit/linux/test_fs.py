"""KernelFS: every open confined beneath its mount, errors that name path, value and errno."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from guestagent.errors import FailedPrecondition, Internal, InvalidArgument
from guestagent.linux import fs as fs_module
from guestagent.linux import syscalls
from guestagent.linux.fs import KernelFS
from tests.fakes.root import FakeRoot


@pytest.fixture(params=["openat2", "fallback"])
def kfs(
    request: pytest.FixtureRequest, fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> KernelFS:
    """Each test runs with openat2 and with the pre-5.6 resolve-and-check fallback."""
    if request.param == "fallback":
        monkeypatch.setattr(fs_module, "have_openat2", lambda: False)
    elif not fs_module.have_openat2():
        pytest.skip("this kernel has no openat2")
    return fake_root.fs


@pytest.fixture
def outside(fake_root: FakeRoot) -> Path:
    secret = fake_root.root / "etc" / "secret"
    secret.parent.mkdir(parents=True)
    secret.write_text("not a kernel file\n")
    return secret


def test_reads_and_writes_beneath_the_mount(kfs: KernelFS, fake_root: FakeRoot) -> None:
    ctr = str(fake_root.add_cgroup("pod"))
    limit = os.path.join(ctr, "memory.max")
    assert kfs.read(limit) == "max\n"
    kfs.write(limit, "4096")
    assert Path(limit).read_text() == "4096"
    assert kfs.read_optional(os.path.join(ctr, "memory.nothing")) is None
    assert kfs.is_dir(ctr) and not kfs.is_dir(limit)
    assert kfs.exists(limit) and not kfs.exists(os.path.join(ctr, "nope"))


def test_a_dotdot_escape_is_invalid_argument(kfs: KernelFS, outside: Path) -> None:
    escape = kfs.proc("..", "etc", "secret")
    with pytest.raises(InvalidArgument, match=r"secret: EXDEV .*outside its mount"):
        kfs.read(escape)
    with pytest.raises(InvalidArgument):
        kfs.write(os.path.join(kfs.cgroup_root, "..", "..", "..", "etc", "secret"), "x")
    assert outside.read_text() == "not a kernel file\n"


def test_a_symlink_escape_is_invalid_argument(kfs: KernelFS, outside: Path) -> None:
    os.makedirs(kfs.proc("sys"))
    os.symlink(outside, kfs.proc("sys", "leak"))
    with pytest.raises(InvalidArgument, match="EXDEV"):
        kfs.read(kfs.proc("sys", "leak"))
    with pytest.raises(InvalidArgument):
        kfs.write(kfs.proc("sys", "leak"), "x")
    assert outside.read_text() == "not a kernel file\n"


def test_a_symlink_within_sys_is_followed(kfs: KernelFS, fake_root: FakeRoot) -> None:
    # sysfs is made of these: /sys/class/block/vdb -> ../../devices/.../block/vdb.
    fake_root.write("sys/devices/virtio1/block/vdb/size", "2048\n")
    fake_root.root.joinpath("sys/class/block").mkdir(parents=True)
    os.symlink("../../devices/virtio1/block/vdb", kfs.sys("class", "block", "vdb"))
    assert kfs.read(kfs.sys("class", "block", "vdb", "size")) == "2048\n"


def test_any_symlink_under_cgroup2_is_refused(kfs: KernelFS, fake_root: FakeRoot) -> None:
    real = fake_root.add_cgroup("real")
    os.symlink(real, os.path.join(kfs.cgroup_root, "alias"))
    with pytest.raises(InvalidArgument, match="alias"):
        kfs.read(os.path.join(kfs.cgroup_root, "alias", "memory.max"))


def test_a_magic_link_is_refused(fake_root: FakeRoot) -> None:
    if not fs_module.have_openat2():
        pytest.skip("only openat2 can tell a magic link")
    real = KernelFS()
    with pytest.raises(InvalidArgument, match="ELOOP"):
        real.read(real.proc("self", "root", "etc", "hostname"))


def test_a_path_in_no_mount_is_invalid_argument(kfs: KernelFS, outside: Path) -> None:
    with pytest.raises(InvalidArgument, match="in none of the kernel's mounts"):
        kfs.read(str(outside))


def test_a_missing_file_is_failed_precondition_naming_path_and_value(
    kfs: KernelFS, fake_root: FakeRoot
) -> None:
    path = str(fake_root.add_cgroup("pod") / "memory.swap.nothing")
    with pytest.raises(FailedPrecondition) as raised:
        kfs.write(path, "max")
    assert str(raised.value) == f"write 'max' to {path}: ENOENT (No such file or directory)"
    assert raised.value.errno == errno.ENOENT
    assert not os.path.exists(path)  # Never created: a missing file is a missing kernel feature.


def test_write_replaces_the_value_in_one_write(
    kfs: KernelFS, fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fake_root.write("sys/fs/cgroup/memory.max", "536870912\n")
    calls: list[bytes] = []
    real_write = os.write

    def counting_write(fd: int, data: Any) -> int:
        calls.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    kfs.write(str(path), "max")
    assert path.read_text() == "max"
    assert calls == [b"max"]


def test_short_write_is_an_error(
    kfs: KernelFS, fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fake_root.write("sys/fs/cgroup/memory.max", "max\n")
    monkeypatch.setattr(os, "write", lambda fd, data: 1)
    with pytest.raises(Internal, match="short write, 1 of 9 bytes") as raised:
        kfs.write(str(path), "536870912")
    assert raised.value.errno == errno.EIO


def test_every_descriptor_is_close_on_exec(kfs: KernelFS) -> None:
    fd = kfs.open(kfs.proc("meminfo"), os.O_RDONLY)
    try:
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)


def test_eagain_from_openat2_is_retried(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fs_module.have_openat2():
        pytest.skip("this kernel has no openat2")
    real = syscalls.openat2
    calls: list[str] = []

    def racing(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
        calls.append(path)
        if len(calls) < 3:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real(dirfd, path, flags, resolve, mode)

    monkeypatch.setattr(syscalls, "openat2", racing)
    assert fake_root.fs.read(fake_root.fs.proc("meminfo")).startswith("MemTotal")
    assert calls == ["meminfo"] * 3


def test_mkdir_and_rmdir_beneath_the_mount(kfs: KernelFS, outside: Path) -> None:
    kfs.mkdir(os.path.join(kfs.cgroup_root, "pod"))
    assert kfs.is_dir(os.path.join(kfs.cgroup_root, "pod"))
    kfs.rmdir(os.path.join(kfs.cgroup_root, "pod"))
    assert not kfs.exists(os.path.join(kfs.cgroup_root, "pod"))
    os.symlink(outside.parent, os.path.join(kfs.cgroup_root, "out"))
    with pytest.raises(InvalidArgument):
        kfs.mkdir(os.path.join(kfs.cgroup_root, "out", "new"))
    assert not (outside.parent / "new").exists()


def test_listdir(kfs: KernelFS, fake_root: FakeRoot) -> None:
    fake_root.add_cgroup("b")
    fake_root.add_cgroup("a")
    assert [n for n in kfs.listdir(kfs.cgroup_root) if not n.startswith("cgroup.")] == ["a", "b"]
