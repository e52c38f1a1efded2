from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from guestagent.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    errno_text,
)
from guestagent.linux.cgroup import tree
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.cgroup.tree import (
    cgroup_dir,
    create_cgroup,
    creation_plan,
    undo_create,
)
from tests.fakes.cgroups import FakeCgroupKernel
from tests.fakes.root import FakeRoot


@pytest.fixture
def kernel(fake_root: FakeRoot) -> FakeCgroupKernel:
    return FakeCgroupKernel(fake_root).install()


def test_symlink_out_of_mount_is_refused(fake_root: FakeRoot) -> None:
    outside = fake_root.root / "outside"
    outside.mkdir()
    os.symlink(outside, fake_root.root / "sys/fs/cgroup/escape")
    with pytest.raises(InvalidArgument, match="outside"):
        cgroup_dir(fake_root.fs, cgroup_name("escape"))


def test_missing_cgroup(fake_root: FakeRoot) -> None:
    with pytest.raises(NotFound, match="'nope'"):
        cgroup_dir(fake_root.fs, cgroup_name("nope"))


def cgroup_path(fake_root: FakeRoot, name: str) -> str:
    return os.path.join(fake_root.root, "sys/fs/cgroup", name)


def test_errno_text_names_the_errno_and_its_words() -> None:
    assert errno_text(OSError(errno.EBUSY, "Device or resource busy")) == (
        "EBUSY (Device or resource busy)"
    )
    assert errno_text(OSError(errno.EINVAL, None)) == f"EINVAL ({os.strerror(errno.EINVAL)})"


