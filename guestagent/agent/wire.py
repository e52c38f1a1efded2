"""Protobuf messages to domain values and back, so the modules stay free of gRPC.

Every request has a decoder (`*_from_pb`) that checks what protobuf cannot and returns plain
values or frozen dataclasses; every response has an encoder (`*_pb`). Nothing here computes,
and the request and answer types belong to the operations (ops/).
"""

from __future__ import annotations

from collections.abc import Sequence

from guestagent.agent.watch_stream import (
    WatchReason,
    WatchSpec,
    WatchUpdate,
    watch_spec,
)
from guestagent.errors import InvalidArgument
from guestagent.linux.blockdev import DeviceSelector
from guestagent.linux.cgroups import canonical_cgroup_name
from guestagent.linux.delayacct import DELAYACCT_STALL
from guestagent.linux.features import Absent
from guestagent.linux.memblocks import HotplugReport
from guestagent.linux.memcg import CgroupMemory
from guestagent.linux.meminfo import MemoryReport
from guestagent.linux.psi import Pressure, PressureLine
from guestagent.linux.vmstat import VmStat
from guestagent.linux.watch import PressureTriggerSpec, pressure_trigger_spec
from guestagent.ops.agent_info import AgentInfo
from guestagent.ops.compaction import CompactResult
from guestagent.ops.giveback import Figure, GiveBack, IdleReport
from guestagent.ops.hotplug import OnlineResult
from guestagent.ops.idle import IdleHistogram, IdleSpec, idle_spec
from guestagent.ops.info import InfoSpec, Report
from guestagent.ops.limits import AppliedLimits, MemorySpec, SetLimitsSpec
from guestagent.ops.overhead import GuestOverhead
from guestagent.ops.reclaim import ReclaimResult, ReclaimSpec
from guestagent.ops.swap import (
    DEFAULT_LABEL,
    DiscardPolicy,
    EnableSwapSpec,
    SwapArea,
    SwapEncryption,
)
from guestagent.ops.workingset.policy import Mode, ReclaimPolicy
from guestagent.ops.workingset.reclaimer import (
    ReclaimOverview,
    ReclaimPolicyRequest,
    TargetStatus,
)
from guestagent.v1 import agent_pb2 as pb

DISCARD_TO_PB = {
    DiscardPolicy.BOTH: pb.DISCARD_BOTH,
    DiscardPolicy.PAGES: pb.DISCARD_PAGES,
    DiscardPolicy.ONCE: pb.DISCARD_ONCE,
    DiscardPolicy.NONE: pb.DISCARD_NONE,
}
DISCARD_FROM_PB = {v: k for k, v in DISCARD_TO_PB.items()}
ENCRYPTION_FROM_PB = {
    pb.SWAP_ENCRYPTION_DEFAULT: SwapEncryption.DEFAULT,
    pb.SWAP_ENCRYPTION_NONE: SwapEncryption.NONE,
    pb.SWAP_ENCRYPTION_EPHEMERAL: SwapEncryption.EPHEMERAL,
}
WATCH_REASON_TO_PB = {
    WatchReason.INITIAL: pb.WATCH_REASON_INITIAL,
    WatchReason.INTERVAL: pb.WATCH_REASON_INTERVAL,
    WatchReason.MEMORY_EVENTS: pb.WATCH_REASON_MEMORY_EVENTS,
    WatchReason.PRESSURE: pb.WATCH_REASON_PRESSURE,
}


# ListSwaps and OnlineMemory take no arguments: their decoders have nothing to check.


def list_swaps_from_pb(request: pb.ListSwapsRequest) -> None:
    return None


def online_memory_from_pb(request: pb.OnlineMemoryRequest) -> None:
    return None


# Names one request may carry: a pod has a few containers, a guest a few pods. Each name
# costs a handful of kernel reads, so this bounds a call's work (and its answer's size).
MAX_NAMES_PER_REQUEST = 1024


def cgroup_names(names: Sequence[str], field: str = "cgroups") -> tuple[str, ...]:
    """Names in their canonical form, each once, in the order given; bounded in number."""
    if len(names) > MAX_NAMES_PER_REQUEST:
        raise InvalidArgument(
            f"{field} has {len(names)} names, over the bound of {MAX_NAMES_PER_REQUEST} "
            "per request",
            "TOO_MANY_NAMES",
            field=field,
            metadata={"bound": MAX_NAMES_PER_REQUEST},
        )
    return tuple(dict.fromkeys(canonical_cgroup_name(name) for name in names))


def cgroups_from_pb(
    request: pb.GetMemoryInfoRequest | pb.GetReclaimStatusRequest,
) -> tuple[str, ...]:
    return cgroup_names(request.cgroups)


