"""Domain values to protobuf messages. Kept out of the modules so they stay free of gRPC."""

from __future__ import annotations

from guestagent.meminfo import CgroupMemory, MemoryReport, Pressure, PressureLine
from guestagent.v1 import agent_pb2 as pb


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
