"""`guestctl give-back`: take from a guest what its agent says it can give, through its VMM.

The agent's report (MemoryInfo.giveback) says how far a balloon or a virtio-mem device can
go without reaching into the guest's working set. This asks for it, compacts the guest first
(so the pages given up lie together, as Apple's Virtualization framework asks before it
drives a balloon), sets the balloon or a virtio-mem device's requested size through the VMM
(QEMU over QMP, Cloud Hypervisor or Firecracker over their REST APIs: guestagent/host/vmm.py),
waits until the VMM reports the device settled, compacts again (so free page reporting can
hand over what the guest freed to make room), and says what changed: the guest's figures
and the VMM's RSS before and after. The decisions are pure functions over plain values; the
VMM, the agent and /proc sit in `give_back` and the backends.

Sizes are in the VMM's terms, as `--to` takes them: QEMU's balloon by what it leaves (the
guest's RAM less the balloon, query-balloon's `actual`), Cloud Hypervisor's and
Firecracker's by what it takes (`desired_balloon`, `amount_mib` in bytes); virtio-mem by the
device's requested size. The agent's safe balloon target is a MemTotal; what the balloon may
take is what it holds now plus MemTotal less the target, with deflate-on-oom off (the
balloon lowers MemTotal as it inflates) or on (MemTotal stays, and the balloon's pages count
as the guest's unreclaimable kernel memory, so the target rises by them): the same sum.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from google.protobuf.json_format import MessageToDict

from guestagent.host.client import AgentClient
from guestagent.host.display import GIVEBACK_FIGURES, mib
from guestagent.host.units import round_down, round_up
from guestagent.host.vmm import Balloon, VirtioMemDevice, Vmm, VmmError
from guestagent.host.vmm_memory import read_vmm_memory
from guestagent.v1 import agent_pb2 as pb

BALLOON, VIRTIO_MEM = "balloon", "virtio-mem"
# How long the VMM's figure must hold still, short of the target, to count as settled: a
# balloon inflating into a guest that must swap to make room moves in bursts. In a TCG guest
# on a busy host one balloon stood still for 30 s, 150 MiB short, and was taken as stopped
# (2026-12-06); in another it moved 4 MiB in 55 s, the last 25 s still, then took the
# remaining 104 MiB in 8 s (the trace in docs/giveback.md).
STILL_SECONDS = 60.0
POLL_SECONDS = 0.5
# The device's figure over the wait goes into the result at this spacing.
TRACE_SECONDS = 5.0
# The guest's /proc/vmstat counters the result carries before, when a device stopped short,
# and after: whether the guest was still swapping out or stalling in direct reclaim says why
# a balloon stood still (docs/giveback.md).
VMSTAT_FIELDS = ("pswpout", "pswpin", "allocstall", "compact_stall", "workingset_refault_anon")


class GiveBackError(Exception):
    """The command cannot go on (no figure, no such device, the VMM never settled): exit 1."""


class Refused(Exception):
    """A size below the safe figure, or none to check it against, without --force: exit 2."""


@dataclass(frozen=True)
class Step:
    """What give-back asks of the VMM, all in the device's own terms (see the module's doc)."""

    via: str
    device: str  # "balloon", or the virtio-mem device's id
    current: int  # The balloon's or the device's size, before.
    value: int  # What the VMM is asked for.
    safe: int | None  # The agent's safe figure in the same terms; None without one.
    reason: str  # The agent's reason for it.
    forced: bool = False
    # The balloon's sizes are in what it leaves of this RAM (QEMU), else 0: what it takes.
    leaves_of: int = 0
    # False when the VMM reports only what it asked (Firecracker without balloon statistics).
    observed: bool = True


def safe_balloon_taken(info: pb.MemoryInfo, balloon: Balloon) -> tuple[int | None, str]:
    """(what the balloon may hold, the agent's reason); None without a figure. It holds what
    it does now plus MemTotal less the agent's target (the module's doc says why that holds
    with deflate-on-oom either way), rounded down to the API's unit (taking less is safe:
    QEMU and Cloud Hypervisor inflate by whole 4 KiB pages, Firecracker by MiB), within the
    guest's RAM."""
    if not (info.HasField("giveback") and info.giveback.HasField("safe_balloon_target")):
        return None, "the agent reports no give-back figures (an agent older than this guestctl?)"
    figure = info.giveback.safe_balloon_target
    room = info.system.mem_total_bytes - figure.bytes
    taken = round_down(balloon.taken + room, balloon.unit)
    return max(0, min(balloon.ram, taken)), figure.reason


