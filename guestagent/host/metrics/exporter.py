"""`guestctl metrics`: serve an agent's memory report over HTTP in Prometheus text format.

It imports prometheus_client (the `host` extra), as server.py does; guestctl imports them when
the command runs. The figures come from families.py over the feed's latest report.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from guestagent.host.client import AgentClient
from guestagent.host.metrics.families import Family, families
from guestagent.host.metrics.feed import WatchFeed
from guestagent.host.metrics.server import MetricsServer
from guestagent.transport.address import TcpAddress


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


class FamiliesCollector(Collector):
    """Builds the families at each scrape from what `build` says then: never a call to a
    guest during a scrape, so a slow one delays none."""

    def __init__(self, build: Callable[[], Iterable[Family]]) -> None:
        self._build = build

    def collect(self) -> Iterator[Metric]:
        for family in self._build():
            yield to_prometheus(family)


def serve_metrics(target: str, listen: TcpAddress, cgroups: Sequence[str], interval_ms: int) -> int:
    """Serve until SIGTERM or SIGINT; a listen address that cannot be bound raises OSError."""
    with AgentClient(target) as client:
        registry = CollectorRegistry(auto_describe=False)
        feed = WatchFeed(client, cgroups, interval_ms)
        registry.register(FamiliesCollector(lambda: families(feed.snapshot())))
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
