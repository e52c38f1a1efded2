"""Kernel files of 'key value' lines: memory.stat, memory.events, /proc/vmstat."""

from __future__ import annotations

from guestagent.errors import KernelFormat


def parse_flat_keyed(text: str, prefix: str = "") -> dict[str, int]:
    """The lines whose key starts with prefix, as a dict; other lines are not checked."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if not (fields[0] if fields else "").startswith(prefix):
            continue
        if len(fields) != 2:
            raise KernelFormat(f"line {line!r} is not 'key value'")
        try:
            values[fields[0]] = int(fields[1])
        except ValueError:
            raise KernelFormat(f"line {line!r} has a non-integer value") from None
    return values


def workingset_refaults(values: dict[str, int]) -> tuple[int, int]:
    """memory.stat's or /proc/vmstat's refaults, (anon, file): before 5.9 there was one
    counter, workingset_refault, which counts as file."""
    file = values.get("workingset_refault_file", values.get("workingset_refault", 0))
    return values.get("workingset_refault_anon", 0), file
