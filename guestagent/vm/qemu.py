"""Boot the guest image under QEMU and give tests a handle on it.

The boot itself, with VMConfig and its devices, is guestagent/host/sizing/boot.py's; the
images are this checkout's (image/build), unless GUESTAGENT_IMAGE_DIR says otherwise. Here the
kernel command line also sets guestagent.testexec=1, which starts a test-only command channel
on a virtio-serial port (image/testexec.py), and the handle adds what tests ask of the guest
and QEMU.
"""

from __future__ import annotations

import functools
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guestagent.host.sizing.boot import Disk, GuestVMError, QemuGuest, VMConfig, image_dir_for
from guestagent.host.vmm.rss import read_rss, read_vmm_memory
from guestagent.sizes import MIB

# `make image` writes the guest images here; the harness runs from a checkout.
DEFAULT_IMAGE_DIR = Path(__file__).resolve().parents[2] / "image" / "build"
TESTEXEC_PORT_NAME = "guestagent.testexec"
# How much longer than the command's own timeout the host waits: TCG guests are slow to answer.
EXEC_GRACE_SECONDS = 30.0


class GuestCommandError(GuestVMError):
    """A command run in the guest with check=True failed or timed out."""


@dataclass(frozen=True)
class ExecResult:
    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass
class _TestexecChannel:
    """Client side of image/testexec.py: one JSON request line, one JSON answer line."""

    path: Path
    _socket: socket.socket | None = None
    _buffer: bytes = b""
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def call(
        self, request: dict[str, Any], deadline: float, vm_alive: Callable[[], bool]
    ) -> dict[str, Any]:
        with self._lock:
            request_id = next(self._ids)
            self._connected().sendall(json.dumps({**request, "id": request_id}).encode() + b"\n")
            # Answers to earlier requests that timed out on the host side may still arrive.
            while True:
                answer = json.loads(self._read_line(deadline, vm_alive))
                if answer.get("id") == request_id:
                    return dict(answer)

    def send_only(self, request: dict[str, Any]) -> None:
        with self._lock:
            self._connected().sendall(json.dumps(request).encode() + b"\n")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket, self._buffer = None, b""

    def _connected(self) -> socket.socket:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX)
            self._socket.settimeout(1.0)
            self._socket.connect(str(self.path))
        return self._socket

    def _read_line(self, deadline: float, vm_alive: Callable[[], bool]) -> bytes:
        sock = self._connected()
        while b"\n" not in self._buffer:
            if not vm_alive():
                raise GuestVMError("QEMU exited while waiting for testexec")
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from testexec")
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                self.close()
                raise GuestVMError("testexec socket closed by QEMU")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line


