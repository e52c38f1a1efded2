import errno
import os

import pytest

from guestagent.errors import FailedPrecondition, InvalidArgument
from guestagent.linux.memblocks import MemoryBlock, memory_blocks
from guestagent.ops.hotplug import HotplugWatcher, OnlinePolicy, online_memory, online_states
from tests.fakes.root import FakeRoot

MEMORY = "sys/devices/system/memory"


def boot(count: int) -> list[MemoryBlock]:
    return [MemoryBlock(i, "online", "Normal", False) for i in range(count)]


def offline(*indices: int) -> list[MemoryBlock]:
    return [MemoryBlock(i, "offline", None, True) for i in indices]


M, K = "online_movable", "online_kernel"


@pytest.mark.parametrize(
    ("blocks", "ratio", "expected"),
    [
        # 512 MiB boot (4 blocks) plus 512 MiB plugged: all movable under 301 %.
        (boot(4) + offline(32, 33, 34, 35), 301, [M, M, M, M]),
        # 4 boot blocks at 301 % allow 12 movable; the 13th and later go to a kernel zone.
        (boot(4) + offline(*range(32, 46)), 301, [M] * 12 + [K, K]),
        # Movable blocks already online count against the ratio.
        ([*boot(4), MemoryBlock(32, "online", "Movable", True), *offline(33)], 25, [K]),
        ([*boot(4), MemoryBlock(32, "online", "Movable", True), *offline(33)], 50, [M]),
        # Hot-plugged memory in a kernel zone is not boot memory: it buys no movable room.
        ([*boot(1), MemoryBlock(32, "online", "Normal", True), *offline(33, 34)], 100, [M, K]),
        # Ratio 0: nothing movable, as the kernel's auto-movable with ratio 0.
        (boot(4) + offline(32), 0, [K]),
        # Lowest blocks first, whatever order they were found in.
        (boot(1) + offline(41, 40), 100, [M, K]),
    ],
)
def test_auto_movable_table(blocks: list[MemoryBlock], ratio: int, expected: list[str]) -> None:
    states = online_states(OnlinePolicy("auto-movable", ratio), blocks)
    assert list(states.values()) == expected
    assert list(states) == sorted(states)


@pytest.mark.parametrize("mode", ["online", "online_movable", "online_kernel"])
def test_fixed_policies_write_one_state(mode: str) -> None:
    states = online_states(OnlinePolicy(mode), boot(1) + offline(8, 9))
    assert states == {8: mode, 9: mode}


def test_online_blocks_are_left_alone() -> None:
    # The kernel's auto-onlining got there first: nothing to write.
    blocks = [*boot(4), MemoryBlock(32, "online", "Normal", True)]
    assert online_states(OnlinePolicy(), blocks) == {}


@pytest.mark.parametrize(
    ("mode", "ratio", "match"), [("sideways", 301, "'sideways'"), ("auto-movable", -1, "-1")]
)
def test_policy_is_checked(mode: str, ratio: int, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        OnlinePolicy(mode, ratio)


def test_online_memory_writes_the_policy_states(fake_root: FakeRoot) -> None:
    blocks = {0: "online", 1: "online", 8: "offline", 9: "offline", 10: "offline"}
    fake_root.add_memory_blocks(blocks)
    result = online_memory(fake_root.fs, OnlinePolicy("auto-movable", 100))
    assert result.onlined == ("memory8", "memory9", "memory10")
    assert result.movable == ("memory8", "memory9")
    assert result.block_size == 128 << 20
    states = memory_blocks(fake_root.fs)
    assert (states["memory8"], states["memory10"]) == ("online_movable", "online_kernel")
    assert states["memory0"] == "online"


def test_a_block_onlined_meanwhile_is_not_a_failure(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_root.add_memory_blocks({0: "online", 8: "offline", 9: "offline"})
    state_file = fake_root.root / MEMORY / "memory8/state"
    real_write = os.write

    def refuse_memory8(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(state_file):
            state_file.write_text("online\n")  # The kernel onlined it first.
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", refuse_memory8)
    result = online_memory(fake_root.fs, OnlinePolicy("online_movable"))
    assert result.onlined == ("memory9",) and result.failed == ()


def test_a_refused_block_is_reported(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_root.add_memory_blocks({0: "online", 8: "offline"})

    def ebusy(fd: int, data: bytes) -> int:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(os, "write", ebusy)
    result = online_memory(fake_root.fs)
    assert result.onlined == () and result.failed[0].startswith("memory8: write")
    assert "EBUSY (Device or resource busy)" in result.failed[0]


def test_online_memory_off_means_off_on_demand_too(fake_root: FakeRoot) -> None:
    """--online-memory off: the OnlineMemory RPC is refused, naming the flag, not obeyed."""
    fake_root.write("sys/devices/system/memory/block_size_bytes", "8000000\n")
    state = fake_root.write("sys/devices/system/memory/memory8/state", "offline\n")
    with pytest.raises(FailedPrecondition, match="--online-memory off"):
        HotplugWatcher(fake_root.fs, None).online_now()
    assert state.read_text() == "offline\n"
