"""Swap: one shared area per pod on a virtio disk, non-rotational, enabled with discard.

The kernel decides at swapon time whether an area is an SSD (cluster allocation, and the
per-cluster discards that give freed blocks back to a sparse file on the host) from
queue/rotational, and virtio-blk says "rotational" by default; so rotational is set to 0
before swapon. A device that is neither blank (all zeros, as a sparse file reads) nor swap
is never formatted without `force`, and a failure after the disk was touched puts back what
was there.
"""

from __future__ import annotations

import enum
import os
import threading
from dataclasses import asdict, dataclass

from guestagent.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    errno_text,
)
from guestagent.jsonlog import EventLog
from guestagent.linux import syscalls
from guestagent.linux.abi import (
    PAGE_SIZE,
    SWAP_FLAG_DISCARD,
    SWAP_FLAG_DISCARD_ONCE,
    SWAP_FLAG_DISCARD_PAGES,
    SWAP_FLAG_PREFER,
    SWAP_FLAG_PRIO_MASK,
)
from guestagent.linux.blockdev import (
    HEAD_BYTES,
    SWAP_SIGNATURE,
    BlockDevice,
    DeviceFinder,
    DeviceSelector,
    UdevDevices,
    device_for_node,
    first_data_offset,
    open_exclusive,
    queue_value,
    refuse_unsafe_device,
    resolve_device,
    write_queue_value,
)
from guestagent.linux.fs import KernelFS
from guestagent.linux.statefile import SWAPS, state_file
from guestagent.linux.swaps import (
    ActiveSwap,
    SwapHeader,
    active_swaps,
    probe_disk,
    read_swap_header,
)
from guestagent.linux.tools import run_mkswap

log = EventLog("guestagent.ops.swap")

DEFAULT_LABEL = "guestagent-swap"


class DiscardPolicy(enum.Enum):
    BOTH = "both"  # Discard the whole area at swapon, and each cluster as it frees.
    PAGES = "pages"  # Only clusters as they free: what gives memory back to the host.
    ONCE = "once"  # Only the whole area at swapon.
    NONE = "none"


@dataclass(frozen=True)
class EnableSwapSpec:
    selector: DeviceSelector
    priority: int | None = None
    discard: DiscardPolicy = DiscardPolicy.BOTH
    wait_ms: int = 0
    force: bool = False
    label: str = DEFAULT_LABEL

    def __post_init__(self) -> None:
        if self.priority is not None and not 0 <= self.priority <= SWAP_FLAG_PRIO_MASK:
            raise InvalidArgument(f"swap priority {self.priority} is outside 0..32767")
        if len(self.label.encode()) > 16:
            raise InvalidArgument(f"swap label {self.label!r} is longer than 16 bytes")


@dataclass(frozen=True)
class SwapArea:
    device: str
    size_bytes: int
    used_bytes: int
    priority: int
    discard: DiscardPolicy | None  # None: enabled by someone else, policy unknown.
    discard_supported: bool
    rotational: bool | None
    uuid: str
    label: str
    already_active: bool = False
    formatted: bool = False


def decode_swap_state(value: object) -> dict[str, dict[str, str]]:
    """The saved swap state: text by text by device; TypeError for anything else."""
    if not isinstance(value, dict) or not all(
        isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
        for entry in value.values()
    ):
        raise TypeError("not an object of objects of strings")
    return value


def swapon_flags(priority: int | None, discard: DiscardPolicy) -> int:
    flags = 0
    if priority is not None:
        flags |= SWAP_FLAG_PREFER | (priority & SWAP_FLAG_PRIO_MASK)
    if discard is DiscardPolicy.BOTH:
        flags |= SWAP_FLAG_DISCARD
    elif discard is DiscardPolicy.PAGES:
        flags |= SWAP_FLAG_DISCARD | SWAP_FLAG_DISCARD_PAGES
    elif discard is DiscardPolicy.ONCE:
        flags |= SWAP_FLAG_DISCARD | SWAP_FLAG_DISCARD_ONCE
    return flags


