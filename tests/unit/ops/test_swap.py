import uuid

import pytest

from guestagent.errors import FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.blockdev import DeviceSelector
from guestagent.ops.swap import (
    SWAP_FLAG_DISCARD,
    SWAP_FLAG_DISCARD_ONCE,
    SWAP_FLAG_DISCARD_PAGES,
    SWAP_FLAG_PREFER,
    DiscardPolicy,
    EnableSwapSpec,
    SwapManager,
    parse_proc_swaps,
    parse_swap_header,
    swapon_flags,
)
from tests.fakes.root import FakeRoot
from tests.unit.linux.test_blockdev import VDB, FakeFinder

PAGE = 4096
SWAPS = (
    "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    "/dev/vdb                                partition\t1048572\t\t2048\t\t10\n"
    "/swap\\040file                           file\t\t65532\t\t0\t\t-2\n"
    "/dev/vdc (deleted)                      partition\t262140\t\t0\t\t-3\n"
)


def test_parse_proc_swaps() -> None:
    vdb, spaced, deleted = parse_proc_swaps(SWAPS)
    assert deleted.filename == "/dev/vdc (deleted)" and deleted.size_bytes == 262140 * 1024
    assert (vdb.filename, vdb.kind, vdb.size_bytes, vdb.used_bytes, vdb.priority) == (
        "/dev/vdb",
        "partition",
        1048572 * 1024,
        2048 * 1024,
        10,
    )
    assert spaced.filename == "/swap file" and spaced.priority == -2


@pytest.mark.parametrize(
    ("priority", "discard", "flags"),
    [
        (None, DiscardPolicy.NONE, 0),
        (None, DiscardPolicy.BOTH, SWAP_FLAG_DISCARD),
        (None, DiscardPolicy.PAGES, SWAP_FLAG_DISCARD | SWAP_FLAG_DISCARD_PAGES),
        (None, DiscardPolicy.ONCE, SWAP_FLAG_DISCARD | SWAP_FLAG_DISCARD_ONCE),
        (10, DiscardPolicy.NONE, SWAP_FLAG_PREFER | 10),
        (32767, DiscardPolicy.BOTH, SWAP_FLAG_PREFER | 32767 | SWAP_FLAG_DISCARD),
        (0, DiscardPolicy.NONE, SWAP_FLAG_PREFER),
    ],
)
def test_swapon_flags(priority: int | None, discard: DiscardPolicy, flags: int) -> None:
    assert swapon_flags(priority, discard) == flags


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"priority": -1}, "outside 0..32767"),
        ({"priority": 40000}, "outside"),
        ({"label": "x" * 17}, "longer than 16"),
    ],
)
def test_spec_refusals(kwargs: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        EnableSwapSpec(DeviceSelector(serial="swap0"), **kwargs)  # type: ignore[arg-type]


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


def test_an_active_area_is_reported_and_left_alone(fake_root: FakeRoot) -> None:
    fake_root.write("proc/swaps", SWAPS)
    fake_root.write("sys/class/block/vdb/queue/rotational", "0\n")
    fake_root.write("sys/class/block/vdb/queue/discard_max_bytes", "2147483136\n")
    manager = SwapManager(fake_root.fs, FakeFinder([VDB]))
    area = manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0"), priority=5))
    assert area.already_active and not area.formatted
    assert (area.device, area.priority, area.size_bytes) == ("/dev/vdb", 10, 1048572 * 1024)
    assert area.rotational is False and area.discard_supported
    assert area.discard is None  # Not enabled by this agent: the policy is unknown.
    assert not fake_root.fs.run("guestagent", "swaps.json").exists()


def test_enable_refuses_a_regular_file_before_touching_it(fake_root: FakeRoot) -> None:
    fake_root.write("proc/swaps", SWAPS.splitlines()[0] + "\n")
    node = fake_root.write("dev/vdb", "precious")
    manager = SwapManager(fake_root.fs, FakeFinder([VDB]))
    with pytest.raises(FailedPrecondition, match="not a block device"):
        manager.enable(EnableSwapSpec(DeviceSelector(path="/dev/vdb")))
    assert node.read_text() == "precious"


def test_disable_of_an_inactive_device_is_not_found(fake_root: FakeRoot) -> None:
    fake_root.write("proc/swaps", SWAPS.splitlines()[0] + "\n")
    manager = SwapManager(fake_root.fs, FakeFinder([VDB]))
    with pytest.raises(NotFound, match="/dev/vdb is not an active swap area"):
        manager.disable(DeviceSelector(serial="swap0"))
