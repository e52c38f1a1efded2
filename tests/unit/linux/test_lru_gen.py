from __future__ import annotations

import errno
import os

import pytest

from guestagent.errors import AgentError, KernelFormat, kernel_error
from guestagent.linux.lru_gen import (
    Eviction,
    Generation,
    Lruvec,
    SharedMount,
    aging_command,
    debugfs_absence,
    eviction_command,
    lru_gen_path,
    parse_lru_gen,
    write_aging,
    write_eviction,
)
from tests.fakes.root import FakeRoot

# As mm/vmscan.c's lru_gen_seq_show prints it on 6.1: the root, a memcg with two nodes, and
# a memcg on a node with no generations listed yet.
LRU_GEN = """\
memcg     1 /
 node     0
          3      40123       1024      20480
          4      30100         12        300
          5      10050        200        100
          6         20          0          4
memcg     7 /pod/ctr
 node     0
         10      90000      51200          0
         11       5000      12800         16
 node     1
          2       1000          1          1
          3          5          0          0
memcg     9 /empty
 node     0
"""


def test_parses_memcgs_nodes_and_generations_oldest_first() -> None:
    root, ctr0, ctr1 = parse_lru_gen(LRU_GEN)
    assert (root.memcg_id, root.path, root.node, root.max_seq) == (1, "/", 0, 6)
    assert root.generations[0] == Generation(3, 40123, 1024, 20480)
    assert (ctr0.path, ctr0.node, ctr0.generations[-1]) == (
        "/pod/ctr",
        0,
        Generation(11, 5000, 12800, 16),
    )
    assert (ctr1.node, ctr1.max_seq) == (1, 3)


def test_full_mode_marks_are_read_as_numbers() -> None:
    (one,) = parse_lru_gen("memcg 1 /\n node 0\n 3 10 5x 6\n 4 1 0 0\n")
    assert one.generations[0] == Generation(3, 10, 5, 6)


def test_a_cgroup_name_with_spaces_is_read_whole() -> None:
    """A name may hold spaces (only "/" and newlines cannot be in one); it once made the line
    malformed and every idle figure of the guest absent."""
    (one,) = parse_lru_gen("memcg    12 /kubepods/my pod  x\n node 0\n 3 10 5 6\n")
    assert (one.memcg_id, one.path) == (12, "/kubepods/my pod  x")


@pytest.mark.parametrize(
    "text",
    [
        "node 0\n",
        " 3 10 5 6\n",
        "memcg 1 /\n 3 10 5 6\n",
        "memcg x /\n",
        "memcg 1 /\n node 0\n 3 ten 5 6\n",
    ],
)
def test_malformed_lines_are_refused(text: str) -> None:
    with pytest.raises(KernelFormat, match="lru_gen line"):
        parse_lru_gen(text)


def test_aging_command_ages_each_lruvec_from_its_youngest() -> None:
    assert aging_command(parse_lru_gen(LRU_GEN)) == "+ 1 0 6 1 1;+ 7 0 11 1 1;+ 7 1 3 1 1"


def test_a_memcg_that_died_is_skipped_and_the_rest_aged(fake_root: FakeRoot) -> None:
    path = fake_root.write("sys/kernel/debug/lru_gen", LRU_GEN)
    written: list[str] = []

    def kernel(p: object, value: str, proceed: object) -> None:
        if "+ 7 0" in value:  # Memcg 7 died: the kernel refuses its command and stops there.
            raise kernel_error("write", path, value, OSError(errno.EINVAL, "Invalid argument"))
        written.append(value)

    fake_root.kernel.on("write", kernel)
    write_aging(fake_root.fs, str(path), parse_lru_gen(LRU_GEN))
    assert written == ["+ 1 0 6 1 1", "+ 7 1 3 1 1"]


def test_absent_without_the_multigen_lru_or_debugfs(fake_root: FakeRoot) -> None:
    fs = fake_root.fs
    absent = debugfs_absence(fs)
    assert absent is not None and "multi-gen LRU" in absent.reason
    fake_root.write("sys/kernel/mm/lru_gen/enabled", "0x0007\n")
    fake_root.write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\n")
    absent = debugfs_absence(fs)
    assert absent is not None and "CONFIG_DEBUG_FS" in absent.reason
    fake_root.write("proc/filesystems", "nodev\tsysfs\nnodev\tdebugfs\n")
    fake_root.write("sys/kernel/debug/lru_gen", LRU_GEN)
    assert debugfs_absence(fs) is None
    assert os.path.exists(lru_gen_path(fs))


def test_lruvec_max_seq_is_the_youngest() -> None:
    v = Lruvec(1, "/", 0, (Generation(1, 9, 0, 0), Generation(2, 1, 0, 0)))
    assert v.max_seq == 2


def test_only_generations_two_below_the_youngest_are_evictable() -> None:
    (root, *_) = parse_lru_gen(LRU_GEN)  # Generations 3 .. 6.
    assert [root.evictable(seq) for seq in (3, 4, 5, 6)] == [True, True, False, False]


@pytest.mark.parametrize(
    ("anon", "command"),
    [(False, "- 7 1 10 0 1024"), (True, "- 7 1 10 200 1024")],
)
def test_the_eviction_command_says_which_kinds_go(anon: bool, command: str) -> None:
    assert eviction_command(Eviction(7, 1, 10, anon, 1024)) == command


def test_an_eviction_the_kernel_refuses_is_false_and_other_errors_raise(
    fake_root: FakeRoot,
) -> None:
    path = fake_root.write("sys/kernel/debug/lru_gen", LRU_GEN)
    fs = fake_root.fs
    assert write_eviction(fs, str(path), Eviction(7, 0, 10, False, 256))
    assert path.read_text() == "- 7 0 10 0 256"
    fake_root.kernel.fail("write", path, errno.EINVAL)
    assert not write_eviction(fs, str(path), Eviction(9, 0, 10, False, 256))
    fake_root.kernel.fail("write", path, errno.ENOMEM)
    with pytest.raises(AgentError, match="Cannot allocate memory"):
        write_eviction(fs, str(path), Eviction(7, 0, 10, True, 256))


def test_threads_share_one_mount_and_the_last_to_leave_unmounts() -> None:
    events: list[str] = []
    shared = SharedMount()
    shared.enter(lambda: False, lambda: events.append("mount"))  # The ager.
    shared.enter(lambda: True, lambda: events.append("mount"))  # The reclaimer, meanwhile.
    shared.leave(lambda: events.append("umount"))  # The ager is done: not under the other.
    assert events == ["mount"]
    shared.leave(lambda: events.append("umount"))
    assert events == ["mount", "umount"]


def test_a_mount_found_in_place_is_left_alone() -> None:
    events: list[str] = []
    shared = SharedMount()
    shared.enter(lambda: True, lambda: events.append("mount"))
    shared.leave(lambda: events.append("umount"))
    assert events == []
