"""/proc/swaps and the swap header, parsed from bytes exactly as the kernel writes them."""

from __future__ import annotations

import contextlib
import os
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import KernelFormat
from guestagent.linux.swaps import (
    ActiveSwap,
    parse_proc_swaps,
    parse_swap_header,
    unescape_name,
)

PAGE = 4096
HEADER = b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


def kernel_escape(path: bytes) -> bytes:
    """What seq_file_path(m, file, " \\t\\n\\\\") makes of a path: those four as \\ooo octal."""
    return b"".join(b"\\%03o" % byte if byte in b" \t\n\\" else bytes([byte]) for byte in path)


def line(
    name: bytes, kind: bytes = b"partition", size: int = 1024, used: int = 0, prio: int = -2
) -> bytes:
    # The kernel pads the name to 40 columns with at least one space (swap_show's
    # `len < 40 ? 40 - len : 1`), then tab-separates the rest.
    padding = b" " * max(40 - len(name), 1)
    return name + padding + b"%s\t%d\t\t%d\t\t%d\n" % (kind, size, used, prio)


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b"/dev/vdb", "/dev/vdb"),
        (b"/swap\\040file", "/swap file"),
        (b"/a\\011tab", "/a\ttab"),
        (b"/new\\012line", "/new\nline"),
        (b"/back\\134slash", "/back\\slash"),
        # unicode_escape used to raise on this, and to garble the UTF-8 below.
        (b"/back\\134\\134x", "/back\\\\x"),
        ("/swäp/файл".encode(), "/swäp/файл"),
        # Not UTF-8: kept as surrogates, so os.fsencode gives swapoff the same bytes back.
        (b"/swap\xff", "/swap\udcff"),
        # The kernel escapes only those four: anything else stays as it is.
        (b"/odd\\x41", "/odd\\x41"),
        (b"/dev/vdc\\040(deleted)", "/dev/vdc (deleted)"),
    ],
)
def test_unescape_name(raw: bytes, name: str) -> None:
    assert unescape_name(raw) == name


def test_parse_proc_swaps() -> None:
    data = (
        HEADER
        + line(b"/dev/vdb", size=1048572, used=2048, prio=10)
        + line(b"/swap\\040file", kind=b"file\t", size=65532, prio=-2)
        + line(b"/dev/vdc\\040(deleted)", size=262140, prio=-3)
        # An older form, with the space of " (deleted)" not escaped.
        + line(b"/dev/vdd (deleted)", size=4096, prio=-4)
    )
    vdb, spaced, deleted, old = parse_proc_swaps(data)
    assert vdb == ActiveSwap("/dev/vdb", "partition", 1048572 * 1024, 2048 * 1024, 10)
    assert spaced == ActiveSwap("/swap file", "file", 65532 * 1024, 0, -2)
    assert deleted.filename == "/dev/vdc (deleted)" and deleted.size_bytes == 262140 * 1024
    assert old.filename == "/dev/vdd (deleted)" and old.priority == -4


def test_only_the_header_means_no_areas() -> None:
    assert parse_proc_swaps(HEADER) == []
    assert parse_proc_swaps(b"") == []


@pytest.mark.parametrize(
    "data",
    [HEADER + b"/dev/vdb partition 10 0\n", HEADER + b"/dev/vdb partition ten 0 -2\n"],
)
def test_malformed_lines_are_kernel_format_errors(data: bytes) -> None:
    with pytest.raises(KernelFormat, match="/proc/swaps line"):
        parse_proc_swaps(data)


# Any path the kernel could hold: any bytes but NUL, starting with '/'.
paths = st.binary(min_size=1, max_size=80).map(lambda b: b"/" + b.replace(b"\0", b""))


@given(
    path=paths,
    size=st.integers(0, 2**40),
    used=st.integers(0, 2**40),
    prio=st.integers(-32768, 32767),
)
def test_any_path_round_trips(path: bytes, size: int, used: int, prio: int) -> None:
    (area,) = parse_proc_swaps(HEADER + line(kernel_escape(path), size=size, used=used, prio=prio))
    assert os.fsencode(area.filename) == path
    assert (area.size_bytes, area.used_bytes, area.priority) == (size * 1024, used * 1024, prio)


@given(data=st.binary(max_size=2000))
def test_garbage_is_parsed_or_a_kernel_format_error(data: bytes) -> None:
    with contextlib.suppress(KernelFormat):
        parse_proc_swaps(data)


def test_swap_header_uuid_and_label() -> None:
    ident = uuid.uuid4()
    head = bytearray(PAGE)
    head[1036:1052] = ident.bytes
    head[1052:1068] = b"guestagent-swap\0"
    head[PAGE - 10 :] = b"SWAPSPACE2"
    header = parse_swap_header(bytes(head), PAGE)
    assert header is not None
    assert (header.uuid, header.label) == (str(ident), "guestagent-swap")
    assert parse_swap_header(bytes(PAGE), PAGE) is None
