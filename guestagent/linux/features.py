"""Kernel features the agent reads or uses but a guest kernel may lack: PSI, delay accounting,
the multi-gen LRU and the idle ages built on it, dm-crypt for encrypted swap, virtio-mem.

Absence is a value, `Absent` (the feature and why, with how to turn it on), never a zero
figure: a stall of 0 from a kernel without PSI would read as "no stall". Each feature has a
pure rule (what the kernel shows in, Absent or None out) and one read; FEATURE_READERS holds
every read by name, which is what GetAgentInfo lists, so a feature added there is listed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from guestagent.linux.fs import KernelFS
from guestagent.records import record

# The features a report or a status may list as absent.
PSI = "psi"
MGLRU = "mglru"
DELAYACCT = "delayacct"
# Listed by GetAgentInfo only.
IDLE_AGES = "idle_ages"
SWAP_ENCRYPTION = "swap_encryption"
VIRTIO_MEM = "virtio_mem"


@record
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


def virtio_mem_absence(driver_present: bool) -> Absent | None:
    """virtio-mem from whether its driver is bound into the virtio bus."""
    if driver_present:
        return None
    return Absent(
        VIRTIO_MEM,
        "no virtio_mem driver (CONFIG_VIRTIO_MEM off, or its module not loaded: it loads "
        "when the VM has a virtio-mem device)",
    )


def read_virtio_mem_absence(fs: KernelFS) -> Absent | None:
    return virtio_mem_absence(fs.is_dir(fs.sys("bus", "virtio", "drivers", "virtio_mem")))


def read_swap_encryption_absence(fs: KernelFS) -> Absent | None:
    """Encrypted swap needs device-mapper with the dm-crypt target. Asked by GetAgentInfo
    only, so device-mapper's ioctls load then, not at start."""
    from guestagent.linux.dm import DeviceMapper, has_crypt_target

    missing = has_crypt_target(DeviceMapper(fs))
    return Absent(SWAP_ENCRYPTION, missing) if missing is not None else None


def read_idle_ages_feature(fs: KernelFS) -> Absent | None:
    absent = read_idle_ages_absence(fs)
    return Absent(IDLE_AGES, absent.reason) if absent is not None else None


# Every optional feature by name, with its read: what GetAgentInfo lists, present or absent.
FEATURE_READERS: dict[str, Callable[[KernelFS], Absent | None]] = {
    PSI: read_psi_absence,
    MGLRU: read_mglru_absence,
    IDLE_AGES: read_idle_ages_feature,
    SWAP_ENCRYPTION: read_swap_encryption_absence,
    VIRTIO_MEM: read_virtio_mem_absence,
}
# The features a memory report's `absent` lists: those its figures depend on.
REPORTED = (PSI, MGLRU)


def read_absent(fs: KernelFS) -> tuple[Absent, ...]:
    """Every feature of a report this kernel lacks (PSI, then the multi-gen LRU), with why."""
    found = (FEATURE_READERS[name](fs) for name in REPORTED)
    return tuple(a for a in found if a is not None)


def read_features(fs: KernelFS) -> tuple[tuple[str, Absent | None], ...]:
    """Each optional feature's name and, when the kernel lacks it, why."""
    return tuple((name, read(fs)) for name, read in FEATURE_READERS.items())


def read_cgroup_psi_absence(fs: KernelFS, directory: str) -> Absent | None:
    """PSI for one cgroup: its memory.pressure, or why it has none."""
    if fs.exists(os.path.join(directory, "memory.pressure")):
        return None
    system = read_psi_absence(fs)
    if system is not None:
        return system
    return Absent(PSI, f"{directory}/memory.pressure is missing: its cgroup.pressure is 0")
