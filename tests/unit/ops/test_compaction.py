import asyncio
import threading

import pytest

from guestagent.errors import DeadlineExceeded, FailedPrecondition, NotFound
from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.mm import parse_buddyinfo
from guestagent.ops.compaction import (
    Compactor,
    counter_deltas,
    free_bytes_at_or_above,
)
from tests.fakes.root import BUDDYINFO, FakeRoot


def test_free_bytes_at_or_above_order() -> None:
    assert free_bytes_at_or_above((5, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1), 9, 4096) == 2 * (4096 << 9) + (
        4096 << 10
    )


def test_vmstat_deltas() -> None:
    before = parse_flat_keyed("compact_stall 1\ncompact_success 2\nnr_free_pages 9\n", "compact_")
    after = {"compact_stall": 4, "compact_success": 2}
    assert before == {"compact_stall": 1, "compact_success": 2}
    assert counter_deltas(before, after) == {"compact_stall": 3, "compact_success": 0}


def setup_compaction(fake_root: FakeRoot) -> None:
    fake_root.write("proc/buddyinfo", BUDDYINFO)
    fake_root.write("proc/vmstat", "compact_stall 0\ncompact_success 0\n")
    fake_root.write("proc/sys/vm/compact_memory", "")


async def test_compact_reports_before_and_after(fake_root: FakeRoot) -> None:
    setup_compaction(fake_root)
    result = await Compactor(fake_root.fs).compact(None, None)
    assert result.free_blocks_before == parse_buddyinfo(BUDDYINFO)
    assert (fake_root.root / "proc/sys/vm/compact_memory").read_text() == "1"
    assert not result.shared


async def test_no_compaction_in_kernel(fake_root: FakeRoot) -> None:
    with pytest.raises(FailedPrecondition, match="CONFIG_COMPACTION"):
        await Compactor(fake_root.fs).compact(None, None)


async def test_unknown_node(fake_root: FakeRoot) -> None:
    setup_compaction(fake_root)
    with pytest.raises(NotFound, match="node 3 does not exist") as raised:
        await Compactor(fake_root.fs).compact(3, None)
    assert raised.value.reason == "NODE_NOT_FOUND"


async def test_concurrent_calls_share_one_run_and_deadlines_are_reported(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_compaction(fake_root)
    compactor = Compactor(fake_root.fs)
    release = threading.Event()
    runs = []
    original = compactor._compact

    def slow(node, path):  # type: ignore[no-untyped-def]
        runs.append(node)
        release.wait(10)
        return original(node, path)

    monkeypatch.setattr(compactor, "_compact", slow)
    first = asyncio.ensure_future(compactor.compact(None, None))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(compactor.compact(None, None))
    with pytest.raises(DeadlineExceeded, match=r"still running after 0\.05 s"):
        await compactor.compact(None, 0.05)
    release.set()
    one, two = await asyncio.gather(first, second)
    assert runs == [None]
    assert not one.shared and two.shared
    assert one.free_blocks_after == two.free_blocks_after
