"""/metrics over HTTP from a prometheus_client registry, in the foreground or on a thread of
its own: what `guestctl metrics` and `give-back --follow --metrics` serve."""

from __future__ import annotations

import socket
import sys
import threading
from http.server import ThreadingHTTPServer

from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import CollectorRegistry

from guestagent.transport.address import TcpAddress, grpc_target


class MetricsServer(ThreadingHTTPServer):
    """/metrics over HTTP; it says on stderr where it listens, `what` naming what it serves."""

    daemon_threads = True  # a scrape in flight does not hold up exit

    def __init__(self, address: TcpAddress, registry: CollectorRegistry, what: str) -> None:
        # An IPv6 address (`[::]:9464`) needs an AF_INET6 socket; http.server defaults to IPv4.
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        super().__init__((address.host, address.port), MetricsHandler.factory(registry))
        # The port actually bound: --listen may say 0.
        bound = grpc_target(TcpAddress(address.host, self.server_port))
        print(f"guestctl: {what} on http://{bound}/metrics", file=sys.stderr, flush=True)


def serve_in_background(listen: TcpAddress, registry: CollectorRegistry) -> MetricsServer:
    """A metrics server on a thread of its own; the caller closes it with shutdown()."""
    server = MetricsServer(listen, registry, "metrics")
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
