import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from guestagent.linux.abi import (
    SWAP_FLAG_DISCARD,
    SWAP_FLAG_DISCARD_ONCE,
    SWAP_FLAG_DISCARD_PAGES,
    SWAP_FLAG_PREFER,
)
from guestagent.linux.blockdev import BlockDevice
from guestagent.linux.confidential import Confidential
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.dm import CryptTable, DeviceMapper
from guestagent.linux.dm_mappings import Mapping
from guestagent.ops.swap import (
    SwapManager,
    choose_encryption,
    refuse_other_encryption,
    swapon_flags,
)
from guestagent.ops.swap_area import DiscardPolicy, EnableSwapSpec, SwapEncryption
from guestagent.sizes import MIB
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
    assert not os.path.exists(fake_root.fs.run("guestagent", "swaps.json"))


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
        (((0, b"sixteen bytes!!!"), (MIB, os.urandom(4 * MIB))), 0),
        (((40 * MIB, os.urandom(MIB)),), 40 * MIB),
    ],
)
def test_unknown_data_is_refused_and_left_alone(
    fake_root: FakeRoot,
    disk_manager: SwapManager,
    writes: tuple[tuple[int, bytes], ...],
    offset: int,
) -> None:
    path = write_disk(fake_root, 64 * MIB, *writes)
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
    write_disk(fake_root, 64 * MIB)
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
    write_disk(fake_root, 64 * MIB, (0, b"data"))
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


NOT_CONFIDENTIAL = Confidential("none", "no SEV-SNP or TDX guest device or cpuinfo flag")
SNP = Confidential("sev-snp", "/sys/devices/platform/sev-guest")
E = SwapEncryption


@pytest.mark.parametrize(
    ("asked", "confidential", "chosen"),
    [
        (E.DEFAULT, NOT_CONFIDENTIAL, E.NONE),
        (E.DEFAULT, SNP, E.EPHEMERAL),
        (E.NONE, NOT_CONFIDENTIAL, E.NONE),
        (E.EPHEMERAL, NOT_CONFIDENTIAL, E.EPHEMERAL),
        (E.EPHEMERAL, SNP, E.EPHEMERAL),
    ],
)
def test_choose_encryption(asked: E, confidential: Confidential, chosen: E) -> None:
    assert choose_encryption(asked, confidential) is chosen


def test_none_is_refused_in_a_confidential_guest_naming_the_platform() -> None:
    with pytest.raises(FailedPrecondition, match=r"NONE refused: .*\(sev-snp, from /sys/devices"):
        choose_encryption(E.NONE, SNP)


@given(
    st.sampled_from(E),
    st.sampled_from(["sev-snp", "tdx", "other", "none"]),
)
def test_a_confidential_guest_never_swaps_in_the_clear(asked: E, platform: str) -> None:
    confidential = Confidential(platform, "test")
    try:
        chosen = choose_encryption(asked, confidential)
    except FailedPrecondition:
        assert confidential.is_confidential and asked is E.NONE
        return
    assert chosen is not E.DEFAULT
    assert chosen is E.EPHEMERAL or not confidential.is_confidential


@pytest.mark.parametrize(
    ("asked", "chosen", "encrypted", "refused"),
    [
        (E.EPHEMERAL, E.EPHEMERAL, True, False),
        (E.NONE, E.NONE, False, False),
        (E.DEFAULT, E.NONE, True, False),  # Unasked, encrypted is never less safe.
        (E.DEFAULT, E.NONE, False, False),
        (E.DEFAULT, E.EPHEMERAL, False, True),  # Plain swap in a confidential guest.
        (E.EPHEMERAL, E.EPHEMERAL, False, True),
        (E.NONE, E.NONE, True, True),
    ],
)
def test_refuse_other_encryption(asked: E, chosen: E, encrypted: bool, refused: bool) -> None:
    if refused:
        with pytest.raises(FailedPrecondition, match="/dev/vdb is already active swap"):
            refuse_other_encryption(asked, chosen, encrypted, "/dev/vdb")
    else:
        refuse_other_encryption(asked, chosen, encrypted, "/dev/vdb")


def confidential_manager(fake_root: FakeRoot, confidential: Confidential) -> SwapManager:
    fake_root.write("sys/class/block/vdb/size", f"{64 * MIB // 512}\n")
    return SwapManager(fake_root.fs, FakeFinder([VDB]), confidential)


def test_none_in_a_confidential_guest_leaves_the_disk_untouched(
    fake_root: FakeRoot, disk_manager: SwapManager
) -> None:
    path = write_disk(fake_root, 64 * MIB)
    manager = confidential_manager(fake_root, SNP)
    with pytest.raises(FailedPrecondition, match="sev-snp"):
        manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0"), encryption=E.NONE))
    assert path.read_bytes() == bytes(64 * MIB)
    assert (fake_root.root / "sys/class/block/vdb/queue/rotational").read_text() == "1\n"


