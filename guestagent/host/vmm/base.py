"""What the host's tools ask of a VMM, whichever it is: the memory devices' terms and the
backends' interface.

Every backend reports and sizes its balloon in bytes the balloon takes, whatever its API
speaks (QEMU's `actual` is what the balloon leaves, Firecracker's `amount_mib` is MiB): the
conversion is the backend's own, so the sizing rules are written once
(guestagent/host/giveback/). Its virtio-mem devices are `VirtioMemDevice`s. The backends:
`qemu.py`, `cloud_hypervisor.py`, `firecracker.py`; none imports another, so a host without
qemu.qmp drives the other two (`connect.py` opens the one asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

QEMU, CLOUD_HYPERVISOR, FIRECRACKER = "qemu", "cloud-hypervisor", "firecracker"
BALLOON_PAGE = 4096  # virtio-balloon's page, whatever the guest's (VIRTIO_BALLOON_PFN_SHIFT).


class VmmError(Exception):
    """A VMM refused a request or did not answer; the text names the request and the VMM."""


@dataclass(frozen=True)
class Balloon:
    """A virtio-balloon as its VMM reports it, in bytes the balloon holds."""

    ram: int  # What the balloon can take from: boot RAM and what is plugged.
    taken: int  # What it holds now (the guest has handed over).
    asked: int  # What it is asked to hold.
    unit: int  # The API sizes it in whole units of this many bytes.
    deflate_on_oom: bool | None  # None: the VMM does not say.
    # False when the VMM reports only what was asked (Firecracker without statistics).
    observed: bool = True


@dataclass(frozen=True)
class VirtioMemDevice:
    """A virtio-mem device as its VMM reports it."""

    id: str
    memaddr: int | None  # None: the VMM's API does not say where its region starts.
    block_size: int
    max_size: int
    size: int  # Plugged now.
    requested_size: int


class Vmm(Protocol):
    """One VMM's API, as give-back uses it."""

    name: str
    pid: int  # The VMM's process, whose RSS is what the host gets back.
    # QEMU's balloon command and --to speak in what the balloon leaves the guest; the others'
    # in what it takes. Only for what a person reads and types: every method takes bytes.
    balloon_leaves: bool

    def balloon(self) -> Balloon: ...

    def balloon_taken(self) -> int:
        """What the balloon holds now, in one request: a settle poll's read."""
        ...

    def set_balloon(self, taken: int) -> None: ...

    def virtio_mem(self) -> list[VirtioMemDevice]: ...

    def set_virtio_mem(self, device: VirtioMemDevice, requested: int) -> None: ...

    def close(self) -> None: ...
