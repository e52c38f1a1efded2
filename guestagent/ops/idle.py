"""Bytes by idle age, from the multi-gen LRU's generations, and the one loop that ages them.

How an age maps from generations: an aging walks the page tables and files the pages it finds
accessed in the generation that was youngest until then, so a page in generation g was last
found accessed no later than when generation g + 1 was opened, and its idle age is at least
that generation's age (pages of the youngest generation count as idle 0); ages are taken as of
the aging, so the resolution is the aging interval.

The kernel keeps at most four generations and, to open a fifth, folds the oldest into the next
(mm/vmscan.c inc_min_seq). So that folding does not make long-idle pages look younger, the
oldest generation carries "layers" here: the pages folded in, each with when they were last
found accessed. Pages that leave it (accessed again, or evicted) are taken from its oldest
layers first, which can only make the figures younger, never older than the truth.

One thread ages every memcg at a fixed interval (default 10 s) and keeps the result; reports
read the result and never age, so the page-table walks cost the same however many callers ask.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import field, replace

from guestagent.errors import AgentError, InvalidArgument
from guestagent.jsonlog import EventLog
from guestagent.linux.abi import PAGE_SIZE
from guestagent.linux.features import MGLRU, Absent, read_idle_ages_absence
from guestagent.linux.giveback_sources import read_swap_barred
from guestagent.linux.kernel import Kernel
from guestagent.linux.lru_gen import (
    Lruvec,
    debugfs,
    debugfs_absence,
    read_lruvecs,
    write_aging,
)
from guestagent.linux.syscalls import name_thread
from guestagent.records import record

log = EventLog("guestagent.ops.idle")

SOURCE = "mglru"
DEFAULT_EDGES_MS = (1_000, 10_000, 60_000, 300_000)
DEFAULT_COLD_AFTER_MS = 60_000
MAX_EDGES = 15
DEFAULT_AGING_INTERVAL_S = 10.0
# The finest default bin edge: aging more often than this resolves nothing a bin can show.
MIN_AGING_INTERVAL_S = 1.0
# Layers kept in one oldest generation: beyond this the two closest fold into the younger.
MAX_LAYERS = 8
NS_PER_MS = 1_000_000
THREAD_NAME = "idle-ager"


@record
class IdleSpec:
    """What a report asks: bin edges (ms, ascending) and the age from which memory is cold."""

    edges_ms: tuple[int, ...] = DEFAULT_EDGES_MS
    cold_after_ms: int = DEFAULT_COLD_AFTER_MS


def idle_spec(edges_ms: Iterable[int], cold_after_ms: int) -> IdleSpec:
    """The request's spec: empty edges and a zero threshold mean the defaults."""
    edges = tuple(edges_ms) or DEFAULT_EDGES_MS
    if len(edges) > MAX_EDGES:
        raise InvalidArgument(
            f"idle_edges_ms has {len(edges)} edges: at most {MAX_EDGES} (16 bins)",
            "IDLE_EDGES_INVALID",
            field="idle_edges_ms",
        )
    if edges[0] == 0:
        raise InvalidArgument(
            f"idle_edges_ms {list(edges)}: an edge of 0 ms makes an empty bin",
            "IDLE_EDGES_INVALID",
            field="idle_edges_ms",
        )
    if any(b <= a for a, b in itertools.pairwise(edges)):
        raise InvalidArgument(
            f"idle_edges_ms {list(edges)} are not strictly ascending",
            "IDLE_EDGES_INVALID",
            field="idle_edges_ms",
        )
    return IdleSpec(edges, cold_after_ms or DEFAULT_COLD_AFTER_MS)


@record
class Layer:
    """Pages last found accessed `idle_ms` before their lruvec's last aging."""

    idle_ms: int
    anon: int
    file: int


@record
class Book:
    """One lruvec's generations as layers, as of its last aging (the youngest's birth)."""

    aged_ns: int
    layers: dict[int, tuple[Layer, ...]]  # By generation seq.


def _births(lruvec: Lruvec, read_ns: int) -> list[int]:
    return [read_ns - g.age_ms * NS_PER_MS for g in lruvec.generations]


