"""udev with and without its daemon: which event source, and libudev found by soname."""

from __future__ import annotations

import socket
from pathlib import Path

from guestagent.linux.fs import KernelFS
from guestagent.linux.udev import load_pyudev, open_udev, udevd_running


def test_udevd_is_seen_by_its_control_socket(tmp_path: Path) -> None:
    fs = KernelFS(tmp_path)
    assert not udevd_running(fs)
    assert open_udev(fs).source == "kernel"
    (tmp_path / "run/udev").mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as control:
        control.bind(str(tmp_path / "run/udev/control"))
        assert udevd_running(fs)
        assert open_udev(fs).source == "udev"


def test_libudev_is_opened_by_soname_without_find_library() -> None:
    """find_library would run ldconfig from the guest's userland; the soname is enough."""
    pyudev = load_pyudev()
    context = pyudev.Context()
    assert context._libudev._name == "libudev.so.1"
    # A real enumeration through the library it loaded.
    assert any(True for _ in context.list_devices(subsystem="mem"))
