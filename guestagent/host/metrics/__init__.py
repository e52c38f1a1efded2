"""An agent's memory report as Prometheus metrics on the host: the families, a pure
conversion (`families.py`), the feed that keeps the latest WatchMemory message (`feed.py`),
and the HTTP endpoint (`exporter.py`, `server.py`: the only modules that import
prometheus_client, the `host` extra, beside giveback/follow_metrics.py)."""
