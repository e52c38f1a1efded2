"""Size a pod's VM the way a Kata-style runtime does, and check the host will not OOM-kill it.

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from guestagent.errors import InvalidArgument

MIB = 1 << 20
# x86_64 guests hotplug and online memory in 128 MiB blocks (block_size_bytes).
DEFAULT_BLOCK_SIZE = 128 * MIB
MODEL_FORMAT = "guestagent-overhead-model/1"


def ceil_mib(value: float) -> int:
    return math.ceil(value / MIB)


@dataclass(frozen=True)
class Container:
    name: str
    limit: int | None = None  # bytes; None when the container has no memory limit
    request: int | None = None


@dataclass(frozen=True)
class Line:
    """overhead = intercept + slope * vm_size, in bytes; never below zero."""

    intercept: float
    slope: float

    def at(self, vm_size: int) -> int:
        return max(0, math.ceil(self.intercept + self.slope * vm_size))


@dataclass(frozen=True)
class OverheadSample:
    """One measured boot: what the guest and the host saw at one VM size."""

    vm_size: int  # configured (-m)
    present: int  # online memory blocks x block size, as the agent counts them
    mem_total: int
    mem_free: int
    used: int  # MemTotal - MemAvailable - workloads: the guest's own daemons and kernel
    agent_rss: int
    qemu_rss: int
    guest_resident: int  # guest RAM pages resident in the QEMU process
    guest_resident_method: str  # "smaps" (counted) or "estimate" (from the guest's meminfo)
    accel: str = ""

    @property
    def kernel(self) -> int:
        # The agent counts whole blocks, so a VM whose size is not a multiple of the block
        # (306 MiB: three 128 MiB blocks) has present > size; the tail is not RAM.
        return max(0, min(self.present, self.vm_size) - self.mem_total)

    @property
    def vmm(self) -> int:
        return max(0, self.qemu_rss - self.guest_resident)


@dataclass(frozen=True)
class OverheadModel:
    kernel: Line
    daemons: Line
    vmm: Line
    source: str
    samples: tuple[OverheadSample, ...] = ()


# Used when plan gets no --model. Upper bounds, with margin, on what measure-overhead saw for
# this image from 306 MiB to 4.5 GiB: kernel 41 MiB + ~1.8 % (memmap), and 64 MiB more once
# RAM reaches above 4 GiB (swiotlb); used outside workloads 55-219 MiB (the daemons, slab,
# and the free-page reserve, which THP raises above 512 MiB). The VMM line is for QEMU with
# KVM (process ~90 MiB, page tables ~0.2 %); under TCG the translation cache alone is
# 300 MiB to 1 GiB, so measure there.
DEFAULT_MODEL = OverheadModel(
    kernel=Line(96 * MIB, 0.02),
    daemons=Line(160 * MIB, 0.015),
    vmm=Line(128 * MIB, 0.01),
    source="built-in conservative default",
)


def fit_line(points: Sequence[tuple[int, int]]) -> Line:
    """Least squares over (vm_size, overhead), then the intercept raised until no point lies
    above the line: plan must not declare less than was measured. A negative slope is
    noise (no overhead shrinks as the VM grows), so that case becomes the largest value."""
    if not points:
        raise InvalidArgument("no samples to fit")
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = (
        sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
        if spread
        else 0.0
    )
    if slope <= 0:
        return Line(max(ys), 0.0)
    intercept = mean_y - slope * mean_x
    intercept += max(0.0, *(y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True)))
    return Line(intercept, slope)


def fit_model(samples: Sequence[OverheadSample], source: str) -> OverheadModel:
    return OverheadModel(
        kernel=fit_line([(s.vm_size, s.kernel) for s in samples]),
        daemons=fit_line([(s.vm_size, s.used) for s in samples]),
        vmm=fit_line([(s.vm_size, s.vmm) for s in samples]),
        source=source,
        samples=tuple(samples),
    )


def model_to_dict(model: OverheadModel) -> dict[str, Any]:
    def line(value: Line) -> dict[str, float]:
        return {"intercept_bytes": value.intercept, "slope": value.slope}

    return {
        "format": MODEL_FORMAT,
        "source": model.source,
        "kernel": line(model.kernel),
        "daemons": line(model.daemons),
        "vmm": line(model.vmm),
        "samples": [{**asdict(s), "kernel": s.kernel, "vmm": s.vmm} for s in model.samples],
    }


def model_from_dict(data: Mapping[str, Any]) -> OverheadModel:
    """The inverse of model_to_dict; derived sample fields (kernel, vmm) are recomputed."""
    if data.get("format") != MODEL_FORMAT:
        raise InvalidArgument(f"format is {data.get('format')!r}, not {MODEL_FORMAT!r}")

    def line(name: str) -> Line:
        try:
            return Line(float(data[name]["intercept_bytes"]), float(data[name]["slope"]))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgument(f"{name}: no intercept_bytes and slope ({e})") from None

    fields = OverheadSample.__dataclass_fields__
    try:
        samples = tuple(
            OverheadSample(**{k: v for k, v in s.items() if k in fields})
            for s in data.get("samples", ())
        )
    except TypeError as e:
        raise InvalidArgument(f"samples: {e}") from None
    return OverheadModel(
        kernel=line("kernel"),
        daemons=line("daemons"),
        vmm=line("vmm"),
        source=str(data.get("source", "")),
        samples=samples,
    )


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


def round_up(value: int, block: int) -> int:
    return -(-value // block) * block if block > 0 else value


def round_down(value: int, block: int) -> int:
    return value // block * block if block > 0 else value


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


def _mib(value: int) -> str:
    return f"{ceil_mib(value)} MiB"


def plan(sizing: PodSizing, model: OverheadModel = DEFAULT_MODEL) -> Plan:
    validate(sizing)
    hotplug = hotplug_amount(sizing)
    vm_size = sizing.default_memory + hotplug.amount
    kernel, daemons, vmm = (
        model.kernel.at(vm_size),
        model.daemons.at(vm_size),
        model.vmm.at(vm_size),
    )
    limits = sum(c.limit for c in sizing.containers if c.limit)
    host_usage = vm_size + vmm
    # Kubernetes adds the RuntimeClass overhead to the containers' limits to make the pod
    # limit, so it must cover all the pod holds beyond them: default_memory and the block
    # rounding, and at least the guest's own kernel and daemons, plus the VMM.
    overhead = ceil_mib(max(host_usage - limits, kernel + daemons + vmm)) * MIB
    warnings = []
    if hotplug.clamped:
        warnings.append(
            f"clamped: the containers' limits want {_mib(hotplug.wanted)} hotplugged, but the "
            f"VM may grow only to {_mib(hotplug.ceiling)} ("
            + (
                "the host's memory"
                if hotplug.ceiling == sizing.host_memory
                else "default_maxmemory"
            )
            + f"), so {_mib(hotplug.amount)} is hotplugged; as under runc, a limit above what "
            "the VM has does not hold memory back"
        )
    if sizing.default_memory > hotplug.ceiling:
        warnings.append(
            f"default_memory {_mib(sizing.default_memory)} is above the VM ceiling "
            f"{_mib(hotplug.ceiling)}"
        )
    if not hotplug.clamped and sizing.default_memory < kernel + daemons:
        warnings.append(
            f"default_memory {_mib(sizing.default_memory)} does not hold the guest's own kernel "
            f"reserve ({_mib(kernel)}) and daemons ({_mib(daemons)}): the containers get "
            f"{_mib(vm_size - kernel - daemons)} for limits of {_mib(limits)} and the guest "
            f"OOM-kills them first; set default_memory to at least {_mib(kernel + daemons)}"
        )
    measured = [sample.vm_size for sample in model.samples]
    if measured and not min(measured) <= vm_size <= max(measured):
        warnings.append(
            f"VM size {_mib(vm_size)} is outside the measured sizes ({_mib(min(measured))} to "
            f"{_mib(max(measured))}): the overheads are extrapolated"
        )
    for c in sizing.containers:
        if not c.limit and c.request:
            warnings.append(
                f"container {c.name!r} requests {_mib(c.request)} but has no limit: the VM "
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


def verdict_text(result: Plan) -> str:
    usage = (
        f"VM {_mib(result.vm_size)} + VMM overhead {_mib(result.vmm)} = {_mib(result.host_usage)}"
    )
    if result.pod_limit is None:
        return f"preflight ok: the pod has no memory limit on the host; it will use {usage}"
    if result.ok:
        return f"preflight ok: pod limit {_mib(result.pod_limit)} covers {usage}"
    return (
        f"preflight FAILED: pod limit {_mib(result.pod_limit)} is below {usage}: short by "
        f"{_mib(result.shortfall)}; the host would OOM-kill the VM once the guest faults its "
        f"RAM in. Raise the pod limit (declare a RuntimeClass overhead of "
        f"{_mib(result.runtime_class_overhead)}) or lower default_memory"
    )


def plan_text(result: Plan) -> str:
    hotplug = result.hotplug
    lines = [
        f"hotplug      {_mib(hotplug.amount)}"
        + (f" (clamped from {_mib(hotplug.wanted)})" if hotplug.clamped else ""),
        f"VM size      {_mib(result.vm_size)} (ceiling {_mib(hotplug.ceiling)})",
        f"overhead     kernel {_mib(result.kernel)}  guest daemons {_mib(result.daemons)}  "
        f"VMM {_mib(result.vmm)}  ({result.model_source})",
        f"containers   {_mib(result.container_room)} left for them (VM - kernel - daemons)",
        f"RuntimeClass overhead to declare: {_mib(result.runtime_class_overhead)}",
    ]
    lines += [f"warning: {w}" for w in result.warnings]
    lines.append(verdict_text(result))
    return "\n".join(lines)


def plan_to_dict(result: Plan) -> dict[str, Any]:
    return {**asdict(result), "ok": result.ok}
