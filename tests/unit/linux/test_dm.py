import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import FailedPrecondition
from guestagent.linux import dm
from guestagent.linux.dm import (
    DM_IOCTL,
    DM_SECURE_DATA_FLAG,
    DM_TARGET_SPEC,
    CryptTable,
    DeviceMapper,
    crypt_table,
    dm_request,
    pack_ioctl,
    pack_table_load,
    parse_target_versions,
    unpack_ioctl,
    write_hex,
)
from guestagent.linux.dm_mappings import Mapping, read_mappings
from tests.fakes.root import FakeRoot


def test_struct_sizes_match_dm_ioctl_h() -> None:
    assert DM_IOCTL.size == 312
    assert DM_TARGET_SPEC.size == 40


@pytest.mark.parametrize(
    ("command", "request_number"),
    [
        (dm.DM_VERSION_CMD, 0xC138FD00),
        (dm.DM_DEV_CREATE_CMD, 0xC138FD03),
        (dm.DM_DEV_REMOVE_CMD, 0xC138FD04),
        (dm.DM_DEV_SUSPEND_CMD, 0xC138FD06),
        (dm.DM_TABLE_LOAD_CMD, 0xC138FD09),
        (dm.DM_LIST_VERSIONS_CMD, 0xC138FD0D),
    ],
)
def test_request_numbers(command: int, request_number: int) -> None:
    assert dm_request(command) == request_number


def test_pack_ioctl_lays_out_the_header() -> None:
    buffer = pack_ioctl("guestagent-swap-vdb", flags=DM_SECURE_DATA_FLAG, data_size=400)
    assert len(buffer) == 400
    version = struct.unpack_from("=3I", buffer)
    data_size, data_start = struct.unpack_from("=2I", buffer, 12)
    assert version == (4, 0, 0) and (data_size, data_start) == (400, 312)
    assert buffer[48 : 48 + 20] == b"guestagent-swap-vdb\0"
    assert unpack_ioctl(buffer).flags == DM_SECURE_DATA_FLAG


def test_a_name_too_long_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 127"):
        pack_ioctl("x" * 128)


