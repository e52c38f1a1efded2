from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.linux.cgroup.memory import CgroupSwap
from guestagent.linux.giveback_sources import DeviceBlocks, GiveBackSources, Protection
from guestagent.ops.giveback_figures import (
    cgroup_giveback,
    cgroup_swap_room,
    cold_figure,
    cold_now,
    free_figures,
    guest_giveback,
    kept_cold,
    protected_cold,
    safe_balloon_target,
    safe_virtio_mem,
    unreclaimable_kernel,
)
from guestagent.ops.idle import Book, IdleSpec, IdleState, IdleView, Layer
from guestagent.sizes import MIB

PAGE = 4096

GUEST = GiveBackSources(
    mem_total=2048 * MIB,
    mem_free=400 * MIB,
    lru_anon=400 * MIB,
    lru_file=1000 * MIB,
    reclaimable_slab=48 * MIB,
    swap_room=1024 * MIB,
    watermarks=16 * MIB,
    free_blocks=(10, 0, 0, 0, 0, 0, 0, 0, 0, 100),
    reporting_order=9,
    page_size=PAGE,
)


def test_free_splits_at_the_reporting_order() -> None:
    reportable, fragmented = free_figures((10, 2, 0, 0, 0, 0, 0, 0, 0, 3, 1), 9, PAGE)
    assert reportable.bytes == 3 * 2 * MIB + 4 * MIB
    assert fragmented.bytes == 10 * PAGE + 2 * 2 * PAGE
    assert "2.0 MiB or more" in reportable.reason and "compaction" in fragmented.reason


@pytest.mark.parametrize(
    ("anon", "file", "room", "cold", "why"),
    [
        (0, 5, None, 5, "file pages idle 60 s or more"),
        (7, 5, None, 5, "cold anon left out: no active swap area"),
        (7, 5, 0, 5, "no room in the swap areas"),
        (7, 5, 3, 8, "anon cut from"),
        (7, 5, 100, 12, "swap has room"),
    ],
)
def test_cold_takes_anon_only_as_far_as_swap_has_room(
    anon: int, file: int, room: int | None, cold: int, why: str
) -> None:
    figure = cold_figure(anon, file, room, 60_000)
    assert figure.bytes == cold and why in figure.reason


def test_a_cgroup_has_only_cold_and_none_without_idle_ages() -> None:
    view = IdleView(1, (Layer(90_000, 10, 20), Layer(0, 5, 5)))
    giveback = cgroup_giveback(view, None, 60_000, PAGE, (15 * PAGE, 25 * PAGE))
    assert giveback.cold is not None and giveback.cold.bytes == 20 * PAGE
    assert giveback.safe_balloon_target is None and giveback.free_reportable is None
    assert cgroup_giveback(None, None, 60_000, PAGE, (0, 0)).cold is None


def test_a_cgroups_swap_room_is_cut_to_its_swap_max() -> None:
    assert cgroup_swap_room(100, CgroupSwap(30, 50)) == 20
    assert cgroup_swap_room(100, CgroupSwap(30, None)) == 100
    assert cgroup_swap_room(None, CgroupSwap(0, 50)) is None
    assert cgroup_swap_room(100, CgroupSwap(60, 50)) == 0


def test_the_balloon_target_keeps_the_working_set_kernel_and_watermarks() -> None:
    kernel = unreclaimable_kernel(GUEST)
    assert kernel == (2048 - 400 - 1400 - 48) * MIB
    target = safe_balloon_target(GUEST, 1000 * MIB)
    assert target.bytes == 400 * MIB + kernel + 16 * MIB + 100 * MIB  # A quarter as slack.
    assert "in use within the threshold 400.0 MiB" in target.reason
    assert "slack 100.0 MiB" in target.reason
    blind = safe_balloon_target(GUEST, None)
    assert blind.bytes == 1400 * MIB + kernel + 16 * MIB + 350 * MIB
    assert "no idle ages" in blind.reason


def test_a_small_working_set_still_gets_the_minimum_slack() -> None:
    target = safe_balloon_target(GUEST, 1300 * MIB)
    assert target.bytes == 100 * MIB + unreclaimable_kernel(GUEST) + 16 * MIB + 64 * MIB


def test_the_balloon_target_never_goes_below_the_protections() -> None:
    target = safe_balloon_target(
        replace(GUEST, protections=(Protection("pod", 900 * MIB, 900 * MIB),)), 1300 * MIB
    )
    assert target.bytes == 900 * MIB + unreclaimable_kernel(GUEST) + 16 * MIB
    assert target.reason.startswith("the floor: cgroup protections 900.0 MiB")


