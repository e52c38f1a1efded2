"""The memory report as Prometheus families: names, labels, units, and what is left out."""

from __future__ import annotations

import math

import pytest

from guestagent.host.metrics.families import Family, Snapshot, families, limit_value
from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb


def report(*cgroups: pb.CgroupMemory, psi: bool = True) -> pb.MemoryInfo:
    info = pb.MemoryInfo(
        system=pb.SystemMemory(
            mem_total_bytes=1024 * MIB,
            mem_free_bytes=300 * MIB,
            mem_available_bytes=600 * MIB,
            buffers_bytes=2 * MIB,
            cached_bytes=200 * MIB,
            swap_total_bytes=512 * MIB,
            swap_free_bytes=500 * MIB,
            shmem_bytes=MIB,
        ),
        cgroups=list(cgroups),
    )
    if psi:
        info.pressure.CopyFrom(
            pb.Pressure(
                some=pb.PressureLine(avg10=1.5, total_us=2_500_000),
                full=pb.PressureLine(total_us=1_000),
            )
        )
    return info


def cgroup(path: str, swap: bool = True, psi: bool = True) -> pb.CgroupMemory:
    memory = pb.CgroupMemory(
        path=path,
        current_bytes=64 * MIB,
        max=pb.Limit(bytes=128 * MIB),
        high=pb.Limit(unlimited=True),
        low_bytes=8 * MIB,
        events=pb.MemoryEvents(high=3, max=2, oom=1, oom_kill=1),
        anon_bytes=40 * MIB,
        file_bytes=20 * MIB,
    )
    if swap:
        memory.swap_current_bytes = 4096
        memory.swap_max.CopyFrom(pb.Limit(unlimited=True))
    if psi:
        memory.pressure.CopyFrom(pb.Pressure(some=pb.PressureLine(total_us=750_000)))
    return memory


def up(info: pb.MemoryInfo | None, reconnects: int = 0) -> Snapshot:
    return Snapshot(report=info, up=True, report_age_seconds=0.25, reconnects=reconnects)


def by_name(found: list[Family]) -> dict[str, Family]:
    named = {family.name: family for family in found}
    assert len(named) == len(found), "a family name appears twice"
    return named


def values(family: Family) -> dict[tuple[str, ...], float]:
    return {sample.label_values: sample.value for sample in family.samples}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("guestagent_up", 1.0),
        ("guestagent_watch_reconnects_total", 2.0),
        ("guestagent_report_age_seconds", 0.25),
        ("guestagent_memory_total_bytes", 1024 * MIB),
        ("guestagent_memory_free_bytes", 300 * MIB),
        ("guestagent_memory_available_bytes", 600 * MIB),
        ("guestagent_memory_buffers_bytes", 2 * MIB),
        ("guestagent_memory_cached_bytes", 200 * MIB),
        ("guestagent_memory_shmem_bytes", MIB),
        ("guestagent_swap_total_bytes", 512 * MIB),
        ("guestagent_swap_free_bytes", 500 * MIB),
    ],
)
def test_system_gauges(name: str, expected: float) -> None:
    family = by_name(families(up(report(), reconnects=2)))[name]
    assert values(family) == {(): expected}
    assert family.label_names == ()


def test_pressure_is_seconds_of_stall_as_a_counter_with_a_kind_label() -> None:
    family = by_name(families(up(report())))["guestagent_memory_pressure_stall_seconds_total"]
    assert (family.kind, family.label_names) == ("counter", ("kind",))
    assert values(family) == {("some",): 2.5, ("full",): 0.001}


