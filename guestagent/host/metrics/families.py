"""The memory report as Prometheus metric families: a pure conversion, no HTTP, no client.

Names follow Prometheus conventions: base units (`_bytes`, `_seconds`), counters end in
`_total`, one family per quantity with the cgroup and the PSI line as labels. An unlimited
cgroup limit is +Inf, as `max` compares in PromQL. A kernel feature that is off is absent,
not zero, as in the report: no PSI, no pressure families; no swap accounting, no cgroup
swap samples.

The families come from the latest WatchMemory message, not a call per scrape; while the
stream is down only the exporter's own families are served (`guestagent_up` 0), so stale
figures never look current.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from guestagent.host.display import GIVEBACK_FIGURES
from guestagent.v1 import agent_pb2 as pb

US_PER_SECOND = 1_000_000


@dataclass(frozen=True)
class Sample:
    label_values: tuple[str, ...]
    value: float


@dataclass(frozen=True)
class Family:
    name: str  # as exposed: a counter's name ends in _total
    kind: Literal["gauge", "counter"]
    help: str
    label_names: tuple[str, ...]
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Snapshot:
    """What the exporter knows at a scrape: the latest report and the stream's state."""

    report: pb.MemoryInfo | None  # the last message received, if any ever was
    up: bool  # the stream is open and has delivered a report recently
    report_age_seconds: float | None  # since the last message arrived, on the host's clock
    reconnects: int


def limit_value(limit: pb.Limit) -> float:
    return math.inf if limit.unlimited else float(limit.bytes)


def _gauge(name: str, help_: str, value: float) -> Family:
    return Family(name, "gauge", help_, (), (Sample((), value),))


def _present(*families: Family) -> list[Family]:
    """The families that have samples: what the report lacks is absent, not an empty family."""
    return [family for family in families if family.samples]


# (metric name, help, field of SystemMemory): one gauge each.
SYSTEM_GAUGES = (
    ("guestagent_memory_total_bytes", "MemTotal from /proc/meminfo", "mem_total_bytes"),
    ("guestagent_memory_free_bytes", "MemFree from /proc/meminfo", "mem_free_bytes"),
    (
        "guestagent_memory_available_bytes",
        "MemAvailable from /proc/meminfo",
        "mem_available_bytes",
    ),
    ("guestagent_memory_buffers_bytes", "Buffers from /proc/meminfo", "buffers_bytes"),
    ("guestagent_memory_cached_bytes", "Cached from /proc/meminfo", "cached_bytes"),
    ("guestagent_memory_shmem_bytes", "Shmem from /proc/meminfo", "shmem_bytes"),
    ("guestagent_swap_total_bytes", "SwapTotal from /proc/meminfo", "swap_total_bytes"),
    ("guestagent_swap_free_bytes", "SwapFree from /proc/meminfo", "swap_free_bytes"),
)

# (metric name suffix, help, value of a cgroup): one gauge family, a sample per cgroup.
CGROUP_GAUGES: tuple[tuple[str, str, Callable[[pb.CgroupMemory], float | None]], ...] = (
    ("current_bytes", "memory.current", lambda c: c.current_bytes),
    ("max_bytes", "memory.max (+Inf: max)", lambda c: limit_value(c.max)),
    ("high_bytes", "memory.high (+Inf: max)", lambda c: limit_value(c.high)),
    ("low_bytes", "memory.low", lambda c: c.low_bytes),
    ("anon_bytes", "anon from memory.stat", lambda c: c.anon_bytes),
    ("file_bytes", "file from memory.stat", lambda c: c.file_bytes),
    (
        "swap_current_bytes",
        "memory.swap.current (absent without swap accounting)",
        lambda c: c.swap_current_bytes if c.HasField("swap_current_bytes") else None,
    ),
    (
        "swap_max_bytes",
        "memory.swap.max (+Inf: max; absent without swap accounting)",
        lambda c: limit_value(c.swap_max) if c.HasField("swap_max") else None,
    ),
)
EVENTS = ("low", "high", "max", "oom", "oom_kill")
PSI_KINDS = ("some", "full")