def test_cold_memory_under_a_protection_stays_in_use_for_the_balloon() -> None:
    """500 MiB cold in a cgroup whose memory.min is 500M, 300 MiB hot elsewhere: reclaim may
    take none of the cold, so the target must keep it (it came out 640 MiB, under the 800 MiB
    the guest holds, before the protections' cold was counted)."""
    g = replace(
        GUEST,
        mem_free=1048 * MIB,
        lru_anon=0,
        lru_file=800 * MIB,
        protections=(Protection("db", 500 * MIB, 500 * MIB),),
    )
    kept = protected_cold(500 * MIB, current=500 * MIB, protected=500 * MIB)
    assert kept == 500 * MIB
    target = safe_balloon_target(g, 500 * MIB, kept)
    kernel = unreclaimable_kernel(g)
    assert target.bytes == 300 * MIB + 500 * MIB + kernel + 16 * MIB + 75 * MIB  # Slack: 1/4.
    assert "cold but protected 500.0 MiB" in target.reason
    assert safe_balloon_target(g, 500 * MIB).bytes < 800 * MIB  # What it was without.


def test_kept_cold_reads_each_protected_cgroups_own_books() -> None:
    """ "db" (memory.min covers all 300 MiB, 200 of it cold) keeps its cold; "web" (protected
    100 MiB of 400, 300 cold) keeps none, since reclaim may take its 300 above the protection;
    an unprotected cgroup's cold is not looked at."""
    pages = MIB // PAGE
    books = {
        (1, "/db", 0): Book(1, {0: (Layer(90_000, 200 * pages, 0), Layer(0, 100 * pages, 0))}),
        (2, "/web", 0): Book(1, {0: (Layer(90_000, 0, 300 * pages), Layer(0, 0, 100 * pages))}),
        (3, "/idle", 0): Book(1, {0: (Layer(90_000, 0, 500 * pages),)}),
    }
    g = replace(
        GUEST,
        protections=(
            Protection("db", 300 * MIB, 300 * MIB),
            Protection("web", 400 * MIB, 100 * MIB),
        ),
    )
    spec = IdleSpec(cold_after_ms=60_000)
    assert kept_cold(g, IdleState(books, None), spec) == 200 * MIB
    # Without swap room the cold anon is no cold at all: in use already, kept by nothing.
    assert kept_cold(replace(g, swap_room=None), IdleState(books, None), spec) == 0


@pytest.mark.parametrize(
    ("cold", "current", "protected", "kept"),
    [(0, 100, 100, 0), (100, 100, 0, 0), (100, 100, 60, 60), (30, 100, 60, 0), (80, 100, 60, 40)],
)
def test_reclaim_takes_a_protected_cgroup_only_above_its_protection(
    cold: int, current: int, protected: int, kept: int
) -> None:
    assert protected_cold(cold, current, protected) == kept


sizes = st.integers(0, 1 << 34)