def idle_spec_from_pb(request: pb.GetMemoryInfoRequest | pb.WatchMemoryRequest) -> IdleSpec:
    return idle_spec(request.idle_edges_ms, request.cold_after_ms)


def memory_info_from_pb(request: pb.GetMemoryInfoRequest) -> InfoSpec:
    return InfoSpec(cgroup_names(request.cgroups), idle_spec_from_pb(request))


def workloads_from_pb(request: pb.GetGuestOverheadRequest) -> tuple[str, ...]:
    return cgroup_names(request.workload_cgroups, "workload_cgroups")


def watch_spec_from_pb(request: pb.WatchMemoryRequest) -> WatchSpec:
    trigger = (
        pressure_trigger_spec(
            request.pressure_trigger.stall_us,
            request.pressure_trigger.window_us,
            request.pressure_trigger.full,
        )
        if request.HasField("pressure_trigger")
        else PressureTriggerSpec()
    )
    return watch_spec(
        cgroup_names(request.cgroups),
        request.interval_ms,
        trigger,
        request.HasField("pressure_trigger"),
        idle_spec_from_pb(request),
    )


def compact_node_from_pb(request: pb.CompactRequest) -> int | None:
    return request.node if request.HasField("node") else None


def reclaim_spec_from_pb(request: pb.ReclaimRequest) -> ReclaimSpec:
    return ReclaimSpec(canonical_cgroup_name(request.cgroup), request.bytes, request.drop_caches)


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
    if cgroup.delay_stall_us is not None:
        message.delay_stall.CopyFrom(delay_stall_pb(cgroup.delay_stall_us))
    return message


def delay_stall_pb(total_us: int) -> pb.MemoryStall:
    return pb.MemoryStall(source=DELAYACCT_STALL, total_us=total_us)


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


def idle_histogram_pb(histogram: IdleHistogram) -> pb.IdleHistogram:
    return pb.IdleHistogram(
        source=histogram.source,
        bins=[
            pb.IdleBin(
                idle_at_least_ms=b.idle_at_least_ms,
                anon_bytes=b.anon_bytes,
                file_bytes=b.file_bytes,
            )
            for b in histogram.bins
        ],
        aged_at_unix_ns=histogram.aged_at_unix_ns,
    )


def figure_pb(figure: Figure) -> pb.Figure:
    return pb.Figure(bytes=figure.bytes, reason=figure.reason)


def giveback_pb(giveback: GiveBack) -> pb.GiveBack:
    message = pb.GiveBack(
        cold_after_ms=giveback.cold_after_ms,
        virtio_mem=[
            pb.VirtioMemTarget(
                device=t.device,
                plugged_bytes=t.plugged_bytes,
                safe_requested_size=figure_pb(t.safe_requested_size),
            )
            for t in giveback.virtio_mem
        ],
    )
    for name in ("free_reportable", "free_fragmented", "cold", "safe_balloon_target"):
        figure = getattr(giveback, name)
        if figure is not None:
            getattr(message, name).CopyFrom(figure_pb(figure))
    return message


def add_idle_pb(message: pb.MemoryInfo, idle: IdleReport) -> None:
    """The idle histograms and give-back figures into a report (its cgroups in order)."""
    if idle.idle is not None:
        message.idle.CopyFrom(idle_histogram_pb(idle.idle))
    message.giveback.CopyFrom(giveback_pb(idle.giveback))
    for cgroup, figures in zip(message.cgroups, idle.cgroups, strict=True):
        if figures.idle is not None:
            cgroup.idle.CopyFrom(idle_histogram_pb(figures.idle))
        cgroup.giveback.CopyFrom(giveback_pb(figures.giveback))
    known = {a.feature for a in message.absent}
    if idle.absent is not None and idle.absent.feature not in known:
        message.absent.append(absent_pb(idle.absent))


def memory_info_pb(
    report: MemoryReport,
    reason: pb.WatchReason.ValueType = pb.WATCH_REASON_UNSPECIFIED,
    changed: tuple[str, ...] = (),
    reclaim: tuple[TargetStatus, ...] = (),
    idle: IdleReport | None = None,
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
        removed_cgroups=report.removed,
    )
    if report.pressure is not None:
        message.pressure.CopyFrom(pressure_pb(report.pressure))
    if report.delay_stall_us is not None:
        message.delay_stall.CopyFrom(delay_stall_pb(report.delay_stall_us))
    if report.hotplug is not None:
        message.hotplug.CopyFrom(hotplug_pb(report.hotplug))
    if report.vmstat is not None:
        message.vmstat.CopyFrom(vmstat_pb(report.vmstat))
    message.reclaim.extend(reclaim_target_pb(status) for status in reclaim)
    message.absent.extend(absent_pb(a) for a in report.absent)
    if idle is not None:
        add_idle_pb(message, idle)
    return message


