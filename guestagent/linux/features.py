"""Kernel features the agent reads but a guest kernel may lack: PSI, delay accounting and the
multi-gen LRU.

Absence is a value, `Absent` (the feature and why, with how to turn it on), never a zero
figure: a stall of 0 from a kernel without PSI would read as "no stall". Each feature has a
pure rule (what the kernel shows in, Absent or None out) and one read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from guestagent.linux.fs import KernelFS

# The features a report or a status may list as absent.
PSI = "psi"
MGLRU = "mglru"
DELAYACCT = "delayacct"


@dataclass(frozen=True)
class Absent:
    """A kernel feature that is not there, and why (the reason says how to get it)."""

    feature: str
    reason: str


def psi_absence(pressure_present: bool, cmdline: str | None) -> Absent | None:
    """PSI from whether /proc/pressure/memory exists and the kernel's command line."""
    if pressure_present:
        return None
    args = (cmdline or "").split()
    if "psi=0" in args:
        why = "the kernel was booted with psi=0; boot with psi=1 instead"
    else:
        why = (
            "the kernel has no /proc/pressure: built without CONFIG_PSI, or with "
            "CONFIG_PSI_DEFAULT_DISABLED (Kata's guest kernel) and booted without psi=1; "
            'boot with psi=1 (Kata: kernel_params = "psi=1")'
        )
    return Absent(PSI, why)


# lru_gen/enabled's bits (Documentation/admin-guide/mm/multigen_lru.rst): the core switch and
# the page-table walk.
MGLRU_CORE = 0x0001
MGLRU_MM_WALK = 0x0002


def lru_gen_caps(text: str) -> int:
    """The bits lru_gen/enabled shows; "y" is every one the CPU has, anything else none."""
    try:
        return int(text, 16)
    except ValueError:
        return -1 if text == "y" else 0


def mglru_absence(enabled: str | None) -> Absent | None:
    """The multi-gen LRU from /sys/kernel/mm/lru_gen/enabled (None: no such file)."""
    if enabled is None:
        return Absent(MGLRU, "the kernel has no multi-gen LRU (CONFIG_LRU_GEN, Linux 6.1+)")
    text = enabled.strip()
    if lru_gen_caps(text) & MGLRU_CORE:
        return None
    return Absent(
        MGLRU,
        f"the multi-gen LRU is off (lru_gen/enabled {text}): "
        "echo y > /sys/kernel/mm/lru_gen/enabled (the bundle's tmpfiles line does)",
    )


def idle_ages_absence(enabled: str | None) -> Absent | None:
    """The multi-gen LRU as the idle ages need it: on, and walking page tables when it ages.
    Without the walk (the bit off, or a CPU that sets no accessed bit in hardware) aging
    looks at no mapped page, so a hot one would keep the age it had when it was faulted in
    and count as cold."""
    absent = mglru_absence(enabled)
    if absent is not None or enabled is None:
        return absent
    text = enabled.strip()
    if lru_gen_caps(text) & MGLRU_MM_WALK:
        return None
    return Absent(
        MGLRU,
        f"the multi-gen LRU's aging walks no page tables (lru_gen/enabled {text}: 0x0002 "
        "off, or a CPU without a hardware accessed bit), so a mapped page's idle age would "
        "be wrong: echo y > /sys/kernel/mm/lru_gen/enabled",
    )


def read_idle_ages_absence(fs: KernelFS) -> Absent | None:
    return idle_ages_absence(read_lru_gen_enabled(fs))


def read_psi_absence(fs: KernelFS) -> Absent | None:
    present = fs.exists(fs.proc("pressure", "memory"))
    return psi_absence(present, None if present else fs.read_optional(fs.proc("cmdline")))


def read_lru_gen_enabled(fs: KernelFS) -> str | None:
    return fs.read_optional(fs.sys("kernel", "mm", "lru_gen", "enabled"))


def write_lru_gen_enabled(fs: KernelFS, value: str) -> None:
    fs.write(fs.sys("kernel", "mm", "lru_gen", "enabled"), value)


def read_mglru_absence(fs: KernelFS) -> Absent | None:
    return mglru_absence(read_lru_gen_enabled(fs))


def read_absent(fs: KernelFS) -> tuple[Absent, ...]:
    """Every feature this kernel lacks (PSI, then the multi-gen LRU), each with why."""
    found = (read_psi_absence(fs), read_mglru_absence(fs))
    return tuple(a for a in found if a is not None)


def read_cgroup_psi_absence(fs: KernelFS, directory: Path) -> Absent | None:
    """PSI for one cgroup: its memory.pressure, or why it has none."""
    if fs.exists(directory / "memory.pressure"):
        return None
    system = read_psi_absence(fs)
    if system is not None:
        return system
    return Absent(PSI, f"{directory}/memory.pressure is missing: its cgroup.pressure is 0")
