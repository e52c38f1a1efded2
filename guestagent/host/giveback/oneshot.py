"""`guestctl give-back`: take from a guest what its agent says it can give, through its VMM.

The agent's report (MemoryInfo.giveback) says how far a balloon or a virtio-mem device can
go without reaching into the guest's working set. This asks for it, compacts the guest first
(so the pages given up lie together, as Apple's Virtualization framework asks before it
drives a balloon), sets the balloon or a virtio-mem device's requested size through the VMM
(guestagent/host/vmm/), waits until the VMM reports the device settled, compacts again (so
free page reporting can hand over what the guest freed to make room), and says what changed:
the guest's figures and the VMM's RSS before and after, as a `GiveBack` record. The
decisions are plan.py's; the VMM, the agent and /proc sit here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from guestagent.host.client import AgentClient
from guestagent.host.display import message_dict, mib
from guestagent.host.giveback.plan import (
    BALLOON,
    STILL_SECONDS,
    UNOBSERVED,
    GiveBackError,
    Step,
    pick_virtio_mem,
    plan_balloon,
    plan_virtio_mem,
    settled,
    thinned,
)
from guestagent.host.vmm.base import VirtioMemDevice, Vmm, VmmError
from guestagent.host.vmm.rss import read_vmm_memory
from guestagent.v1 import agent_pb2 as pb

POLL_SECONDS = 0.5
# The device's figure over the wait goes into the result at this spacing.
TRACE_SECONDS = 5.0
# The guest's /proc/vmstat counters the result carries before, when a device stopped short,
# and after: whether the guest was still swapping out or stalling in direct reclaim says why
# a balloon stood still (docs/giveback.md).
VMSTAT_FIELDS = ("pswpout", "pswpin", "allocstall", "compact_stall", "workingset_refault_anon")


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


@dataclass(frozen=True)
class GuestFigures:
    """The guest at one moment: MemTotal, what is free, the vmstat counters that say whether
    it is making room, and the report's give-back section (as the contract's JSON)."""

    mem_total_bytes: int
    mem_free_bytes: int
    swap_free_bytes: int
    vmstat: dict[str, int]
    giveback: dict[str, Any]


def guest_figures(info: pb.MemoryInfo) -> GuestFigures:
    return GuestFigures(
        mem_total_bytes=info.system.mem_total_bytes,
        mem_free_bytes=info.system.mem_free_bytes,
        swap_free_bytes=info.system.swap_free_bytes,
        vmstat={name: getattr(info.vmstat, name) for name in VMSTAT_FIELDS},
        giveback=message_dict(info.giveback),
    )


@dataclass(frozen=True)
class VmmRss:
    """The VMM process's VmRSS and, of it, TCG's translated code (0 under KVM and for the
    other VMMs): that buffer grows as the guest runs new code whatever the guest holds, so
    what was given back is measured without it."""

    rss_bytes: int
    tcg_code_rss_bytes: int

    @property
    def guest_bytes(self) -> int:
        """The RSS less TCG's translated code: the guest's memory and the VMM's own."""
        return self.rss_bytes - self.tcg_code_rss_bytes


def vmm_rss(pid: int) -> VmmRss:
    memory = read_vmm_memory(pid)
    return VmmRss(memory.rss, memory.tcg_code)


@dataclass(frozen=True)
class Settled:
    how: str  # "reached", "stopped" (short, and asked for where it stood), or UNOBSERVED
    seconds: float
    device_bytes: int  # Where the device ended, in the step's terms.
    trace: list[tuple[float, int]]  # (seconds, device bytes), every TRACE_SECONDS.


