"""Sizes as guestctl takes them on the command line: one parser for every flag.

All suffixes are 1024-based, as the kernel reads `64M` in memory.max and as Kubernetes
reads `64Mi`: K, M, G and T, each optionally followed by `i` or `iB` (and `B`), in any case.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"(\d+)([KMGT]?)(I?B?)")
_FACTORS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Said in every size flag's --help, so nobody has to guess whether M is 10^6.
SIZE_HELP = "bytes, or with a suffix K/M/G/T (also Ki/Mi/Gi/Ti, KiB/MiB/GiB/TiB), all 1024-based"
OCI_UNLIMITED = -1  # as ops/limits.py: the OCI spec's "no limit"


def parse_size(text: str) -> int:
    """'64M', '64Mi' and '64MiB' -> 67108864; '4096' as is. Never negative."""
    match = _SIZE.fullmatch(text.strip().upper())
    # A bare `I` (`64I`) is no unit; a suffix letter is needed before it.
    if match is None or (match[3].startswith("I") and not match[2]):
        raise ValueError(f"size {text!r} is not bytes or a number with a K/M/G/T suffix")
    return int(match[1]) * _FACTORS[match[2]]


def parse_limit(text: str) -> int:
    """A size, or -1 (also `max`) for unlimited, as the OCI runtime spec writes it."""
    if text.strip().lower() in ("-1", "max"):
        return OCI_UNLIMITED
    return parse_size(text)