def balloon_terms(taken: int, leaves_of: int) -> int:
    """A balloon size in its VMM's terms: what it leaves of leaves_of bytes, or what it takes."""
    return leaves_of - taken if leaves_of else taken


def check_size(
    asked: int, safe: int | None, reason: str, force: bool, what: str, leaves: bool = True
) -> tuple[int, bool]:
    """(asked, forced): refuse a size past the safe figure (below it for what a device
    leaves, above it for what a balloon takes), or with no figure to check it against,
    unless forced."""
    if safe is not None and (asked >= safe if leaves else asked <= safe):
        return asked, False
    if not force:
        if safe is None:
            raise Refused(
                f"--to {asked} ({mib(asked)}) cannot be checked: the agent reports no {what} "
                f"({reason}); nothing changed (--force to go ahead)"
            )
        side = "below" if leaves else "above"
        raise Refused(
            f"--to {asked} ({mib(asked)}) is {side} the safe {what} {safe} ({mib(safe)}): "
            f"{reason}; nothing changed (--force to go ahead)"
        )
    return asked, True


def plan_balloon(
    info: pb.MemoryInfo, balloon: Balloon, leaves: bool, to: int | None, force: bool
) -> Step:
    """The balloon step: --safe (to None) takes the agent's figure, --to a size in the VMM's
    terms (what it leaves when `leaves`, QEMU's; else what it takes); never more than the
    guest's RAM, as every VMM caps it there too."""
    leaves_of = balloon.ram if leaves else 0
    safe_taken, reason = safe_balloon_taken(info, balloon)
    safe = None if safe_taken is None else balloon_terms(safe_taken, leaves_of)
    current = balloon_terms(balloon.taken, leaves_of)
    if to is None:
        if safe is None:
            raise GiveBackError(f"--safe: {reason}")
        return Step(
            BALLOON, BALLOON, current, safe, safe, reason, False, leaves_of, balloon.observed
        )
    if leaves:
        asked = min(round_up(to, balloon.unit), balloon.ram)
    else:
        asked = min(round_down(to, balloon.unit), balloon.ram)
    value, forced = check_size(asked, safe, reason, force, "balloon size", leaves)
    return Step(BALLOON, BALLOON, current, value, safe, reason, forced, leaves_of, balloon.observed)


def pick_virtio_mem(devices: Sequence[VirtioMemDevice], wanted: str | None) -> VirtioMemDevice:
    """The device named, or the only one."""
    if wanted is not None:
        for device in devices:
            if device.id == wanted:
                return device
        known = ", ".join(d.id for d in devices) or "none"
        raise GiveBackError(f"no virtio-mem device {wanted!r} in the VMM (it has: {known})")
    if len(devices) != 1:
        known = ", ".join(d.id for d in devices) or "none"
        raise GiveBackError(f"name a virtio-mem device with --device (the VMM has: {known})")
    return devices[0]


def safe_requested_size(info: pb.MemoryInfo, device: VirtioMemDevice) -> pb.Figure | None:
    """The agent's figure for the device: the guest names it (virtio4), QEMU by its id; the
    region's start address is what both know. A VMM that does not report the address
    (Cloud Hypervisor, Firecracker) is matched only when the guest has one device."""
    if device.memaddr is None:
        names = [r.device for r in info.hotplug.virtio_mem]
        names = names if len(names) == 1 else []
    else:
        names = [r.device for r in info.hotplug.virtio_mem if r.start_address == device.memaddr]
    for target in info.giveback.virtio_mem:
        if target.device in names and target.HasField("safe_requested_size"):
            return target.safe_requested_size
    return None


def _where(device: VirtioMemDevice) -> str:
    if device.memaddr is None:
        return f"{device.id} (the VMM does not say where it starts, so only one may be in use)"
    return f"the device at {device.memaddr:#x}"


def safe_virtio_mem(info: pb.MemoryInfo, device: VirtioMemDevice) -> tuple[int | None, str]:
    """(the device's safe requested size, reason), rounded up to the device's block (VMMs
    take only whole blocks, and rounding up never goes below a figure); None without one."""
    figure = safe_requested_size(info, device)
    if figure is None:
        return None, f"the agent reports no safe requested size for {_where(device)}"
    # The guest counts whole memory blocks added; the VMM's size may be less (a block partly
    # plugged): asking for more than it has would plug memory, not give it back.
    return min(round_up(figure.bytes, device.block_size), device.size), figure.reason


