"""ssl kept out of the host's tools: grpc imports asyncio, which imports ssl when it can, and
ssl's libraries were 3.4 MiB of the node daemon's RSS (docs/measurements.md, the node daemon)
for tools that speak gRPC and HTTP in the clear. guestctl's entry (entry.py) keeps it out;
only qemu.qmp needs it (it imports it for a monitor over TLS, which no one here asks for), and
what imports qemu.qmp lets it in first."""

from __future__ import annotations

import sys


def keep_ssl_out() -> None:
    """Before any other import: `import ssl` fails, and asyncio and http.client do without."""
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]


def let_ssl_in() -> None:
    """Before importing qemu.qmp: ssl importable again, where keep_ssl_out() kept it out."""
    if "ssl" in sys.modules and sys.modules["ssl"] is None:
        del sys.modules["ssl"]
