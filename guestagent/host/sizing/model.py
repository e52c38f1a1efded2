"""The overhead model: what a VM of a given size costs beyond its containers' limits.

Three overheads in the VM size (kernel reserve, guest daemons, the VMM's own memory), each a
line or the upper envelope of two, either the built-in conservative default or fitted to
boots measured by `guestctl measure-overhead` (or to a published survey, `survey`), and the
JSON file format `plan --model` reads. Pure functions over frozen dataclasses, in bytes; no
I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from guestagent.errors import InvalidArgument
from guestagent.sizes import MIB

MODEL_FORMAT = "guestagent-overhead-model/1"


def ceil_mib(value: float) -> int:
    return math.ceil(value / MIB)


def mib_text(value: int) -> str:
    """Rounded up, so a figure the text shows is never below what the plan needs."""
    return f"{ceil_mib(value)} MiB"


@dataclass(frozen=True)
class Line:
    """overhead = intercept + slope * vm_size, in bytes; never below zero."""

    intercept: float
    slope: float

    def at(self, vm_size: int) -> int:
        return max(0, math.ceil(self.intercept + self.slope * vm_size))


@dataclass(frozen=True)
class Envelope:
    """The largest of its lines at each size: an overhead whose growth changes at some VM
    size, as a confidential guest's kernel reserve does once its swiotlb outgrows 64 MiB."""

    lines: tuple[Line, ...]

    def at(self, vm_size: int) -> int:
        return max(line.at(vm_size) for line in self.lines)


Overhead = Line | Envelope


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
    kernel: Overhead
    daemons: Overhead
    vmm: Overhead
    source: str
    samples: tuple[OverheadSample, ...] = ()
    # The VM sizes fitted when there are no samples (figures carried over from a survey).
    fitted_sizes: tuple[int, ...] = ()

    @property
    def sizes(self) -> tuple[int, ...]:
        """The VM sizes the overheads were fitted at; outside them they are extrapolated."""
        return self.fitted_sizes or tuple(sample.vm_size for sample in self.samples)


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


def overhead_formula(overhead: Overhead) -> str:
    """'35.8 MiB + 0.0176 x VM size', or the larger of two such lines."""
    if isinstance(overhead, Envelope):
        return "the larger of " + " and ".join(f"({overhead_formula(x)})" for x in overhead.lines)
    return f"{overhead.intercept / MIB:.1f} MiB + {overhead.slope:.4f} x VM size"


def excess(overhead: Overhead, points: Sequence[tuple[int, int]]) -> float:
    """How far above the points the overhead lies, in all."""
    return float(sum(overhead.at(x) - y for x, y in points))


def fit_envelope(points: Sequence[tuple[int, int]]) -> Overhead:
    """fit_line on either side of a VM size, two points or more a side, at the split that
    leaves the least excess over all the points; one line when no split does better. Each
    side's line lies on or above its points, so the envelope lies on or above them all."""
    ordered = sorted(points)
    best: Overhead = fit_line(ordered)
    for split in range(2, len(ordered) - 1):
        candidate = Envelope((fit_line(ordered[:split]), fit_line(ordered[split:])))
        # Better by more than `at`'s rounding up to whole bytes, which a straight line's
        # split would otherwise win by.
        if excess(candidate, ordered) < excess(best, ordered) - len(ordered):
            best = candidate
    return best


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

    def overhead(value: Overhead) -> dict[str, Any]:
        if isinstance(value, Envelope):
            return {"lines": [line(each) for each in value.lines]}
        return line(value)

    return {
        "format": MODEL_FORMAT,
        "source": model.source,
        "kernel": overhead(model.kernel),
        "daemons": overhead(model.daemons),
        "vmm": overhead(model.vmm),
        "samples": [{**asdict(s), "kernel": s.kernel, "vmm": s.vmm} for s in model.samples],
        "fitted_sizes": list(model.fitted_sizes),
    }


def model_from_dict(data: Mapping[str, Any]) -> OverheadModel:
    """The inverse of model_to_dict; derived sample fields (kernel, vmm) are recomputed."""
    if data.get("format") != MODEL_FORMAT:
        raise InvalidArgument(f"format is {data.get('format')!r}, not {MODEL_FORMAT!r}")

    def line(name: str, value: Any) -> Line:
        try:
            return Line(float(value["intercept_bytes"]), float(value["slope"]))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidArgument(f"{name}: no intercept_bytes and slope ({e})") from None

    def overhead(name: str) -> Overhead:
        value = data.get(name)
        if isinstance(value, Mapping) and "lines" in value:
            lines = value["lines"]
            if not isinstance(lines, list) or not lines:
                raise InvalidArgument(f"{name}: lines is not a list of lines")
            return Envelope(tuple(line(name, each) for each in lines))
        return line(name, value)

    fields = OverheadSample.__dataclass_fields__
    try:
        samples = tuple(
            OverheadSample(**{k: v for k, v in s.items() if k in fields})
            for s in data.get("samples", ())
        )
    except TypeError as e:
        raise InvalidArgument(f"samples: {e}") from None
    try:
        fitted_sizes = tuple(int(size) for size in data.get("fitted_sizes", ()))
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"fitted_sizes: {e}") from None
    return OverheadModel(
        kernel=overhead("kernel"),
        daemons=overhead("daemons"),
        vmm=overhead("vmm"),
        source=str(data.get("source", "")),
        samples=samples,
        fitted_sizes=fitted_sizes,
    )
