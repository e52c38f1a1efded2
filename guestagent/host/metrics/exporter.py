"""`guestctl metrics`: serve an agent's memory report over HTTP in Prometheus text format, the
figures from families.py over the feed's latest report."""

from __future__ import annotations

import signal
from collections.abc import Sequence

from guestagent.host.client import AgentClient
from guestagent.host.metrics.families import families
from guestagent.host.metrics.feed import WatchFeed
from guestagent.host.metrics.server import MetricsServer
from guestagent.transport.address import TcpAddress


def serve_metrics(target: str, listen: TcpAddress, cgroups: Sequence[str], interval_ms: int) -> int:
    """Serve until SIGTERM or SIGINT; a listen address that cannot be bound raises OSError."""
    with AgentClient(target) as client:
        feed = WatchFeed(client, cgroups, interval_ms)
        server = MetricsServer(listen, lambda: families(feed.snapshot()), f"metrics of {target}")
        feed.start()
        try:
            server.serve_until_signalled((signal.SIGTERM, signal.SIGINT))
        finally:
            server.server_close()
            feed.stop()
    return 0