def absent_pb(absent: Absent) -> pb.Absent:
    return pb.Absent(feature=absent.feature, reason=absent.reason)


def agent_info_from_pb(_: pb.GetAgentInfoRequest) -> None:
    return None


def agent_info_pb(info: AgentInfo) -> pb.AgentInfo:
    return pb.AgentInfo(
        version=info.version,
        contract_revision=info.contract_revision,
        features=[
            pb.Feature(name=name, present=absent is None, reason=absent.reason if absent else "")
            for name, absent in info.features
        ],
        error_domain=info.error_domain,
    )


def report_pb(answer: Report) -> pb.MemoryInfo:
    message = memory_info_pb(answer.report, reclaim=answer.reclaim, idle=answer.idle)
    message.state_unavailable = answer.state_unavailable
    message.confidential.platform = answer.confidential.platform
    message.confidential.evidence = answer.confidential.evidence
    return message


def watch_update_pb(update: WatchUpdate) -> pb.MemoryInfo:
    return memory_info_pb(
        update.report,
        WATCH_REASON_TO_PB[update.reason],
        update.changed,
        update.reclaim,
        update.idle,
    )


def vmstat_pb(vmstat: VmStat) -> pb.VmStat:
    return pb.VmStat(**vmstat.__dict__)


def selector_from_pb(message: pb.DeviceSelector) -> DeviceSelector:
    which = message.WhichOneof("device")
    if which == "path":
        return DeviceSelector(path=message.path)
    if which == "serial":
        return DeviceSelector(serial=message.serial)
    raise InvalidArgument(
        "no device given: set device.path or device.serial", "DEVICE_INVALID", field="device"
    )


def enable_swap_spec_from_pb(request: pb.EnableSwapRequest) -> EnableSwapSpec:
    if request.discard not in DISCARD_FROM_PB:
        raise InvalidArgument(
            f"discard policy {request.discard} is not one of {sorted(DISCARD_FROM_PB)}",
            "ENUM_VALUE_UNKNOWN",
            field="discard",
        )
    if request.encryption not in ENCRYPTION_FROM_PB:
        raise InvalidArgument(
            f"swap encryption {request.encryption} is not one of {sorted(ENCRYPTION_FROM_PB)}",
            "ENUM_VALUE_UNKNOWN",
            field="encryption",
        )
    return EnableSwapSpec(
        selector=selector_from_pb(request.device),
        priority=request.priority if request.HasField("priority") else None,
        discard=DISCARD_FROM_PB[request.discard],
        wait_ms=request.wait_ms,
        force=request.force,
        label=request.label or DEFAULT_LABEL,
        encryption=ENCRYPTION_FROM_PB[request.encryption],
    )


def disable_swap_from_pb(request: pb.DisableSwapRequest) -> DeviceSelector:
    return selector_from_pb(request.device)


def swap_area_pb(area: SwapArea) -> pb.SwapArea:
    message = pb.SwapArea(
        device=area.device,
        size_bytes=area.size_bytes,
        used_bytes=area.used_bytes,
        priority=area.priority,
        discard_supported=area.discard_supported,
        uuid=area.uuid,
        label=area.label,
        already_active=area.already_active,
        formatted=area.formatted,
        encrypted=area.encrypted,
        mapping=area.mapping,
        backing_device=area.backing_device,
    )
    if area.discard is not None:
        message.discard = DISCARD_TO_PB[area.discard]
    if area.rotational is not None:
        message.rotational = area.rotational
    return message


def swap_list_pb(areas: list[SwapArea]) -> pb.ListSwapsResponse:
    return pb.ListSwapsResponse(areas=[swap_area_pb(a) for a in areas])


def memory_spec_from_pb(memory: pb.LinuxMemory) -> MemorySpec:
    # cgroup v1 knobs with no cgroup v2 file: refusing them beats silently dropping them.
    v1_only = {
        "kernel": memory.HasField("kernel"),
        "kernel_tcp": memory.HasField("kernel_tcp"),
        "swappiness": memory.HasField("swappiness"),
        "disable_oom_killer": memory.HasField("disable_oom_killer"),
    }
    given = [name for name, is_set in v1_only.items() if is_set]
    if given:
        values = ", ".join(f"{name}={getattr(memory, name)}" for name in given)
        raise InvalidArgument(
            f"{values}: cgroup v1 settings that cgroup v2 has no file for; leave them unset",
            "CGROUP_V1_SETTING",
            field="memory",
        )
    return MemorySpec(
        limit=memory.limit if memory.HasField("limit") else None,
        swap=memory.swap if memory.HasField("swap") else None,
        reservation=memory.reservation if memory.HasField("reservation") else None,
    )


