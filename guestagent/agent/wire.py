"""Protobuf messages to domain values and back, so the modules stay free of gRPC.

Every request has a decoder (`*_from_pb`) that checks what protobuf cannot and returns plain
values or frozen dataclasses: ops/' specs, and linux/' selectors and trigger specs. Every
answer type is declared once with its message and encoded by the naming convention
(encoding.py); what is written out here is only what the convention cannot carry. Nothing
here computes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import Message

from guestagent.agent.encoding import declare, encode, encoder
from guestagent.agent.watch_stream import (
    WatchReason,
    WatchSpec,
    WatchUpdate,
    watch_spec,
)
from guestagent.errors import InvalidArgument, quoted
from guestagent.linux.cgroup.memory import CgroupMemory, MemoryEvents
from guestagent.linux.cgroup.name import CgroupName, cgroup_name
from guestagent.linux.confidential import Confidential
from guestagent.linux.delayacct import DELAYACCT_STALL
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.features import Absent
from guestagent.linux.memblocks import HotplugReport, RegionBlocks
from guestagent.linux.meminfo import MemoryReport, SystemMemory
from guestagent.linux.psi import Pressure, PressureLine
from guestagent.linux.swiotlb import Swiotlb
from guestagent.linux.vmstat import VmStat
from guestagent.linux.watch import PressureTriggerSpec, pressure_trigger_spec
from guestagent.ops.agent_info import AgentInfo
from guestagent.ops.compaction import CompactResult
from guestagent.ops.giveback_figures import Figure, GiveBack, GiveBackFigures, VirtioMemTarget
from guestagent.ops.hotplug import OnlineResult
from guestagent.ops.idle import IdleBin, IdleHistogram, IdleSpec, idle_spec
from guestagent.ops.info import InfoSpec, Report
from guestagent.ops.limits import AppliedLimits, MemorySpec, SetLimitsSpec
from guestagent.ops.overhead import GuestOverhead
from guestagent.ops.reclaim import ReclaimResult, ReclaimSpec
from guestagent.ops.swap_area import (
    DEFAULT_LABEL,
    DiscardPolicy,
    EnableSwapSpec,
    SwapArea,
    SwapEncryption,
)
from guestagent.ops.workingset.compaction_trigger import CompactionStatus
from guestagent.ops.workingset.policy import Mode, ReclaimPolicy
from guestagent.ops.workingset.status import (
    ReclaimOverview,
    ReclaimPolicyRequest,
    TargetStatus,
    WorkloadReclaimRequest,
)
from guestagent.v1 import agent_pb2 as pb

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

E = TypeVar("E", bound=enum.Enum)
V = TypeVar("V", bound=int)


def enum_to_pb(domain: type[E], wire: _EnumTypeWrapper[V], prefix: str) -> dict[E, V]:
    """Each member as the wire's value of the same name after `prefix` (BOTH: DISCARD_BOTH)."""
    return {member: wire.Value(prefix + member.name) for member in domain}


DISCARD_TO_PB = enum_to_pb(DiscardPolicy, pb.DiscardPolicy, "DISCARD_")
DISCARD_FROM_PB = {v: k for k, v in DISCARD_TO_PB.items()}
ENCRYPTION_FROM_PB = {
    v: k for k, v in enum_to_pb(SwapEncryption, pb.SwapEncryption, "SWAP_ENCRYPTION_").items()
}
WATCH_REASON_TO_PB = enum_to_pb(WatchReason, pb.WatchReason, "WATCH_REASON_")
RECLAIM_STATE_TO_PB = enum_to_pb(Mode, pb.ReclaimState, "RECLAIM_STATE_")


def as_is(answer: bytes) -> bytes:
    """The encoder of an answer already encoded (GetMemoryInfo's, on a reader thread)."""
    return answer


def no_arguments(
    request: pb.ListSwapsRequest | pb.OnlineMemoryRequest | pb.GetAgentInfoRequest,
) -> None:
    """The decoder of a request without fields (ListSwaps, OnlineMemory, GetAgentInfo)."""
    return None


# Names one request may carry: a pod has a few containers, a guest a few pods. Each name
# costs a handful of kernel reads, so this bounds a call's work (and its answer's size).
MAX_NAMES_PER_REQUEST = 1024


def cgroup_names(names: Sequence[str], field: str = "cgroups") -> tuple[CgroupName, ...]:
    """Names checked, each once, in the order given; bounded in number."""
    if len(names) > MAX_NAMES_PER_REQUEST:
        raise InvalidArgument(
            f"{field} has {len(names)} names, over the bound of {MAX_NAMES_PER_REQUEST} "
            "per request",
            "TOO_MANY_NAMES",
            field=field,
            metadata={"bound": MAX_NAMES_PER_REQUEST},
        )
    return tuple(dict.fromkeys(cgroup_name(name) for name in names))


def cgroups_from_pb(
    request: pb.GetMemoryInfoRequest | pb.GetReclaimStatusRequest,
) -> tuple[CgroupName, ...]:
    return cgroup_names(request.cgroups)


