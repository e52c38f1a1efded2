"""What the ages let a target evict at once: the generations' cold parts, oldest first, within
the floors and the swap rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from guestagent.linux.lru_gen import Eviction, Generation, Lruvec
from guestagent.ops.idle import Book, IdleView, Layer
from guestagent.ops.workingset.cold import (
    ColdBounds,
    booked_cold,
    cooling_bytes,
    eviction_plan,
)

COLD = 30_000  # ms
PAGE = 4096
MUCH = 1 << 40


def lruvec(memcg: int, path: str, *gens: tuple[int, int, int]) -> Lruvec:
    """Generations (seq, anon, file) as the kernel holds them now, oldest first."""
    return Lruvec(memcg, path, 0, tuple(Generation(seq, 0, a, f) for seq, a, f in gens))


def book(layers: dict[int, tuple[Layer, ...]]) -> Book:
    return Book(0, layers)


# The reclaim scenario's pod after the workload went quiet: its oldest generation holds the
# cold set (idle 45 s) folded with pages idle 20 s; the youngest two hold the hot loop.
POD = lruvec(5, "/pod", (10, 90_000, 50_000), (11, 10, 0), (12, 12_000, 2), (13, 0, 0))
POD_BOOK = book(
    {
        10: (Layer(45_000, 88_000, 49_000), Layer(20_000, 2_000, 1_000)),
        11: (Layer(10_000, 10, 0),),
        12: (Layer(0, 12_000, 2),),
        13: (Layer(0, 0, 0),),
    }
)
BOOKS = {(5, "/pod", 0): POD_BOOK}


def test_the_cold_part_of_the_oldest_generation_file_first() -> None:
    plan = eviction_plan((POD,), BOOKS, "pod", COLD, ColdBounds(MUCH, swap_room=MUCH))
    assert plan == (Eviction(5, 0, 10, False, 49_000), Eviction(5, 0, 10, True, 88_000))


def test_without_anon_only_file_pages_go() -> None:
    plan = eviction_plan((POD,), BOOKS, "pod", COLD, ColdBounds(MUCH))
    assert plan == (Eviction(5, 0, 10, False, 49_000),)


def test_anon_goes_only_as_far_as_swap_has_room() -> None:
    plan = eviction_plan((POD,), BOOKS, "pod", COLD, ColdBounds(MUCH, swap_room=1_000))
    assert plan[-1] == Eviction(5, 0, 10, True, 1_000)
    plan = eviction_plan((POD,), BOOKS, "pod", COLD, ColdBounds(MUCH, swap_room=0))
    assert [e.anon for e in plan] == [False]


def test_never_anon_from_a_memcg_that_may_not_swap() -> None:
    bounds = ColdBounds(MUCH, swap_room=MUCH, swap_barred=frozenset({"/pod"}))
    assert [e.anon for e in eviction_plan((POD,), BOOKS, "pod", COLD, bounds)] == [False]


def test_never_below_the_floor() -> None:
    plan = eviction_plan((POD,), BOOKS, "pod", COLD, ColdBounds(50_000, swap_room=MUCH))
    assert plan == (Eviction(5, 0, 10, False, 49_000), Eviction(5, 0, 10, True, 1_000))


def test_a_longer_threshold_leaves_the_set_that_is_not_yet_cold() -> None:
    assert eviction_plan((POD,), BOOKS, "pod", 60_000, ColdBounds(MUCH, MUCH)) == ()
    assert booked_cold(BOOKS, "pod", 60_000) == 0
    assert booked_cold(BOOKS, "pod", COLD) == 137_000


def test_cut_to_what_the_generation_holds_now() -> None:
    # Since the aging most of the set was found in use again (or reclaimed): 100 pages left.
    now = lruvec(5, "/pod", (10, 100, 0), (11, 10, 0), (12, 12_000, 2), (13, 0, 0))
    plan = eviction_plan((now,), BOOKS, "pod", COLD, ColdBounds(MUCH, swap_room=MUCH))
    assert plan == (Eviction(5, 0, 10, True, 100),)


def test_the_two_youngest_generations_are_never_asked_for() -> None:
    # Books that call everything cold: the kernel evicts no generation younger than max - 2.
    books = {(5, "/pod", 0): book({s: (Layer(COLD, 100, 100),) for s in (10, 11, 12, 13)})}
    plan = eviction_plan((POD,), books, "pod", COLD, ColdBounds(MUCH, swap_room=MUCH))
    assert {e.seq for e in plan} == {10, 11}


def test_generation_by_generation_oldest_first_and_only_the_targets_subtree() -> None:
    ctr = lruvec(7, "/pod/ctr", (3, 100, 100), (4, 100, 100), (5, 0, 0), (6, 0, 0))
    other = lruvec(9, "/other", (3, 100, 100), (4, 0, 0), (5, 0, 0))
    books = {
        (7, "/pod/ctr", 0): book({3: (Layer(90_000, 100, 100),), 4: (Layer(40_000, 100, 100),)}),
        (9, "/other", 0): book({3: (Layer(90_000, 100, 100),)}),
        **BOOKS,
    }
    plan = eviction_plan((POD, ctr, other), books, "pod", COLD, ColdBounds(MUCH, swap_room=MUCH))
    assert [(e.memcg_id, e.seq, e.anon) for e in plan] == [
        (7, 3, False),  # Idle 90 s.
        (5, 10, False),  # 45 s.
        (7, 4, False),  # 40 s.
        (7, 3, True),
        (5, 10, True),
        (7, 4, True),
    ]


def test_a_protected_memcg_below_the_target_keeps_its_protection() -> None:
    # The eviction command ignores memory.low and memory.min: the plan holds them instead.
    ctr = lruvec(7, "/pod/ctr", (3, 100, 100), (4, 0, 0), (5, 0, 0))
    deeper = lruvec(8, "/pod/ctr/x", (3, 100, 100), (4, 0, 0), (5, 0, 0))
    cold = book({3: (Layer(90_000, 100, 100),)})
    books = {(7, "/pod/ctr", 0): cold, (8, "/pod/ctr/x", 0): cold}
    bounds = ColdBounds(MUCH, swap_room=MUCH, protected={"/pod/ctr": 150})
    plan = eviction_plan((ctr, deeper), books, "pod", COLD, bounds)
    assert sum(e.pages for e in plan) == 150


@given(
    headroom=st.integers(0, 300_000),
    room=st.none() | st.integers(0, 200_000),
    cold_after=st.integers(1_000, 100_000),
)
def test_a_plan_keeps_every_bound(headroom: int, room: int | None, cold_after: int) -> None:
    bounds = ColdBounds(headroom, swap_room=room)
    plan = eviction_plan((POD,), BOOKS, "pod", cold_after, bounds)
    assert sum(e.pages for e in plan) <= headroom
    assert sum(e.pages for e in plan if e.anon) <= (room or 0)
    assert all(POD.evictable(e.seq) and e.pages > 0 for e in plan)
    held = {(g.seq, True): g.anon_pages for g in POD.generations}
    held |= {(g.seq, False): g.file_pages for g in POD.generations}
    assert all(e.pages <= held[e.seq, e.anon] for e in plan)


def test_cooling_is_what_was_not_used_since_the_last_aging_and_is_still_there() -> None:
    view = IdleView(0, (Layer(45_000, 100, 50), Layer(10_000, 20, 0), Layer(0, 300, 10)))
    booked = (420 * PAGE, 60 * PAGE)
    assert cooling_bytes(view, booked, PAGE) == 170 * PAGE
    # 150 anon pages left the LRU since the aging (evicted): taken to have been idle ones,
    # so of the anon none is left cooling; the file pages are all still there.
    assert cooling_bytes(view, (270 * PAGE, 60 * PAGE), PAGE) == 50 * PAGE