@dataclass(frozen=True)
class GiveBack:
    """What give-back did: the step, the guest and the VMM's RSS before, and unless a dry run,
    the two compactions, how the device settled and the guest and RSS after; `at_stop` when
    the device stood still short of the step."""

    vmm: str
    vmm_pid: int
    balloon_leaves: bool  # The VMM speaks of its balloon by what it leaves (QEMU).
    step: Step
    dry_run: bool
    before: GuestFigures
    rss_before: VmmRss
    compact: dict[str, Any] | None = None
    settled: Settled | None = None
    at_stop: GuestFigures | None = None
    compact_after: dict[str, Any] | None = None
    after: GuestFigures | None = None
    rss_after: VmmRss | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as `--json` prints it: what is not set is left out."""
        return {key: value for key, value in asdict(self).items() if value is not None}


def plan(info: pb.MemoryInfo, vmm: Vmm, options: Options) -> Step:
    if options.via == BALLOON:
        return plan_balloon(info, vmm.balloon(), vmm.balloon_leaves, options.to, options.force)
    device = pick_virtio_mem(vmm.virtio_mem(), options.device)
    return plan_virtio_mem(info, device, options.to, options.force)


def virtio_mem_device(vmm: Vmm, device_id: str) -> VirtioMemDevice:
    return pick_virtio_mem(vmm.virtio_mem(), device_id)


def device_size(vmm: Vmm, step: Step) -> int:
    """The VMM's figure for the step's device, in one read: what the balloon holds, or the
    virtio-mem device's plugged size."""
    if step.via == BALLOON:
        return vmm.balloon_taken()
    return virtio_mem_device(vmm, step.device).size


class StillMoving(GiveBackError):
    """The device had not settled by the timeout; `reached` is where it stood."""

    def __init__(self, message: str, reached: int) -> None:
        super().__init__(message)
        self.reached = reached


def apply(vmm: Vmm, step: Step) -> None:
    if step.via == BALLOON:
        vmm.set_balloon(step.value)
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
                f"{step.device} still moving after {options.settle_timeout:g} s: "
                f"{_holding(step, samples[-1][1])} of the {mib(step.value)} asked",
                samples[-1][1],
            )
        sleep(POLL_SECONDS)


def _holding(step: Step, size: int) -> str:
    """Where a device stands, in words that hold for every VMM's terms."""
    return f"holds {mib(size)}" if step.via == BALLOON else f"has {mib(size)} plugged"


def compaction(agent: Agent) -> dict[str, Any]:
    return message_dict(agent.compact())


def give_back(agent: Agent, vmm: Vmm, options: Options, pid: int | None) -> GiveBack:
    """The whole command; returns what it did. Refused and GiveBackError change nothing but
    what they say; past the settle timeout the VMM is left asking for where the device
    stood."""
    vmm_pid = pid if pid is not None else vmm.pid
    info = agent.report()
    try:
        step = plan(info, vmm, options)
    except VmmError as e:
        raise GiveBackError(str(e)) from None
    result = GiveBack(
        vmm=vmm.name,
        vmm_pid=vmm_pid,
        balloon_leaves=vmm.balloon_leaves,
        step=step,
        dry_run=options.dry_run,
        before=guest_figures(info),
        rss_before=vmm_rss(vmm_pid),
    )
    if options.dry_run:
        return result
    compacted = compaction(agent)
    at_stop = None
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
                    f"{e}; {vmm.name} now asks for {mib(e.reached)}, where it stands"
                ) from None
        if outcome == "stopped":
            try:
                # The guest as it stood still, before it is let off: what was free, whether
                # it was still swapping out or stalling, what it still counted cold.
                at_stop = guest_figures(agent.report())
            finally:
                # Left asking for more, the guest's driver keeps pressing: the balloon retries
                # its allocations every 200 ms and virtio-mem its unplugs, which pushed a guest
                # here into its hot set (seen: the hot loop 1.78x slower after). What it gave
                # is what it can. Let off even when the agent did not answer.
                apply(vmm, replace(step, value=reached))
    except VmmError as e:
        raise GiveBackError(str(e)) from None
    # And once more: the guest swapped pages out to make room and freed them scattered, and
    # free page reporting hands over only whole 2 MiB blocks (30.5 MiB lay in smaller
    # pieces after one give-back here, 2026-12-06).
    compacted_after = compaction(agent)
    return replace(
        result,
        compact=compacted,
        settled=Settled(outcome, round(seconds, 1), reached, trace),
        at_stop=at_stop,
        compact_after=compacted_after,
        after=guest_figures(agent.report()),
        rss_after=vmm_rss(vmm_pid),
    )
