"""Swap: one shared area per pod on a virtio disk, non-rotational, enabled with discard.

The kernel decides at swapon time whether an area is an SSD (cluster allocation, and the
per-cluster discards that give freed blocks back to a sparse file on the host) from
queue/rotational, and virtio-blk says "rotational" by default; so rotational is set to 0
before swapon. A device that is neither blank (all zeros, as a sparse file reads) nor swap
is never formatted without `force`, and a failure after the disk was touched puts back what
was there.

Encrypted swap (docs/confidential-swap.md) maps the disk through dm-crypt with a key made in
the guest and held only by its kernel, then formats and enables the mapping; the same checks
run on the raw disk first. In a confidential guest it is the default and the only choice.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import asdict, replace

from guestagent.errors import (
    Aborted,
    AgentError,
    FailedPrecondition,
    NotFound,
    caused_by,
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
    UdevDevices,
    device_for_node,
    device_number,
    discard_all,
    first_data_offset,
    open_exclusive,
    queue_value,
    refuse_unsafe_device,
    resolve_device,
    size_bytes,
    write_queue_value,
)
from guestagent.linux.confidential import Confidential, decide, read_facts
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.dm import DeviceMapper, crypt_table, has_crypt_target
from guestagent.linux.dm_mappings import Mapping, mapping_named
from guestagent.linux.kernel import Kernel
from guestagent.linux.statestore import SWAPS, StateFileError, state_file
from guestagent.linux.swaps import (
    ActiveSwap,
    SwapHeader,
    active_swaps,
    probe_disk,
    read_swap_header,
)
from guestagent.linux.tools import run_mkswap
from guestagent.ops.swap_area import (
    MAPPING_PREFIX,
    DiscardPolicy,
    EnableSwapSpec,
    SwapArea,
    SwapEncryption,
    decode_swap_state,
    our_mappings,
)

log = EventLog("guestagent.ops.swap")


def choose_encryption(asked: SwapEncryption, confidential: Confidential) -> SwapEncryption:
    """NONE or EPHEMERAL for a request; never swap in the clear in a confidential guest."""
    if asked is SwapEncryption.DEFAULT:
        return SwapEncryption.EPHEMERAL if confidential.is_confidential else SwapEncryption.NONE
    if asked is SwapEncryption.NONE and confidential.is_confidential:
        raise FailedPrecondition(
            f"encryption NONE refused: this is a confidential guest ({confidential.platform}, "
            f"from {confidential.evidence}), and swap in the clear hands its memory to the "
            "host; ask for EPHEMERAL or leave encryption unset",
            "CLEAR_SWAP_IN_CONFIDENTIAL_GUEST",
            metadata={"platform": confidential.platform},
        )
    return asked


def refuse_other_encryption(
    asked: SwapEncryption, chosen: SwapEncryption, encrypted: bool, devnode: str
) -> None:
    """An active area is returned unchanged only if it is what was asked for (or, unasked,
    encrypted: never less safe than the default)."""
    if encrypted == (chosen is SwapEncryption.EPHEMERAL):
        return
    if asked is SwapEncryption.DEFAULT and encrypted:
        return
    have = "encrypted" if encrypted else "in the clear"
    want = "encrypted" if chosen is SwapEncryption.EPHEMERAL else "in the clear"
    raise FailedPrecondition(
        f"{devnode} is already active swap {have}; disable it before enabling it {want}",
        "SWAP_ACTIVE_OTHERWISE",
        metadata={"device": devnode, "encrypted": encrypted},
    )


def mapped_device(mapping: Mapping) -> BlockDevice:
    return BlockDevice(mapping.devnode, mapping.sysname, "disk", mapping.major, mapping.minor)


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

    def __init__(
        self,
        kernel: Kernel,
        finder: DeviceFinder | None = None,
        confidential: Confidential | None = None,
    ) -> None:
        self.kernel = kernel
        self.confidential = (
            confidential if confidential is not None else decide("auto", read_facts(kernel))
        )
        self._finder = finder
        self._lock = threading.Lock()
        self._store = state_file(kernel, SWAPS)

    @property
    def finder(self) -> DeviceFinder:
        if self._finder is None:
            if not self.kernel.is_real:
                # libudev knows the live system's disks, not a test tree's.
                raise FailedPrecondition(
                    f"finding block devices needs udev; this agent runs over {self.kernel.root}",
                    "UDEV_UNAVAILABLE",
                )
            self._finder = UdevDevices(self.kernel)
        return self._finder

    def check_state(self) -> None:
        """At start: a saved state that is not one of ours is moved aside now, not at the
        first swap call; a mapping of ours without active swap on it (an agent killed
        between the table load and swapon) is removed."""
        with self._lock:  # The server answers during start: an EnableSwap may save now.
            if not self._read_state() and self._store.exists():
                # Agents before 2026-12-05 kept `{}` once their last swap went, which would
                # load swap's machinery at every start: gone, the next start loads none of it.
                try:
                    self._store.remove()
                except StateFileError as e:
                    log.warning("swap_state_not_removed", error=str(e))
            # A kernel without swap (no /proc/swaps) has none on a mapping either: not a
            # reason to refuse to start.
            swap_supported = active_swaps(self.kernel) is not None
            for mapping in our_mappings(self.kernel):
                if swap_supported and self._active_entry(mapped_device(mapping)) is not None:
                    log.info("encrypted_swap_found", mapping=mapping.name, device=mapping.devnode)
                    continue
                try:
                    DeviceMapper(self.kernel).remove(mapping.name)
                except (AgentError, OSError) as e:
                    log.error("stale_mapping_not_removed", mapping=mapping.name, error=str(e))
                    continue
                log.warning(
                    "stale_mapping_removed", mapping=mapping.name, backing=",".join(mapping.slaves)
                )

    def _mapping_of(self, device: BlockDevice) -> Mapping | None:
        """Our mapping over device, or device itself when it is one of our mappings."""
        for mapping in our_mappings(self.kernel):
            if device.sysname in mapping.slaves or device.sysname == mapping.sysname:
                return mapping
        return None

    def _read_state(self) -> dict[str, dict[str, str]]:
        """What /proc/swaps cannot say (the discard policy), kept across agent restarts."""
        return self._store.load_valid(decode_swap_state) or {}

    def active(self) -> list[ActiveSwap]:
        areas = active_swaps(self.kernel)
        if areas is None:
            raise FailedPrecondition(
                "the kernel has no swap support (no /proc/swaps)", "SWAP_UNSUPPORTED"
            )
        return areas

    def _active_entry(self, device: BlockDevice) -> ActiveSwap | None:
        for area in self.active():
            if area.filename == device.devnode or self._same_device(area.filename, device):
                return area
        return None

    def _same_device(self, filename: str, device: BlockDevice) -> bool:
        return device_number(self.kernel, filename) == (device.major, device.minor)

    def _area(
        self,
        device: BlockDevice,
        entry: ActiveSwap,
        mapping: Mapping | None,
        already_active: bool = False,
        formatted: bool = False,
    ) -> SwapArea:
        recorded = self._read_state().get(device.devnode, {})
        rotational = queue_value(self.kernel, device, "rotational")
        discard_max = queue_value(self.kernel, device, "discard_max_bytes")
        header = read_swap_header(self.kernel, device.devnode, PAGE_SIZE)
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
            already_active=already_active,
            formatted=formatted,
            encrypted=mapping is not None,
            mapping=mapping.mapper_node if mapping is not None else "",
            backing_device=mapping.backing_nodes if mapping is not None else "",
        )

    def enable(self, spec: EnableSwapSpec) -> SwapArea:
        # First: in a confidential guest, swap in the clear is refused whatever the disk.
        chosen = choose_encryption(spec.encryption, self.confidential)
        device = resolve_device(self.finder, spec.selector, spec.wait_ms)
        with self._lock:
            mapping = self._mapping_of(device)
            swap_device = mapped_device(mapping) if mapping is not None else device
            entry = self._active_entry(swap_device)
            if entry is not None:
                refuse_other_encryption(
                    spec.encryption, chosen, mapping is not None, device.devnode
                )
                return self._area(swap_device, entry, mapping, already_active=True)
            # On the raw disk, before anything is mapped; a mapping left on it holds it.
            refuse_unsafe_device(self.kernel, device)
            head = self._read_head(device)
            reusable = self._check_signatures(device, head, spec.force)
            rotational_before = queue_value(self.kernel, device, "rotational")
            if chosen is SwapEncryption.EPHEMERAL:
                mapping = self._map_and_swapon(device, spec, head, rotational_before)
                swap_device = mapped_device(mapping)
            else:
                try:
                    self._prepare_and_swapon(device, spec, reusable)
                except Exception as e:
                    restored = self._restore(device, head, rotational_before)
                    raise Aborted(
                        f"enabling swap on {device.devnode} failed: {e}; {restored}",
                        "SWAP_ENABLE_FAILED",
                        metadata={**caused_by(e), "device": device.devnode},
                    ) from e
            state = self._read_state()
            state[swap_device.devnode] = {"discard": spec.discard.value}
            self._store.save_or_remove(state)
            entry = self._active_entry(swap_device)
            if entry is None:
                raise FailedPrecondition(
                    f"{swap_device.devnode} was enabled but is not in /proc/swaps",
                    "SWAP_NOT_LISTED",
                    metadata={"device": swap_device.devnode},
                )
            formatted = mapping is not None or reusable is None
            area = self._area(swap_device, entry, mapping, formatted=formatted)
            log.info("swap_enabled", **{k: str(v) for k, v in asdict(area).items()})
            return area

    def _map_and_swapon(
        self, device: BlockDevice, spec: EnableSwapSpec, head: bytes, rotational: str | None
    ) -> Mapping:
        """Map device through dm-crypt with a fresh key, format and enable the mapping; on
        any failure remove the mapping and put the disk back as it was found."""
        mapper = DeviceMapper(self.kernel)
        missing = has_crypt_target(mapper)
        if missing is not None:
            raise FailedPrecondition(
                f"cannot encrypt swap on {device.devnode}: {missing}",
                "ENCRYPTION_UNAVAILABLE",
                metadata={"device": device.devnode},
            )
        logical_block = queue_value(self.kernel, device, "logical_block_size")
        table = crypt_table(
            size_bytes(self.kernel, device), int(logical_block or 512), device.major, device.minor
        )
        name = MAPPING_PREFIX + device.sysname
        created = False
        try:
            self._set_nonrotational(device)
            mapper.create(name)
            created = True
            mapper.load_crypt(name, table)
            mapper.resume(name)
            mapping = mapping_named(self.kernel, name)
            if mapping is None:
                raise FailedPrecondition(
                    f"mapping {name} is not in /sys/block after its resume",
                    "ENCRYPTION_UNAVAILABLE",
                    metadata={"device": device.devnode, "mapping": name},
                )
            # The mapping stacks the disk's rotational flag; written anyway, and checked. Always
            # formatted, with force: it holds ciphertext of what the checked disk held, never data.
            self._prepare_and_swapon(mapped_device(mapping), replace(spec, force=True), None)
        except Exception as e:
            undone = []
            if created:
                try:
                    mapper.remove(name)
                    undone.append(f"removed mapping {name}")
                except (AgentError, OSError) as removing:
                    undone.append(f"removing mapping {name} failed: {removing}")
            undone.append(self._restore(device, head, rotational))
            raise Aborted(
                f"enabling encrypted swap on {device.devnode} failed: {e}; {'; '.join(undone)}",
                "SWAP_ENABLE_FAILED",
                metadata={**caused_by(e), "device": device.devnode},
            ) from e
        return mapping

    def _set_nonrotational(self, device: BlockDevice) -> None:
        write_queue_value(self.kernel, device, "rotational", "0")
        if queue_value(self.kernel, device, "rotational") != "0":
            raise FailedPrecondition(
                f"{device.devnode} still reads rotational=1 after writing 0",
                "DEVICE_STAYS_ROTATIONAL",
                metadata={"device": device.devnode},
            )

    def _read_head(self, device: BlockDevice) -> bytes:
        with open_exclusive(self.kernel, device) as fd:
            return os.pread(fd, HEAD_BYTES, 0)

    def _check_signatures(self, device: BlockDevice, head: bytes, force: bool) -> SwapHeader | None:
        """The existing swap header to reuse, or None when the device must be formatted."""
        contents = probe_disk(head, device.devnode, PAGE_SIZE)
        data = [s for s in contents.signatures if s != SWAP_SIGNATURE]
        if data and not force:
            raise FailedPrecondition(
                f"{device.devnode} holds {', '.join(data)}; refusing to format it as swap "
                "(pass force to overwrite)",
                "DEVICE_HOLDS_DATA",
                metadata={"device": device.devnode, "signatures": ",".join(data)},
            )
        if SWAP_SIGNATURE in contents.signatures and not data:
            return contents.swap_header
        if not force:
            self._refuse_unknown_data(device)
        return None

    def _refuse_unknown_data(self, device: BlockDevice) -> None:
        """A disk handed over for swap is blank (a sparse file reads as zeros) or swap already;
        anything else is somebody's data in a format no probe knows."""
        with open_exclusive(self.kernel, device) as fd:
            try:
                offset = first_data_offset(fd)
            except OSError as e:
                raise FailedPrecondition(
                    f"reading {device.devnode} to check that it is blank failed: {errno_text(e)}",
                    "DEVICE_UNREADABLE",
                    metadata={"device": device.devnode, "errno": errno.errorcode.get(e.errno or 0)},
                ) from e
        if offset is not None:
            raise FailedPrecondition(
                f"{device.devnode} is neither blank nor swap: it has data at byte offset "
                f"{offset}; pass force to format it anyway",
                "DEVICE_HOLDS_DATA",
                metadata={"device": device.devnode, "offset": offset},
            )

    def _prepare_and_swapon(
        self, device: BlockDevice, spec: EnableSwapSpec, reusable: SwapHeader | None
    ) -> None:
        self._set_nonrotational(device)
        if reusable is None:
            import uuid  # Here, not at start: only a format needs it (and it loads platform).

            run_mkswap(device.devnode, str(uuid.uuid4()), spec.label, spec.force)
        syscalls.swapon(device.devnode, swapon_flags(spec.priority, spec.discard))

    def _restore(self, device: BlockDevice, head: bytes, rotational: str | None) -> str:
        """Put the device back as it was found; say what state it is in."""
        done: list[str] = []
        try:
            with open_exclusive(self.kernel, device) as fd:
                if os.pread(fd, len(head), 0) != head:
                    os.pwrite(fd, head, 0)
                    os.fsync(fd)
                    done.append(f"restored its first {len(head)} bytes")
            if rotational is not None:
                write_queue_value(self.kernel, device, "rotational", rotational)
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
            raise e.reworded(
                f"{e}; still active with their device nodes gone: {', '.join(orphans)}"
            ) from e
        with self._lock:
            mapping = self._mapping_of(device)
            swap_device = mapped_device(mapping) if mapping is not None else device
            entry = self._active_entry(swap_device)
            if entry is None:
                raise NotFound(
                    f"{device.devnode} is not an active swap area",
                    "SWAP_NOT_ACTIVE",
                    metadata={"device": device.devnode},
                )
            area = self._area(swap_device, entry, mapping)
            try:
                syscalls.swapoff(entry.filename)
            except OSError as e:
                # ENOMEM: the pages in swap do not fit back in memory.
                raise FailedPrecondition(
                    f"swapoff {entry.filename} failed: {errno_text(e)}",
                    "SWAPOFF_FAILED",
                    metadata={"device": entry.filename, "errno": errno.errorcode.get(e.errno or 0)},
                ) from e
            state = self._read_state()
            state.pop(swap_device.devnode, None)
            self._store.save_or_remove(state)
            if mapping is not None:
                self._unmap(mapping)
            log.info("swap_disabled", device=swap_device.devnode, mapping=area.mapping)
            return area

    def _unmap(self, mapping: Mapping) -> None:
        """Discard the whole mapping, so the host gets every block back and the disk reads
        blank for the next EnableSwap, then remove it: the key goes with it."""
        device = mapped_device(mapping)
        try:
            with open_exclusive(self.kernel, device) as fd:
                discard_all(fd, size_bytes(self.kernel, device))
        except (AgentError, OSError) as e:
            # The disk keeps ciphertext: unreadable, but no longer blank (EnableSwap needs force).
            log.warning("mapping_not_discarded", mapping=mapping.name, error=str(e))
        try:
            DeviceMapper(self.kernel).remove(mapping.name)
        except (AgentError, OSError) as e:
            # An AgentError already says why (no device-mapper, the control node refused).
            why = errno_text(e) if isinstance(e, OSError) else str(e)
            raise FailedPrecondition(
                f"swap on {mapping.devnode} is off, but removing mapping {mapping.name} "
                f"failed: {why}",
                "MAPPING_NOT_REMOVED",
                metadata={"mapping": mapping.name},
            ) from e

    def list(self) -> list[SwapArea]:
        areas = []
        for entry in self.active():
            device = device_for_node(self.kernel, entry.filename)
            if device is None:
                areas.append(
                    SwapArea(entry.filename, entry.size_bytes, entry.used_bytes, entry.priority)
                )
            else:
                areas.append(self._area(device, entry, self._mapping_of(device)))
        return areas
