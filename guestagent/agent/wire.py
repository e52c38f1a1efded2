"""Protobuf messages to domain values and back, so the modules stay free of gRPC."""

from __future__ import annotations

from guestagent.errors import InvalidArgument
from guestagent.linux.blockdev import DeviceSelector
from guestagent.linux.memblocks import HotplugReport
from guestagent.linux.meminfo import CgroupMemory, MemoryReport, Pressure, PressureLine
from guestagent.ops.compaction import CompactResult, free_bytes_at_or_above
from guestagent.ops.hotplug import OnlineResult
from guestagent.ops.limits import AppliedLimits, MemorySpec
from guestagent.ops.overhead import GuestOverhead
from guestagent.ops.reclaim import ReclaimResult
from guestagent.ops.swap import DEFAULT_LABEL, DiscardPolicy, EnableSwapSpec, SwapArea
from guestagent.v1 import agent_pb2 as pb

DISCARD_TO_PB = {
    DiscardPolicy.BOTH: pb.DISCARD_BOTH,
    DiscardPolicy.PAGES: pb.DISCARD_PAGES,
    DiscardPolicy.ONCE: pb.DISCARD_ONCE,
    DiscardPolicy.NONE: pb.DISCARD_NONE,
}
DISCARD_FROM_PB = {v: k for k, v in DISCARD_TO_PB.items()}


def limit_pb(value: int | None) -> pb.Limit:
    return pb.Limit(unlimited=True) if value is None else pb.Limit(bytes=value)


def pressure_line_pb(line: PressureLine) -> pb.PressureLine:
    return pb.PressureLine(
        avg10=line.avg10, avg60=line.avg60, avg300=line.avg300, total_us=line.total_us
    )


def pressure_pb(pressure: Pressure) -> pb.Pressure:
    return pb.Pressure(some=pressure_line_pb(pressure.some), full=pressure_line_pb(pressure.full))


def cgroup_pb(cgroup: CgroupMemory) -> pb.CgroupMemory:
    message = pb.CgroupMemory(
        path=cgroup.path,
        current_bytes=cgroup.current,
        max=limit_pb(cgroup.max),
        high=limit_pb(cgroup.high),
        low_bytes=cgroup.low,
        events=pb.MemoryEvents(
            low=cgroup.events.low,
            high=cgroup.events.high,
            max=cgroup.events.max,
            oom=cgroup.events.oom,
            oom_kill=cgroup.events.oom_kill,
        ),
        anon_bytes=cgroup.anon,
        file_bytes=cgroup.file,
    )
    if cgroup.swap is not None:
        message.swap_current_bytes = cgroup.swap.current
        message.swap_max.CopyFrom(limit_pb(cgroup.swap.max))
    if cgroup.pressure is not None:
        message.pressure.CopyFrom(pressure_pb(cgroup.pressure))
    return message


def hotplug_pb(report: HotplugReport) -> pb.MemoryHotplug:
    return pb.MemoryHotplug(
        block_size_bytes=report.block_size,
        movable_blocks=report.movable_blocks,
        normal_blocks=report.normal_blocks,
        offline_blocks=report.offline_blocks,
        virtio_mem=[
            pb.VirtioMemRegion(
                device=r.region.device,
                start_address=r.region.start,
                region_bytes=r.region.size,
                plugged_bytes=r.added,
                movable_blocks=r.movable,
                normal_blocks=r.normal,
                offline_blocks=r.offline,
            )
            for r in report.regions
        ],
    )


def memory_info_pb(
    report: MemoryReport,
    reason: pb.WatchReason = pb.WATCH_REASON_UNSPECIFIED,
    changed: tuple[str, ...] = (),
    hotplug: HotplugReport | None = None,
) -> pb.MemoryInfo:
    system = report.system
    message = pb.MemoryInfo(
        collected_at_unix_ns=report.collected_at_unix_ns,
        system=pb.SystemMemory(
            mem_total_bytes=system.mem_total,
            mem_free_bytes=system.mem_free,
            mem_available_bytes=system.mem_available,
            buffers_bytes=system.buffers,
            cached_bytes=system.cached,
            swap_total_bytes=system.swap_total,
            swap_free_bytes=system.swap_free,
            shmem_bytes=system.shmem,
        ),
        cgroups=[cgroup_pb(c) for c in report.cgroups],
        reason=reason,
        changed_cgroups=changed,
    )
    if report.pressure is not None:
        message.pressure.CopyFrom(pressure_pb(report.pressure))
    if hotplug is not None:
        message.hotplug.CopyFrom(hotplug_pb(hotplug))
    return message