def test_create_makes_each_level_and_enables_memory_top_down(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu io\n")
    created = create_cgroup(fake_root.fs, cgroup_name("pod/ctr"))
    pod, ctr = cgroup_path(fake_root, "pod"), cgroup_path(fake_root, "pod/ctr")
    assert created.made == (pod, ctr)
    root_control = fake_root.root / "sys/fs/cgroup/cgroup.subtree_control"
    assert created.enabled == (str(root_control), os.path.join(pod, "cgroup.subtree_control"))
    # On the fake tree the control files just receive the text the kernel would parse.
    assert root_control.read_text() == "+memory"
    assert Path(pod, "cgroup.subtree_control").read_text() == "+memory"
    assert Path(ctr, "memory.max").read_text() == "max\n"


def test_create_skips_parents_that_already_list_memory(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    created = create_cgroup(fake_root.fs, cgroup_name("pod"))
    assert created.enabled == ()
    assert (fake_root.root / "sys/fs/cgroup/cgroup.subtree_control").read_text() == "memory\n"
    assert os.path.isfile(os.path.join(cgroup_path(fake_root, "pod"), "memory.max"))


def test_create_leaves_an_existing_cgroup_alone(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    fake_root.add_cgroup("pod")
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "")
    created = create_cgroup(fake_root.fs, cgroup_name("pod"))
    assert (created.made, created.enabled) == ((), ())
    assert (fake_root.root / "sys/fs/cgroup/cgroup.subtree_control").read_text() == ""


def test_create_under_an_existing_parent(fake_root: FakeRoot, kernel: FakeCgroupKernel) -> None:
    pod = cgroup_path(fake_root, "pod")
    fake_root.fs.mkdir(pod)  # Through the fake kernel, which adds the interface files.
    created = create_cgroup(fake_root.fs, cgroup_name("pod/ctr"))
    assert created.made == (os.path.join(pod, "ctr"),)
    assert Path(pod, "cgroup.subtree_control").read_text() == "+memory"


def test_create_failing_midway_removes_what_it_made(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "")
    kernel.fail_mkdir = "ctr"
    with pytest.raises(Aborted, match=r"make directory .*ctr: ENOSPC") as raised:
        create_cgroup(fake_root.fs, cgroup_name("pod/ctr"))
    assert not os.path.exists(cgroup_path(fake_root, "pod"))
    assert "removed" in str(raised.value)
    # The root's "+memory" was taken back; pod's went with pod.
    assert (fake_root.root / "sys/fs/cgroup/cgroup.subtree_control").read_text() == "-memory"


def test_create_failing_to_enable_names_the_control_file(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    pod_control = fake_root.root / "sys/fs/cgroup/pod/cgroup.subtree_control"
    fake_root.kernel.fail("write", pod_control, errno.EBUSY)
    with pytest.raises(Aborted, match=r"write '\+memory' to .*pod/cgroup.subtree_control") as e:
        create_cgroup(fake_root.fs, cgroup_name("pod/ctr"))
    assert "EBUSY" in str(e.value)
    assert "removed" in str(e.value)
    assert not os.path.exists(cgroup_path(fake_root, "pod"))


def test_create_refuses_a_file_in_the_path(fake_root: FakeRoot, kernel: FakeCgroupKernel) -> None:
    fake_root.write("sys/fs/cgroup/memory.stat", "anon 0\n")
    with pytest.raises(FailedPrecondition, match=r"memory\.stat is a file"):
        create_cgroup(fake_root.fs, cgroup_name("memory.stat/ctr"))


def test_create_refuses_a_parent_that_is_not_cgroup_v2(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    os.mkdir(cgroup_path(fake_root, "plain"))  # Not through the fake kernel: no control file.
    with pytest.raises(FailedPrecondition, match=r"no cgroup\.subtree_control"):
        create_cgroup(fake_root.fs, cgroup_name("plain/ctr"))
    assert not os.path.exists(cgroup_path(fake_root, "plain/ctr"))


def test_create_refuses_a_symlink_out_of_the_mount(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    outside = fake_root.root / "outside"
    outside.mkdir()
    os.symlink(outside, cgroup_path(fake_root, "escape"))
    with pytest.raises(InvalidArgument, match="outside"):
        create_cgroup(fake_root.fs, cgroup_name("escape/new"))
    assert not (outside / "new").exists()


def test_create_refuses_even_a_symlink_inside_the_mount(
    fake_root: FakeRoot, kernel: FakeCgroupKernel
) -> None:
    # cgroupfs cannot hold a symlink, so one in the path is someone else's doing.
    real = cgroup_path(fake_root, "real")
    os.mkdir(real)
    os.symlink(real, cgroup_path(fake_root, "alias"))
    with pytest.raises(InvalidArgument, match="alias"):
        create_cgroup(fake_root.fs, cgroup_name("alias/ctr"))
    assert not os.path.exists(os.path.join(real, "ctr"))


def test_undo_of_nothing(fake_root: FakeRoot) -> None:
    created = tree.CreatedCgroup(cgroup_path(fake_root, "pod"))
    assert undo_create(fake_root.fs, created) == "nothing had been created"


def test_undo_says_what_it_could_not_remove(fake_root: FakeRoot) -> None:
    pod = fake_root.add_cgroup("pod")  # Holds files, so a plain rmdir fails.
    created = tree.CreatedCgroup(str(pod), made=(str(pod),))
    assert "could not remove" in undo_create(fake_root.fs, created)
    assert "ENOTEMPTY" in undo_create(fake_root.fs, created)


def test_creation_plan(fake_root: FakeRoot) -> None:
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu\n")
    assert creation_plan(fake_root.fs, cgroup_name("pod/ctr")) == (("pod", "pod/ctr"), ("", "pod"))
    fake_root.write("sys/fs/cgroup/cgroup.subtree_control", "cpu memory\n")
    assert creation_plan(fake_root.fs, cgroup_name("pod/ctr")) == (("pod", "pod/ctr"), ("pod",))
    fake_root.add_cgroup("pod")
    fake_root.write("sys/fs/cgroup/pod/cgroup.subtree_control", "memory\n")
    assert creation_plan(fake_root.fs, cgroup_name("pod/ctr")) == (("pod/ctr",), ())
    fake_root.add_cgroup("pod/ctr")
    assert creation_plan(fake_root.fs, cgroup_name("pod/ctr")) == ((), ())