def _trim(layers: list[Layer], anon: int, file: int) -> tuple[Layer, ...]:
    """Layers (youngest last) holding exactly anon and file pages: a surplus is the kernel's
    own filing (new pages) and joins the youngest layer; a shortfall comes out of the oldest."""

    def fit(counts: list[int], actual: int) -> list[int]:
        counts = counts[:]
        excess = sum(counts) - actual
        if excess < 0:
            counts[-1] -= excess
        for i in range(len(counts)):
            take = min(max(excess, 0), counts[i])
            counts[i] -= take
            excess -= take
        return counts

    order = sorted(layers, key=lambda layer: -layer.idle_ms)
    anons = fit([x.anon for x in order], anon)
    files = fit([x.file for x in order], file)
    merged: dict[int, tuple[int, int]] = {}
    for layer, a, f in zip(order, anons, files, strict=True):
        old = merged.get(layer.idle_ms, (0, 0))
        merged[layer.idle_ms] = (old[0] + a, old[1] + f)
    kept = [Layer(idle, a, f) for idle, (a, f) in sorted(merged.items(), reverse=True) if a or f]
    while len(kept) > MAX_LAYERS:
        # Fold the two closest ages into the younger: the figures get younger, not older.
        i = min(range(len(kept) - 1), key=lambda j: kept[j].idle_ms - kept[j + 1].idle_ms)
        older, younger = kept[i], kept[i + 1]
        kept[i : i + 2] = [
            Layer(younger.idle_ms, older.anon + younger.anon, older.file + younger.file)
        ]
    return tuple(kept) or (Layer(0, 0, 0),)


