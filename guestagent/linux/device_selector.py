"""How a call names a block device: by path or by virtio serial. Checked here, apart from
finding and probing the device (blockdev.py), which the agent loads at the first swap call.
"""

from __future__ import annotations

from guestagent.errors import InvalidArgument, quoted
from guestagent.records import record


@record
class DeviceSelector:
    """A device named by path (/dev/vdb) or by virtio serial (udev ID_SERIAL, e.g. swap0)."""

    path: str | None = None
    serial: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.serial is None):
            raise InvalidArgument(
                "name the device by exactly one of path or serial", "DEVICE_INVALID", field="device"
            )
        if self.path is not None:
            if not self.path.startswith("/dev/") or "/../" in self.path + "/":
                raise InvalidArgument(
                    f"device path {quoted(self.path)} is not under /dev",
                    "DEVICE_INVALID",
                    field="device.path",
                )
            if len(self.path.encode()) > 255 or "\x00" in self.path:
                raise InvalidArgument(
                    f"device path {self.path[:64]!r} is too long or has NUL",
                    "DEVICE_INVALID",
                    field="device.path",
                )
        elif not self.serial or "/" in self.serial or "\x00" in self.serial:
            raise InvalidArgument(
                f"device serial {quoted(self.serial or '')} is empty or has '/' or NUL",
                "DEVICE_INVALID",
                field="device.serial",
            )
        elif len(self.serial) > 64:
            raise InvalidArgument(
                f"device serial {self.serial[:64]!r}... is over 64 characters",
                "DEVICE_INVALID",
                field="device.serial",
            )

    def __str__(self) -> str:
        return self.path if self.path is not None else f"serial {quoted(self.serial or '')}"
