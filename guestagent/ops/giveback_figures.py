"""What the host can take back now: pure figures from parsed kernel values, each in bytes with
the reason it is what it is (docs/giveback.md).

- free_reportable / free_fragmented: free memory in blocks of at least, and below, the order
  free page reporting hands to the host.
- cold: memory idle at least the threshold that reclaim could take: cold file pages, and cold
  anon only as far as a swap area has room.
- safe_balloon_target: the smallest guest size (MemTotal terms) that keeps everything used
  within the threshold, the kernel's unreclaimable memory, the zones' high watermarks and
  slack above them for what the ages miss, and never less than the floors (cgroup
  protections + unreclaimable kernel memory + watermarks).
- safe_virtio_mem: per device, the requested size reached by unplugging only its blocks in
  ZONE_MOVABLE (a kernel-zone block may hold what cannot move), and no further than the
  balloon target allows, so the boot memory keeps its headroom.
"""

from __future__ import annotations

from guestagent.linux.cgroup.memory import CgroupSwap
from guestagent.linux.features import Absent
from guestagent.linux.giveback_sources import GiveBackSources
from guestagent.linux.meminfo import MemoryReport
from guestagent.ops.idle import IdleHistogram, IdleSpec, IdleState, IdleView
from guestagent.records import record
from guestagent.sizes import MIB

# Room above the high watermarks for the working set to breathe: ages are as of the last
# aging and page cache read with read(2) is not aged by the page-table walk, so the figure
# in use runs short; with no slack a 1 GiB guest thrashed (docs/giveback.md).
SLACK_MIN = 64 * MIB
SLACK_SHARE = 4  # A quarter of the memory in use, when that is more than SLACK_MIN.


@record
class Figure:
    bytes: int
    reason: str


@record
class VirtioMemTarget:
    device: str
    plugged_bytes: int
    safe_requested_size: Figure


@record
class GiveBack:
    cold_after_ms: int
    cold: Figure | None  # None without idle ages (absent, never zero).
    free_reportable: Figure | None = None  # System-wide only.
    free_fragmented: Figure | None = None
    safe_balloon_target: Figure | None = None
    virtio_mem: tuple[VirtioMemTarget, ...] = ()


def _mib(value: int) -> str:
    return f"{value / MIB:.1f} MiB"


def free_figures(free_blocks: tuple[int, ...], order: int, page_size: int) -> tuple[Figure, Figure]:
    """Free memory in blocks free page reporting takes (order >= `order`), and below it."""
    sizes = [count * (page_size << o) for o, count in enumerate(free_blocks)]
    big, small = sum(sizes[order:]), sum(sizes[:order])
    block = _mib(page_size << order)
    return (
        Figure(big, f"free in blocks of {block} or more: free page reporting hands these over"),
        Figure(small, f"free in blocks under {block}: the host gets these after a compaction"),
    )


def cold_figure(
    cold_anon: int, cold_file: int, swap_room: int | None, cold_after_ms: int, barred: int = 0
) -> Figure:
    """Cold file always; cold anon as far as the swap room goes (None: no active swap area),
    less `barred`: cold anon of cgroups that may not swap."""
    figure = _cold_figure(max(0, cold_anon - barred), cold_file, swap_room, cold_after_ms)
    if not barred:
        return figure
    return Figure(
        figure.bytes,
        f"{figure.reason}; {_mib(min(barred, cold_anon))} cold anon left out: "
        "its cgroups may not swap (memory.swap.max 0)",
    )


def _cold_figure(
    cold_anon: int, cold_file: int, swap_room: int | None, cold_after_ms: int
) -> Figure:
    after = f"idle {cold_after_ms / 1000:g} s or more"
    if cold_anon == 0:
        return Figure(cold_file, f"file pages {after}")
    if not swap_room:
        why = "no active swap area" if swap_room is None else "no room in the swap areas"
        return Figure(cold_file, f"file pages {after}; {_mib(cold_anon)} cold anon left out: {why}")
    anon = min(cold_anon, swap_room)
    if anon < cold_anon:
        return Figure(
            cold_file + anon,
            f"file and anon pages {after}; anon cut from {_mib(cold_anon)} to the swap room",
        )
    return Figure(cold_file + anon, f"file and anon pages {after} (swap has room)")


