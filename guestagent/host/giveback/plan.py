"""What give-back asks of the VMM, decided from the agent's report and the device as the VMM
reports it: pure functions over plain values.

One unit throughout: a balloon in bytes it takes from the guest, a virtio-mem device in bytes
it has plugged. `--to` is read in the VMM's own terms (QEMU's balloon by what it leaves the
guest, the others' by what it takes) and converted once, here, as the balloon is planned; a
size is shown in those terms again only in what a person reads (`balloon_shown`).

The agent's safe balloon target is a MemTotal; what the balloon may take is what it holds now
plus MemTotal less the target, with deflate-on-oom off (the balloon lowers MemTotal as it
inflates) or on (MemTotal stays, and the balloon's pages count as the guest's unreclaimable
kernel memory, so the target rises by them): the same sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guestagent.host.display import mib
from guestagent.host.units import round_down, round_up
from guestagent.host.vmm.base import Balloon, VirtioMemDevice
from guestagent.v1 import agent_pb2 as pb

BALLOON, VIRTIO_MEM = "balloon", "virtio-mem"
# How long the VMM's figure must hold still, short of the target, to count as settled: a
# balloon inflating into a guest that must swap to make room moves in bursts. In a TCG guest
# on a busy host one balloon stood still for 30 s, 150 MiB short, and was taken as stopped
# (2026-12-06); in another it moved 4 MiB in 55 s, the last 25 s still, then took the
# remaining 104 MiB in 8 s (the trace in docs/giveback.md).
STILL_SECONDS = 60.0
# How a balloon settled when its VMM reports only what it was asked (Firecracker without
# balloon statistics): not waited for, as nothing shows what it holds.
UNOBSERVED = "unobserved"


class GiveBackError(Exception):
    """The command cannot go on (no figure, no such device, the VMM never settled): exit 1."""


class Refused(Exception):
    """A size past the safe figure, or none to check it against, without --force: exit 2."""


@dataclass(frozen=True)
class Step:
    """What give-back asks of the VMM: a balloon in bytes it takes, a virtio-mem device in
    bytes plugged."""

    via: str
    device: str  # "balloon", or the virtio-mem device's id
    current: int  # The balloon's or the device's size, before.
    value: int  # What the VMM is asked for.
    safe: int | None  # The agent's safe figure in the same terms; None without one.
    reason: str  # The agent's reason for it.
    forced: bool = False
    # The RAM a balloon takes from (QEMU's terms count what it leaves of it); 0 for virtio-mem.
    ram: int = 0
    # False when the VMM reports only what it asked (Firecracker without balloon statistics).
    observed: bool = True


def balloon_shown(taken: int, ram: int, leaves: bool) -> int:
    """A balloon's size as its VMM speaks it, for a person: what it leaves of `ram` (QEMU's
    terms), or what it takes."""
    return ram - taken if leaves else taken


def balloon_asked(to: int, balloon: Balloon, leaves: bool) -> int:
    """--to, given in the VMM's terms, as bytes the balloon takes, within the guest's RAM as
    every VMM caps it: what QEMU's leaves is rounded up to the API's unit and what the
    others' takes rounded down (taking less is the safe side)."""
    if leaves:
        return balloon.ram - min(round_up(to, balloon.unit), balloon.ram)
    return min(round_down(to, balloon.unit), balloon.ram)


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


def refusal(asked: int, safe: int | None, reason: str, what: str, side: str) -> Refused:
    """Why --to is refused, both sizes as the person typed them."""
    if safe is None:
        return Refused(
            f"--to {asked} ({mib(asked)}) cannot be checked: the agent reports no {what} "
            f"({reason}); nothing changed (--force to go ahead)"
        )
    return Refused(
        f"--to {asked} ({mib(asked)}) is {side} the safe {what} {safe} ({mib(safe)}): "
        f"{reason}; nothing changed (--force to go ahead)"
    )


def plan_balloon(
    info: pb.MemoryInfo, balloon: Balloon, leaves: bool, to: int | None, force: bool
) -> Step:
    """The balloon step: --safe (to None) takes the agent's figure, --to a size in the VMM's
    terms (what it leaves when `leaves`, QEMU's; else what it takes); more than the figure
    allows only with force."""
    safe, reason = safe_balloon_taken(info, balloon)

    def step(value: int, forced: bool = False) -> Step:
        return Step(
            BALLOON,
            BALLOON,
            balloon.taken,
            value,
            safe,
            reason,
            forced,
            ram=balloon.ram,
            observed=balloon.observed,
        )

    if to is None:
        if safe is None:
            raise GiveBackError(f"--safe: {reason}")
        return step(safe)
    asked = balloon_asked(to, balloon, leaves)
    if safe is not None and asked <= safe:
        return step(asked)
    if not force:
        shown = None if safe is None else balloon_shown(safe, balloon.ram, leaves)
        asked_shown = balloon_shown(asked, balloon.ram, leaves)
        raise refusal(asked_shown, shown, reason, "balloon size", "below" if leaves else "above")
    return step(asked, forced=True)


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
    if safe is not None and asked >= safe:
        return Step(VIRTIO_MEM, device.id, device.size, asked, safe, reason)
    if not force:
        raise refusal(asked, safe, reason, "requested size", "below")
    return Step(VIRTIO_MEM, device.id, device.size, asked, safe, reason, forced=True)


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
