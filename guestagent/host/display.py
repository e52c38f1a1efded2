"""Human-readable text for guestctl: pure functions from messages to lines."""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from guestagent.sizes import MIB
from guestagent.v1 import agent_pb2 as pb

# MemoryInfo.giveback's figures, in the order every view lists them.
GivebackFigure = Literal["free_reportable", "free_fragmented", "cold", "safe_balloon_target"]
GIVEBACK_FIGURES: tuple[GivebackFigure, ...] = get_args(GivebackFigure)


def message_dict(message: Any, every_field: bool = False) -> dict[str, Any]:
    """A message as a dict under its proto field names; `every_field` adds the unset ones."""
    # Here, not at the top: only --json output and give-back's records read it, never the
    # node daemon.
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=every_field,
    )


def as_json(message: Any) -> str:
    return json.dumps(message_dict(message, every_field=True), indent=2)


def mib(value: int) -> str:
    return f"{value / MIB:,.1f} MiB"


def limit_text(limit: pb.Limit) -> str:
    return "max" if limit.unlimited else mib(limit.bytes)


def delay_stall_text(stall: pb.MemoryStall) -> str:
    return f"{stall.total_us / 1e6:.3f} s in all ({stall.source}, summed over tasks)"


def pressure_text(pressure: pb.Pressure) -> str:
    return (
        f"some avg10={pressure.some.avg10:.2f} avg60={pressure.some.avg60:.2f} "
        f"full avg10={pressure.full.avg10:.2f} avg60={pressure.full.avg60:.2f}"
    )


def memory_info_text(info: pb.MemoryInfo) -> str:
    system = info.system
    lines = [
        f"memory   total {mib(system.mem_total_bytes)}  free {mib(system.mem_free_bytes)}  "
        f"available {mib(system.mem_available_bytes)}",
        f"         buffers {mib(system.buffers_bytes)}  cached {mib(system.cached_bytes)}  "
        f"shmem {mib(system.shmem_bytes)}",
        f"swap     total {mib(system.swap_total_bytes)}  free {mib(system.swap_free_bytes)}",
        "pressure " + (pressure_text(info.pressure) if info.HasField("pressure") else "(no PSI)"),
    ]
    if info.HasField("delay_stall"):
        lines.append(f"stall    {delay_stall_text(info.delay_stall)}")
    if info.HasField("confidential"):
        lines.append(
            f"guest    confidential {info.confidential.platform} ({info.confidential.evidence})"
        )
    lines += [f"absent   {a.feature}: {a.reason}" for a in info.absent]
    if info.HasField("hotplug"):
        lines += hotplug_lines(info.hotplug)
    for cgroup in info.cgroups:
        swap = (
            f"swap {mib(cgroup.swap_current_bytes)} / {limit_text(cgroup.swap_max)}"
            if cgroup.HasField("swap_max")
            else "swap (no accounting)"
        )
        events = cgroup.events
        lines += [
            f"cgroup {cgroup.path}",
            f"  memory {mib(cgroup.current_bytes)} / max {limit_text(cgroup.max)}  "
            f"high {limit_text(cgroup.high)}  low {mib(cgroup.low_bytes)}  {swap}",
            f"  anon {mib(cgroup.anon_bytes)}  file {mib(cgroup.file_bytes)}  events "
            f"low={events.low} high={events.high} max={events.max} oom={events.oom} "
            f"oom_kill={events.oom_kill}",
        ]
        if cgroup.HasField("pressure"):
            lines.append(f"  pressure {pressure_text(cgroup.pressure)}")
        if cgroup.HasField("delay_stall"):
            lines.append(f"  stall {delay_stall_text(cgroup.delay_stall)}")
        if cgroup.HasField("idle"):
            lines.append(f"  idle {idle_text(cgroup.idle, cgroup.giveback)}")
    if info.HasField("idle"):
        lines.append(f"idle     {idle_text(info.idle, info.giveback)}")
    if info.HasField("giveback"):
        lines += giveback_lines(info.giveback)
    if info.HasField("vmstat"):
        lines.append(vmstat_text(info.vmstat))
    lines += [reclaim_target_text(target) for target in info.reclaim]
    return "\n".join(lines)


