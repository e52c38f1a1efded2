"""/metrics over HTTP from a prometheus_client registry, in the foreground or on a thread of
its own: what `guestctl metrics`, `give-back --follow --metrics` and `guestctl node` serve."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import CollectorRegistry

from guestagent.transport.address import TcpAddress, grpc_target


def _stderr(url: str, what: str) -> None:
    print(f"guestctl: {what} on {url}", file=sys.stderr, flush=True)


# Says where the server listens: (its URL, what it serves).
Announce = Callable[[str, str], None]


class MetricsServer(ThreadingHTTPServer):
    """/metrics over HTTP; it says where it listens (on stderr unless told otherwise), `what`
    naming what it serves."""

    daemon_threads = True  # a scrape in flight does not hold up exit

    def __init__(
        self,
        address: TcpAddress,
        registry: CollectorRegistry,
        what: str,
        announce: Announce = _stderr,
    ) -> None:
        # An IPv6 address (`[::]:9464`) needs an AF_INET6 socket; http.server defaults to IPv4.
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        super().__init__((address.host, address.port), MetricsHandler.factory(registry))
        # The port actually bound: --listen may say 0.
        bound = grpc_target(TcpAddress(address.host, self.server_port))
        announce(f"http://{bound}/metrics", what)


def serve_in_background(
    listen: TcpAddress, registry: CollectorRegistry, announce: Announce = _stderr
) -> MetricsServer:
    """A metrics server on a thread of its own; the caller closes it with shutdown()."""
    server = MetricsServer(listen, registry, "metrics", announce)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
