"""What both stand-ins share: an HTTP/1.1 server on a unix socket, one request at a time (as
both VMMs' API threads serve them), every request body kept for the tests to check against
the VMM's schema, and a QMP connection to the QEMU whose guest it drives."""

from __future__ import annotations

import argparse
import json
import signal
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from guestagent.host.vmm.qemu import QemuMonitor


class ApiFault(Exception):
    """An error answer: the status and the VMM's body for it."""

    def __init__(self, status: int, body: dict[str, Any] | None) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


# (method, path) -> handler(body) -> (status, JSON answer or None)
Route = Callable[[Any], tuple[int, Any]]


@dataclass
class Received:
    method: str
    path: str
    body: Any


@dataclass
class StandIn:
    """A stand-in's socket and what it was sent; subclasses add the routes."""

    api_path: Path
    qmp_path: Path
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.qmp = QemuMonitor(str(self.qmp_path), 30.0)
        self.routes: dict[tuple[str, str], Route] = {}
        self._server: socketserver.UnixStreamServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ram(self) -> int:
        """The guest's RAM as QEMU's balloon counts it: boot memory and what is plugged."""
        summary = self.qmp.cmd("query-memory-size-summary")
        return int(summary["base-memory"] + summary.get("plugged-memory", 0))

    def virtio_mem(self) -> dict[str, Any] | None:
        for device in self.qmp.cmd("query-memory-devices"):
            if device["type"] == "virtio-mem":
                data: dict[str, Any] = device["data"]
                return data
        return None

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self._lock:
            self.received.append(Received(method, path, body))
            route = self.routes.get((method, path))
            if route is None:
                return 404, self.not_found(method, path)
            try:
                return route(body)
            except ApiFault as e:
                return e.status, e.body

    def not_found(self, method: str, path: str) -> Any:
        return None

    def start(self) -> StandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    status, answer = 400, {"fault_message": "the body is not JSON"}
                else:
                    status, answer = stand_in.handle(self.command, self.path, body)
                payload = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                if payload:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                # Not even an empty write after a 204: the client may have gone once it had
                # the headers, and a write to it fails with EPIPE.
                if payload:
                    self.wfile.write(payload)

            do_GET = do_PUT = do_PATCH = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # The tests read `received`, not a log.

        self._server = socketserver.UnixStreamServer(str(self.api_path), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.api_path.unlink(missing_ok=True)
        self.qmp.close()

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_until_sigterm(kind: type[StandIn], doc: str | None) -> None:
    """A stand-in as a process of its own, beside a running guest: --api SOCKET --qmp SOCKET."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--api", type=Path, required=True)
    parser.add_argument("--qmp", type=Path, required=True)
    args = parser.parse_args()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with kind(args.api, args.qmp):
        done.wait()
