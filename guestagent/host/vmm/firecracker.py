"""Firecracker's REST API (src/firecracker/swagger/firecracker.yaml) as give-back's VMM.

`GET /balloon` gives the balloon's `amount_mib` (MiB it is asked to take) and
`deflate_on_oom`; `PATCH /balloon` `{"amount_mib": N}` resizes it; `GET /balloon/statistics`
(only when `stats_polling_interval_s` was non-zero at boot) gives `actual_pages`, what it
holds. `GET /hotplug/memory` reports the virtio-mem device (`total_size_mib`,
`block_size_mib`, `plugged_size_mib`, `requested_size_mib`) and `PATCH /hotplug/memory`
`{"requested_size_mib": N}` resizes it. The machine's RAM is `GET /machine-config`'s
`mem_size_mib`. Errors come as 400 with a `fault_message`.
"""

from __future__ import annotations

from typing import Any

from guestagent.host.vmm.base import BALLOON_PAGE, FIRECRACKER, Balloon, VirtioMemDevice, VmmError
from guestagent.host.vmm.unixhttp import ApiError, RestVmm
from guestagent.sizes import MIB

DEVICE = "hotplug"  # Firecracker has one virtio-mem device, with no id of its own.


def balloon_of(
    config: dict[str, Any], stats: dict[str, Any] | None, mem_size_mib: int, plugged: int
) -> Balloon:
    """The balloon from /balloon, /balloon/statistics (None when not enabled) and the RAM."""
    asked = int(config["amount_mib"]) * MIB
    taken = int(stats["actual_pages"]) * BALLOON_PAGE if stats is not None else asked
    return Balloon(
        ram=mem_size_mib * MIB + plugged,
        taken=taken,
        asked=asked,
        unit=MIB,
        deflate_on_oom=bool(config["deflate_on_oom"]),
        observed=stats is not None,
    )


def virtio_mem_of(status: dict[str, Any]) -> list[VirtioMemDevice]:
    if not status.get("total_size_mib"):
        return []
    return [
        VirtioMemDevice(
            DEVICE,
            None,
            int(status["block_size_mib"]) * MIB,
            int(status["total_size_mib"]) * MIB,
            int(status.get("plugged_size_mib", 0)) * MIB,
            int(status.get("requested_size_mib", 0)) * MIB,
        )
    ]


class FirecrackerVmm(RestVmm):
    name = FIRECRACKER
    title = "Firecracker"

    def _stats(self) -> dict[str, Any] | None:
        """None when statistics were not enabled at boot: Firecracker answers 400 then."""
        try:
            stats: dict[str, Any] = self.api.request("GET", "/balloon/statistics")
        except ApiError as e:
            if "HTTP 400" in str(e):
                return None
            raise VmmError(f"{self.title}: {e}") from None
        return stats

    def _hotplug(self) -> dict[str, Any]:
        """/hotplug/memory's status; {} when the VM has no virtio-mem (an error answer)."""
        try:
            status: dict[str, Any] = self.api.request("GET", "/hotplug/memory") or {}
        except ApiError:
            return {}
        return status

    def balloon(self) -> Balloon:
        config = self._call("GET", "/balloon")
        machine = self._call("GET", "/machine-config")
        plugged = int(self._hotplug().get("plugged_size_mib", 0)) * MIB
        return balloon_of(config, self._stats(), int(machine["mem_size_mib"]), plugged)

    def balloon_taken(self) -> int:
        """From the statistics alone; a balloon without them is not polled (give-back says
        it is unobserved), so their absence here is the VMM's error."""
        stats = self._stats()
        if stats is None:
            raise VmmError(f"{self.title}: no balloon statistics (stats_polling_interval_s 0)")
        return int(stats["actual_pages"]) * BALLOON_PAGE

    def set_balloon(self, taken: int) -> None:
        self._call("PATCH", "/balloon", {"amount_mib": taken // MIB})

    def virtio_mem(self) -> list[VirtioMemDevice]:
        return virtio_mem_of(self._hotplug())

    def set_virtio_mem(self, device: VirtioMemDevice, requested: int) -> None:
        self._call("PATCH", "/hotplug/memory", {"requested_size_mib": requested // MIB})
