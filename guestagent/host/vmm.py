"""What give-back asks of a VMM, whichever it is, and QEMU's answer over QMP.

Every backend reports its balloon as a `Balloon` in bytes the balloon takes, whatever its
API speaks (QEMU's `actual` is what the balloon leaves, Firecracker's `amount_mib` is MiB),
and its virtio-mem devices as `VirtioMemDevice`s, so the sizing rules are written once
(guestagent/host/giveback.py). The backends: guestagent/host/qmp.py (QEMU),
guestagent/host/cloud_hypervisor.py, guestagent/host/firecracker.py; none imports another,
so a host without qemu.qmp drives the other two.
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
    # QEMU sizes its balloon by what it leaves the guest; the others by what it takes.
    balloon_leaves: bool

    def balloon(self) -> Balloon: ...

    def set_balloon(self, taken: int) -> None: ...

    def virtio_mem(self) -> list[VirtioMemDevice]: ...

    def set_virtio_mem(self, device: VirtioMemDevice, requested: int) -> None: ...

    def close(self) -> None: ...