def age_text(ms: int) -> str:
    """An idle-age bound as the flag takes it, shortened: 1s, 90s, 5m, 1500ms."""
    if ms % 60_000 == 0 and ms >= 60_000 * 5:
        return f"{ms // 60_000}m"
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def idle_text(idle: pb.IdleHistogram, giveback: pb.GiveBack) -> str:
    """One line: anon+file MiB per bin by its lower bound, and the cold figure."""
    bins = "  ".join(
        f">={age_text(b.idle_at_least_ms)} {(b.anon_bytes + b.file_bytes) / MIB:,.0f}"
        f"({b.anon_bytes / MIB:,.0f}a)"
        for b in idle.bins
    )
    cold = f"  cold {mib(giveback.cold.bytes)}" if giveback.HasField("cold") else ""
    return f"MiB by idle age: {bins}{cold}"


def giveback_lines(giveback: pb.GiveBack) -> list[str]:
    figures = [
        (name, getattr(giveback, name)) for name in GIVEBACK_FIGURES if giveback.HasField(name)
    ]
    lines = [f"giveback {name} {mib(f.bytes)}: {f.reason}" for name, f in figures]
    lines += [
        f"giveback virtio-mem {t.device} plugged {mib(t.plugged_bytes)} safe requested "
        f"{mib(t.safe_requested_size.bytes)}: {t.safe_requested_size.reason}"
        for t in giveback.virtio_mem
    ]
    return lines


def vmstat_text(vmstat: pb.VmStat) -> str:
    return (
        f"vmstat   pswpin {vmstat.pswpin}  pswpout {vmstat.pswpout}  "
        f"pgmajfault {vmstat.pgmajfault}  refault anon {vmstat.workingset_refault_anon} "
        f"file {vmstat.workingset_refault_file}  oom_kill {vmstat.oom_kill}  "
        f"allocstall {vmstat.allocstall}  compact_stall {vmstat.compact_stall}"
    )


def reclaim_target_text(target: pb.ReclaimTargetStatus) -> str:
    state = pb.ReclaimState.Name(target.state).removeprefix("RECLAIM_STATE_").lower()
    policy = target.policy
    what = target.cgroup or "workloads"  # The workloads policy names no cgroup.
    # Which way the last step went (an agent older than the field does not say).
    last = f" ({target.last_step}, {target.last_step_us / 1000:.0f} ms)" if target.last_step else ""
    return (
        f"reclaim {what}: {state} ({target.reason})\n"
        f"  reclaimed {mib(target.reclaimed_total_bytes)} in total (evicted cold "
        f"{mib(target.evicted_cold_total_bytes)}, probed {mib(target.probed_total_bytes)}), "
        f"{mib(target.reclaimed_last_bytes)} last step{last}; stall {target.last_stall_us} us, "
        f"refaults {mib(target.last_refault_bytes)}; memory {mib(target.current_bytes)}, "
        f"floor {mib(target.effective_floor_bytes)}; {target.intervals} intervals\n"
        f"  policy interval {policy.interval_ms} ms  stall target {policy.stall_target_us} us  "
        f"max step {policy.max_step_fraction:g}  floor {mib(policy.floor_bytes)}  "
        f"anon {'on' if policy.anon else 'off'}  refault guard {policy.refault_guard_fraction:g}  "
        f"cold after {policy.cold_after_ms / 1000:g} s"
        + (f"\n  runs on {', '.join(target.signals)}" if target.signals else "")
        + "".join(f"\n  without {a.feature}: {a.reason}" for a in target.absent)
    )


def reclaim_status_text(status: pb.ReclaimStatus) -> str:
    lines = [reclaim_target_text(t) for t in status.targets] or ["no cgroup has a policy"]
    compaction = status.compaction
    lines.append(f"compaction: {compaction.runs} run(s); last check: {compaction.last_decision}")
    return "\n".join(lines)