def plan_virtio_mem(
    info: pb.MemoryInfo, device: VirtioMemDevice, to: int | None, force: bool
) -> Step:
    """The virtio-mem step, in whole blocks of the device."""
    safe, reason = safe_virtio_mem(info, device)
    if to is None:
        if safe is None:
            raise GiveBackError(f"--safe: {reason}")
        return Step(VIRTIO_MEM, device.id, device.size, safe, safe, reason)
    asked = round_up(to, device.block_size)
    if asked > device.max_size:
        raise Refused(f"--to {asked} ({mib(asked)}) is above {device.id}'s {mib(device.max_size)}")
    value, forced = check_size(asked, safe, reason, force, "requested size")
    return Step(VIRTIO_MEM, device.id, device.size, value, safe, reason, forced)


# How a balloon settled when its VMM reports only what it was asked (Firecracker without
# balloon statistics): not waited for, as nothing shows what it holds.
UNOBSERVED = "unobserved"


def settled(samples: Sequence[tuple[float, int]], target: int, still_seconds: float) -> str | None:
    """ "reached" once the VMM's figure is the target, "stopped" once it has not moved for
    still_seconds short of it (the guest gave what it could); None while it moves."""
    if not samples:
        return None
    now, last = samples[-1]
    if last == target:
        return "reached"
    since = now
    for seen, value in reversed(samples):
        if value != last:
            break
        since = seen
    return "stopped" if now - since >= still_seconds else None


class Agent(Protocol):
    """What give-back asks of the agent."""

    def report(self) -> pb.MemoryInfo: ...

    def compact(self) -> pb.CompactResult: ...


@dataclass(frozen=True)
class ClientAgent:
    """The agent through guestctl's client, its report asked with the cold threshold."""

    client: AgentClient
    cold_after_ms: int

    def report(self) -> pb.MemoryInfo:
        return self.client.info(cold_after_ms=self.cold_after_ms)

    def compact(self) -> pb.CompactResult:
        return self.client.compact()


@dataclass(frozen=True)
class Options:
    via: str
    to: int | None  # None: --safe
    force: bool
    dry_run: bool
    device: str | None
    settle_timeout: float
    still_seconds: float = STILL_SECONDS


def qemu_rss(pid: int) -> dict[str, int]:
    """The VMM's VmRSS and, of it, TCG's translated code (0 under KVM and for the other VMMs):
    that buffer grows as the guest runs new code whatever the guest holds, so what was given
    back is measured without it. The names are QEMU's, as the first VMM's; any VMM's pid."""
    memory = read_vmm_memory(pid)
    return {"qemu_rss_bytes": memory.rss, "qemu_tcg_code_rss_bytes": memory.tcg_code}


def guest_rss(side: dict[str, Any]) -> int:
    """The VMM's RSS less TCG's translated code: the guest's memory and the VMM's own."""
    return int(side["qemu_rss_bytes"]) - int(side.get("qemu_tcg_code_rss_bytes", 0))


def plan(info: pb.MemoryInfo, vmm: Vmm, options: Options) -> Step:
    if options.via == BALLOON:
        return plan_balloon(info, vmm.balloon(), vmm.balloon_leaves, options.to, options.force)
    device = pick_virtio_mem(vmm.virtio_mem(), options.device)
    return plan_virtio_mem(info, device, options.to, options.force)


def virtio_mem_device(vmm: Vmm, device_id: str) -> VirtioMemDevice:
    return pick_virtio_mem(vmm.virtio_mem(), device_id)


def device_size(vmm: Vmm, step: Step) -> int:
    """The VMM's figure for the step's device: the balloon's size in its terms, or the
    virtio-mem device's plugged size."""
    if step.via == BALLOON:
        return balloon_terms(vmm.balloon().taken, step.leaves_of)
    return virtio_mem_device(vmm, step.device).size


class StillMoving(GiveBackError):
    """The device had not settled by the timeout; `reached` is where it stood."""

    def __init__(self, message: str, reached: int) -> None:
        super().__init__(message)
        self.reached = reached


def apply(vmm: Vmm, step: Step) -> None:
    if step.via == BALLOON:
        vmm.set_balloon(balloon_terms(step.value, step.leaves_of))
    else:
        vmm.set_virtio_mem(virtio_mem_device(vmm, step.device), step.value)