@st.composite
def guests(draw: st.DrawFn) -> GiveBackSources:
    total = draw(st.integers(64 * MIB, 1 << 34))
    free = draw(st.integers(0, total))
    lru = draw(st.integers(0, total - free))
    slab = draw(st.integers(0, total - free - lru))
    anon = draw(st.integers(0, lru))
    return replace(
        GUEST,
        mem_total=total,
        mem_free=free,
        lru_anon=anon,
        lru_file=lru - anon,
        reclaimable_slab=slab,
        watermarks=draw(st.integers(0, total // 8)),
        protections=(Protection("pod", total, draw(st.integers(0, total))),),
    )


@given(guests(), st.one_of(st.none(), sizes))
def test_the_target_stays_between_the_floors_and_memtotal(
    g: GiveBackSources, cold: int | None
) -> None:
    target = safe_balloon_target(g, cold).bytes
    floor = g.protected + unreclaimable_kernel(g) + g.watermarks
    assert min(floor, g.mem_total) <= target <= g.mem_total


@given(guests(), sizes, sizes, sizes)
def test_protected_cold_never_lowers_the_target(
    g: GiveBackSources, cold: int, kept: int, more: int
) -> None:
    before = safe_balloon_target(g, cold, kept).bytes
    assert safe_balloon_target(g, cold, kept + more).bytes >= before
    assert before >= safe_balloon_target(g, cold).bytes


@given(guests(), sizes, st.integers(0, 1 << 30))
def test_more_use_never_raises_what_the_balloon_may_take(
    g: GiveBackSources, cold: int, more: int
) -> None:
    """Memory going from free into use (as LRU pages or kernel memory) never lowers the target,
    nor does less of it being cold."""
    more = min(more, g.mem_free)
    before = safe_balloon_target(g, cold).bytes
    assert (
        safe_balloon_target(
            replace(g, mem_free=g.mem_free - more, lru_file=g.lru_file + more), cold
        ).bytes
        >= before
    )
    assert safe_balloon_target(replace(g, mem_free=g.mem_free - more), cold).bytes >= before
    assert safe_balloon_target(g, max(0, cold - more)).bytes >= before


@given(
    guests(),
    st.integers(0, 1 << 34),
    st.lists(st.tuples(st.integers(0, 64), st.integers(0, 64)), max_size=3),
)
def test_virtio_mem_unplugs_only_movable_whole_blocks_within_the_balloon_room(
    g: GiveBackSources, target: int, devices: list[tuple[int, int]]
) -> None:
    block = 128 * MIB
    g = replace(
        g,
        devices=tuple(
            DeviceBlocks(f"virtio{i}", max(m, p) * block, m * block, block)
            for i, (p, m) in enumerate(devices)
        ),
    )
    target = min(target, g.mem_total)
    taken = 0
    for device, result in zip(g.devices, safe_virtio_mem(g, target), strict=True):
        size = result.safe_requested_size.bytes
        assert device.plugged - device.movable <= size <= device.plugged
        assert (device.plugged - size) % block == 0
        taken += device.plugged - size
    assert taken <= g.mem_total - target


def test_guest_giveback_puts_it_together() -> None:
    view = IdleView(1, (Layer(120_000, 50 * MIB // PAGE, 100 * MIB // PAGE), Layer(0, 1, 1)))
    g = replace(GUEST, devices=(DeviceBlocks("virtio4", 1024 * MIB, 768 * MIB, 128 * MIB),))
    giveback = guest_giveback(g, view, 60_000)
    assert giveback.cold is not None and giveback.cold.bytes == 150 * MIB
    assert giveback.free_reportable is not None and giveback.free_reportable.bytes == 200 * MIB
    assert giveback.safe_balloon_target is not None
    (device,) = giveback.virtio_mem
    # The balloon target (1250 MiB in use + 152 kernel + 16 watermarks + 312.5 slack)
    # leaves 317.5 MiB: two of the six movable blocks.
    assert device.safe_requested_size.bytes == 768 * MIB
    assert "256.0 MiB in kernel-zone blocks stays" in device.safe_requested_size.reason
    assert "the rest would reach into the working set" in device.safe_requested_size.reason


@given(sizes, sizes, sizes)
def test_cold_now_never_exceeds_the_lru_now_nor_the_books(cold: int, booked: int, now: int) -> None:
    cold = min(cold, booked)
    fresh = cold_now(cold, booked, now)
    assert 0 <= fresh <= min(cold, now)
    if now >= booked:
        assert fresh == cold  # Nothing left the LRU: the books stand.


def test_a_big_exit_since_the_last_aging_leaves_the_working_set_in_use() -> None:
    # The books (as of the last aging) hold a 400 MiB set idle 90 s and 100 MiB in use; the
    # set's process has exited since, so the LRU holds 120 MiB now. Without the cut the
    # 400 MiB counted cold and the memory in use came out as 0 (seen 2026-12-03).
    view = IdleView(1, (Layer(90_000, 400 * MIB // PAGE, 0), Layer(0, 100 * MIB // PAGE, 0)))
    g = replace(GUEST, lru_anon=120 * MIB, lru_file=0, mem_free=GUEST.mem_free + 1280 * MIB)
    giveback = guest_giveback(g, view, 60_000)
    assert giveback.cold is not None and giveback.cold.bytes == 20 * MIB
    assert giveback.safe_balloon_target is not None
    assert "in use within the threshold 100.0 MiB" in giveback.safe_balloon_target.reason


def test_cold_anon_that_may_not_swap_is_left_out_and_named() -> None:
    figure = cold_figure(300 * MIB, 50 * MIB, 1024 * MIB, 60_000, barred=200 * MIB)
    assert figure.bytes == 150 * MIB
    assert figure.reason.endswith(
        "200.0 MiB cold anon left out: its cgroups may not swap (memory.swap.max 0)"
    )
    # Barred as of the last aging, more than is cold now: never below the cold file.
    assert cold_figure(100 * MIB, 50 * MIB, 1024 * MIB, 60_000, barred=200 * MIB).bytes == 50 * MIB