@pytest.mark.parametrize(
    ("name", "a", "b"),
    [
        ("guestagent_cgroup_memory_current_bytes", 64 * MIB, 64 * MIB),
        ("guestagent_cgroup_memory_max_bytes", 128 * MIB, 128 * MIB),
        ("guestagent_cgroup_memory_high_bytes", math.inf, math.inf),
        ("guestagent_cgroup_memory_low_bytes", 8 * MIB, 8 * MIB),
        ("guestagent_cgroup_memory_anon_bytes", 40 * MIB, 40 * MIB),
        ("guestagent_cgroup_memory_file_bytes", 20 * MIB, 20 * MIB),
        # b has no swap accounting: absent, not zero.
        ("guestagent_cgroup_memory_swap_current_bytes", 4096, None),
        ("guestagent_cgroup_memory_swap_max_bytes", math.inf, None),
    ],
)
def test_cgroup_gauges_one_sample_per_cgroup(name: str, a: float, b: float | None) -> None:
    found = by_name(families(up(report(cgroup("pod/a"), cgroup("pod/b", swap=False)))))
    family = found[name]
    assert (family.kind, family.label_names) == ("gauge", ("cgroup",))
    expected = {("pod/a",): a} | ({} if b is None else {("pod/b",): b})
    assert values(family) == expected


def test_cgroup_events_are_counters_labelled_by_event() -> None:
    family = by_name(families(up(report(cgroup("pod")))))["guestagent_cgroup_memory_events_total"]
    assert (family.kind, family.label_names) == ("counter", ("cgroup", "event"))
    assert values(family) == {
        ("pod", "low"): 0,
        ("pod", "high"): 3,
        ("pod", "max"): 2,
        ("pod", "oom"): 1,
        ("pod", "oom_kill"): 1,
    }


def test_cgroup_pressure_only_for_cgroups_that_have_it() -> None:
    found = by_name(families(up(report(cgroup("a"), cgroup("b", psi=False)))))
    family = found["guestagent_cgroup_memory_pressure_stall_seconds_total"]
    assert values(family) == {("a", "some"): 0.75, ("a", "full"): 0.0}


@pytest.mark.parametrize(
    ("snapshot", "present", "absent"),
    [
        # No PSI in the guest, no cgroups asked for: those families are absent, not zero.
        (
            up(report(psi=False)),
            {"guestagent_memory_total_bytes"},
            {
                "guestagent_memory_pressure_stall_seconds_total",
                "guestagent_cgroup_memory_events_total",
            },
        ),
        # A cgroup without swap accounting or PSI: no empty families either.
        (
            up(report(cgroup("a", swap=False, psi=False))),
            {"guestagent_cgroup_memory_current_bytes"},
            {
                "guestagent_cgroup_memory_swap_current_bytes",
                "guestagent_cgroup_memory_pressure_stall_seconds_total",
            },
        ),
        # The stream is down: only the exporter's own families, the last report's age kept.
        (
            Snapshot(report(cgroup("a")), up=False, report_age_seconds=30.0, reconnects=4),
            {"guestagent_up", "guestagent_report_age_seconds", "guestagent_watch_reconnects_total"},
            {"guestagent_memory_total_bytes", "guestagent_cgroup_memory_current_bytes"},
        ),
        # Never connected: no age either.
        (
            Snapshot(None, up=False, report_age_seconds=None, reconnects=0),
            {"guestagent_up"},
            {"guestagent_report_age_seconds", "guestagent_memory_total_bytes"},
        ),
    ],
)
def test_what_is_left_out(snapshot: Snapshot, present: set[str], absent: set[str]) -> None:
    names = set(by_name(families(snapshot)))
    assert present <= names
    assert not absent & names


def test_down_is_zero() -> None:
    snapshot = Snapshot(None, up=False, report_age_seconds=None, reconnects=3)
    found = by_name(families(snapshot))
    assert values(found["guestagent_up"]) == {(): 0.0}
    assert values(found["guestagent_watch_reconnects_total"]) == {(): 3.0}


def test_every_family_follows_the_naming_conventions() -> None:
    for family in families(up(report(cgroup("a")))):
        assert family.name.startswith("guestagent_")
        assert family.name.endswith("_total") == (family.kind == "counter"), family.name
        assert family.help
        assert all(len(s.label_values) == len(family.label_names) for s in family.samples)
        assert family.samples, family.name


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(pb.Limit(unlimited=True), math.inf), (pb.Limit(bytes=4096), 4096.0), (pb.Limit(), 0.0)],
)
def test_limit_value(limit: pb.Limit, expected: float) -> None:
    assert limit_value(limit) == expected