def idle_spec_from_pb(request: pb.GetMemoryInfoRequest | pb.WatchMemoryRequest) -> IdleSpec:
    return idle_spec(request.idle_edges_ms, request.cold_after_ms)


def memory_info_from_pb(request: pb.GetMemoryInfoRequest) -> InfoSpec:
    return InfoSpec(cgroup_names(request.cgroups), idle_spec_from_pb(request))


def workloads_from_pb(request: pb.GetGuestOverheadRequest) -> tuple[CgroupName, ...]:
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
    return ReclaimSpec(cgroup_name(request.cgroup), request.bytes, request.drop_caches)


def limit_pb(value: int | None) -> pb.Limit:
    return pb.Limit(unlimited=True) if value is None else pb.Limit(bytes=value)


def delay_stall_pb(total_us: int | None) -> pb.MemoryStall | None:
    return None if total_us is None else pb.MemoryStall(source=DELAYACCT_STALL, total_us=total_us)


def feature_pb(feature: tuple[str, Absent | None]) -> pb.Feature:
    name, absent = feature
    return pb.Feature(name=name, present=absent is None, reason=absent.reason if absent else "")


# The answers, declared once each (encoding.py); what is named here is what the naming
# convention cannot carry.
declare(Absent, pb.Absent)
declare(PressureLine, pb.PressureLine)
declare(Pressure, pb.Pressure)
declare(MemoryEvents, pb.MemoryEvents)
declare(SystemMemory, pb.SystemMemory, off_wire={"lru_anon", "lru_file", "reclaimable_slab"})
declare(VmStat, pb.VmStat)
declare(
    CgroupMemory,
    pb.CgroupMemory,
    by_hand={
        "max": ("max", limit_pb),
        "high": ("high", limit_pb),
        "swap_current_bytes": ("swap", lambda swap: swap and swap.current),
        "swap_max": ("swap", lambda swap: swap and limit_pb(swap.max)),
        "delay_stall": ("delay_stall_us", delay_stall_pb),
    },
    off_wire={"lru_anon", "lru_file"},
    elsewhere={"idle", "giveback"},  # The idle report's, by add_idle_pb.
)
declare(HotplugReport, pb.MemoryHotplug, renamed={"virtio_mem": "regions"})
declare(
    RegionBlocks,
    pb.VirtioMemRegion,
    by_hand={
        "device": ("region", lambda region: region.device),
        "start_address": ("region", lambda region: region.start),
        "region_bytes": ("region", lambda region: region.size),
    },
    renamed={"plugged_bytes": "added"},
)
declare(
    MemoryReport,
    pb.MemoryInfo,
    by_hand={"delay_stall": ("delay_stall_us", delay_stall_pb)},
    renamed={"removed_cgroups": "removed"},
    # The rest of the answer's (report_pb).
    elsewhere={
        "reason",
        "changed_cgroups",
        "reclaim",
        "state_unavailable",
        "confidential",
        "idle",
        "giveback",
    },
)
declare(Confidential, pb.ConfidentialGuest)
declare(IdleBin, pb.IdleBin)
declare(IdleHistogram, pb.IdleHistogram)
declare(Figure, pb.Figure)
declare(VirtioMemTarget, pb.VirtioMemTarget)
declare(GiveBack, pb.GiveBack)
declare(
    AgentInfo,
    pb.AgentInfo,
    by_hand={"features": ("features", lambda features: [feature_pb(f) for f in features])},
)


def add_idle_pb(message: pb.MemoryInfo, idle: GiveBackFigures) -> None:
    """The idle histograms and give-back figures into a report (its cgroups in order)."""
    if idle.idle is not None:
        message.idle.CopyFrom(encode(idle.idle, pb.IdleHistogram))
    message.giveback.CopyFrom(encode(idle.giveback, pb.GiveBack))
    for cgroup, figures in zip(message.cgroups, idle.cgroups, strict=True):
        if figures.idle is not None:
            cgroup.idle.CopyFrom(encode(figures.idle, pb.IdleHistogram))
        cgroup.giveback.CopyFrom(encode(figures.giveback, pb.GiveBack))
    known = {a.feature for a in message.absent}
    if idle.absent is not None and idle.absent.feature not in known:
        message.absent.append(encode(idle.absent, pb.Absent))


def memory_info_pb(report: MemoryReport) -> pb.MemoryInfo:
    return encode(report, pb.MemoryInfo)


def report_pb(
    answer: Report,
    reason: pb.WatchReason.ValueType = pb.WATCH_REASON_UNSPECIFIED,
    changed: tuple[str, ...] = (),
) -> pb.MemoryInfo:
    """GetMemoryInfo's answer, and each of WatchMemory's with why it was sent."""
    message = memory_info_pb(answer.report)
    message.reason = reason
    message.changed_cgroups.extend(changed)
    message.reclaim.extend(reclaim_target_pb(status) for status in answer.reclaim)
    message.state_unavailable = answer.state_unavailable
    message.confidential.CopyFrom(encode(answer.confidential, pb.ConfidentialGuest))
    if answer.idle is not None:
        add_idle_pb(message, answer.idle)
    return message


