"""Sizes as guestctl takes them on the command line (one parser for every flag), and sizes
rounded to whole blocks (of a balloon, a virtio-mem device, guest memory hotplug).

All suffixes are 1024-based, as the kernel reads `64M` in memory.max and as Kubernetes
reads `64Mi`: K, M, G and T, each optionally followed by `i` or `iB`, in any case. `MB`
(and KB, GB, TB) is refused: it is 10^6 to SI and to Kubernetes but 2^20 to Docker and most
tools, so an operator who writes it may mean either; the message names `MiB`.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"(\d+)([KMGT]?)(I?B?)")
_FACTORS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Said in every size flag's --help, so nobody has to guess whether M is 10^6.
SIZE_HELP = "bytes, or with a suffix K/M/G/T (also Ki/Mi/Gi/Ti, KiB/MiB/GiB/TiB), all 1024-based"
OCI_UNLIMITED = -1  # as ops/limits.py: the OCI spec's "no limit"
# The contract's sizes are int64 (LinuxMemory) or uint64: the int64 bound fits both.
LARGEST = (1 << 63) - 1


def round_up(value: int, block: int) -> int:
    """value up to a whole number of blocks; a block of 0 is exact."""
    return -(-value // block) * block if block > 0 else value


def round_down(value: int, block: int) -> int:
    return value // block * block if block > 0 else value


def parse_size(text: str) -> int:
    """'64M', '64Mi' and '64MiB' -> 67108864; '4096' as is. Never negative, at most LARGEST."""
    word = text.strip().upper()
    if word.startswith("-"):
        raise ValueError(f"size {text!r} is negative")
    match = _SIZE.fullmatch(word)
    # A bare `I` (`64I`) is no unit; a suffix letter is needed before it.
    if match is None or (match[3].startswith("I") and not match[2]):
        raise ValueError(f"size {text!r} is not bytes or a number with a K/M/G/T suffix")
    if match[2] and match[3] == "B":
        raise ValueError(
            f"size {text!r} is ambiguous ({match[2]}B is 1000-based to some, 1024-based to "
            f"others): write {match[1]}{match[2]}iB for 1024-based, or the bytes"
        )
    # Past 20 digits it is over LARGEST whatever the suffix (and int() has a digit limit).
    value = LARGEST + 1 if len(match[1]) > 20 else int(match[1]) * _FACTORS[match[2]]
    if value > LARGEST:
        raise ValueError(f"size {text!r} is over the largest, {LARGEST} bytes (8 EiB less 1)")
    return value


def parse_limit(text: str) -> int:
    """A size, or -1 (also `max`) for unlimited, as the OCI runtime spec writes it."""
    if text.strip().lower() in ("-1", "max"):
        return OCI_UNLIMITED
    if text.strip().startswith("-"):
        raise ValueError(f"limit {text!r} is negative: -1 or max means unlimited, else a size")
    return parse_size(text)