def selector_from_pb(message: pb.DeviceSelector) -> DeviceSelector:
    which = message.WhichOneof("device")
    if which == "path":
        return DeviceSelector(path=message.path)
    if which == "serial":
        return DeviceSelector(serial=message.serial)
    raise InvalidArgument("no device given: set device.path or device.serial")


def enable_swap_spec_from_pb(request: pb.EnableSwapRequest) -> EnableSwapSpec:
    if request.discard not in DISCARD_FROM_PB:
        raise InvalidArgument(
            f"discard policy {request.discard} is not one of {sorted(DISCARD_FROM_PB)}"
        )
    return EnableSwapSpec(
        selector=selector_from_pb(request.device),
        priority=request.priority if request.HasField("priority") else None,
        discard=DISCARD_FROM_PB[request.discard],
        wait_ms=request.wait_ms,
        force=request.force,
        label=request.label or DEFAULT_LABEL,
    )


def swap_area_pb(area: SwapArea) -> pb.SwapArea:
    message = pb.SwapArea(
        device=area.device,
        size_bytes=area.size_bytes,
        used_bytes=area.used_bytes,
        priority=area.priority,
        discard_supported=area.discard_supported,
        rotational=bool(area.rotational),
        uuid=area.uuid,
        label=area.label,
        already_active=area.already_active,
        formatted=area.formatted,
    )
    if area.discard is not None:
        message.discard = DISCARD_TO_PB[area.discard]
    return message


# cgroup v1 knobs with no cgroup v2 file: refusing them beats silently dropping them.
V1_ONLY_FIELDS = ("kernel", "kernel_tcp", "swappiness", "disable_oom_killer")


def memory_spec_from_pb(memory: pb.LinuxMemory) -> MemorySpec:
    given = [name for name in V1_ONLY_FIELDS if memory.HasField(name)]
    if given:
        values = ", ".join(f"{name}={getattr(memory, name)}" for name in given)
        raise InvalidArgument(
            f"{values}: cgroup v1 settings that cgroup v2 has no file for; leave them unset"
        )
    return MemorySpec(
        limit=memory.limit if memory.HasField("limit") else None,
        swap=memory.swap if memory.HasField("swap") else None,
        reservation=memory.reservation if memory.HasField("reservation") else None,
    )


def applied_limits_pb(applied: AppliedLimits) -> pb.AppliedLimits:
    return pb.AppliedLimits(
        memory_max=applied.memory_max,
        swap_max=applied.swap_max or "",
        memory_low=applied.memory_low,
        untouched=applied.untouched,
        created=applied.created,
    )


HUGE_ORDER = 9  # 2 MiB blocks with 4 KiB pages: pageblock_order on x86-64.


def compact_result_pb(result: CompactResult, page_size: int) -> pb.CompactResult:
    return pb.CompactResult(
        duration_us=int(result.duration_s * 1e6),
        free_blocks_before=result.free_blocks_before,
        free_blocks_after=result.free_blocks_after,
        free_huge_bytes_before=free_bytes_at_or_above(
            result.free_blocks_before, HUGE_ORDER, page_size
        ),
        free_huge_bytes_after=free_bytes_at_or_above(
            result.free_blocks_after, HUGE_ORDER, page_size
        ),
        counters=result.counters,
        shared=result.shared,
    )


def reclaim_result_pb(result: ReclaimResult) -> pb.ReclaimResult:
    return pb.ReclaimResult(
        current_before_bytes=result.current_before,
        current_after_bytes=result.current_after,
        complete=result.complete,
    )


def online_result_pb(result: OnlineResult) -> pb.OnlineMemoryResult:
    return pb.OnlineMemoryResult(
        onlined_blocks=result.onlined,
        failed_blocks=result.failed,
        block_size_bytes=result.block_size,
        mem_total_bytes=result.mem_total,
        movable_blocks=result.movable,
    )


def overhead_pb(overhead: GuestOverhead) -> pb.GuestOverhead:
    return pb.GuestOverhead(
        present_bytes=overhead.present,
        mem_total_bytes=overhead.mem_total,
        kernel_reserved_bytes=overhead.kernel_reserved,
        outside_workloads_bytes=overhead.outside_workloads,
        agent_rss_bytes=overhead.agent_rss,
        workloads_bytes=overhead.workloads,
    )