def test_without_dm_crypt_nothing_is_mapped_or_formatted(
    fake_root: FakeRoot, disk_manager: SwapManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_disk(fake_root, 64 * MIB)
    monkeypatch.setattr(DeviceMapper, "targets", lambda self: {"linear": (1, 4, 0)})
    monkeypatch.setattr(DeviceMapper, "create", lambda self, name: pytest.fail("mapped"))
    manager = confidential_manager(fake_root, SNP)
    with pytest.raises(FailedPrecondition, match="dm_crypt is not loaded"):
        manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0")))
    assert path.read_bytes() == bytes(64 * MIB)
    assert (fake_root.root / "sys/class/block/vdb/queue/rotational").read_text() == "1\n"


def test_the_raw_disk_is_checked_before_anything_is_mapped(
    fake_root: FakeRoot, disk_manager: SwapManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_disk(fake_root, 64 * MIB, (MIB, b"somebody's data"))
    monkeypatch.setattr(DeviceMapper, "targets", lambda self: pytest.fail("reached dm"))
    manager = confidential_manager(fake_root, SNP)
    with pytest.raises(FailedPrecondition, match=f"data at byte offset {MIB}"):
        manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0"), encryption=E.EPHEMERAL))


def test_a_failed_table_load_removes_the_mapping_and_restores_the_disk(
    fake_root: FakeRoot, disk_manager: SwapManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_disk(fake_root, 64 * MIB)
    removed: list[str] = []

    def load(self: DeviceMapper, name: str, table: CryptTable) -> None:
        assert table == CryptTable(64 * MIB // 512, 254, 16, 4096)
        raise OSError(errno.EINVAL, "DM_TABLE_LOAD: Invalid argument")

    monkeypatch.setattr(DeviceMapper, "targets", lambda self: {"crypt": (1, 24, 0)})
    monkeypatch.setattr(DeviceMapper, "create", lambda self, name: (253, 0))
    monkeypatch.setattr(DeviceMapper, "load_crypt", load)
    monkeypatch.setattr(DeviceMapper, "remove", lambda self, name: removed.append(name))
    manager = confidential_manager(fake_root, NOT_CONFIDENTIAL)
    with pytest.raises(Aborted, match=r"removed mapping guestagent-swap-vdb; .*rotational=1"):
        manager.enable(EnableSwapSpec(DeviceSelector(serial="swap0"), encryption=E.EPHEMERAL))
    assert removed == ["guestagent-swap-vdb"]
    assert path.read_bytes() == bytes(64 * MIB)
    assert (fake_root.root / "sys/class/block/vdb/queue/rotational").read_text() == "1"


def test_start_removes_a_mapping_without_swap_and_keeps_an_active_one(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_root.write("proc/swaps", SWAPS.splitlines()[0] + "\n/dev/dm-1 partition 1024 0 -2\n")
    fake_root.add_mapping("guestagent-swap-vdb", "dm-0", "253:0", "vdb")
    fake_root.add_mapping("guestagent-swap-vdc", "dm-1", "253:1", "vdc")
    fake_root.add_mapping("someone-elses", "dm-2", "253:2", "vdd")
    removed: list[str] = []
    monkeypatch.setattr(DeviceMapper, "remove", lambda self, name: removed.append(name))
    SwapManager(fake_root.fs, FakeFinder([VDB]), NOT_CONFIDENTIAL).check_state()
    assert removed == ["guestagent-swap-vdb"]


def test_start_on_a_kernel_without_swap_removes_our_mapping_and_goes_on(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not (fake_root.root / "proc/swaps").exists()
    fake_root.add_mapping("guestagent-swap-vdb", "dm-0", "253:0", "vdb")
    removed: list[str] = []
    monkeypatch.setattr(DeviceMapper, "remove", lambda self, name: removed.append(name))
    SwapManager(fake_root.fs, FakeFinder([VDB]), NOT_CONFIDENTIAL).check_state()
    assert removed == ["guestagent-swap-vdb"]


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (OSError(errno.EBUSY, "Device or resource busy"), "EBUSY"),
        (FailedPrecondition("the kernel has no device-mapper: load dm_mod"), "load dm_mod"),
    ],
)
def test_a_mapping_that_cannot_be_removed_is_named_with_why(
    fake_root: FakeRoot, monkeypatch: pytest.MonkeyPatch, failure: Exception, said: str
) -> None:
    def remove(self: DeviceMapper, name: str) -> None:
        raise failure

    monkeypatch.setattr(DeviceMapper, "remove", remove)
    mapping = Mapping("guestagent-swap-vdb", "dm-0", 253, 0, ("vdb",))
    manager = SwapManager(fake_root.fs, FakeFinder([VDB]))
    expected = f"removing mapping guestagent-swap-vdb failed: .*{said}"
    with pytest.raises(FailedPrecondition, match=expected):
        manager._unmap(mapping)