def watch_update_pb(update: WatchUpdate) -> pb.MemoryInfo:
    return report_pb(update.answer, WATCH_REASON_TO_PB[update.reason], update.changed)


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


def set_fields(message: Message, domain: type) -> dict[str, Any]:
    """The fields of a domain dataclass that the message sets, from its fields of the same
    names; the dataclass's defaults stand for the others."""
    names = (f.name for f in dataclasses.fields(domain))
    return {name: getattr(message, name) for name in names if message.HasField(name)}


# cgroup v1 knobs with no cgroup v2 file: refusing them beats silently dropping them.
CGROUP_V1_ONLY = ("kernel", "kernel_tcp", "swappiness", "disable_oom_killer")


def memory_spec_from_pb(memory: pb.LinuxMemory) -> MemorySpec:
    given = [name for name in CGROUP_V1_ONLY if memory.HasField(name)]  # type: ignore[arg-type]
    if given:
        values = ", ".join(f"{name}={getattr(memory, name)}" for name in given)
        raise InvalidArgument(
            f"{values}: cgroup v1 settings that cgroup v2 has no file for; leave them unset",
            "CGROUP_V1_SETTING",
            field="memory",
        )
    return MemorySpec(**set_fields(memory, MemorySpec))


def set_limits_spec_from_pb(request: pb.SetMemoryLimitsRequest) -> SetLimitsSpec:
    return SetLimitsSpec(
        cgroup_name(request.cgroup), memory_spec_from_pb(request.memory), request.create
    )


def reclaim_policy_from_pb(message: pb.ReclaimPolicy) -> ReclaimPolicy:
    """Unset fields take the defaults; validation (ranges) is the reclaimer's."""
    return ReclaimPolicy(**set_fields(message, ReclaimPolicy))


def reclaim_policy_request_from_pb(
    request: pb.SetReclaimPolicyRequest,
) -> ReclaimPolicyRequest | WorkloadReclaimRequest:
    """One cgroup's policy, or with `workloads` the workloads' (then no cgroup)."""
    policy = reclaim_policy_from_pb(request.policy)
    if not request.workloads:
        return ReclaimPolicyRequest(cgroup_name(request.cgroup), request.enabled, policy)
    if request.cgroup:
        raise InvalidArgument(
            f"cgroup {quoted(request.cgroup)} and workloads both name what to reclaim; give one",
            "INVALID_REQUEST",
            field="cgroup",
        )
    return WorkloadReclaimRequest(request.enabled, policy)


declare(SwapArea, pb.SwapArea, by_hand={"discard": ("discard", DISCARD_TO_PB.get)})
declare(AppliedLimits, pb.AppliedLimits)
declare(
    CompactResult,
    pb.CompactResult,
    by_hand={"duration_us": ("duration_s", lambda seconds: int(seconds * 1e6))},
    off_wire={"node"},  # The caller's own request.
)
declare(ReclaimResult, pb.ReclaimResult, off_wire={"cgroup"})
declare(OnlineResult, pb.OnlineMemoryResult)


declare(Swiotlb, pb.SwiotlbSize, renamed={"bytes": "size"})
declare(
    GuestOverhead,
    pb.GuestOverhead,
    by_hand={
        "swiotlb_size": ("swiotlb", lambda s: s if isinstance(s, Swiotlb) else None),
        "swiotlb_absent": ("swiotlb", lambda s: s if isinstance(s, Absent) else None),
    },
)
declare(ReclaimPolicy, pb.ReclaimPolicy)
declare(
    TargetStatus,
    pb.ReclaimTargetStatus,
    by_hand={"state": ("mode", RECLAIM_STATE_TO_PB.__getitem__)},
    renamed={"reason": "why", "effective_floor_bytes": "floor"},
)
declare(CompactionStatus, pb.ReclaimCompaction)
declare(ReclaimOverview, pb.ReclaimStatus)


def swap_list_pb(areas: list[SwapArea]) -> pb.ListSwapsResponse:
    return pb.ListSwapsResponse(areas=[swap_area_pb(a) for a in areas])


# The answers that need no more than their declaration.
agent_info_pb = encoder(pb.AgentInfo)
hotplug_pb = encoder(pb.MemoryHotplug)
swap_area_pb = encoder(pb.SwapArea)
applied_limits_pb = encoder(pb.AppliedLimits)
compact_result_pb = encoder(pb.CompactResult)
reclaim_result_pb = encoder(pb.ReclaimResult)
online_result_pb = encoder(pb.OnlineMemoryResult)
overhead_pb = encoder(pb.GuestOverhead)
reclaim_target_pb = encoder(pb.ReclaimTargetStatus)
reclaim_status_pb = encoder(pb.ReclaimStatus)
