"""What the multi-gen LRU's ages let a target give back at once: the memory idle at least the
policy's cold_after_ms, as eviction commands for the generations that hold it, oldest first.

The idle ager's books (ops/idle.py) say, per lruvec and generation, how long each part of it
has been idle as of the last aging; the generations read now say what is still there. A
generation's cold part is what its layers idle at least cold_after_ms hold, cut to what it
holds now (pages found accessed since have left it). The kernel evicts a generation list
oldest first, and within the oldest generation the pages folded in from older ones first
(mm/vmscan.c inc_min_seq appends them at the tail, where eviction starts), so asking for the
cold part's count takes the cold part. Within the bounds the reclaimer keeps for a probe:

- never below a floor: the target's (the policy's floor, memory.low, memory.min) and each
  protected memcg's below it, since the kernel's eviction command, unlike memory.reclaim,
  does not apply memory.low or memory.min;
- anonymous pages only with the policy's `anon`, only as far as swap has room, and never from
  a memcg that may not swap (memory.swap.max 0 on it or an ancestor): the `cold` figure's rule
  (ops/giveback_figures.py).

File pages go first: dropping a clean page costs no I/O, writing one to swap does.

The ages also bound what a probe looks for once the cold part is gone (`cooling_bytes`):
memory found in use at the last aging is the working set, and only the rest is cooling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from guestagent.linux.lru_gen import Eviction, Lruvec
from guestagent.ops.giveback_figures import current_cold
from guestagent.ops.idle import Book, IdleView, in_subtree
from guestagent.records import record


@record
class ColdBounds:
    """How much the target may give, in pages: above its floor (`headroom`), from each
    protected memcg below it (`protected`, by kernel path: what it holds above its
    protection), to swap (`swap_room`, None: no anon), and which memcgs may not swap."""

    headroom: int
    swap_room: int | None = None
    protected: Mapping[str, int] | None = None
    swap_barred: frozenset[str] = frozenset()


def cold_pages(book: Book, seq: int, cold_after_ms: int) -> tuple[int, int]:
    """Anon and file pages of generation `seq` idle at least cold_after_ms at the aging."""
    cold = [layer for layer in book.layers.get(seq, ()) if layer.idle_ms >= cold_after_ms]
    return sum(layer.anon for layer in cold), sum(layer.file for layer in cold)


def booked_cold(books: Mapping[tuple[int, str, int], Book], cgroup: str, cold_after_ms: int) -> int:
    """Pages the books call cold in the subtree, before reading the generations now: 0 means
    there is nothing to evict, whatever the kernel holds."""
    return sum(
        sum(cold_pages(book, seq, cold_after_ms))
        for (_, path, _), book in books.items()
        if in_subtree(path, cgroup)
        for seq in book.layers
    )


def cooling_bytes(view: IdleView, lru_now: tuple[int, int], page_size: int) -> int:
    """Bytes the ages say were not used since the last aging (idle at least one aging
    interval), cut to what the LRU holds now: everything a probe may find. The rest, found
    in use at the last aging, is the working set."""
    return sum(current_cold(view, 1, lru_now, page_size))


def _below(path: str, top: str) -> Iterable[str]:
    """The memcg path and its ancestors, up to but not including the target's own path."""
    while path != top and path not in ("", "/"):
        yield path
        path = path.rsplit("/", 1)[0]


@record
class _Candidate:
    lruvec: Lruvec
    seq: int
    anon: bool
    pages: int
    idle_ms: int  # Its youngest cold layer's: the order of eviction, oldest first.


def _candidates(
    lruvecs: Iterable[Lruvec],
    books: Mapping[tuple[int, str, int], Book],
    cgroup: str,
    cold_after_ms: int,
) -> list[_Candidate]:
    found = []
    for lruvec in lruvecs:
        book = books.get((lruvec.memcg_id, lruvec.path, lruvec.node))
        if book is None or not in_subtree(lruvec.path, cgroup):
            continue
        for gen in lruvec.generations:
            if not lruvec.evictable(gen.seq):
                continue
            anon, file = cold_pages(book, gen.seq, cold_after_ms)
            idle = min(
                (x.idle_ms for x in book.layers.get(gen.seq, ()) if x.idle_ms >= cold_after_ms),
                default=0,
            )
            # Cut to what the generation holds now: pages found in use since have left it.
            kinds = ((False, min(file, gen.file_pages)), (True, min(anon, gen.anon_pages)))
            found += [_Candidate(lruvec, gen.seq, a, n, idle) for a, n in kinds if n > 0]
    # File before anon; within each, the longest idle first.
    return sorted(found, key=lambda c: (c.anon, -c.idle_ms, c.lruvec.memcg_id, c.seq))


def eviction_plan(
    lruvecs: Iterable[Lruvec],
    books: Mapping[tuple[int, str, int], Book],
    cgroup: str,
    cold_after_ms: int,
    bounds: ColdBounds,
) -> tuple[Eviction, ...]:
    """The eviction commands for the target's cold memory (the module's docstring says
    which), in the order to write them. `cgroup` is the target's name ("pod/ctr")."""
    top = "/" + cgroup.strip("/")
    left = dict(bounds.protected or {})
    headroom = bounds.headroom
    swap_room = bounds.swap_room or 0
    plan = []
    for c in _candidates(lruvecs, books, cgroup, cold_after_ms):
        path = c.lruvec.path
        if c.anon and path in bounds.swap_barred:
            continue
        protected = [p for p in _below(path, top) if p in left]
        pages = min(c.pages, headroom, *(left[p] for p in protected))
        if c.anon:
            pages = min(pages, swap_room)
        if pages <= 0:
            continue
        for p in protected:
            left[p] -= pages
        headroom -= pages
        if c.anon:
            swap_room -= pages
        plan.append(Eviction(c.lruvec.memcg_id, c.lruvec.node, c.seq, c.anon, pages))
    return tuple(plan)
