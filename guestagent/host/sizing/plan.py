"""The plan rules: size a pod's VM the way a Kata-style runtime does, and check the host will
not OOM-kill it.

The runtime boots the VM with `default_memory` and hotplugs the sum of the containers'
memory limits on top, in whole guest memory blocks, up to a ceiling: `default_maxmemory`,
where 0 means the host's memory, and never above the host's memory. A limit above the
ceiling is clamped (with a warning), never refused: runc would run that pod too.

On the host the VM is one process in the pod's cgroup. Once the guest has faulted in its
RAM (page cache fills free memory sooner or later) that process holds the whole VM size plus
the VMM's own memory, so the pod's cgroup limit must cover both; Kubernetes sets it to the
containers' limits plus the RuntimeClass overhead. Inside the VM, the kernel's reserve
(present - MemTotal, growing with VM size) and the guest's daemons take memory that the
containers' limits do not account for, so default_memory must hold them.

Pure functions over frozen dataclasses, in bytes; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from guestagent.errors import InvalidArgument
from guestagent.host.sizing.model import DEFAULT_MODEL, OverheadModel, ceil_mib, mib_text
from guestagent.host.units import round_down, round_up
from guestagent.sizes import MIB

# x86_64 guests hotplug and online memory in 128 MiB blocks (block_size_bytes).
DEFAULT_BLOCK_SIZE = 128 * MIB


@dataclass(frozen=True)
class Container:
    name: str
    limit: int | None = None  # bytes; None when the container has no memory limit
    request: int | None = None


@dataclass(frozen=True)
class PodSizing:
    """What the runtime is told: its configuration, the host, and the pod."""

    host_memory: int
    default_memory: int
    default_maxmemory: int = 0  # 0: the host's memory (Kata's meaning)
    containers: tuple[Container, ...] = ()
    pod_limit: int | None = None  # the pod's cgroup memory.max on the host; None: no limit
    block_size: int = DEFAULT_BLOCK_SIZE  # hotplug granularity; 0: exact


@dataclass(frozen=True)
class Hotplug:
    wanted: int  # the containers' limits, in whole blocks
    amount: int  # what is hotplugged: wanted, clamped to the ceiling
    ceiling: int  # the largest the VM may grow to
    clamped: bool


@dataclass(frozen=True)
class Plan:
    hotplug: Hotplug
    vm_size: int
    kernel: int
    daemons: int
    vmm: int
    host_usage: int  # vm_size + vmm: what the pod's cgroup holds once guest RAM is faulted in
    container_room: int  # vm_size - kernel - daemons: what the containers can have
    runtime_class_overhead: int  # MiB-rounded bytes to declare in the RuntimeClass
    pod_limit: int | None
    shortfall: int  # host_usage - pod_limit when positive, else 0
    model_source: str
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.shortfall == 0


def vm_ceiling(host_memory: int, default_maxmemory: int) -> int:
    """default_maxmemory, or the host's memory when it is 0 or larger than the host."""
    if default_maxmemory <= 0:
        return host_memory
    return min(default_maxmemory, host_memory)


def hotplug_amount(sizing: PodSizing) -> Hotplug:
    limits = sum(c.limit for c in sizing.containers if c.limit)
    wanted = round_up(limits, sizing.block_size)
    ceiling = vm_ceiling(sizing.host_memory, sizing.default_maxmemory)
    # Whole blocks only, so a clamped hotplug stays at or below the ceiling.
    room = max(0, round_down(ceiling - sizing.default_memory, sizing.block_size))
    return Hotplug(wanted=wanted, amount=min(wanted, room), ceiling=ceiling, clamped=wanted > room)


