"""Measure what the guest costs at several VM sizes: the samples `guestctl plan --model` fits.

Each size is one boot of the guest image under QEMU (boot.py). The agent
says what the guest sees (GetGuestOverhead, MemFree); the host side is QEMU's VmRSS and
/proc/PID/smaps (guestagent/host/vmm/rss.py). Guest RAM is QEMU's anonymous mapping of exactly a
memory backend's size (query-memdev), so its resident pages are the guest pages the host
really holds, and the rest of QEMU's RSS is the VMM's own. If that mapping cannot be told
apart, guest pages touched are estimated from the guest as MemTotal - MemFree + the
kernel's reserve; that misses pages the guest touched and freed (boot, initrd), so it
overstates the VMM.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import GuestVMError, QemuGuest, VMConfig, accelerator
from guestagent.host.sizing.model import OverheadModel, OverheadSample, overhead_formula
from guestagent.host.vmm.rss import Mapping, read_vmm_memory
from guestagent.sizes import MIB


class MeasureError(Exception):
    """A guest could not be booted or measured; guestctl reports it without a traceback."""


def guest_ram_resident(mappings: Sequence[Mapping], ram_sizes: Sequence[int]) -> int | None:
    """Resident bytes of the guest RAM mappings: one private, non-executable anonymous
    mapping per backend, of exactly its size. None if the sizes do not match one to one
    (the TCG code buffer is executable, so it is never taken for RAM)."""
    candidates: dict[int, list[Mapping]] = {}
    for m in mappings:
        if m.path == "" and m.perms.startswith("rw") and "x" not in m.perms:
            candidates.setdefault(m.size, []).append(m)
    resident = 0
    for size, count in Counter(ram_sizes).items():
        found = candidates.get(size, [])
        if len(found) != count:
            return None
        resident += sum(m.rss for m in found)
    return resident


def measure_size(
    vm_mib: int,
    image_dir: Path | None = None,
    boot_timeout: float = 300.0,
    settle_seconds: float = 2.0,
) -> OverheadSample:
    """Boot one guest of vm_mib MiB with no workload and measure it."""
    try:
        with QemuGuest(VMConfig(memory_mib=vm_mib), image_dir, boot_timeout=boot_timeout) as vm:
            with AgentClient(vm.agent_target, timeout=120) as client:
                client.wait_ready(120)
                time.sleep(settle_seconds)  # Let boot-time daemons finish starting.
                overhead = client.overhead()
                mem_free = client.info().system.mem_free_bytes
            ram_sizes = [int(backend["size"]) for backend in vm.qmp("query-memdev")]
            qemu = read_vmm_memory(vm.pid)
            accel = accelerator(vm.image_dir / "vmlinuz")[0]
    except GuestVMError as e:
        # The boot is an implementation detail: callers see one error type.
        raise MeasureError(str(e)) from e
    counted = guest_ram_resident(qemu.mappings, ram_sizes)
    sample = OverheadSample(
        vm_size=vm_mib * MIB,
        present=overhead.present_bytes,
        mem_total=overhead.mem_total_bytes,
        mem_free=mem_free,
        used=overhead.outside_workloads_bytes,
        agent_rss=overhead.agent_rss_bytes,
        qemu_rss=qemu.rss,
        guest_resident=counted or 0,
        guest_resident_method="smaps",
        accel=accel,
    )
    if counted is None:
        estimate = sample.mem_total - sample.mem_free + sample.kernel
        sample = replace(sample, guest_resident=estimate, guest_resident_method="estimate")
    return sample


def _mib(value: float) -> str:
    return f"{value / MIB:.1f}"


def table_text(model: OverheadModel) -> str:
    header = (
        f"{'VM MiB':>7} {'MemTotal':>9} {'used':>7} {'kernel':>7} {'agent':>6} "
        f"{'QEMU RSS':>9} {'guest res':>9} {'VMM':>7}  accel"
    )
    rows = [
        f"{s.vm_size // MIB:>7} {_mib(s.mem_total):>9} {_mib(s.used):>7} {_mib(s.kernel):>7} "
        f"{_mib(s.agent_rss):>6} {_mib(s.qemu_rss):>9} {_mib(s.guest_resident):>9} "
        f"{_mib(s.vmm):>7}  {s.accel}"
        + ("" if s.guest_resident_method == "smaps" else " (guest res estimated)")
        for s in model.samples
    ]

    fits = [
        f"{name + ' overhead':<16} = {overhead_formula(fit)}"
        for name, fit in (("kernel", model.kernel), ("daemons", model.daemons), ("VMM", model.vmm))
    ]
    return "\n".join([header, *rows, "", f"fitted model ({model.source}):", *fits])
