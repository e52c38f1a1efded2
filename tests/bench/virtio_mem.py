"""virtio-mem figures for the bench JSON: how long the guest takes to plug 512 MiB into a
512 MiB guest and to give it back, and QEMU's RSS before, with and after a 400 MiB workload.
The same steps as tests/vm/test_virtio_mem.py, on a guest of its own."""

from __future__ import annotations

from typing import Any

from guestagent.host.client import AgentClient
from guestagent.host.sizing.boot import VirtioMem, VMConfig
from guestagent.sizes import MIB
from guestagent.vm.qemu import GuestVM
from tests.vm.guest import meminfo_bytes
from tests.workloads.virtio_mem import plug, unplug_after_workload


def measure_virtio_mem() -> dict[str, Any]:
    config = VMConfig(memory_mib=512, virtio_mem=VirtioMem(max_mib=1024))
    with GuestVM(config) as vm, AgentClient(vm.agent_target, timeout=600) as agent:
        agent.wait_ready(60)
        boot_total = meminfo_bytes(vm, "MemTotal")
        return {
            "plug": plug(vm, 512 * MIB, 120),
            "unplug": unplug_after_workload(vm, 400, boot_total),
        }
