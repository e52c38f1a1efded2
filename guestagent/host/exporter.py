"""`guestctl metrics`: serve an agent's memory report over HTTP in Prometheus text format.

The only module that imports prometheus_client (the `host` extra); guestctl imports it when
the command runs. The figures come from host/metrics.py over the feed's latest report.
"""

from __future__ import annotations

import math
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector, CollectorRegistry

from guestagent.host.client import AgentClient
from guestagent.host.feed import WatchFeed
from guestagent.host.follow import Change, Reading
from guestagent.host.metrics import Family, Snapshot, families
from guestagent.transport.address import TcpAddress, grpc_target


def to_prometheus(family: Family) -> Metric:
    metric: GaugeMetricFamily | CounterMetricFamily
    if family.kind == "counter":
        # CounterMetricFamily takes the name without _total and adds it to each sample.
        metric = CounterMetricFamily(
            family.name.removesuffix("_total"), family.help, labels=family.label_names
        )
    else:
        metric = GaugeMetricFamily(family.name, family.help, labels=family.label_names)
    for sample in family.samples:
        metric.add_metric(list(sample.label_values), sample.value)
    return metric


class FeedCollector(Collector):
    """Builds the families at each scrape from what the feed holds then."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        for family in families(self._snapshot()):
            yield to_prometheus(family)


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


def serve_metrics(target: str, listen: TcpAddress, cgroups: Sequence[str], interval_ms: int) -> int:
    """Serve until SIGTERM or SIGINT; a listen address that cannot be bound raises OSError."""
    with AgentClient(target) as client:
        registry = CollectorRegistry(auto_describe=False)
        feed = WatchFeed(client, cgroups, interval_ms)
        registry.register(FeedCollector(feed.snapshot))
        server = MetricsServer(listen, registry, f"metrics of {target}")
        # SIGTERM as SIGINT: KeyboardInterrupt in the main thread leaves serve_forever.
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        feed.start()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.server_close()
            feed.stop()
    return 0


class FollowMetrics:
    """`give-back --follow --metrics`: what the loop asks and sees, one series per device."""

    def __init__(self, vmm: str, device: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ("vmm", "device")
        values = (vmm, device)
        self._values = values

        def gauge(name: str, help: str) -> Any:
            return Gauge(name, help, labels, registry=self.registry).labels(*values)

        self.taken = gauge(
            "guestctl_giveback_follow_taken_bytes", "What the device holds of the guest's memory"
        )
        self.asked = gauge(
            "guestctl_giveback_follow_asked_bytes", "What the device is asked to hold"
        )
        self.safe = gauge(
            "guestctl_giveback_follow_safe_bytes",
            "The most the device may hold by the agent's figure (NaN without one)",
        )
        self.stall = gauge(
            "guestctl_giveback_follow_stall_ratio",
            "Share of the last interval some task stalled on memory (NaN without two samples)",
        )
        self.changes = Counter(
            "guestctl_giveback_follow_changes",
            "Requests to the VMM, by direction and cause",
            (*labels, "direction", "cause"),
            registry=self.registry,
        )

    def observe(self, reading: Reading, asked: int, stall: float | None) -> None:
        self.taken.set(reading.taken)
        self.asked.set(asked)
        self.safe.set(math.nan if reading.safe is None else reading.safe)
        self.stall.set(math.nan if stall is None else stall)

    def changed(self, change: Change, direction: str) -> None:
        self.changes.labels(*self._values, direction, change.cause).inc()


def serve_in_background(listen: TcpAddress, registry: CollectorRegistry) -> MetricsServer:
    """A metrics server on a thread of its own; the caller closes it with shutdown()."""
    server = MetricsServer(listen, registry, "metrics")
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