def wait_settled(
    vmm: Vmm,
    step: Step,
    options: Options,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, list[tuple[float, int]]]:
    """(how it settled, the VMM's figure at each poll, from 0 s); GiveBackError past the
    timeout."""
    started = clock()
    samples: list[tuple[float, int]] = []
    while True:
        samples.append((clock() - started, device_size(vmm, step)))
        outcome = settled(samples, step.value, options.still_seconds)
        if outcome is not None:
            return outcome, samples
        if samples[-1][0] > options.settle_timeout:
            raise StillMoving(
                f"{step.device} still moving after {options.settle_timeout:g} s: at "
                f"{mib(samples[-1][1])}, asked {mib(step.value)}",
                samples[-1][1],
            )
        sleep(POLL_SECONDS)


def thinned(samples: Sequence[tuple[float, int]], every: float) -> list[tuple[float, int]]:
    """The first sample, then one at least `every` seconds after the last kept, and the last:
    how the device moved, short enough for the command's JSON."""
    kept: list[tuple[float, int]] = []
    for sample in samples:
        if not kept or sample[0] - kept[-1][0] >= every:
            kept.append(sample)
    if samples and kept[-1] != samples[-1]:
        kept.append(samples[-1])
    return [(round(seconds, 1), size) for seconds, size in kept]


def figures(info: pb.MemoryInfo) -> dict[str, Any]:
    """The report's give-back section, MemTotal, what is free and the vmstat counters that
    say whether the guest is making room, for the before, a stop and the after."""
    return {
        "mem_total_bytes": info.system.mem_total_bytes,
        "mem_free_bytes": info.system.mem_free_bytes,
        "swap_free_bytes": info.system.swap_free_bytes,
        "vmstat": {name: getattr(info.vmstat, name) for name in VMSTAT_FIELDS},
        "giveback": MessageToDict(info.giveback, preserving_proto_field_name=True),
    }


def give_back(agent: Agent, vmm: Vmm, options: Options, pid: int | None) -> dict[str, Any]:
    """The whole command; returns what it did. Refused and GiveBackError change nothing but
    what they say; past the settle timeout the VMM is left asking for where the device
    stood."""
    vmm_pid = pid if pid is not None else vmm.pid
    info = agent.report()
    try:
        step = plan(info, vmm, options)
    except VmmError as e:
        raise GiveBackError(str(e)) from None
    result: dict[str, Any] = {
        "vmm": vmm.name,
        "step": asdict(step),
        "qemu_pid": vmm_pid,
        "dry_run": options.dry_run,
        "before": {**figures(info), **qemu_rss(vmm_pid)},
    }
    if options.dry_run:
        return result
    result["compact"] = MessageToDict(agent.compact(), preserving_proto_field_name=True)
    try:
        apply(vmm, step)
        trace: list[tuple[float, int]] = []
        if not step.observed:
            # Firecracker without balloon statistics reports what it asked as what the balloon
            # holds: a wait would end at once and call that reached, which nothing saw.
            outcome, seconds, reached = UNOBSERVED, 0.0, step.value
        else:
            try:
                outcome, samples = wait_settled(vmm, step, options)
                (seconds, reached), trace = samples[-1], thinned(samples, TRACE_SECONDS)
            except StillMoving as e:
                # As for a device that stopped short (below): left asking, the guest presses on.
                apply(vmm, replace(step, value=e.reached))
                raise GiveBackError(
                    f"{e}; {vmm.name} now asks for {mib(e.reached)}, where it stood"
                ) from None
        if outcome == "stopped":
            try:
                # The guest as it stood still, before it is let off: what was free, whether
                # it was still swapping out or stalling, what it still counted cold.
                result["at_stop"] = figures(agent.report())
            finally:
                # Left asking for more, the guest's driver keeps pressing: the balloon retries
                # its allocations every 200 ms and virtio-mem its unplugs, which pushed a guest
                # here into its hot set (seen: the hot loop 1.78x slower after). What it gave
                # is what it can. Let off even when the agent did not answer.
                apply(vmm, replace(step, value=reached))
    except VmmError as e:
        raise GiveBackError(str(e)) from None
    result["settled"] = {
        "how": outcome,
        "seconds": round(seconds, 1),
        "device_bytes": reached,
        "trace": trace,
    }
    # And once more: the guest swapped pages out to make room and freed them scattered, and
    # free page reporting hands over only whole 2 MiB blocks (30.5 MiB lay in smaller
    # pieces after one give-back here, 2026-12-06).
    result["compact_after"] = MessageToDict(agent.compact(), preserving_proto_field_name=True)
    result["after"] = {**figures(agent.report()), **qemu_rss(vmm_pid)}
    return result


