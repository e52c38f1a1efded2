"""udev as the agent uses it, with or without the udev daemon.

With systemd-udevd running, devices carry udev's properties (ID_SERIAL) and events arrive
once udev has processed them, as on any distribution. Kata's initrd and minimal guest roots
run no udevd: there is no udev database, so a disk's serial comes from sysfs (virtio-blk's
`serial` attribute, which is what udev's ID_SERIAL holds for a virtio disk), and events come
straight from the kernel's uevents, as kata's extension mount script finds its disk.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from guestagent.linux.fs import KernelFS
from guestagent.records import record

LIBUDEV_SONAME = "libudev.so.1"


def udevd_running(fs: KernelFS) -> bool:
    """udevd's control socket: what libudev itself checks to tell whether udev runs."""
    return fs.exists(fs.run("udev", "control"))


def _libudev_by_soname(name: str) -> str | None:
    return LIBUDEV_SONAME if name == "udev" else None


def load_pyudev() -> ModuleType:
    """pyudev, with libudev opened by its soname. pyudev asks ctypes.util.find_library,
    which runs the guest's ldconfig (or gcc) and answers with the guest's copy of the
    library; the soname alone lets the loader search the agent's own lib/ first (its
    interpreter's DT_RPATH), or the system's where the agent runs from a venv."""
    import pyudev._ctypeslib.utils as loader

    loader.find_library = _libudev_by_soname
    return importlib.import_module("pyudev")


@record
class Udev:
    """A libudev context and where its events come from: "udev" (the daemon's, after its
    rules ran) or "kernel" (raw uevents, when no udevd runs)."""

    pyudev: ModuleType
    context: Any
    source: str

    def monitor(self, subsystem: str) -> Any:
        monitor = self.pyudev.Monitor.from_netlink(self.context, source=self.source)
        monitor.filter_by(subsystem)
        return monitor

    def serial(self, device: Any) -> str | None:
        if self.source == "udev":
            serial = device.properties.get("ID_SERIAL")
            return None if serial is None else str(serial)
        try:
            return str(device.attributes.asstring("serial")).strip() or None
        except KeyError:
            return None


def open_udev(fs: KernelFS) -> Udev:
    pyudev = load_pyudev()
    return Udev(pyudev, pyudev.Context(), "udev" if udevd_running(fs) else "kernel")
