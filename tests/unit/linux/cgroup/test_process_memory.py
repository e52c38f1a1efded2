"""The cgroup a process runs in and its memory against memory.max, from a fake /proc and
cgroup tree."""

from __future__ import annotations

import pytest

from guestagent.errors import KernelFormat
from guestagent.linux.cgroup.process_memory import (
    CgroupMemoryUse,
    parse_unified_cgroup,
    read_cgroup_memory,
)
from tests.fakes.root import FakeRoot


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "0::/kubepods.slice/pod1.slice/cri-containerd-a.scope\n",
            "/kubepods.slice/pod1.slice/cri-containerd-a.scope",
        ),
        # A host with cgroup v1 controllers mounted beside v2: the unified line is the one.
        ("12:memory:/x\n0::/system.slice/qemu.service\n", "/system.slice/qemu.service"),
        ("0::/\n", "/"),
    ],
)
def test_the_unified_line(text: str, path: str) -> None:
    assert parse_unified_cgroup(text) == path


def test_a_process_without_a_v2_line_is_a_format_error() -> None:
    with pytest.raises(KernelFormat, match="no cgroup v2 line"):
        parse_unified_cgroup("12:memory:/x\n")


def test_a_vmms_cgroup_and_its_limit(fake_root: FakeRoot) -> None:
    fake_root.write("proc/4242/cgroup", "0::/pods/vm1\n")
    fake_root.write("sys/fs/cgroup/pods/vm1/memory.current", "734003200\n")
    fake_root.write("sys/fs/cgroup/pods/vm1/memory.max", "1073741824\n")
    assert read_cgroup_memory(fake_root.fs, 4242) == CgroupMemoryUse(
        "/pods/vm1", 734003200, 1073741824
    )
    fake_root.write("sys/fs/cgroup/pods/vm1/memory.max", "max\n")
    assert read_cgroup_memory(fake_root.fs, 4242) == CgroupMemoryUse("/pods/vm1", 734003200, None)


def test_a_process_gone_or_in_the_root_has_none(fake_root: FakeRoot) -> None:
    assert read_cgroup_memory(fake_root.fs, 99999) is None
    fake_root.write("proc/1/cgroup", "0::/\n")
    assert read_cgroup_memory(fake_root.fs, 1) is None


def test_a_hybrid_hosts_v1_memory_controller(fake_root: FakeRoot) -> None:
    """The v2 mount holds no memory controller there (this CI host's layout): v1's files."""
    fake_root.write("proc/77/cgroup", "9:name=systemd:/\n4:memory:/pods/vm1\n0::/\n")
    fake_root.write("sys/fs/cgroup/memory/pods/vm1/memory.usage_in_bytes", "536870912\n")
    fake_root.write("sys/fs/cgroup/memory/pods/vm1/memory.limit_in_bytes", "1073741824\n")
    assert read_cgroup_memory(fake_root.fs, 77) == CgroupMemoryUse(
        "/pods/vm1", 536870912, 1073741824
    )
    fake_root.write("sys/fs/cgroup/memory/pods/vm1/memory.limit_in_bytes", "9223372036854771712\n")
    assert read_cgroup_memory(fake_root.fs, 77) == CgroupMemoryUse("/pods/vm1", 536870912, None)


def test_a_garbled_cgroup_file_is_a_format_error() -> None:
    with pytest.raises(KernelFormat, match="is not ID:CONTROLLERS:PATH"):
        parse_unified_cgroup("garbage\n")
