"""/metrics over HTTP, in the foreground or on a thread of its own: what `guestctl metrics`,
`give-back --follow --metrics` and `guestctl node` serve. Each scrape builds the families
then, from what the caller last saw: never a call to a guest, so a slow one delays none."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from guestagent.host.metrics.exposition import CONTENT_TYPE, exposition
from guestagent.host.metrics.families import Family
from guestagent.transport.address import TcpAddress, grpc_target

Build = Callable[[], Iterable[Family]]
# Says where the server listens: (its URL, what it serves).
Announce = Callable[[str, str], None]


def _stderr(url: str, what: str) -> None:
    print(f"guestctl: {what} on {url}", file=sys.stderr, flush=True)


def _handler(build: Build) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/metrics"):
                status, kind, body = 200, CONTENT_TYPE, exposition(build()).encode()
            elif path == "/healthz":
                status, kind, body = 200, "text/plain; charset=utf-8", b"ok\n"
            else:
                status, kind, body = 404, "text/plain; charset=utf-8", b"/metrics or /healthz\n"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # A scrape every 15 s is no news.

    return Handler


class MetricsServer(ThreadingHTTPServer):
    """/metrics over HTTP; it says where it listens (on stderr unless told otherwise), `what`
    naming what it serves."""

    daemon_threads = True  # a scrape in flight does not hold up exit

    def __init__(
        self, address: TcpAddress, build: Build, what: str, announce: Announce = _stderr
    ) -> None:
        # An IPv6 address (`[::]:9464`) needs an AF_INET6 socket; http.server defaults to IPv4.
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        super().__init__((address.host, address.port), _handler(build))
        # The port actually bound: --listen may say 0.
        bound = grpc_target(TcpAddress(address.host, self.server_port))
        announce(f"http://{bound}/metrics", what)


def serve_in_background(
    listen: TcpAddress, build: Build, announce: Announce = _stderr
) -> MetricsServer:
    """A metrics server on a thread of its own; the caller closes it with shutdown()."""
    server = MetricsServer(listen, build, "metrics", announce)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