def _figure_text(name: str, figure: dict[str, Any]) -> str:
    return f"  {name} {mib(int(figure.get('bytes', 0)))}: {figure.get('reason', '')}"


def _guest_text(side: dict[str, Any]) -> list[str]:
    giveback = side["giveback"]
    lines = [f"  MemTotal {mib(side['mem_total_bytes'])}"]
    for name in GIVEBACK_FIGURES:
        if name in giveback:
            lines.append(_figure_text(name, giveback[name]))
    for target in giveback.get("virtio_mem", []):
        figure = target.get("safe_requested_size", {})
        lines.append(_figure_text(f"{target['device']} safe_requested_size", figure))
    return lines


def _rss_text(side: dict[str, Any]) -> str:
    code = int(side.get("qemu_tcg_code_rss_bytes", 0))
    text = mib(int(side["qemu_rss_bytes"]))
    return f"{text} ({mib(guest_rss(side))} without TCG's translated code)" if code else text


def _compact_text(what: str, compact: dict[str, Any]) -> str:
    before = mib(int(compact.get("free_huge_bytes_before", 0)))
    after = mib(int(compact.get("free_huge_bytes_after", 0)))
    return f"{what}: free in 2 MiB blocks {before} -> {after}"


def _stop_text(before: dict[str, Any], at_stop: dict[str, Any]) -> str:
    """The guest when the device stood still: what was free and whether it was still making
    room (pages swapped out, direct-reclaim stalls since the step began)."""
    moved = {
        name: int(at_stop["vmstat"][name]) - int(before["vmstat"][name])
        for name in ("pswpout", "allocstall")
    }
    cold = at_stop["giveback"].get("cold", {})
    return (
        f"guest when it stood still: free {mib(int(at_stop['mem_free_bytes']))}, swap free "
        f"{mib(int(at_stop['swap_free_bytes']))}, cold {mib(int(cold.get('bytes', 0)))}; since "
        f"the step began {moved['pswpout']} pages swapped out, {moved['allocstall']} "
        "direct-reclaim stalls"
    )


def _what(vmm: str, step: dict[str, Any]) -> str:
    if step["via"] != BALLOON:
        return f"{vmm} virtio-mem {step['device']} requested size"
    terms = "what it leaves the guest" if step.get("leaves_of") else "what it takes"
    return f"{vmm} balloon ({terms})"


def result_text(result: dict[str, Any]) -> str:
    step = result["step"]
    vmm = result.get("vmm", "qemu")
    what = _what(vmm, step)
    safe = "none reported" if step["safe"] is None else mib(step["safe"])
    forced = " (--force: below the safe figure)" if step["forced"] else ""
    lines = [
        f"{what}: {mib(step['current'])} -> {mib(step['value'])}{forced}; safe {safe}",
        "guest before:",
        *_guest_text(result["before"]),
        f"{vmm} (pid {result['qemu_pid']}) RSS before {_rss_text(result['before'])}",
    ]
    if result["dry_run"]:
        return "\n".join([*lines, "dry run: nothing compacted, nothing asked of the VMM"])
    settled_ = result["settled"]
    short = settled_["how"] == "stopped"
    if settled_["how"] == UNOBSERVED:
        how = (
            f"{step['device']} asked for {mib(settled_['device_bytes'])}, not seen to settle: "
            f"{vmm} reports only what it asked (no balloon statistics; "
            "stats_polling_interval_s > 0 at boot shows what the guest handed over)"
        )
    else:
        how = (
            f"{step['device']} {settled_['how']} at {mib(settled_['device_bytes'])} after "
            f"{settled_['seconds']} s"
            + ("; asked for that instead, so the guest is not pressed further" if short else "")
        )
    stood_still = [_stop_text(result["before"], result["at_stop"])] if "at_stop" in result else []
    lines += [
        _compact_text("compacted", result["compact"]),
        how,
        *stood_still,
        _compact_text("compacted again", result["compact_after"]),
        "guest after:",
        *_guest_text(result["after"]),
        f"{vmm} RSS after {_rss_text(result['after'])} "
        f"({mib(guest_rss(result['before']) - guest_rss(result['after']))} given back)",
    ]
    return "\n".join(lines)
