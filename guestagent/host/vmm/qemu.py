"""QEMU as give-back's VMM, over QMP (qemu.qmp: the vm extra)."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Protocol

from qemu.qmp import QMPClient, QMPError

from guestagent.host.vmm.base import BALLOON_PAGE, QEMU, Balloon, VirtioMemDevice, VmmError


class Monitor(Protocol):
    """What QemuVmm asks of a QMP connection."""

    pid: int

    def cmd(self, name: str, **args: Any) -> Any: ...

    def close(self) -> None: ...


class QemuMonitor:
    """A QMP connection to QEMU (qemu.qmp: the vm extra), and the pid of the QEMU at its
    other end, from the unix socket's peer credentials."""

    def __init__(self, path: str, timeout: float) -> None:
        self.timeout = timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError as e:
            sock.close()
            raise VmmError(f"QEMU's monitor {path}: {e.strerror or e}") from None
        self.pid: int = struct.unpack("3i", creds)[0]
        self._loop = asyncio.new_event_loop()
        self._client = QMPClient("guestctl")
        try:
            # A monitor already in use by another client accepts but never greets.
            self._run(self._client.connect(sock), f"QMP greeting on {path}")
        except BaseException:
            sock.close()
            self._loop.close()
            raise

    def _run(self, work: Any, what: str) -> Any:
        try:
            return self._loop.run_until_complete(asyncio.wait_for(work, self.timeout))
        except TimeoutError:
            raise VmmError(f"no answer from QEMU within {self.timeout:g} s: {what}") from None
        except QMPError as e:
            raise VmmError(f"QMP {what}: {e}") from None

    def cmd(self, name: str, **args: Any) -> Any:
        return self._run(self._client.execute(name, args), name)

    def close(self) -> None:
        # disconnect raises what ended the connection: EOFError from a QEMU that is gone,
        # which leaves nothing to close.
        try:
            self._run(self._client.disconnect(), "disconnect")
        except (EOFError, OSError):
            pass
        finally:
            self._loop.close()


class QemuVmm:
    """QEMU over QMP: `balloon value` and `query-balloon`'s `actual` are the guest's RAM less
    the balloon, converted here from and to bytes taken; a virtio-mem device's
    `requested-size` is set with qom-set."""

    name = QEMU
    balloon_leaves = True

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.pid = monitor.pid
        self._ram_seen: int | None = None

    def _ram(self) -> int:
        summary = self.monitor.cmd("query-memory-size-summary")
        self._ram_seen = int(summary["base-memory"] + summary.get("plugged-memory", 0))
        return self._ram_seen

    def _last_ram(self) -> int:
        """The RAM the last balloon() read, which every caller makes before it sizes the
        balloon: a poll or a resize then costs one command, not two."""
        return self._ram() if self._ram_seen is None else self._ram_seen

    def balloon(self) -> Balloon:
        ram = self._ram()
        taken = ram - int(self.monitor.cmd("query-balloon")["actual"])
        # QMP says what the balloon holds, never what it was asked for: taken as the same.
        # deflate-on-oom is a device property QMP's query-balloon does not report.
        return Balloon(ram, taken, taken, BALLOON_PAGE, None)

    def balloon_taken(self) -> int:
        return self._last_ram() - int(self.monitor.cmd("query-balloon")["actual"])

    def set_balloon(self, taken: int) -> None:
        self.monitor.cmd("balloon", value=self._last_ram() - taken)

    def virtio_mem(self) -> list[VirtioMemDevice]:
        return [
            VirtioMemDevice(
                id=d["data"]["id"],
                memaddr=d["data"]["memaddr"],
                block_size=d["data"]["block-size"],
                max_size=d["data"]["max-size"],
                size=d["data"]["size"],
                requested_size=d["data"]["requested-size"],
            )
            for d in self.monitor.cmd("query-memory-devices")
            if d["type"] == "virtio-mem"
        ]

    def set_virtio_mem(self, device: VirtioMemDevice, requested: int) -> None:
        path = f"/machine/peripheral/{device.id}"
        self.monitor.cmd("qom-set", path=path, property="requested-size", value=requested)

    def close(self) -> None:
        self.monitor.close()
