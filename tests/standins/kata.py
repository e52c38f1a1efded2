"""Stand-ins for what a Kata sandbox leaves on a host, for the node daemon's VM test: no Kata
shim and no vhost-vsock run here, so a sandbox is laid out by hand around a QEMU guest.

- `ShimMonitor`: the shim's monitor socket as Kata 4.1.0's Go shim serves it
  (src/runtime/pkg/containerd-shim-v2/shim_management.go, ddcb1ad): HTTP on a unix socket,
  `GET /agent-url` answering 200 with the URL and no newline, 500 with an error's text.
- `HybridVsock`: a VMM's hybrid vsock socket as Firecracker documents it (docs/vsock.md,
  81b38b9) and Cloud Hypervisor implements it (virtio-devices/src/vsock/unix/muxer.rs,
  ae44c29): the host writes `CONNECT <port>\\n` (either case), the VMM answers
  `OK <host-side port>\\n` and then carries the bytes to the guest's port, or closes when
  nothing listens there. Here the guest's port is QEMU's forwarded TCP port of the agent.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


class ShimMonitor:
    """GET /agent-url on a unix socket; `agent_url` None answers 500 as a failing shim."""

    def __init__(self, path: Path, agent_url: str | None) -> None:
        self.path, self.agent_url = path, agent_url
        monitor = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/agent-url":
                    status, body = 404, b"404 page not found\n"
                elif monitor.agent_url is None:
                    status, body = 500, b"sandbox is not running"
                else:
                    status, body = 200, monitor.agent_url.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        path.parent.mkdir(parents=True, exist_ok=True)
        self._server = _UnixServer(str(path), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class HybridVsock:
    """A hybrid vsock socket whose guest port `port` is the agent at 127.0.0.1:`tcp_port`."""

    def __init__(self, path: Path, port: int, tcp_port: int) -> None:
        self.path, self.port, self.tcp_port = path, port, tcp_port
        self.connects = 0
        vsock = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                line = b""
                while not line.endswith(b"\n") and len(line) < 32:
                    byte = conn.recv(1)
                    if not byte:
                        return
                    line += byte
                word, _, asked = line.decode(errors="replace").strip().partition(" ")
                if word.lower() != "connect" or asked != str(vsock.port):
                    return  # Nothing listens there: the VMM closes the connection.
                vsock.connects += 1
                with socket.create_connection(("127.0.0.1", vsock.tcp_port), 10) as guest:
                    guest.settimeout(None)
                    conn.sendall(f"OK {1 << 30 | vsock.connects}\n".encode())
                    back = threading.Thread(target=_pipe, args=(guest, conn), daemon=True)
                    back.start()
                    _pipe(conn, guest)
                    back.join()

        path.parent.mkdir(parents=True, exist_ok=True)
        self._server = _UnixServer(str(path), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
