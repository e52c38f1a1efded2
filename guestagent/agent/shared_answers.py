"""GetMemoryInfo's answers, encoded once for every caller whose report would be the same.

Callers within the readings' window share the kernel's readings (ops/shared_reads.py), yet
each built its report, its protobuf message and its bytes anew: under a hundred callers that
was most of what the agent spent on a call above grpc's own (docs/measurements.md, issue 56).
A report is a function of its spec and its readings (ops/info.py Reporter.report_from), so
the last answer encoded for a spec serves a later call whose readings are the same ones; any
other call builds and encodes its own, as before, and keeps it for the next.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from guestagent.ops.info import InfoSpec, Readings

# Specs whose last answer is kept, the oldest dropped first: a host asks a few specs over
# and over (the node's figures, or each of its containers' cgroups).
MAX_SPECS = 256


class SharedAnswers:
    def __init__(self, max_specs: int = MAX_SPECS) -> None:
        self._max_specs = max_specs
        self._lock = threading.Lock()
        self._last: dict[InfoSpec, tuple[Readings, bytes]] = {}

    def answer(self, spec: InfoSpec, readings: Readings, encode: Callable[[], bytes]) -> bytes:
        """The answer kept for spec if it was made of the same readings, else encode()'s,
        kept in its place."""
        with self._lock:
            kept = self._last.get(spec)
        if kept is not None and kept[0].same_as(readings):
            return kept[1]
        encoded = encode()
        with self._lock:
            self._last.pop(spec, None)
            self._last[spec] = (readings, encoded)
            while len(self._last) > self._max_specs:
                del self._last[next(iter(self._last))]
        return encoded

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)
