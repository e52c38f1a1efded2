"""A Kata shim's monitor as both runtimes serve it (Kata 4.1.0: the Go shim's
shim_management.go answers 500 with its error's text; runtime-rs's shim_mgmt/handlers.rs 200
with an empty body), one that hangs, one that answers garbage: each a clear AgentUrlError."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from guestagent.host.node.sandboxes import AgentUrlError
from guestagent.host.node.shim import ask_agent_address


class UnixHTTPServer(ThreadingHTTPServer):
    address_family = socket.AF_UNIX
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)
        self.server_name, self.server_port = "shim", 0


def shim(path: Path, status: int, body: bytes, delay: float = 0.0) -> UnixHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert self.path == "/agent-url"
            time.sleep(delay)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = UnixHTTPServer(str(path), Handler)  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "shim-monitor.sock"


def test_the_go_shims_answer(socket_path: Path) -> None:
    with shim(socket_path, 200, b"hvsock:///run/vc/vm/abc/clh.sock:1024") as server:
        assert ask_agent_address(str(socket_path), 6464, 2.0) == (
            "hvsock:///run/vc/vm/abc/clh.sock:6464"
        )
        server.shutdown()


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (500, b"sandbox not ready", "HTTP 500 Internal Server Error: sandbox not ready"),
        (200, b"", "the shim gave no agent URL"),  # runtime-rs on error.
        (200, b"\x00\x01\x02", "is not vsock:// or hvsock://"),
        (404, b"URL NOT FOUND", "HTTP 404"),
    ],
)
def test_a_shim_that_cannot_say_is_one_error(
    socket_path: Path, status: int, body: bytes, said: str
) -> None:
    with shim(socket_path, status, body) as server:
        with pytest.raises(AgentUrlError, match=said):
            ask_agent_address(str(socket_path), 6464, 2.0)
        server.shutdown()


def test_a_shim_that_hangs_is_given_up_on(socket_path: Path) -> None:
    with shim(socket_path, 200, b"vsock://3:1024", delay=3.0) as server:
        started = time.monotonic()
        with pytest.raises(AgentUrlError, match=r"no answer from .* within 0\.5 s"):
            ask_agent_address(str(socket_path), 6464, 0.5)
        assert time.monotonic() - started < 2.0
        server.shutdown()


def test_a_shim_gone_names_its_socket(socket_path: Path) -> None:
    with pytest.raises(AgentUrlError, match=f"{socket_path}: .*No such file"):
        ask_agent_address(str(socket_path), 6464, 1.0)