def hotplug_lines(hotplug: pb.MemoryHotplug) -> list[str]:
    block = hotplug.block_size_bytes
    lines = [
        f"hotplug  blocks of {mib(block)}: movable {hotplug.movable_blocks} "
        f"({mib(hotplug.movable_blocks * block)}, unpluggable)  normal {hotplug.normal_blocks}  "
        f"offline {hotplug.offline_blocks}"
    ]
    for region in hotplug.virtio_mem:
        lines.append(
            f"  {region.device} at {region.start_address:#x}: plugged "
            f"{mib(region.plugged_bytes)} of {mib(region.region_bytes)}  blocks movable "
            f"{region.movable_blocks}  normal {region.normal_blocks}  "
            f"offline {region.offline_blocks}"
        )
    return lines


def swap_area_text(area: pb.SwapArea) -> str:
    discard = (
        pb.DiscardPolicy.Name(area.discard).removeprefix("DISCARD_").lower()
        if area.HasField("discard")
        else "unknown"
    )
    rotational = str(int(area.rotational)) if area.HasField("rotational") else "unknown"
    state = "already active" if area.already_active else ("formatted" if area.formatted else "")
    return (
        f"{area.device}  {mib(area.size_bytes)} (used {mib(area.used_bytes)})  "
        f"priority {area.priority}  discard {discard}"
        f"{'' if area.discard_supported else ' (device cannot discard)'}  "
        f"rotational {rotational}  uuid {area.uuid or '-'}  label {area.label or '-'}"
        + (f"  encrypted: {area.mapping} over {area.backing_device}" if area.encrypted else "")
        + (f"  [{state}]" if state else "")
    )


def limits_text(cgroup: str, applied: pb.AppliedLimits) -> str:
    untouched = f"  (untouched: {', '.join(applied.untouched)})" if applied.untouched else ""
    return (
        f"{cgroup}{' (created)' if applied.created else ''}: memory.max {applied.memory_max}  "
        f"memory.swap.max {applied.swap_max or '(no swap accounting)'}  "
        f"memory.low {applied.memory_low}{untouched}"
    )


def compact_text(result: pb.CompactResult) -> str:
    shared = " (joined a run already under way)" if result.shared else ""
    counters = " ".join(
        f"{k.removeprefix('compact_')}={v}" for k, v in sorted(result.counters.items()) if v
    )
    return (
        f"compacted in {result.duration_us / 1000:.0f} ms{shared}: free memory in blocks of "
        f"2 MiB or more {mib(result.free_huge_bytes_before)} -> "
        f"{mib(result.free_huge_bytes_after)}\n"
        f"free blocks per order before {list(result.free_blocks_before)}\n"
        f"free blocks per order after  {list(result.free_blocks_after)}\n"
        f"counters {counters or '(no change)'}"
    )


def reclaim_text(cgroup: str, result: pb.ReclaimResult) -> str:
    partial = "" if result.complete else " (partial: the kernel could not reclaim all of it)"
    return (
        f"{cgroup}: memory.current {mib(result.current_before_bytes)} -> "
        f"{mib(result.current_after_bytes)}{partial}"
    )


def online_text(result: pb.OnlineMemoryResult) -> str:
    failed = f"; failed: {', '.join(result.failed_blocks)}" if result.failed_blocks else ""
    return (
        f"onlined {len(result.onlined_blocks)} blocks of {mib(result.block_size_bytes)} "
        f"({len(result.movable_blocks)} movable); "
        f"MemTotal now {mib(result.mem_total_bytes)}{failed}"
    )


def swiotlb_text(result: pb.GuestOverhead) -> str:
    which = result.WhichOneof("swiotlb")
    if which == "swiotlb_size":
        return f"swiotlb {mib(result.swiotlb_size.bytes)} (from {result.swiotlb_size.source})"
    if which == "swiotlb_absent":
        return f"swiotlb unknown: {result.swiotlb_absent.reason}"
    return "swiotlb not reported (an older agent)"


def overhead_text(result: pb.GuestOverhead) -> str:
    return (
        f"present {mib(result.present_bytes)}  MemTotal {mib(result.mem_total_bytes)}  "
        f"kernel reserved {mib(result.kernel_reserved_bytes)}, of which {swiotlb_text(result)}\n"
        f"used outside workloads {mib(result.outside_workloads_bytes)} (agent RSS "
        f"{mib(result.agent_rss_bytes)})  workloads {mib(result.workloads_bytes)}"
    )
