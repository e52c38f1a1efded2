"""virtio-mem's plug and unplug in a real guest, timed, shared by the VM test and the bench:
the host raises or drops the requested size and waits until the guest has followed."""

from __future__ import annotations

import time
from typing import Any

from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import (
    filler_ready,
    make_cgroup,
    meminfo_bytes,
    start_filler,
    stop_filler,
    wait_until,
)


def plug(vm: GuestVM, size: int, timeout: float) -> dict[str, Any]:
    """Raise the requested size and wait until MemTotal has grown by it (less 16 MiB for
    the new blocks' memmap); the figures say how long that took."""
    before = meminfo_bytes(vm, "MemTotal")
    plugged_before = vm.virtio_mem_sizes()[0]
    started = time.monotonic()
    vm.set_virtio_mem_requested(size)
    grown = wait_until(
        lambda: (
            (total := meminfo_bytes(vm, "MemTotal")) - before >= size - plugged_before - 16 * MIB
            and total
        ),
        timeout,
        f"MemTotal to grow by {(size - plugged_before) // MIB} MiB",
    )
    return {
        "plug_mib": (size - plugged_before) // MIB,
        "plug_seconds": round(time.monotonic() - started, 1),
        "mem_total_before_mib": before // MIB,
        "mem_total_after_mib": grown // MIB,
    }


def unplug_after_workload(vm: GuestVM, workload_mib: int, boot_total: int) -> dict[str, Any]:
    """A workload touches workload_mib of the plugged memory and exits; then the host asks
    for everything back. QEMU's RSS (without TCG's translated code, which grows whatever the
    guest holds) should fall by what the workload had touched."""
    make_cgroup(vm, "vmemload")
    before = vm.qemu_guest_rss_bytes()
    marker = start_filler(vm, "vmemload", workload_mib, name="vmemload")
    wait_until(lambda: filler_ready(vm, marker), 600, "the workload's allocation")
    peak = vm.qemu_guest_rss_bytes()
    stop_filler(vm, "vmemload")
    started = time.monotonic()
    vm.set_virtio_mem_requested(0)
    wait_until(
        lambda: vm.virtio_mem_sizes()[0] == 0 and meminfo_bytes(vm, "MemTotal") <= boot_total,
        300,
        "the guest to unplug everything",
    )
    unplug_seconds = time.monotonic() - started
    # QEMU discards each block as the guest unplugs it; RSS follows at once.
    after = wait_until(
        lambda: (rss := vm.qemu_guest_rss_bytes()) <= peak - 0.9 * workload_mib * MIB and rss,
        60,
        "QEMU's RSS to fall",
    )
    return {
        "workload_mib": workload_mib,
        "unplug_seconds": round(unplug_seconds, 1),
        "qemu_rss_before_mib": before // MIB,
        "qemu_rss_peak_mib": peak // MIB,
        "qemu_rss_after_mib": after // MIB,
        "returned_fraction_of_workload": round((peak - after) / (workload_mib * MIB), 3),
    }