@pytest.mark.parametrize(
    ("size", "logical_block", "sector_size"),
    [
        (1 << 30, 512, 4096),
        (1 << 30, 4096, 4096),
        ((1 << 30) + 512, 512, 512),  # Not a multiple of 4 KiB: the disk's own sectors.
        (4096, 512, 4096),
    ],
)
def test_crypt_table_sector_size(size: int, logical_block: int, sector_size: int) -> None:
    table = crypt_table(size, logical_block, 254, 16)
    assert table == CryptTable(size // 512, 254, 16, sector_size)


@pytest.mark.parametrize(
    ("size", "logical_block", "reason"),
    [(1 << 30, 8192, "cannot be mapped"), ((1 << 30) + 512, 4096, "cannot"), (2048, 512, "small")],
)
def test_crypt_table_refusals(size: int, logical_block: int, reason: str) -> None:
    with pytest.raises(FailedPrecondition, match=reason):
        crypt_table(size, logical_block, 254, 16)


KEY = bytearray(range(64))


@pytest.mark.parametrize(
    ("table", "line"),
    [
        (
            CryptTable(2097152, 254, 16, 4096),
            f"aes-xts-plain64 {KEY.hex()} 0 254:16 0 2 allow_discards sector_size:4096",
        ),
        (
            CryptTable(2097153, 254, 32, 512),
            f"aes-xts-plain64 {KEY.hex()} 0 254:32 0 1 allow_discards",
        ),
    ],
)
def test_table_load_buffer(table: CryptTable, line: str) -> None:
    buffer = pack_table_load("guestagent-swap-vdb", table, KEY)
    header = unpack_ioctl(buffer)
    assert header.flags & DM_SECURE_DATA_FLAG
    assert header.data_size == len(buffer) and len(buffer) % 8 == 0
    assert struct.unpack_from("=I", buffer, 20) == (1,)  # target_count
    start, length, _, step, kind = DM_TARGET_SPEC.unpack_from(buffer, header.data_start)
    assert (start, length, kind.rstrip(b"\0")) == (0, table.length_sectors, b"crypt")
    assert step == len(buffer) - header.data_start
    params = buffer[header.data_start + DM_TARGET_SPEC.size :]
    assert params.rstrip(b"\0").decode() == line
    assert params[len(line)] == 0


@given(st.binary(min_size=1, max_size=64))
def test_write_hex_is_hex(key: bytes) -> None:
    buffer = bytearray(2 * len(key) + 2)
    write_hex(buffer, 1, bytearray(key))
    assert buffer[1:-1] == key.hex().encode() and buffer[0] == buffer[-1] == 0


def versions_answer(*targets: tuple[str, tuple[int, int, int]]) -> bytearray:
    buffer = pack_ioctl(data_size=1024)
    offset = DM_IOCTL.size
    for index, (name, version) in enumerate(targets):
        record = struct.pack("=4I", 0, *version) + name.encode() + b"\0"
        step = (len(record) + 7) & ~7
        last = index == len(targets) - 1
        buffer[offset : offset + len(record)] = record
        struct.pack_into("=I", buffer, offset, 0 if last else step)
        offset += step
    return buffer


def test_parse_target_versions() -> None:
    answer = versions_answer(("linear", (1, 4, 0)), ("crypt", (1, 24, 0)), ("verity", (1, 8, 1)))
    assert parse_target_versions(answer) == {
        "linear": (1, 4, 0),
        "crypt": (1, 24, 0),
        "verity": (1, 8, 1),
    }


def test_parse_target_versions_of_a_truncated_answer_stops() -> None:
    answer = versions_answer(("linear", (1, 4, 0)))
    answer[DM_IOCTL.size + 16 :] = b"x" * (len(answer) - DM_IOCTL.size - 16)  # No NUL.
    assert parse_target_versions(answer) == {}


def test_read_mappings(fake_root: FakeRoot) -> None:
    fake_root.add_mapping("guestagent-swap-vdb", "dm-0", "253:0", "vdb")
    fake_root.add_mapping("other", "dm-1", "253:1")
    fake_root.write("sys/block/vda/dev", "254:0\n")
    assert read_mappings(fake_root.fs) == [
        Mapping("guestagent-swap-vdb", "dm-0", 253, 0, ("vdb",)),
        Mapping("other", "dm-1", 253, 1, ()),
    ]
    mapping = read_mappings(fake_root.fs)[0]
    assert (mapping.devnode, mapping.mapper_node, mapping.backing_nodes) == (
        "/dev/dm-0",
        "/dev/mapper/guestagent-swap-vdb",
        "/dev/vdb",
    )


def test_the_key_and_the_buffer_are_wiped(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[bytearray, bytes]] = []

    def call(self: DeviceMapper, command: int, buffer: bytearray, what: str) -> None:
        seen.append((buffer, bytes(buffer)))

    keys: list[bytearray] = []

    def random(buffer: bytearray) -> None:
        buffer[:] = b"\xa5" * len(buffer)
        keys.append(buffer)

    monkeypatch.setattr(DeviceMapper, "_call", call)
    monkeypatch.setattr("guestagent.linux.syscalls.getrandom_into", random)
    DeviceMapper(fake_root.fs).load_crypt("guestagent-swap-vdb", CryptTable(2048, 254, 16, 4096))
    (buffer, sent), (key,) = seen[0], keys
    assert b"a5" * 64 in sent  # What the kernel got held the key...
    assert not any(buffer) and not any(key)  # ...and neither copy of it survives the call.


def test_a_missing_control_node_names_dm_mod(fake_root: FakeRoot) -> None:
    assert "load dm_mod" in (dm.has_crypt_target(DeviceMapper(fake_root.fs)) or "")


def test_no_crypt_target_names_dm_crypt(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DeviceMapper, "targets", lambda self: {"linear": (1, 4, 0)})
    why = dm.has_crypt_target(DeviceMapper(fake_root.fs)) or ""
    assert "dm_crypt is not loaded" in why and "linear" in why


def test_getrandom_fills_in_place() -> None:
    from guestagent.linux.syscalls import getrandom_into

    buffer = bytearray(64)
    getrandom_into(buffer)
    assert any(buffer)
