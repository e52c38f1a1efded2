"""Cloud Hypervisor's REST API (vmm/src/api/openapi/cloud-hypervisor.yaml) as give-back's VMM.

`GET /api/v1/vm.info` gives the VM's configuration and `memory_actual_size`: the boot RAM
less the balloon's actual size plus what virtio-mem has plugged. `PUT /api/v1/vm.resize`
takes `desired_balloon` (bytes the balloon takes) or `desired_ram` (the boot RAM plus what
the default zone's virtio-mem should have plugged); `PUT /api/v1/vm.resize-zone` takes a
zone's `id` and `desired_ram` (the zone's size plus its virtio-mem's). Both answer 204.

The API reports the balloon and virtio-mem together, in `memory_actual_size`, and each only
as asked in the configuration (`balloon.size`, `hotplugged_size`). So what the one holds is
read with the other taken as settled at what it was asked: the balloon with virtio-mem at
`hotplugged_size`, virtio-mem (without zones) with the balloon at `balloon.size`; a zone's
device is reported at what it was asked.
"""

from __future__ import annotations

from typing import Any

from guestagent.host.vmm.base import (
    BALLOON_PAGE,
    CLOUD_HYPERVISOR,
    Balloon,
    VirtioMemDevice,
    VmmError,
)
from guestagent.host.vmm.unixhttp import RestVmm

API_PREFIX = "/api/v1"
# Cloud Hypervisor's virtio-mem block (VIRTIO_MEM_DEFAULT_BLOCK_SIZE); its API does not
# report it. Its default memory zone's id (DEFAULT_MEMORY_ZONE), for the device without zones.
BLOCK_SIZE = 2 << 20
DEFAULT_ZONE = "mem0"


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    return int(value) if value is not None else 0


def base_ram(memory: dict[str, Any]) -> int:
    """The boot RAM: memory.size and each zone's size, without what is hotplugged."""
    return _int(memory, "size") + sum(_int(zone, "size") for zone in memory.get("zones") or [])


def hotplugged(memory: dict[str, Any]) -> int:
    return _int(memory, "hotplugged_size") + sum(
        _int(zone, "hotplugged_size") for zone in memory.get("zones") or []
    )


def uses_virtio_mem(memory: dict[str, Any]) -> bool:
    return str(memory.get("hotplug_method", "Acpi")).lower() == "virtiomem"


def balloon_of(info: dict[str, Any]) -> Balloon:
    """The balloon from vm.info; VmmError without one."""
    config = info["config"]
    balloon = config.get("balloon")
    if not balloon:
        raise VmmError("Cloud Hypervisor's VM has no balloon (--balloon at boot)")
    memory = config["memory"]
    plugged = hotplugged(memory)
    actual_size = int(info.get("memory_actual_size", base_ram(memory) + plugged))
    taken = max(0, base_ram(memory) + plugged - actual_size)
    return Balloon(
        ram=base_ram(memory) + plugged,
        taken=taken,
        asked=int(balloon["size"]),
        unit=BALLOON_PAGE,
        deflate_on_oom=bool(balloon.get("deflate_on_oom", False)),
    )


def virtio_mem_of(info: dict[str, Any]) -> list[VirtioMemDevice]:
    """The virtio-mem devices from vm.info: the default zone's, or one per zone that has
    hotplug room."""
    config = info["config"]
    memory = config["memory"]
    if not uses_virtio_mem(memory):
        return []
    zones = memory.get("zones") or []
    if not zones:
        if not _int(memory, "hotplug_size"):
            return []
        asked = _int(memory, "hotplugged_size")
        balloon = config.get("balloon") or {}
        actual_size = int(info.get("memory_actual_size", base_ram(memory) + asked))
        plugged = actual_size - base_ram(memory) + _int(balloon, "size")
        return [
            VirtioMemDevice(
                DEFAULT_ZONE, None, BLOCK_SIZE, _int(memory, "hotplug_size"), plugged, asked
            )
        ]
    return [
        VirtioMemDevice(
            str(zone["id"]),
            None,
            BLOCK_SIZE,
            _int(zone, "hotplug_size"),
            _int(zone, "hotplugged_size"),
            _int(zone, "hotplugged_size"),
        )
        for zone in zones
        if _int(zone, "hotplug_size")
    ]


def resize_request(
    info: dict[str, Any], device: VirtioMemDevice, requested: int
) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) that asks the device for `requested` plugged bytes."""
    memory = info["config"]["memory"]
    if device.id == DEFAULT_ZONE and not memory.get("zones"):
        return "/vm.resize", {"desired_ram": base_ram(memory) + requested}
    for zone in memory.get("zones") or []:
        if zone["id"] == device.id:
            desired = _int(zone, "size") + requested
            return "/vm.resize-zone", {"id": device.id, "desired_ram": desired}
    raise VmmError(f"Cloud Hypervisor has no memory zone {device.id!r}")


class CloudHypervisorVmm(RestVmm):
    name = CLOUD_HYPERVISOR
    title = "Cloud Hypervisor"
    prefix = API_PREFIX

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self._call("GET", "/vm.info")
        return info

    def balloon(self) -> Balloon:
        return balloon_of(self.info())

    def balloon_taken(self) -> int:
        return self.balloon().taken

    def set_balloon(self, taken: int) -> None:
        self._call("PUT", "/vm.resize", {"desired_balloon": taken})

    def virtio_mem(self) -> list[VirtioMemDevice]:
        return virtio_mem_of(self.info())

    def set_virtio_mem(self, device: VirtioMemDevice, requested: int) -> None:
        endpoint, body = resize_request(self.info(), device, requested)
        self._call("PUT", endpoint, body)
