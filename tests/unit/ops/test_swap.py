import os
from pathlib import Path

import pytest

from guestagent.errors import FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.abi import (
    SWAP_FLAG_DISCARD,
    SWAP_FLAG_DISCARD_ONCE,
    SWAP_FLAG_DISCARD_PAGES,
    SWAP_FLAG_PREFER,
)
from guestagent.linux.blockdev import BlockDevice, DeviceSelector
from guestagent.ops.swap import (
    DiscardPolicy,
    EnableSwapSpec,
    SwapManager,
    swapon_flags,
)
from tests.fakes.devices import VDB, FakeFinder
from tests.fakes.root import FakeRoot

PAGE = 4096
SWAPS = (
    "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    "/dev/vdb                                partition\t1048572\t\t2048\t\t10\n"
    "/swap\\040file                           file\t\t65532\t\t0\t\t-2\n"
    "/dev/vdc\\040(deleted)                    partition\t262140\t\t0\t\t-3\n"
)


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


MiB = 1 << 20


@pytest.fixture
def disk_manager(fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch) -> SwapManager:
    """A manager over a fake tree whose /dev/vdb is a regular file, past the safety checks."""
    fake_root.write("proc/swaps", SWAPS.splitlines()[0] + "\n")
    fake_root.write("sys/class/block/vdb/queue/rotational", "1\n")
    monkeypatch.setattr("guestagent.ops.swap.refuse_unsafe_device", lambda fs, device: None)
    monkeypatch.setattr("guestagent.linux.swaps.blkid_signatures", lambda devnode: [])
    return SwapManager(fake_root.fs, FakeFinder([VDB]))


def write_disk(fake_root: FakeRoot, size: int, *writes: tuple[int, bytes]) -> Path:
    path = fake_root.root / "dev/vdb"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in writes:
            f.seek(offset)
            f.write(data)
    return path


@pytest.mark.parametrize(
    ("writes", "offset"),
    [
        (((0, b"sixteen bytes!!!"), (MiB, os.urandom(4 * MiB))), 0),
        (((40 * MiB, os.urandom(MiB)),), 40 * MiB),
    ],
)
def test_unknown_data_is_refused_and_left_alone(
    fake_root: FakeRoot,
    disk_manager: SwapManager,
    writes: tuple[tuple[int, bytes], ...],
    offset: int,
) -> None:
    path = write_disk(fake_root, 64 * MiB, *writes)
    before = path.read_bytes()
    with pytest.raises(FailedPrecondition) as raised:
        disk_manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0")))
    assert str(raised.value) == (
        f"/dev/vdb is neither blank nor swap: it has data at byte offset {offset}; "
        "pass force to format it anyway"
    )
    assert path.read_bytes() == before
    assert (fake_root.root / "sys/class/block/vdb/queue/rotational").read_text() == "1\n"


def test_a_blank_disk_goes_on_to_be_formatted(
    fake_root: FakeRoot, disk_manager: SwapManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_disk(fake_root, 64 * MiB)
    formatted: list[str] = []

    def prepare(device: BlockDevice, spec: EnableSwapSpec, reusable: object) -> None:
        formatted.append(device.devnode)
        raise RuntimeError("stop before swapon")

    monkeypatch.setattr(disk_manager, "_prepare_and_swapon", prepare)
    with pytest.raises(Exception, match="stop before swapon"):
        disk_manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0")))
    assert formatted == ["/dev/vdb"]


def test_force_skips_the_blank_check(
    fake_root: FakeRoot, disk_manager: SwapManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_disk(fake_root, 64 * MiB, (0, b"data"))
    formatted: list[bool] = []

    def must_not_read(fd: int) -> int | None:
        raise AssertionError("force must not read the disk")

    def prepare(device: BlockDevice, spec: EnableSwapSpec, reusable: object) -> None:
        formatted.append(reusable is None)
        raise RuntimeError("stop before swapon")

    monkeypatch.setattr("guestagent.ops.swap.first_data_offset", must_not_read)
    monkeypatch.setattr(disk_manager, "_prepare_and_swapon", prepare)
    with pytest.raises(Exception, match="stop before swapon"):
        disk_manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0"), force=True))
    assert formatted == [True]