def pressure_samples(pressure: pb.Pressure, *labels: str) -> list[Sample]:
    return [
        Sample((*labels, kind), getattr(pressure, kind).total_us / US_PER_SECOND)
        for kind in PSI_KINDS
    ]


def system_families(report: pb.MemoryInfo) -> list[Family]:
    gauges = [
        _gauge(name, help_, float(getattr(report.system, field)))
        for name, help_, field in SYSTEM_GAUGES
    ]
    pressure = pressure_samples(report.pressure) if report.HasField("pressure") else []
    delay = report.delay_stall.total_us / US_PER_SECOND
    return gauges + _present(
        Family(
            "guestagent_memory_pressure_stall_seconds_total",
            "counter",
            "time tasks stalled on memory, from /proc/pressure/memory (some: at least one "
            "task, full: all non-idle tasks)",
            ("kind",),
            tuple(pressure),
        ),
        Family(
            "guestagent_memory_delay_stall_seconds_total",
            "counter",
            "time the guest's tasks waited on memory (reclaim, thrashing, compaction), "
            "summed over tasks, from delay accounting: where there is no PSI",
            (),
            (Sample((), delay),) if report.HasField("delay_stall") else (),
        ),
    )


IDLE_HELP = (
    "bytes idle for less than le seconds (cumulative, histogram-shaped), from the multi-gen "
    "LRU's generations as of the last aging; absent without them"
)


def idle_samples(idle: pb.IdleHistogram, *labels: str) -> list[Sample]:
    """Cumulative per kind: a bin's upper bound is the next bin's lower one, the last +Inf."""
    samples = []
    bounds = [f"{b.idle_at_least_ms / 1000:g}" for b in idle.bins[1:]] + ["+Inf"]
    for kind in ("anon", "file"):
        total = 0
        for b, le in zip(idle.bins, bounds, strict=True):
            total += getattr(b, f"{kind}_bytes")
            samples.append(Sample((*labels, kind, le), float(total)))
    return samples


def idle_families(report: pb.MemoryInfo) -> list[Family]:
    """The idle histograms and give-back figures, guest-wide and per cgroup; each absent
    when the report has none."""
    whole = idle_samples(report.idle) if report.HasField("idle") else []
    per_cgroup = tuple(
        s for c in report.cgroups if c.HasField("idle") for s in idle_samples(c.idle, c.path)
    )
    figures = tuple(
        Sample((name,), float(getattr(report.giveback, name).bytes))
        for name in GIVEBACK_FIGURES
        if report.giveback.HasField(name)
    )
    cold = tuple(
        Sample((c.path,), float(c.giveback.cold.bytes))
        for c in report.cgroups
        if c.giveback.HasField("cold")
    )
    devices = tuple(
        Sample((t.device,), float(t.safe_requested_size.bytes)) for t in report.giveback.virtio_mem
    )
    return _present(
        Family("guestagent_memory_idle_bytes", "gauge", IDLE_HELP, ("kind", "le"), tuple(whole)),
        Family(
            "guestagent_cgroup_memory_idle_bytes",
            "gauge",
            IDLE_HELP,
            ("cgroup", "kind", "le"),
            per_cgroup,
        ),
        Family(
            "guestagent_giveback_bytes",
            "gauge",
            "what the host can take back now (safe_balloon_target: the smallest guest size)",
            ("figure",),
            figures,
        ),
        Family(
            "guestagent_cgroup_giveback_cold_bytes",
            "gauge",
            "the cgroup's memory idle past the threshold that reclaim could take",
            ("cgroup",),
            cold,
        ),
        Family(
            "guestagent_giveback_virtio_mem_safe_requested_bytes",
            "gauge",
            "the smallest requested size the virtio-mem device's driver can reach now",
            ("device",),
            devices,
        ),
    )