def giveback_figures() -> pb.MemoryInfo:
    histogram = pb.IdleHistogram(
        source="mglru",
        bins=[
            pb.IdleBin(idle_at_least_ms=0, anon_bytes=100 * MIB, file_bytes=MIB),
            pb.IdleBin(idle_at_least_ms=60_000, anon_bytes=400 * MIB, file_bytes=2 * MIB),
        ],
    )
    pod = cgroup("pod")
    pod.idle.CopyFrom(histogram)
    pod.giveback.cold.CopyFrom(pb.Figure(bytes=402 * MIB, reason="r"))
    info = report(pod)
    info.idle.CopyFrom(histogram)
    info.giveback.cold.CopyFrom(pb.Figure(bytes=402 * MIB, reason="r"))
    info.giveback.safe_balloon_target.CopyFrom(pb.Figure(bytes=300 * MIB, reason="r"))
    info.giveback.virtio_mem.add(
        device="virtio4", safe_requested_size=pb.Figure(bytes=256 * MIB, reason="r")
    )
    return info


def test_idle_bytes_are_cumulative_by_le_seconds() -> None:
    found = by_name(families(up(giveback_figures())))
    assert values(found["guestagent_cgroup_memory_idle_bytes"]) == {
        ("pod", "anon", "60"): 100 * MIB,
        ("pod", "anon", "+Inf"): 500 * MIB,
        ("pod", "file", "60"): MIB,
        ("pod", "file", "+Inf"): 3 * MIB,
    }
    assert values(found["guestagent_memory_idle_bytes"])[("anon", "+Inf")] == 500 * MIB
    assert values(found["guestagent_giveback_bytes"]) == {
        ("cold",): 402 * MIB,
        ("safe_balloon_target",): 300 * MIB,
    }
    assert values(found["guestagent_cgroup_giveback_cold_bytes"]) == {("pod",): 402 * MIB}
    assert values(found["guestagent_giveback_virtio_mem_safe_requested_bytes"]) == {
        ("virtio4",): 256 * MIB
    }


def test_no_idle_families_without_idle_ages() -> None:
    names = set(by_name(families(up(report(cgroup("a"))))))
    assert not {n for n in names if "idle" in n or "giveback" in n}


def test_delay_accountings_stall_where_there_is_no_psi() -> None:
    """Its own families, never a PSI family with delay accounting's figure in it."""
    plain = cgroup("a", psi=False)
    plain.delay_stall.CopyFrom(pb.MemoryStall(source="delayacct_stall", total_us=1_500_000))
    info = report(plain, cgroup("b", psi=False), psi=False)
    info.delay_stall.CopyFrom(pb.MemoryStall(source="delayacct_stall", total_us=4_000_000))
    found = by_name(families(up(info)))
    assert values(found["guestagent_memory_delay_stall_seconds_total"]) == {(): 4.0}
    assert values(found["guestagent_cgroup_memory_delay_stall_seconds_total"]) == {("a",): 1.5}
    assert "guestagent_memory_pressure_stall_seconds_total" not in found


def test_the_reclaimers_stall_signal_per_target() -> None:
    info = report(cgroup("pod"))
    info.reclaim.add(
        cgroup="pod",
        reclaimed_total_bytes=8 * MIB,
        evicted_cold_total_bytes=6 * MIB,
        probed_total_bytes=2 * MIB,
        last_step="probe",
        last_step_us=250_000,
        signals=["delayacct_stall", "refaults", "reclaim_yield"],
    )
    found = by_name(families(up(info)))
    assert values(found["guestagent_reclaim_stall_signal"]) == {("pod", "delayacct_stall"): 1.0}
    assert values(found["guestagent_reclaim_reclaimed_bytes_total"]) == {("pod",): 8.0 * MIB}
    assert values(found["guestagent_reclaim_step_bytes_total"]) == {
        ("pod", "evict_cold"): 6.0 * MIB,
        ("pod", "probe"): 2.0 * MIB,
    }
    assert values(found["guestagent_reclaim_last_step_seconds"]) == {("pod", "probe"): 0.25}
