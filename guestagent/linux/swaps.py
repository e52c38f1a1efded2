"""What the kernel says about swap: /proc/swaps, and a swap area's on-disk header.

Pure functions over bytes, and the one read of /proc/swaps. A swap area's name is a path,
and a path may hold any byte but NUL: the kernel writes space, tab, newline and backslash in
it as \\ooo octal escapes (seq_file_path with " \\t\\n\\\\"), and every other byte as it
is. The name is decoded exactly that way, then as UTF-8 with surrogateescape, so a name that
is not UTF-8 still round-trips to the same bytes through os.fsencode (for swapoff).
"""

from __future__ import annotations

import os
import re

from guestagent.errors import AgentError, KernelFormat
from guestagent.linux.blockdev import SWAP_SIGNATURE, probe_signatures
from guestagent.linux.fs import KernelFS
from guestagent.linux.tools import blkid_signatures
from guestagent.records import record

_OCTAL_ESCAPE = re.compile(rb"\\([0-3][0-7]{2})")
# Only the separators the kernel writes: a name keeps a raw \v, \f or \r, which bytes.split()
# would take for whitespace.
_SEPARATORS = re.compile(rb"[ \t]+")
# The columns after the name: Type, Size and Used (KiB), Priority.
_COLUMNS_AFTER_NAME = 4


@record
class ActiveSwap:
    filename: str
    kind: str  # "partition" for a block device, "file" for a swap file.
    size_bytes: int
    used_bytes: int
    priority: int


@record
class SwapHeader:
    uuid: str
    label: str


def unescape_name(raw: bytes) -> str:
    """A /proc/swaps name as the path it stands for."""
    unescaped = _OCTAL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), raw)
    return unescaped.decode("utf-8", errors="surrogateescape")


def parse_proc_swaps(data: bytes) -> list[ActiveSwap]:
    """The active areas, from /proc/swaps (a header line, then one line per area)."""
    areas: list[ActiveSwap] = []
    for line in data.split(b"\n")[1:]:
        fields = [field for field in _SEPARATORS.split(line) if field]
        if not fields:
            continue
        if len(fields) <= _COLUMNS_AFTER_NAME:
            raise KernelFormat(f"/proc/swaps line {line!r} has too few fields")
        # The name is all but the last four fields. Its own spaces are escaped, but a kernel
        # that printed " (deleted)" after a removed device node unescaped would split it; the
        # fields are rejoined with the one space that was most likely there.
        name, (kind, size_kib, used_kib, priority) = (
            b" ".join(fields[:-_COLUMNS_AFTER_NAME]),
            fields[-_COLUMNS_AFTER_NAME:],
        )
        try:
            sizes = int(size_kib) * 1024, int(used_kib) * 1024, int(priority)
        except ValueError:
            raise KernelFormat(f"/proc/swaps line {line!r} is malformed") from None
        areas.append(ActiveSwap(unescape_name(name), kind.decode("ascii", "replace"), *sizes))
    return areas


def parse_swap_header(head: bytes, page_size: int) -> SwapHeader | None:
    """UUID and label of a version 1 swap header (struct swap_header_v1_2)."""
    if head[page_size - 10 : page_size] != b"SWAPSPACE2":
        return None
    raw_uuid, raw_label = head[1036:1052], head[1052:1068]
    return SwapHeader(uuid_text(raw_uuid), raw_label.split(b"\0")[0].decode(errors="replace"))


def uuid_text(raw: bytes) -> str:
    """str(uuid.UUID(bytes=raw)), without loading the uuid module (and platform, which it
    imports) into a daemon that reads a header a few times in its life."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def active_swaps(fs: KernelFS) -> list[ActiveSwap] | None:
    """The swap areas in use, from /proc/swaps; None for a kernel built without swap."""
    path = fs.proc("swaps")
    if not fs.exists(path):
        return None
    return parse_proc_swaps(fs.read_bytes(path))


@record
class DiskContents:
    signatures: tuple[str, ...]  # What the probes found on the disk, "swap" among them.
    swap_header: SwapHeader | None  # The swap header in the head, if it holds one.


def probe_disk(head: bytes, devnode: str, page_size: int) -> DiskContents:
    """What a disk's first bytes hold, by this agent's probes and libblkid's where installed."""
    found = probe_signatures(head, page_size)
    found += [s for s in blkid_signatures(devnode) if s not in found]
    header = parse_swap_header(head, page_size) if SWAP_SIGNATURE in found else None
    return DiskContents(tuple(found), header)


def read_swap_header(fs: KernelFS, devnode: str, page_size: int) -> SwapHeader | None:
    """An active area's header, read without a claim (swapon holds the exclusive one)."""
    try:
        fd = fs.open(fs.host_path(devnode), os.O_RDONLY)
    except AgentError:
        return None
    try:
        return parse_swap_header(os.pread(fd, page_size, 0), page_size)
    except OSError:
        return None
    finally:
        os.close(fd)
