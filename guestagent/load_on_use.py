"""Modules a library imports but neither the agent nor the node daemon runs, executed only if
something reads them.

protobuf's descriptor_pool imports its pure-Python message implementation (python_message,
and through it text_format, decoder, encoder, type_checkers, datetime and pickle) whichever
implementation serves the messages. Under upb, the agent's, nothing calls into it, yet it is
about 1 MiB of every guest's anonymous memory (0.97 MiB; docs/measurements.md), and 0.7 MiB
of the node daemon's (host/entry.py). importlib's LazyLoader puts the module in sys.modules at
once and runs its code at the first attribute read, so an `import` of it stays cheap and any
real use still gets the whole module.

The standard library's ipaddress is the other: urllib.parse imports it for bracketed hosts,
and pathlib imports urllib.parse, so every agent loaded it at start while its kernel paths were
Paths, the largest module it loaded (0.2 MiB traced; docs/measurements.md, 2026-12-06). They
are strings now, and nothing the agent runs imports it until it checks that a tcp listener is
on loopback (a guest listening on vsock never does); deferred still, should a library bring it.

And calendar: upb imports protobuf's well-known types with the first message class it
builds, and they import calendar for Timestamp's conversions, which the contract never
uses: 0.22 MiB of RssAnon after the first call on this host (docs/measurements.md,
2026-12-06).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence

# Loaded by protobuf at import, called only by its pure-Python implementation. A module here
# must stay in the runtime tree: build/runtime.py traces the daemon's imports without this.
PROTOBUF_PURE_PYTHON = ("google.protobuf.internal.python_message",)
# Imported by urllib.parse, read only for an IP address (transport/address.py).
IP_ADDRESSES = ("ipaddress",)
# Imported by protobuf's well-known types (upb loads them with the first message class), read
# only by Timestamp's conversions; the contract has no Timestamp.
PROTOBUF_TIMESTAMPS = ("calendar",)
LOADED_ON_USE = (*PROTOBUF_PURE_PYTHON, *IP_ADDRESSES, *PROTOBUF_TIMESTAMPS)


class LoadOnUseFinder:
    """A meta path finder: the named modules as the path finder finds them, with their loader
    wrapped in a LazyLoader; every other module it leaves to the finders after it. Not an
    importlib.abc.MetaPathFinder: importing that module brings tempfile, shutil and random
    (through importlib.resources) into every agent."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        # Python 3.11's LazyLoader is not safe against two threads' first reads at once; a
        # module here is read by no thread at all unless protobuf's implementation changes,
        # or, for ipaddress, by the event loop's alone, at start (a tcp listener's check).
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def load_on_use(names: Sequence[str] = LOADED_ON_USE) -> None:
    """From now on, importing one of the names runs none of its code until it is read.
    Only a process's entry may call this, before the library's first import."""
    if not any(isinstance(f, LoadOnUseFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, LoadOnUseFinder(names))