def validate(sizing: PodSizing) -> None:
    if sizing.host_memory <= 0:
        raise InvalidArgument(f"host memory {sizing.host_memory} is not positive")
    if sizing.default_memory <= 0:
        raise InvalidArgument(f"default_memory {sizing.default_memory} is not positive")
    if sizing.default_maxmemory < 0:
        raise InvalidArgument(f"default_maxmemory {sizing.default_maxmemory} is negative")
    if sizing.block_size < 0:
        raise InvalidArgument(f"block size {sizing.block_size} is negative")
    if sizing.pod_limit is not None and sizing.pod_limit <= 0:
        raise InvalidArgument(f"pod limit {sizing.pod_limit} is not positive")
    for c in sizing.containers:
        for what, value in (("limit", c.limit), ("request", c.request)):
            if value is not None and value < 0:
                raise InvalidArgument(f"container {c.name!r}: {what} {value} is negative")
        if c.limit and c.request and c.request > c.limit:
            raise InvalidArgument(
                f"container {c.name!r}: request {ceil_mib(c.request)} MiB is above its limit "
                f"{ceil_mib(c.limit)} MiB"
            )


def plan(sizing: PodSizing, model: OverheadModel = DEFAULT_MODEL) -> Plan:
    validate(sizing)
    hotplug = hotplug_amount(sizing)
    vm_size = sizing.default_memory + hotplug.amount
    kernel = model.kernel.at(vm_size)
    daemons = model.daemons.at(vm_size)
    vmm = model.vmm.at(vm_size)
    limits = sum(c.limit for c in sizing.containers if c.limit)
    host_usage = vm_size + vmm
    # Kubernetes adds the RuntimeClass overhead to the containers' limits to make the pod
    # limit, so it must cover all the pod holds beyond them: default_memory and the block
    # rounding, and at least the guest's own kernel and daemons, plus the VMM.
    overhead = ceil_mib(max(host_usage - limits, kernel + daemons + vmm)) * MIB
    warnings = []
    if hotplug.clamped:
        warnings.append(
            f"clamped: the containers' limits want {mib_text(hotplug.wanted)} hotplugged, but the "
            f"VM may grow only to {mib_text(hotplug.ceiling)} ("
            + (
                "the host's memory"
                if hotplug.ceiling == sizing.host_memory
                else "default_maxmemory"
            )
            + f"), so {mib_text(hotplug.amount)} is hotplugged; as under runc, a limit above what "
            "the VM has does not hold memory back"
        )
    if sizing.default_memory > hotplug.ceiling:
        warnings.append(
            f"default_memory {mib_text(sizing.default_memory)} is above the VM ceiling "
            f"{mib_text(hotplug.ceiling)}"
        )
    if not hotplug.clamped and sizing.default_memory < kernel + daemons:
        warnings.append(
            f"default_memory {mib_text(sizing.default_memory)} does not hold the guest's own "
            f"kernel reserve ({mib_text(kernel)}) and daemons ({mib_text(daemons)}): the "
            f"containers get {mib_text(vm_size - kernel - daemons)} for limits of "
            f"{mib_text(limits)} and the guest OOM-kills them first; set default_memory to at "
            f"least {mib_text(kernel + daemons)}"
        )
    measured = model.sizes
    if measured and not min(measured) <= vm_size <= max(measured):
        warnings.append(
            f"VM size {mib_text(vm_size)} is outside the measured sizes "
            f"({mib_text(min(measured))} to {mib_text(max(measured))}): the overheads are "
            "extrapolated"
        )
    for c in sizing.containers:
        if not c.limit and c.request:
            warnings.append(
                f"container {c.name!r} requests {mib_text(c.request)} but has no limit: the VM "
                "is sized from limits, so nothing is hotplugged for it"
            )
    shortfall = 0 if sizing.pod_limit is None else max(0, host_usage - sizing.pod_limit)
    return Plan(
        hotplug=hotplug,
        vm_size=vm_size,
        kernel=kernel,
        daemons=daemons,
        vmm=vmm,
        host_usage=host_usage,
        container_room=max(0, vm_size - kernel - daemons),
        runtime_class_overhead=overhead,
        pod_limit=sizing.pod_limit,
        shortfall=shortfall,
        model_source=model.source,
        warnings=tuple(warnings),
    )