def cold_now(cold: int, booked: int, now: int) -> int:
    """Cold bytes of one kind (anon or file) as of the last aging, less what has left the LRU
    since (`booked` then, `now` now): pages gone meanwhile (a process exited, reclaim ran)
    are taken to have been cold ones, so the figure errs toward in use, never toward cold.
    Without this, for up to an aging interval after a big process exits, its pages still
    counted cold and the memory in use came out as 0."""
    return max(0, cold - max(0, booked - now))


def current_cold(
    view: IdleView, cold_after_ms: int, now: tuple[int, int], page: int
) -> tuple[int, int]:
    """(anon, file) bytes idle at least cold_after_ms, cut to what the LRU holds now."""
    cold, booked = view.idle_at_least(cold_after_ms, page), view.booked(page)
    return (cold_now(cold[0], booked[0], now[0]), cold_now(cold[1], booked[1], now[1]))


def unreclaimable_kernel(g: GiveBackSources) -> int:
    """Memory neither free, on the LRU lists nor in reclaimable slab: kernel stacks, page
    tables, unreclaimable slab, vmalloc, pages pinned or mlocked."""
    return max(0, g.mem_total - g.mem_free - g.lru - g.reclaimable_slab)


def slack(working: int) -> int:
    return max(SLACK_MIN, working // SLACK_SHARE)


def protected_cold(cold: int, current: int, protected: int) -> int:
    """What of a protected cgroup's cold memory reclaim may not take: reclaim takes at most
    its use above the protection (memory.min; memory.low only once nothing else is left)."""
    return max(0, cold - max(0, current - protected))


def safe_balloon_target(g: GiveBackSources, cold: int | None, kept_cold: int = 0) -> Figure:
    """The smallest size the guest keeps its working set at (None cold: no idle ages, so all
    LRU memory counts as in use). kept_cold: cold memory the cgroups' protections keep
    (protected_cold), in use as far as the balloon is concerned."""
    kernel = unreclaimable_kernel(g)
    floor = g.protected + kernel + g.watermarks
    kept_cold = min(kept_cold, cold or 0)
    working = max(0, g.lru - (cold or 0))
    need = working + kept_cold + kernel + g.watermarks + slack(working)
    target = min(g.mem_total, max(need, floor))
    parts = f"in use within the threshold {_mib(working)}"
    if kept_cold:
        parts += f" + cold but protected {_mib(kept_cold)}"
    parts += (
        f" + unreclaimable kernel {_mib(kernel)} "
        f"+ high watermarks {_mib(g.watermarks)} + slack {_mib(slack(working))}"
    )
    if cold is None:
        parts += " (no idle ages: all LRU memory counted as in use)"
    if target == g.mem_total and max(need, floor) > g.mem_total:
        return Figure(target, f"nothing to take: {parts} reach MemTotal")
    if floor > need:
        return Figure(
            target,
            f"the floor: cgroup protections {_mib(g.protected)} + unreclaimable kernel "
            f"{_mib(kernel)} + high watermarks {_mib(g.watermarks)}, above {parts}",
        )
    return Figure(target, parts)


def safe_virtio_mem(g: GiveBackSources, balloon_target: int) -> tuple[VirtioMemTarget, ...]:
    """Per device: unplug only movable blocks, and in all no more than the balloon target
    leaves to take (devices in the order given share it)."""
    room = max(0, g.mem_total - balloon_target)
    targets = []
    for d in g.devices:
        take = min(d.movable, d.plugged, room)
        take -= take % d.block_size if d.block_size else 0
        room -= take
        kept = d.plugged - take
        if d.movable < d.plugged:
            why = f"{_mib(d.plugged - d.movable)} in kernel-zone blocks stays (may not move)"
        else:
            why = "every block is in ZONE_MOVABLE"
        if take < min(d.movable, d.plugged):
            why += "; the rest would reach into the working set or the boot memory's headroom"
        targets.append(
            VirtioMemTarget(d.device, d.plugged, Figure(kept, f"unplug {_mib(take)}: {why}"))
        )
    return tuple(targets)


def guest_giveback(
    g: GiveBackSources,
    idle: IdleView | None,
    cold_after_ms: int,
    kept_cold: int = 0,
    barred: int = 0,
) -> GiveBack:
    """kept_cold: protected_cold summed; barred: cold anon of the cgroups that may not swap."""
    reportable, fragmented = free_figures(g.free_blocks, g.reporting_order, g.page_size)
    cold = None
    if idle is not None:
        anon, file = current_cold(idle, cold_after_ms, (g.lru_anon, g.lru_file), g.page_size)
        cold = cold_figure(anon, file, g.swap_room, cold_after_ms, barred)
    target = safe_balloon_target(g, cold.bytes if cold else None, kept_cold)
    return GiveBack(
        cold_after_ms,
        cold,
        reportable,
        fragmented,
        target,
        safe_virtio_mem(g, target.bytes),
    )


def cgroup_giveback(
    idle: IdleView | None,
    swap_room: int | None,
    cold_after_ms: int,
    page_size: int,
    lru_now: tuple[int, int],
    barred: int = 0,
) -> GiveBack:
    """A cgroup's: only cold (swap_room: the guest's, cut to the cgroup's memory.swap.max;
    lru_now: its subtree's anon and file LRU bytes now; barred: cold anon in it that may not
    swap, its own or a descendant's memory.swap.max 0 or an ancestor's)."""
    if idle is None:
        return GiveBack(cold_after_ms, None)
    anon, file = current_cold(idle, cold_after_ms, lru_now, page_size)
    return GiveBack(cold_after_ms, cold_figure(anon, file, swap_room, cold_after_ms, barred))


@record
class CgroupGiveBack:
    path: str
    idle: IdleHistogram | None
    giveback: GiveBack


@record
class GiveBackFigures:
    """A report's idle histograms and give-back figures; absent says why there are no idle
    ages (then every histogram and cold figure is unset)."""

    idle: IdleHistogram | None
    giveback: GiveBack
    cgroups: tuple[CgroupGiveBack, ...] = ()
    absent: Absent | None = None


def cgroup_swap_room(guest: int | None, swap: CgroupSwap | None) -> int | None:
    """The guest's swap room, cut to what the cgroup's memory.swap.max still allows."""
    if guest is None or swap is None or swap.max is None:
        return guest
    return min(guest, max(0, swap.max - swap.current))


def giveback_figures(
    sources: GiveBackSources, report: MemoryReport, state: IdleState, spec: IdleSpec
) -> GiveBackFigures:
    """sources: read with the report's system figures (read_giveback_sources)."""
    page = sources.page_size
    cgroups = []
    for c in report.cgroups:
        view = state.view(c.path)
        room = cgroup_swap_room(sources.swap_room, c.swap)
        cgroups.append(
            CgroupGiveBack(
                c.path,
                view.histogram(spec.edges_ms, page) if view else None,
                cgroup_giveback(
                    view,
                    room,
                    spec.cold_after_ms,
                    page,
                    (c.lru_anon, c.lru_file),
                    barred_anon(state, c.path, spec.cold_after_ms, page),
                ),
            )
        )
    view = state.view("")
    return GiveBackFigures(
        view.histogram(spec.edges_ms, page) if view else None,
        guest_giveback(
            sources,
            view,
            spec.cold_after_ms,
            kept_cold(sources, state, spec),
            barred_anon(state, "", spec.cold_after_ms, page),
        ),
        tuple(cgroups),
        state.absent,
    )


def barred_anon(state: IdleState, cgroup: str, cold_after_ms: int, page_size: int) -> int:
    """Cold anon in the subtree's memcgs that may not swap (as of the last aging)."""
    view = state.swap_barred_view(cgroup)
    return view.idle_at_least(cold_after_ms, page_size)[0] if view else 0


def kept_cold(sources: GiveBackSources, state: IdleState, spec: IdleSpec) -> int:
    """Cold memory the protected top-level cgroups keep from reclaim, summed. Their cold is
    as of the last aging, not cut to their LRU now: erring toward kept, so toward in use."""
    total = 0
    for p in sources.protections:
        view = state.view(p.path)
        if view is None:
            continue
        anon, file = view.idle_at_least(spec.cold_after_ms, sources.page_size)
        cold = cold_figure(anon, file, sources.swap_room, spec.cold_after_ms).bytes
        total += protected_cold(cold, p.current, p.protected)
    return total
