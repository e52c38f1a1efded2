"""A QMP server on a unix socket that speaks enough of QEMU's monitor for guestctl give-back:
the greeting, capabilities, the balloon and a virtio-mem device whose size follows its
requested-size at once. Every command it is sent is kept, so a test can say none changed
anything."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GREETING = {"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}}, "capabilities": []}}
MIB = 1 << 20


@dataclass
class FakeQemu:
    path: Path
    ram_size: int = 1024 * MIB
    actual: int = 1024 * MIB
    vmem_size: int = 1024 * MIB
    vmem_requested: int = 1024 * MIB
    vmem_block: int = 2 * MIB
    vmem_max: int = 2048 * MIB
    vmem_addr: int = 0x100000000
    # The balloon stops this far short of its target, as a guest that cannot give more.
    balloon_shortfall: int = 0
    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _listener: socket.socket | None = None
    _thread: threading.Thread | None = None
    _conn: socket.socket | None = None

    def __enter__(self) -> FakeQemu:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._listener is not None
        self._listener.close()

    def hang_up(self) -> None:
        """End the connection in hand, as a QEMU that was killed."""
        assert self._conn is not None
        self._conn.shutdown(socket.SHUT_RDWR)

    def writes(self) -> list[str]:
        return [name for name, args in self.commands if name in ("balloon", "qom-set")]

    def _serve(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conn = conn
            with conn:
                try:
                    self._session(conn)
                except OSError:
                    continue

    def _session(self, conn: socket.socket) -> None:
        conn.sendall(json.dumps(GREETING).encode() + b"\n")
        # Clients send JSON objects back to back, with no newline between them.
        decoder, buffer = json.JSONDecoder(), ""
        while chunk := conn.recv(65536):
            buffer += chunk.decode()
            while buffer.strip():
                try:
                    request, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                name, args = request["execute"], request.get("arguments", {})
                self.commands.append((name, args))
                reply = {"return": self._answer(name, args)}
                if "id" in request:
                    reply["id"] = request["id"]
                conn.sendall(json.dumps(reply).encode() + b"\n")

    def _answer(self, name: str, args: dict[str, Any]) -> Any:
        if name == "query-memory-size-summary":
            return {"base-memory": self.ram_size, "plugged-memory": 0}
        if name == "query-balloon":
            return {"actual": self.actual}
        if name == "balloon":
            # Short of a new target by the shortfall; a target it already holds, exactly.
            shortfall = 0 if args["value"] == self.actual else self.balloon_shortfall
            self.actual = min(self.ram_size, args["value"] + shortfall)
            return {}
        if name == "query-memory-devices":
            data = {
                "id": "vmem0",
                "memaddr": self.vmem_addr,
                "block-size": self.vmem_block,
                "max-size": self.vmem_max,
                "size": self.vmem_size,
                "requested-size": self.vmem_requested,
                "node": 0,
                "memdev": "/objects/vmem0-ram",
            }
            return [{"type": "virtio-mem", "data": data}]
        if name == "qom-get":
            return self.vmem_size if args["property"] == "size" else self.vmem_requested
        if name == "qom-set":
            self.vmem_requested = self.vmem_size = args["value"]
            return {}
        return {}
