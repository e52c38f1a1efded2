"""A stand-in for Cloud Hypervisor's REST API (the endpoints give-back uses, as
vmm/src/api/openapi/cloud-hypervisor.yaml and its vmm/src/lib.rs, vm.rs define them), over a
real guest under QEMU: Cloud Hypervisor does not run here without KVM.

- `GET /api/v1/vm.info`: a VmInfo whose `config.memory` is the boot RAM with the virtio-mem
  device as the default zone's hotplug (`hotplug_method` "VirtioMem", `hotplug_size` its
  max, `hotplugged_size` what was last asked), `config.balloon` with `size` the last
  `desired_balloon` and `deflate_on_oom` false, and `memory_actual_size` as Cloud Hypervisor
  computes it: boot RAM less the balloon's actual size plus what virtio-mem has plugged.
- `PUT /api/v1/vm.resize`: `desired_balloon` sets QEMU's balloon to take that many bytes
  (whole 4 KiB pages, rounded down, as virtio-balloon's num_pages); `desired_ram` asks the
  virtio-mem device for `desired_ram` less the boot RAM, refused below the boot RAM as
  Cloud Hypervisor refuses it. 204 on success.
- `PUT /api/v1/vm.resize-zone`: 500, as Cloud Hypervisor answers a VM without user zones.
"""

from __future__ import annotations

from typing import Any

from tests.standins.server import ApiFault, StandIn, serve_until_sigterm

PAGE = 4096
PREFIX = "/api/v1"


class CloudHypervisorStandIn(StandIn):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.base = int(self.qmp.cmd("query-memory-size-summary")["base-memory"])
        self.balloon_size = 0
        device = self.virtio_mem()
        self.hotplugged = 0 if device is None else int(device["requested-size"])
        self.routes = {
            ("GET", f"{PREFIX}/vm.info"): self.info,
            ("PUT", f"{PREFIX}/vm.resize"): self.resize,
            ("PUT", f"{PREFIX}/vm.resize-zone"): self.resize_zone,
        }

    def info(self, body: Any) -> tuple[int, Any]:
        ram = self.ram()
        balloon_actual = ram - int(self.qmp.cmd("query-balloon")["actual"])
        device = self.virtio_mem()
        memory: dict[str, Any] = {"size": self.base, "hotplug_method": "Acpi"}
        plugged = 0
        if device is not None:
            plugged = int(device["size"])
            memory.update(
                hotplug_method="VirtioMem",
                hotplug_size=int(device["max-size"]),
                hotplugged_size=self.hotplugged,
            )
        config = {
            "payload": {"kernel": "/stand-in/vmlinux"},
            "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
            "memory": memory,
            "balloon": {"size": self.balloon_size, "deflate_on_oom": False},
        }
        return 200, {
            "config": config,
            "state": "Running",
            "memory_actual_size": self.base - balloon_actual + plugged,
        }

    def resize(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            raise ApiFault(400, None)
        if "desired_ram" in body:
            desired = int(body["desired_ram"])
            if desired < self.base:
                raise ApiFault(500, None)  # InvalidResizeBelowBootSize
            self.hotplugged = desired - self.base
            self.qmp.cmd(
                "qom-set",
                path=f"/machine/peripheral/{self.virtio_mem_id()}",
                property="requested-size",
                value=self.hotplugged,
            )
        if "desired_balloon" in body:
            pages = int(body["desired_balloon"]) // PAGE
            self.balloon_size = int(body["desired_balloon"])
            self.qmp.cmd("balloon", value=self.ram() - pages * PAGE)
        return 204, None

    def resize_zone(self, body: Any) -> tuple[int, Any]:
        raise ApiFault(500, None)  # ResizeZone: not allowed without user-defined zones.

    def virtio_mem_id(self) -> str:
        device = self.virtio_mem()
        if device is None:
            raise ApiFault(500, None)
        return str(device["id"])


if __name__ == "__main__":
    serve_until_sigterm(CloudHypervisorStandIn, __doc__)
