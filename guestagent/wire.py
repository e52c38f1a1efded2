"""Protobuf messages to domain values and back, so the modules stay free of gRPC."""

from __future__ import annotations

from guestagent.blockdev import DeviceSelector
from guestagent.errors import InvalidArgument
from guestagent.meminfo import CgroupMemory, MemoryReport, Pressure, PressureLine
from guestagent.swap import DEFAULT_LABEL, DiscardPolicy, EnableSwapSpec, SwapArea
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


def memory_info_pb(
    report: MemoryReport,
    reason: pb.WatchReason = pb.WATCH_REASON_UNSPECIFIED,
    changed: tuple[str, ...] = (),
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