class GuestVM(QemuGuest):
    """A QemuGuest with the test-only command channel; use as a context manager."""

    def __init__(
        self,
        config: VMConfig = VMConfig(),
        image_dir: Path | None = None,
        workdir: Path | None = None,
        boot_timeout: float = 240.0,
    ) -> None:
        image_dir = image_dir or image_dir_for(config.arch, DEFAULT_IMAGE_DIR)
        super().__init__(config, image_dir, workdir, boot_timeout)

    @functools.cached_property
    def _testexec(self) -> _TestexecChannel:
        return _TestexecChannel(self.workdir / "testexec.sock")

    @functools.cached_property
    def _dimm_ids(self) -> itertools.count[int]:
        return itertools.count()

    def _harness_options(self) -> tuple[list[str], list[tuple[str, str]]]:
        testexec_socket = self._testexec.path
        return ["guestagent.testexec=1"], [
            ("-device", "virtio-serial-pci,id=vser0"),
            ("-chardev", f"socket,id=testexec,path={testexec_socket},server=on,wait=off"),
            ("-device", f"virtserialport,bus=vser0.0,chardev=testexec,name={TESTEXEC_PORT_NAME}"),
        ]

    def _wait_ready(self, deadline: float) -> None:
        """Ready means testexec answers, then the agent (QemuGuest's readiness)."""
        self._wait_for("testexec", self._testexec.path.exists, deadline, 0.1)
        if self.flavour.testexec:
            try:
                self._testexec.call({"argv": ["true"], "timeout": 10}, deadline, self._alive)
            except (TimeoutError, GuestVMError) as error:
                raise self._boot_error(f"testexec: {error}") from error
        super()._wait_ready(deadline)

    def _shutdowns(self) -> tuple[Callable[[], None], ...]:
        """Power off from inside (clean for the guest) first."""
        return (self._poweroff_guest, *super()._shutdowns())

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        self._testexec.close()

    def exec(
        self,
        argv_or_sh: Sequence[str] | str,
        timeout: float = 60,
        check: bool = True,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run a command in the guest: a list is an argv, a string goes to /bin/sh -c."""
        if not self.flavour.testexec:
            raise GuestVMError(f"the {self.config.flavour} guest has no testexec to run commands")
        request: dict[str, Any] = (
            {"sh": argv_or_sh} if isinstance(argv_or_sh, str) else {"argv": list(argv_or_sh)}
        )
        request["timeout"] = timeout
        if stdin is not None:
            request["stdin"] = stdin
        answer = self._testexec.call(
            request, time.monotonic() + timeout + EXEC_GRACE_SECONDS, self._alive
        )
        result = ExecResult(answer["rc"], answer["stdout"], answer["stderr"], answer["timed_out"])
        if check and (result.rc != 0 or result.timed_out):
            what = "timed out" if result.timed_out else f"exited with {result.rc}"
            raise GuestCommandError(
                f"guest command {argv_or_sh!r} {what}:\n{result.stderr}{result.stdout}"
            )
        return result

    def balloon(self, target_bytes: int) -> None:
        self.qmp("balloon", value=target_bytes)

    def hotplug_dimm(self, size_mib: int) -> str:
        """Plug a pc-dimm of size_mib (needs slots); the guest sees it offline until onlined."""
        dimm_id = f"dimm{next(self._dimm_ids)}"
        self.qmp(
            "object-add",
            **{"qom-type": "memory-backend-ram", "id": f"mem-{dimm_id}", "size": size_mib * MIB},
        )
        self.qmp("device_add", driver="pc-dimm", id=dimm_id, memdev=f"mem-{dimm_id}")
        return dimm_id

    def hotplug_disk(self, disk: Disk) -> None:
        """Plug a virtio-blk disk backed by a new sparse file, as a runtime adds a volume."""
        with open(self.disk_path(disk.name), "wb") as backing:
            backing.truncate(disk.size_bytes)
        node = f"disk-{disk.name}"
        file_node = {"driver": "file", "filename": str(self.disk_path(disk.name))}
        discard = "unmap" if disk.discard else "ignore"
        self.qmp(
            "blockdev-add",
            **{"driver": "raw", "node-name": node, "file": file_node, "discard": discard},
        )
        serial = {"serial": disk.serial} if disk.serial else {}
        self.qmp("device_add", driver="virtio-blk-pci", id=node, drive=node, **serial)

    def set_virtio_mem_requested(self, size_bytes: int, device: str = "vmem0") -> None:
        """Ask the guest to plug (or unplug down to) size_bytes; the driver acts on its own."""
        path = f"/machine/peripheral/{device}"
        self.qmp("qom-set", path=path, property="requested-size", value=size_bytes)

    def virtio_mem_sizes(self, device: str = "vmem0") -> tuple[int, int]:
        """(plugged, requested) bytes as QEMU sees them: `size` is what the guest holds."""
        path = f"/machine/peripheral/{device}"
        plugged = self.qmp("qom-get", path=path, property="size")
        requested = self.qmp("qom-get", path=path, property="requested-size")
        return int(plugged), int(requested)

    def qemu_rss_bytes(self) -> int:
        return read_rss(self.pid)

    def qemu_guest_rss_bytes(self) -> int:
        """VmRSS less TCG's translated-code buffer (VmmMemory.without_tcg_code)."""
        return read_vmm_memory(self.pid).without_tcg_code

    def disk_allocated_bytes(self, name: str) -> int:
        return self.disk_path(name).stat().st_blocks * 512

    def _poweroff_guest(self) -> None:
        if not self.flavour.testexec:
            raise GuestVMError("no testexec in this guest to power it off from inside")
        # The guest powers off before it could answer, so do not wait for one.
        self._testexec.send_only({"id": "poweroff", "argv": ["poweroff", "-f"], "timeout": 10})
