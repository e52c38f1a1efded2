"""The taskstats client's pure half: requests, replies and struct taskstats, on bytes captured
from the test guest's kernel (Debian 12's 6.1, struct version 13) and on made-up ones."""

from __future__ import annotations

import base64
import contextlib
import errno
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import AgentError, KernelFormat
from guestagent.linux.taskstats import (
    FREEPAGES_DELAY,
    TASKSTATS_TYPE_AGGR_TGID,
    TASKSTATS_TYPE_STATS,
    TASKSTATS_TYPE_TGID,
    TaskDelays,
    attributes,
    family_request,
    parse_family_id,
    parse_taskstats,
    parse_tgid_stats,
    reply_body,
    tgid_request,
)

# 2026-12-04, the test guest (6.1.0-57-cloud-amd64), kernel.task_delayacct 1, the reply to
# request 2 for tgid 1 (init, 21.9 s after boot): nothing stalled.
INIT_REPLY = base64.b64decode(
    "xAEAAB8AAAACAAAAFwEAAAIBAACwAQUACAACAAEAAACkAQMADQAAAAAAAAAAAAAAAAAAAAACAAAAAAAAM3h/CQAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB5dTkAAAAA2r/4PgAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAKVJOAQAAAABAGQEAAAAAAGCc"
    "DQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAADrAAAAAAAAABUBAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAB5dTkAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
)
# The same guest, request 2 for tgid 284: a reader of a 64 MiB file four times over in a
# cgroup with memory.max 24M, the cgroup's memory.pressure then "some ... total=315266" (us).
READER_REPLY = base64.b64decode(
    "xAEAAB8AAAACAAAAJAEAAAIBAACwAQUACAACABwBAACkAQMADQAAAAAAAAAAAAAAAAAAAK4BAAAAAAAA1qc0GAAA"
    "AAAOAAAAAAAAAG0IVAAAAAAAAAAAAAAAAAAAAAAAAAAAAABjw/YAAAAAVlZgHgEAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAwE57AAAAAADgnwIAAAAAAACM"
    "PAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAJ4BAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAABjw/YAAAAAtwMAAAAAAABNtm0SAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACYBAAAAAAAAd/E8BAAAAAA="
)


def test_a_captured_reply_for_init() -> None:
    tgid, delays = parse_tgid_stats(reply_body(INIT_REPLY, 2))
    assert tgid == 1
    assert delays == TaskDelays(13, 21_910_057, 0, 0, 0, 0)


def test_a_captured_reply_for_a_process_in_reclaim_agrees_with_psi() -> None:
    tgid, delays = parse_tgid_stats(reply_body(READER_REPLY, 2))
    assert tgid == 284 and delays.version == 13
    # Direct reclaim under memory.max: 309.2 ms, where the cgroup's PSI said 315.3 ms.
    assert delays.freepages_ns == 309_179_981
    assert delays.memory_ns == 309_179_981
    assert (delays.swapin_ns, delays.thrashing_ns, delays.compact_ns) == (0, 0, 0)


def test_a_reply_to_another_request_is_not_taken() -> None:
    with pytest.raises(KernelFormat, match="reply to request 2, not 3"):
        reply_body(READER_REPLY, 3)


def stats_reply(payload: bytes, seq: int = 7, tgid: int = 42) -> bytes:
    def attribute(kind: int, data: bytes) -> bytes:
        raw = struct.pack("=HH", 4 + len(data), kind) + data
        return raw + b"\0" * (-len(raw) % 4)

    nested = attribute(TASKSTATS_TYPE_TGID, struct.pack("=I", tgid)) + attribute(
        TASKSTATS_TYPE_STATS, payload
    )
    body = struct.pack("=BBH", 1, 1, 0) + attribute(TASKSTATS_TYPE_AGGR_TGID | 0x8000, nested)
    return struct.pack("=IHHII", 16 + len(body), 31, 0, seq, 0) + body


def test_an_older_struct_has_only_the_fields_of_its_version() -> None:
    # Version 7 (2.6.27): freepages is the last field, so no thrashing and no compaction.
    payload = bytearray(FREEPAGES_DELAY + 8)
    struct.pack_into("=H", payload, 0, 7)
    struct.pack_into("=Q", payload, 56, 5)
    struct.pack_into("=Q", payload, FREEPAGES_DELAY, 11)
    tgid, delays = parse_tgid_stats(reply_body(stats_reply(bytes(payload)), 7))
    assert tgid == 42
    assert delays == TaskDelays(7, 0, 5, 11, None, None) and delays.memory_ns == 16


def test_an_error_reply_carries_the_errno() -> None:
    error = struct.pack("=IHHII", 36, 2, 0, 5, 0) + struct.pack("=i", -errno.ESRCH) + bytes(16)
    with pytest.raises(AgentError, match="ESRCH") as raised:
        reply_body(error, 5)
    assert raised.value.errno == errno.ESRCH


def test_requests_are_well_formed() -> None:
    request = tgid_request(31, 284, 9)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", request)
    assert (length, kind, flags, seq) == (len(request), 31, 1, 9)
    assert list(attributes(request[20:])) == [(2, struct.pack("=I", 284))]
    family = family_request("TASKSTATS", 1)
    assert list(attributes(family[20:])) == [(2, b"TASKSTATS\0")]


def test_the_family_id_from_the_controllers_reply() -> None:
    body = struct.pack("=HH", 14, 2) + b"TASKSTATS\0" + b"\0\0" + struct.pack("=HHH", 6, 1, 31)
    assert parse_family_id(body + b"\0\0") == 31
    with pytest.raises(KernelFormat):
        parse_family_id(struct.pack("=HH", 14, 2) + b"TASKSTATS\0\0\0")


@pytest.mark.parametrize("size", [0, 1, 63])
def test_a_struct_too_short_for_any_version_is_a_format_error(size: int) -> None:
    with pytest.raises(KernelFormat, match=f"{size} bytes"):
        parse_taskstats(bytes(size))


@pytest.mark.slow
@given(st.binary(max_size=600), st.integers(0, 2**32 - 1))
def test_hostile_replies_give_a_format_error_or_a_value(data: bytes, seq: int) -> None:
    with contextlib.suppress(AgentError):
        parse_tgid_stats(reply_body(data, seq))


@pytest.mark.slow
@given(st.binary(max_size=600))
def test_hostile_structs_give_a_format_error_or_a_value(data: bytes) -> None:
    try:
        delays = parse_taskstats(data)
    except KernelFormat:
        return
    assert delays.memory_ns >= 0


def test_a_working_set_swap_in_counts_once() -> None:
    """The kernel times a working-set swap-in as thrashing and as swapin: PSI's stall is
    reclaim, thrashing and compaction, so swapin stays out where thrashing is there."""
    delays = TaskDelays(13, 0, swapin_ns=700, freepages_ns=20, thrashing_ns=500, compact_ns=3)
    assert delays.memory_ns == 523
