"""Pressure stall information: /proc/pressure/memory and a cgroup's memory.pressure share
one format, parsed here."""

from __future__ import annotations

from guestagent.errors import KernelFormat
from guestagent.linux.fs import KernelFS, parsed
from guestagent.records import record


@record
class PressureLine:
    avg10: float
    avg60: float
    avg300: float
    total_us: int


@record
class Pressure:
    some: PressureLine
    full: PressureLine


def parse_pressure(text: str) -> Pressure:
    """A PSI file: 'some avg10=0.00 avg60=0.00 avg300=0.00 total=0' and a 'full' line."""
    lines: dict[str, PressureLine] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, *pairs = line.split()
        fields = dict(pair.partition("=")[::2] for pair in pairs)
        try:
            lines[kind] = PressureLine(
                avg10=float(fields["avg10"]),
                avg60=float(fields["avg60"]),
                avg300=float(fields["avg300"]),
                total_us=int(fields["total"]),
            )
        except (KeyError, ValueError):
            raise KernelFormat(f"pressure line {line!r} is malformed") from None
    if "some" not in lines:
        raise KernelFormat(f"pressure text {text!r} has no 'some' line")
    # Kernels before 5.13 print no 'full' line for the system-wide cpu file only;
    # memory always has it, but a zero line keeps the type total.
    return Pressure(some=lines["some"], full=lines.get("full", PressureLine(0.0, 0.0, 0.0, 0)))


def read_pressure(fs: KernelFS, path: str) -> Pressure | None:
    """A PSI file, None where the kernel has none (no CONFIG_PSI, or cgroup.pressure 0)."""
    text = fs.read_optional(path)
    return parsed(path, text, parse_pressure) if text is not None else None