def cgroup_families(cgroups: Iterable[pb.CgroupMemory]) -> list[Family]:
    cgroups = list(cgroups)
    gauges = [
        Family(
            f"guestagent_cgroup_memory_{suffix}",
            "gauge",
            help_,
            ("cgroup",),
            tuple(
                Sample((c.path,), float(value))
                for c in cgroups
                if (value := value_of(c)) is not None
            ),
        )
        for suffix, help_, value_of in CGROUP_GAUGES
    ]
    pressure = tuple(
        sample
        for c in cgroups
        if c.HasField("pressure")
        for sample in pressure_samples(c.pressure, c.path)
    )
    delay = tuple(
        Sample((c.path,), c.delay_stall.total_us / US_PER_SECOND)
        for c in cgroups
        if c.HasField("delay_stall")
    )
    return _present(
        *gauges,
        Family(
            "guestagent_cgroup_memory_events_total",
            "counter",
            "memory.events counters",
            ("cgroup", "event"),
            tuple(
                Sample((c.path, event), float(getattr(c.events, event)))
                for c in cgroups
                for event in EVENTS
            ),
        ),
        Family(
            "guestagent_cgroup_memory_pressure_stall_seconds_total",
            "counter",
            "time the cgroup's tasks stalled on memory, from memory.pressure",
            ("cgroup", "kind"),
            pressure,
        ),
        Family(
            "guestagent_cgroup_memory_delay_stall_seconds_total",
            "counter",
            "time the cgroup's tasks waited on memory, summed over tasks, from delay "
            "accounting: where the cgroup has no memory.pressure",
            ("cgroup",),
            delay,
        ),
    )


def reclaim_families(targets: Iterable[pb.ReclaimTargetStatus]) -> list[Family]:
    """The reclaimer's watched targets: which stall signal each runs on, and what it took."""
    targets = tuple(targets)
    if not targets:
        return []
    return [
        Family(
            "guestagent_reclaim_stall_signal",
            "gauge",
            "1 for the stall signal the cgroup's working-set reclaimer runs on: psi_stall "
            "(memory.pressure) or delayacct_stall (delay accounting, without PSI)",
            ("cgroup", "signal"),
            tuple(Sample((t.cgroup, t.signals[0]), 1.0) for t in targets if t.signals),
        ),
        Family(
            "guestagent_reclaim_reclaimed_bytes_total",
            "counter",
            "what the cgroup's working-set reclaimer has reclaimed",
            ("cgroup",),
            tuple(Sample((t.cgroup,), float(t.reclaimed_total_bytes)) for t in targets),
        ),
        Family(
            "guestagent_reclaim_step_bytes_total",
            "counter",
            "what the cgroup's working-set reclaimer has reclaimed each way: evict_cold (what "
            "the idle ages call cold) or probe (memory.reclaim)",
            ("cgroup", "way"),
            tuple(
                Sample((t.cgroup, way), float(taken))
                for t in targets
                for way, taken in (
                    ("evict_cold", t.evicted_cold_total_bytes),
                    ("probe", t.probed_total_bytes),
                )
            ),
        ),
        Family(
            "guestagent_reclaim_last_step_seconds",
            "gauge",
            "how long the cgroup's working-set reclaimer's last step took, by the way it went",
            ("cgroup", "way"),
            tuple(
                Sample((t.cgroup, t.last_step), t.last_step_us / 1e6)
                for t in targets
                if t.last_step
            ),
        ),
    ]


def exporter_families(snapshot: Snapshot) -> list[Family]:
    families = [
        _gauge(
            "guestagent_up",
            "1 while the WatchMemory stream is open and delivering reports, else 0",
            1.0 if snapshot.up else 0.0,
        ),
        Family(
            "guestagent_watch_reconnects_total",
            "counter",
            "WatchMemory streams opened again after the first (each attempt counts)",
            (),
            (Sample((), float(snapshot.reconnects)),),
        ),
    ]
    if snapshot.report_age_seconds is not None:
        families.append(
            _gauge(
                "guestagent_report_age_seconds",
                "seconds since the last WatchMemory message arrived",
                snapshot.report_age_seconds,
            )
        )
    return families


def families(snapshot: Snapshot) -> list[Family]:
    """Every family a scrape serves, the exporter's own first."""
    found = exporter_families(snapshot)
    if snapshot.up and snapshot.report is not None:
        found += system_families(snapshot.report)
        found += cgroup_families(snapshot.report.cgroups)
        found += reclaim_families(snapshot.report.reclaim)
        found += idle_families(snapshot.report)
    return found
