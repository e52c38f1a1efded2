"""A block-device finder without udev, for tests of the swap and block-device code."""

from __future__ import annotations

from guestagent.linux.blockdev import BlockDevice
from guestagent.linux.device_selector import DeviceSelector

VDB = BlockDevice("/dev/vdb", "vdb", "disk", 254, 16, "swap0")


class FakeFinder:
    def __init__(self, devices: list[BlockDevice], appear: BlockDevice | None = None) -> None:
        self.devices = devices
        self.appear = appear
        self.waited: float | None = None

    def find(self, selector: DeviceSelector) -> BlockDevice | None:
        return next(
            (
                d
                for d in self.devices
                if selector.serial in (d.serial,) or selector.path == d.devnode
            ),
            None,
        )

    def wait(self, selector: DeviceSelector, timeout_s: float) -> BlockDevice | None:
        self.waited = timeout_s
        return self.appear