class SwapManager:
    """EnableSwap, DisableSwap and ListSwaps; one at a time, since a pod shares one area."""

    def __init__(self, fs: KernelFS, finder: DeviceFinder | None = None) -> None:
        self.fs = fs
        self._finder = finder
        self._lock = threading.Lock()
        self._page_size = PAGE_SIZE
        self._store = state_file(fs, SWAPS)

    @property
    def finder(self) -> DeviceFinder:
        if self._finder is None:
            if not self.fs.is_real:
                # libudev knows the live system's disks, not a test tree's.
                raise FailedPrecondition(
                    f"finding block devices needs udev; this agent runs over {self.fs.root}"
                )
            self._finder = UdevDevices(self.fs)
        return self._finder

    def check_state(self) -> None:
        """At start: a saved state that is not one of ours is moved aside now, not at the
        first swap call."""
        self._read_state()

    def _read_state(self) -> dict[str, dict[str, str]]:
        """What /proc/swaps cannot say (the discard policy), kept across agent restarts."""
        return self._store.load_valid(decode_swap_state) or {}

    def _write_state(self, state: dict[str, dict[str, str]]) -> None:
        self._store.save(state)

    def active(self) -> list[ActiveSwap]:
        areas = active_swaps(self.fs)
        if areas is None:
            raise FailedPrecondition("the kernel has no swap support (no /proc/swaps)")
        return areas

    def _active_entry(self, device: BlockDevice) -> ActiveSwap | None:
        for area in self.active():
            if area.filename == device.devnode or self._same_device(area.filename, device):
                return area
        return None

    def _same_device(self, filename: str, device: BlockDevice) -> bool:
        try:
            rdev = os.stat(self.fs.host_path(filename)).st_rdev
        except OSError:
            return False
        return rdev != 0 and (os.major(rdev), os.minor(rdev)) == (device.major, device.minor)

    def _area(self, device: BlockDevice, entry: ActiveSwap, **extra: bool) -> SwapArea:
        recorded = self._read_state().get(device.devnode, {})
        rotational = queue_value(self.fs, device, "rotational")
        discard_max = queue_value(self.fs, device, "discard_max_bytes")
        header = read_swap_header(self.fs, device.devnode, self._page_size)
        return SwapArea(
            device=device.devnode,
            size_bytes=entry.size_bytes,
            used_bytes=entry.used_bytes,
            priority=entry.priority,
            discard=DiscardPolicy(recorded["discard"]) if "discard" in recorded else None,
            discard_supported=discard_max not in (None, "0"),
            rotational=rotational == "1" if rotational is not None else None,
            uuid=header.uuid if header is not None else "",
            label=header.label if header is not None else "",
            **extra,
        )

    def enable(self, spec: EnableSwapSpec) -> SwapArea:
        device = resolve_device(self.finder, spec.selector, spec.wait_ms)
        with self._lock:
            entry = self._active_entry(device)
            if entry is not None:
                return self._area(device, entry, already_active=True)
            refuse_unsafe_device(self.fs, device)
            head = self._read_head(device)
            reusable = self._check_signatures(device, head, spec.force)
            rotational_before = queue_value(self.fs, device, "rotational")
            try:
                self._prepare_and_swapon(device, spec, reusable)
            except Exception as e:
                restored = self._restore(device, head, rotational_before)
                raise Aborted(f"enabling swap on {device.devnode} failed: {e}; {restored}") from e
            state = self._read_state()
            state[device.devnode] = {"discard": spec.discard.value}
            self._write_state(state)
            entry = self._active_entry(device)
            if entry is None:
                raise FailedPrecondition(f"{device.devnode} was enabled but is not in /proc/swaps")
            area = self._area(device, entry, formatted=reusable is None)
            log.info("swap_enabled", **{k: str(v) for k, v in asdict(area).items()})
            return area

    def _read_head(self, device: BlockDevice) -> bytes:
        fd = open_exclusive(self.fs, device)
        try:
            return os.pread(fd, HEAD_BYTES, 0)
        finally:
            os.close(fd)

    def _check_signatures(self, device: BlockDevice, head: bytes, force: bool) -> SwapHeader | None:
        """The existing swap header to reuse, or None when the device must be formatted."""
        contents = probe_disk(head, device.devnode, self._page_size)
        data = [s for s in contents.signatures if s != SWAP_SIGNATURE]
        if data and not force:
            raise FailedPrecondition(
                f"{device.devnode} holds {', '.join(data)}; refusing to format it as swap "
                "(pass force to overwrite)"
            )
        if SWAP_SIGNATURE in contents.signatures and not data:
            return contents.swap_header
        if not force:
            self._refuse_unknown_data(device)
        return None

    def _refuse_unknown_data(self, device: BlockDevice) -> None:
        """A disk handed over for swap is blank (a sparse file reads as zeros) or swap already;
        anything else is somebody's data in a format no probe knows."""
        fd = open_exclusive(self.fs, device)
        try:
            offset = first_data_offset(fd)
        except OSError as e:
            raise FailedPrecondition(
                f"reading {device.devnode} to check that it is blank failed: {errno_text(e)}"
            ) from e
        finally:
            os.close(fd)
        if offset is not None:
            raise FailedPrecondition(
                f"{device.devnode} is neither blank nor swap: it has data at byte offset "
                f"{offset}; pass force to format it anyway"
            )

    def _prepare_and_swapon(
        self, device: BlockDevice, spec: EnableSwapSpec, reusable: SwapHeader | None
    ) -> None:
        write_queue_value(self.fs, device, "rotational", "0")
        if queue_value(self.fs, device, "rotational") != "0":
            raise FailedPrecondition(f"{device.devnode} still reads rotational=1 after writing 0")
        if reusable is None:
            import uuid  # Here, not at start: only a format needs it (and it loads platform).

            run_mkswap(device.devnode, str(uuid.uuid4()), spec.label, spec.force)
        syscalls.swapon(device.devnode, swapon_flags(spec.priority, spec.discard))

    def _restore(self, device: BlockDevice, head: bytes, rotational: str | None) -> str:
        """Put the device back as it was found; say what state it is in."""
        done: list[str] = []
        try:
            fd = open_exclusive(self.fs, device)
            try:
                if os.pread(fd, len(head), 0) != head:
                    os.pwrite(fd, head, 0)
                    os.fsync(fd)
                    done.append(f"restored its first {len(head)} bytes")
            finally:
                os.close(fd)
            if rotational is not None:
                write_queue_value(self.fs, device, "rotational", rotational)
                done.append(f"restored rotational={rotational}")
        except Exception as e:
            return f"{', '.join(done) or 'nothing restored'}; restoring failed: {e}"
        return ", ".join(done) or "the device was not changed"

    def disable(self, selector: DeviceSelector) -> SwapArea:
        try:
            device = resolve_device(self.finder, selector, 0)
        except NotFound as e:
            orphans = [a.filename for a in self.active() if a.filename.endswith(" (deleted)")]
            if not orphans:
                raise
            # swapoff(2) takes a path, and these areas have none left to give it.
            raise NotFound(
                f"{e}; still active with their device nodes gone: {', '.join(orphans)}"
            ) from e
        with self._lock:
            entry = self._active_entry(device)
            if entry is None:
                raise NotFound(f"{device.devnode} is not an active swap area")
            area = self._area(device, entry)
            try:
                syscalls.swapoff(entry.filename)
            except OSError as e:
                # ENOMEM: the pages in swap do not fit back in memory.
                raise FailedPrecondition(f"swapoff {entry.filename} failed: {errno_text(e)}") from e
            state = self._read_state()
            state.pop(device.devnode, None)
            self._write_state(state)
            log.info("swap_disabled", device=device.devnode)
            return area

    def list(self) -> list[SwapArea]:
        areas = []
        for entry in self.active():
            device = device_for_node(self.fs, entry.filename)
            if device is None:
                areas.append(
                    SwapArea(
                        entry.filename,
                        entry.size_bytes,
                        entry.used_bytes,
                        entry.priority,
                        None,
                        False,
                        None,
                        "",
                        "",
                    )
                )
            else:
                areas.append(self._area(device, entry))
        return areas