def set_limits_spec_from_pb(request: pb.SetMemoryLimitsRequest) -> SetLimitsSpec:
    return SetLimitsSpec(
        canonical_cgroup_name(request.cgroup), memory_spec_from_pb(request.memory), request.create
    )


def applied_limits_pb(applied: AppliedLimits) -> pb.AppliedLimits:
    return pb.AppliedLimits(
        memory_max=applied.memory_max,
        swap_max=applied.swap_max or "",
        memory_low=applied.memory_low,
        untouched=applied.untouched,
        created=applied.created,
    )


def compact_result_pb(result: CompactResult) -> pb.CompactResult:
    return pb.CompactResult(
        duration_us=int(result.duration_s * 1e6),
        free_blocks_before=result.free_blocks_before,
        free_blocks_after=result.free_blocks_after,
        free_huge_bytes_before=result.free_huge_bytes_before,
        free_huge_bytes_after=result.free_huge_bytes_after,
        counters=result.counters,
        shared=result.shared,
        huge_block_bytes=result.huge_block_bytes,
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
    message = pb.GuestOverhead(
        present_bytes=overhead.present,
        mem_total_bytes=overhead.mem_total,
        kernel_reserved_bytes=overhead.kernel_reserved,
        outside_workloads_bytes=overhead.outside_workloads,
        agent_rss_bytes=overhead.agent_rss,
        workloads_bytes=overhead.workloads,
    )
    if isinstance(overhead.swiotlb, Absent):
        message.swiotlb_absent.CopyFrom(absent_pb(overhead.swiotlb))
    else:
        message.swiotlb_size.CopyFrom(
            pb.SwiotlbSize(bytes=overhead.swiotlb.size, source=overhead.swiotlb.source)
        )
    return message


RECLAIM_STATE_TO_PB = {
    Mode.PROBING: pb.RECLAIM_STATE_PROBING,
    Mode.BACKING_OFF: pb.RECLAIM_STATE_BACKING_OFF,
    Mode.AT_FLOOR: pb.RECLAIM_STATE_AT_FLOOR,
    Mode.DISABLED: pb.RECLAIM_STATE_DISABLED,
}


def reclaim_policy_from_pb(message: pb.ReclaimPolicy) -> ReclaimPolicy:
    """Unset fields take the defaults; validation (ranges) is the reclaimer's."""
    defaults = ReclaimPolicy().__dict__
    given = {name: getattr(message, name) for name in defaults if message.HasField(name)}  # type: ignore[arg-type]
    return ReclaimPolicy(**{**defaults, **given})


def reclaim_policy_request_from_pb(request: pb.SetReclaimPolicyRequest) -> ReclaimPolicyRequest:
    return ReclaimPolicyRequest(
        canonical_cgroup_name(request.cgroup),
        request.enabled,
        reclaim_policy_from_pb(request.policy),
    )


def reclaim_policy_pb(policy: ReclaimPolicy) -> pb.ReclaimPolicy:
    return pb.ReclaimPolicy(**policy.__dict__)


def reclaim_target_pb(status: TargetStatus) -> pb.ReclaimTargetStatus:
    return pb.ReclaimTargetStatus(
        cgroup=status.cgroup,
        enabled=status.enabled,
        policy=reclaim_policy_pb(status.policy),
        state=RECLAIM_STATE_TO_PB[status.mode],
        reason=status.why,
        reclaimed_total_bytes=status.reclaimed_total,
        reclaimed_last_bytes=status.reclaimed_last,
        last_stall_us=status.last_stall_us,
        last_refault_bytes=status.last_refault_bytes,
        intervals=status.intervals,
        current_bytes=status.current,
        effective_floor_bytes=status.floor,
        signals=status.signals,
        absent=[absent_pb(a) for a in status.absent],
    )


def reclaim_status_pb(overview: ReclaimOverview) -> pb.ReclaimStatus:
    compaction = overview.compaction
    return pb.ReclaimStatus(
        targets=[reclaim_target_pb(t) for t in overview.targets],
        compaction=pb.ReclaimCompaction(
            runs=compaction.runs,
            last_decision=compaction.last_decision,
            last_run_unix_ns=compaction.last_run_unix_ns,
        ),
    )