def advance(previous: Book | None, lruvec: Lruvec, read_ns: int) -> Book:
    """The lruvec's book after a reading taken at read_ns (ns, the clock of `previous`)."""
    births = _births(lruvec, read_ns)
    aged_ns = births[-1]
    gens = lruvec.generations
    layers: dict[int, tuple[Layer, ...]] = {}
    for i, gen in enumerate(gens):
        seen = births[i + 1] if i + 1 < len(gens) else births[i]
        own = Layer(max(0, (aged_ns - seen) // NS_PER_MS), gen.anon_pages, gen.file_pages)
        if i > 0 or previous is None:
            layers[gen.seq] = (own,)
            continue
        # The oldest: what was in it and in every generation folded into it, aged since.
        shift = max(0, (aged_ns - previous.aged_ns) // NS_PER_MS)
        carried = [
            replace(layer, idle_ms=layer.idle_ms + shift)
            for seq, old in previous.layers.items()
            if seq <= gen.seq
            for layer in old
        ]
        # A generation seen before keeps its own age: its layers already hold it.
        if gen.seq not in previous.layers:
            carried.append(own)
        layers[gen.seq] = _trim(carried, gen.anon_pages, gen.file_pages)
    return Book(aged_ns, layers)


@record
class IdleBin:
    idle_at_least_ms: int
    anon_bytes: int
    file_bytes: int


@record
class IdleHistogram:
    source: str
    bins: tuple[IdleBin, ...]
    aged_at_unix_ns: int


@record
class IdleView:
    """Layers of one cgroup's subtree (or the guest), as of aged_ns: what reports bin."""

    aged_ns: int
    layers: tuple[Layer, ...]

    def histogram(self, edges_ms: tuple[int, ...], page_size: int = PAGE_SIZE) -> IdleHistogram:
        bounds = (0, *edges_ms)
        anon = [0] * len(bounds)
        file = [0] * len(bounds)
        for layer in self.layers:
            i = bisect.bisect_right(bounds, layer.idle_ms) - 1
            anon[i] += layer.anon
            file[i] += layer.file
        bins = tuple(
            IdleBin(b, a * page_size, f * page_size)
            for b, a, f in zip(bounds, anon, file, strict=True)
        )
        return IdleHistogram(SOURCE, bins, self.aged_ns)

    def booked(self, page_size: int = PAGE_SIZE) -> tuple[int, int]:
        """Anon and file bytes on the books: the LRU as of the last aging."""
        return (
            sum(x.anon for x in self.layers) * page_size,
            sum(x.file for x in self.layers) * page_size,
        )

    def idle_at_least(self, ms: int, page_size: int = PAGE_SIZE) -> tuple[int, int]:
        """Anon and file bytes idle at least `ms`."""
        old = [layer for layer in self.layers if layer.idle_ms >= ms]
        return (
            sum(x.anon for x in old) * page_size,
            sum(x.file for x in old) * page_size,
        )


def in_subtree(kernel_path: str, cgroup: str) -> bool:
    """Whether the kernel's memcg path ("/pod1/ctr1") is the cgroup ("pod1") or below it;
    "" is the root, so every memcg."""
    if not cgroup:
        return True
    prefix = "/" + cgroup
    return kernel_path == prefix or kernel_path.startswith(prefix + "/")


def view_of(books: dict[tuple[int, str, int], Book], cgroup: str) -> IdleView | None:
    """The subtree's layers (a parent's lruvec holds only what was charged to it, the
    children's hold theirs), as of the earliest aging among them; None when none is known."""
    chosen = [book for (_, path, _), book in books.items() if in_subtree(path, cgroup)]
    if not chosen:
        return None
    aged = min(book.aged_ns for book in chosen)
    layers = tuple(layer for book in chosen for seq in book.layers for layer in book.layers[seq])
    return IdleView(aged, layers)


NOT_AGED = Absent(MGLRU, "the idle ages are not read yet: the first aging runs")


@record
class IdleState:
    """The ager's last result: books by (memcg id, path, node), or why there are none. The
    books keep the monotonic clock (a stepped wall clock, as after a snapshot's restore,
    would age every layer by the step); unix_offset_ns turns their times into Unix time."""

    books: dict[tuple[int, str, int], Book] = field(default_factory=dict)
    absent: Absent | None = NOT_AGED
    unix_offset_ns: int = 0
    swap_barred: frozenset[str] = frozenset()  # Memcg paths that may not swap, at the aging.

    def view(self, cgroup: str) -> IdleView | None:
        """The subtree's layers, aged_ns in Unix time."""
        view = None if self.absent is not None else view_of(self.books, cgroup)
        return None if view is None else IdleView(view.aged_ns + self.unix_offset_ns, view.layers)

    def swap_barred_view(self, cgroup: str) -> IdleView | None:
        """The layers of the subtree's memcgs that may not swap: their anon cannot go."""
        if self.absent is not None or not self.swap_barred:
            return None
        books = {k: b for k, b in self.books.items() if k[1] in self.swap_barred}
        return view_of(books, cgroup)


def next_books(
    previous: dict[tuple[int, str, int], Book], lruvecs: tuple[Lruvec, ...], read_ns: int
) -> dict[tuple[int, str, int], Book]:
    """Every lruvec's book after a reading; lruvecs gone from the file are dropped."""
    books = {}
    for v in lruvecs:
        key = (v.memcg_id, v.path, v.node)
        books[key] = advance(previous.get(key), v, read_ns)
    return books


class IdleAger:
    """The agent's one aging loop: ages every memcg's generations every `interval` seconds
    while the multi-gen LRU is on, and keeps the books reports read."""

    def __init__(
        self,
        kernel: Kernel,
        interval: float = DEFAULT_AGING_INTERVAL_S,
        clock: Callable[[], int] = time.monotonic_ns,
        wall: Callable[[], int] = time.time_ns,
    ) -> None:
        self.kernel = kernel
        self.interval = interval
        self._clock = clock
        self._wall = wall
        self._state = (
            IdleState()
            if interval > 0
            else IdleState({}, Absent(MGLRU, "the agent ages no generations (--idle-aging 0)"))
        )
        self._lruvecs: tuple[Lruvec, ...] = ()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> IdleState:
        with self._lock:
            return self._state

    def start(self) -> None:
        if self.interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        # Named, so its CPU (the page-table walks are this thread's system time) can be
        # read apart from the agent's in /proc (tests/bench/idle_aging.py).
        name_thread(THREAD_NAME)
        while not self._stopping.is_set():
            try:
                self.cycle()
            except Exception:  # A bug must not end the idle figures silently.
                log.error("idle_aging_failed", exc=True)
            self._stopping.wait(self.interval)

    def cycle(self) -> None:
        """Age what the last reading listed, then read: the books are as of this aging."""
        # Once read, only the switch can change (debugfs does not leave the kernel): one read
        # instead of three opens, each a millisecond or more under TCG.
        absent = (
            read_idle_ages_absence(self.kernel) if self._lruvecs else debugfs_absence(self.kernel)
        )
        if absent is not None:
            self._lruvecs = ()
            with self._lock:
                self._state = IdleState({}, absent)
            return
        try:
            with debugfs(self.kernel) as path:
                if not self._lruvecs:
                    self._lruvecs = read_lruvecs(self.kernel, path)
                write_aging(self.kernel, path, self._lruvecs)
                lruvecs = read_lruvecs(self.kernel, path)
                read_ns = self._clock()
                unix_offset = self._wall() - read_ns
            barred = read_swap_barred(self.kernel, {v.path for v in lruvecs})
        except AgentError as e:
            self._lruvecs = ()
            with self._lock:
                self._state = IdleState({}, Absent(MGLRU, f"the idle ages cannot be read: {e}"))
            return
        self._lruvecs = lruvecs
        with self._lock:
            books = next_books(self._state.books, lruvecs, read_ns)
            self._state = IdleState(books, None, unix_offset, barred)
