from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import InvalidArgument
from guestagent.linux.lru_gen import Generation, Lruvec
from guestagent.ops.idle import (
    DEFAULT_EDGES_MS,
    MAX_LAYERS,
    Book,
    IdleSpec,
    IdleView,
    Layer,
    advance,
    idle_spec,
    in_subtree,
    next_books,
    view_of,
)

S = 1_000_000_000  # ns
PAGE = 4096


def lruvec(*gens: tuple[int, int, int, int], path: str = "/pod", memcg: int = 5) -> Lruvec:
    return Lruvec(memcg, path, 0, tuple(Generation(*g) for g in gens))


@pytest.mark.parametrize(
    ("edges", "cold", "expected"),
    [
        ((), 0, IdleSpec(DEFAULT_EDGES_MS, 60_000)),
        ((500,), 30_000, IdleSpec((500,), 30_000)),
        (tuple(range(1, 16)), 1, IdleSpec(tuple(range(1, 16)), 1)),
    ],
)
def test_idle_spec_defaults_and_accepts(
    edges: tuple[int, ...], cold: int, expected: IdleSpec
) -> None:
    assert idle_spec(edges, cold) == expected


@pytest.mark.parametrize(
    ("edges", "message"),
    [
        ((0, 10), r"\[0, 10\]: an edge of 0 ms"),
        ((10, 10), r"\[10, 10\] are not strictly ascending"),
        ((60, 10), r"\[60, 10\] are not strictly ascending"),
        (tuple(range(1, 17)), "16 edges: at most 15"),
    ],
)
def test_idle_spec_refuses_edges_naming_them(edges: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        idle_spec(edges, 0)


def test_a_generation_is_as_idle_as_the_next_younger_is_old() -> None:
    # Read 1 s after the aging that opened generation 8: pages in 7 were found then (idle 0),
    # pages in 6 last at the aging that opened 7 (age 11 s, so 10 s before the aging).
    book = advance(
        None,
        lruvec((5, 61_000, 1, 2), (6, 31_000, 3, 4), (7, 11_000, 5, 6), (8, 1_000, 7, 8)),
        100 * S,
    )
    assert book.aged_ns == 99 * S
    assert book.layers == {
        5: (Layer(30_000, 1, 2),),
        6: (Layer(10_000, 3, 4),),
        7: (Layer(0, 5, 6),),
        8: (Layer(0, 7, 8),),
    }


def test_the_oldest_keeps_what_was_folded_into_it() -> None:
    first = advance(
        None,
        lruvec((5, 70_000, 100, 0), (6, 50_000, 10, 0), (7, 30_000, 0, 0), (8, 0, 5, 0)),
        100 * S,
    )
    # 10 s later: one aging folded 5 into 6 and opened 9; two pages of 6 were used again.
    second = advance(
        first,
        lruvec((6, 60_000, 108, 0), (7, 40_000, 0, 0), (8, 10_000, 5, 0), (9, 0, 2, 0)),
        110 * S,
    )
    # 5's pages were idle 50 s (6's age) and 6's 30 s, as of the first aging; 10 s on, the
    # two pages used again come out of the oldest layer.
    assert second.layers[6] == (Layer(60_000, 98, 0), Layer(40_000, 10, 0))
    view = IdleView(second.aged_ns, tuple(x for v in second.layers.values() for x in v))
    assert view.idle_at_least(60_000, PAGE) == (98 * PAGE, 0)


def test_a_surplus_in_the_oldest_joins_its_youngest_layer() -> None:
    first = advance(None, lruvec((5, 30_000, 10, 10), (6, 20_000, 0, 0), (7, 0, 0, 0)), 100 * S)
    second = advance(
        first,
        lruvec((5, 40_000, 10, 25), (6, 30_000, 0, 0), (7, 10_000, 0, 0), (8, 0, 0, 0)),
        110 * S,
    )
    assert second.layers[5] == (Layer(30_000, 10, 25),)


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 10**4)),
        min_size=1,
        max_size=4,
    ),
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 10**4)),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 3),
)
def test_books_hold_exactly_the_kernels_pages(
    before: list[tuple[int, int, int]], after: list[tuple[int, int, int]], folded: int
) -> None:
    """Whatever the kernel did between readings, each generation's layers hold its pages."""
    ages = sorted((a for a, _, _ in before), reverse=True)
    gens = tuple(
        (10 + i, age, x, y) for i, (age, (_, x, y)) in enumerate(zip(ages, before, strict=True))
    )
    first = advance(None, lruvec(*gens), 10**12)
    ages = sorted((a for a, _, _ in after), reverse=True)
    gens = tuple(
        (10 + folded + i, age, x, y)
        for i, (age, (_, x, y)) in enumerate(zip(ages, after, strict=True))
    )
    second = advance(first, lruvec(*gens), 10**12 + 10 * S)
    for seq, anon, file in ((g[0], g[2], g[3]) for g in gens):
        layers = second.layers[seq]
        assert sum(x.anon for x in layers) == anon and sum(x.file for x in layers) == file
        assert len(layers) <= MAX_LAYERS and all(x.idle_ms >= 0 for x in layers)


def test_histogram_bins_by_edges_and_counts_bytes() -> None:
    view = IdleView(7, (Layer(0, 1, 2), Layer(999, 1, 0), Layer(1_000, 0, 3), Layer(400_000, 5, 5)))
    histogram = view.histogram(DEFAULT_EDGES_MS, PAGE)
    assert [b.idle_at_least_ms for b in histogram.bins] == [0, *DEFAULT_EDGES_MS]
    assert [(b.anon_bytes // PAGE, b.file_bytes // PAGE) for b in histogram.bins] == [
        (2, 2),
        (0, 3),
        (0, 0),
        (0, 0),
        (5, 5),
    ]
    assert (histogram.source, histogram.aged_at_unix_ns) == ("mglru", 7)


@pytest.mark.parametrize(
    ("kernel", "cgroup", "inside"),
    [
        ("/pod", "pod", True),
        ("/pod/ctr", "pod", True),
        ("/pod2", "pod", False),
        ("/", "", True),
        ("/", "pod", False),
    ],
)
def test_a_cgroup_holds_its_subtree(kernel: str, cgroup: str, inside: bool) -> None:
    assert in_subtree(kernel, cgroup) is inside


def test_a_view_sums_the_subtree_as_of_its_earliest_aging() -> None:
    books = next_books({}, (lruvec((1, 20_000, 4, 0), (2, 0, 1, 0)),), 100 * S)
    books |= {
        (8, "/pod/ctr", 0): Book(50 * S, {3: (Layer(5, 0, 9),)}),
        (9, "/other", 0): Book(1, {1: (Layer(0, 1, 1),)}),
    }
    view = view_of(books, "pod")
    assert view is not None and view.aged_ns == 50 * S
    # Generation 1 is as idle as 2 is old: 0.
    assert sorted(view.layers, key=lambda x: x.idle_ms) == [
        Layer(0, 4, 0),
        Layer(0, 1, 0),
        Layer(5, 0, 9),
    ]
    assert view_of(books, "nothing") is None
