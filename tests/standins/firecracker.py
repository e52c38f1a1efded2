"""A stand-in for Firecracker's REST API (the endpoints give-back uses, as
src/firecracker/swagger/firecracker.yaml defines them), over a real guest under QEMU:
Firecracker does not run here without KVM.

- `GET /machine-config`: `mem_size_mib` (QEMU's boot memory) and `vcpu_count`.
- `GET /balloon`: `amount_mib` (the last PATCH, 0 at boot), `deflate_on_oom` false,
  `stats_polling_interval_s` 1 (0 with `statistics_enabled` false).
- `PATCH /balloon` `{"amount_mib": N}`: QEMU's balloon takes N MiB; 400 with a
  `fault_message` above the guest's memory, as Firecracker refuses it.
- `GET /balloon/statistics`: `target_pages`/`target_mib` (what was asked) and
  `actual_pages`/`actual_mib` (what QEMU's balloon holds), in 4 KiB pages; 400 with
  `statistics_enabled` false, as for a balloon booted without statistics.
- `GET /hotplug/memory`, `PATCH /hotplug/memory` `{"requested_size_mib": N}`: the QEMU
  guest's virtio-mem device (`total_size_mib` its max, `block_size_mib`, `plugged_size_mib`,
  `requested_size_mib`); 400 when it has none.
"""

from __future__ import annotations

from typing import Any

from guestagent.sizes import MIB
from tests.standins.server import ApiFault, StandIn, serve_until_sigterm

PAGE = 4096


def fault(message: str) -> ApiFault:
    return ApiFault(400, {"fault_message": message})


class FirecrackerStandIn(StandIn):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.base = int(self.qmp.cmd("query-memory-size-summary")["base-memory"])
        self.amount_mib = 0
        self.statistics_enabled = True  # As stats_polling_interval_s > 0 at boot.
        self.routes = {
            ("GET", "/machine-config"): self.machine_config,
            ("GET", "/balloon"): self.balloon,
            ("PATCH", "/balloon"): self.patch_balloon,
            ("GET", "/balloon/statistics"): self.statistics,
            ("GET", "/hotplug/memory"): self.hotplug,
            ("PATCH", "/hotplug/memory"): self.patch_hotplug,
        }

    def not_found(self, method: str, path: str) -> Any:
        return {"fault_message": f"Invalid request method and/or path: {method} {path}."}

    def machine_config(self, body: Any) -> tuple[int, Any]:
        return 200, {"vcpu_count": 1, "mem_size_mib": self.base // MIB}

    def balloon(self, body: Any) -> tuple[int, Any]:
        config = {"amount_mib": self.amount_mib, "deflate_on_oom": False}
        return 200, {**config, "stats_polling_interval_s": int(self.statistics_enabled)}

    def patch_balloon(self, body: Any) -> tuple[int, Any]:
        amount = body.get("amount_mib") if isinstance(body, dict) else None
        if not isinstance(amount, int) or amount < 0:
            raise fault(f"amount_mib must be a whole number of MiB, not {amount!r}")
        ram = self.ram()
        if amount * MIB > ram:
            raise fault("Amount of pages requested is too large.")
        self.amount_mib = amount
        self.qmp.cmd("balloon", value=ram - amount * MIB)
        return 204, None

    def statistics(self, body: Any) -> tuple[int, Any]:
        if not self.statistics_enabled:
            raise fault("Statistics for the balloon device are not enabled")
        taken = self.ram() - int(self.qmp.cmd("query-balloon")["actual"])
        return 200, {
            "target_pages": self.amount_mib * MIB // PAGE,
            "actual_pages": taken // PAGE,
            "target_mib": self.amount_mib,
            "actual_mib": taken // MIB,
        }

    def _device(self) -> dict[str, Any]:
        device = self.virtio_mem()
        if device is None:
            raise fault("The memory hotplug device is not configured.")
        return device

    def hotplug(self, body: Any) -> tuple[int, Any]:
        device = self._device()
        return 200, {
            "total_size_mib": int(device["max-size"]) // MIB,
            "slot_size_mib": 128,
            "block_size_mib": int(device["block-size"]) // MIB,
            "plugged_size_mib": int(device["size"]) // MIB,
            "requested_size_mib": int(device["requested-size"]) // MIB,
        }

    def patch_hotplug(self, body: Any) -> tuple[int, Any]:
        device = self._device()
        size = body.get("requested_size_mib") if isinstance(body, dict) else None
        if not isinstance(size, int) or not 0 <= size * MIB <= int(device["max-size"]):
            raise fault(f"requested_size_mib {size!r} is not within the device")
        if size * MIB % int(device["block-size"]):
            raise fault(f"requested_size_mib {size} is not a whole number of blocks")
        self.qmp.cmd(
            "qom-set",
            path=f"/machine/peripheral/{device['id']}",
            property="requested-size",
            value=size * MIB,
        )
        return 204, None


if __name__ == "__main__":
    serve_until_sigterm(FirecrackerStandIn, __doc__)
