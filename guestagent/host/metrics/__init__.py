"""An agent's memory report as Prometheus metrics on the host: the families, a pure
conversion (`families.py`), the feed that keeps the latest WatchMemory message (`feed.py`),
the text format (`exposition.py`) and the HTTP endpoint (`server.py`, `exporter.py`)."""
