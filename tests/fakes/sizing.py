"""Shared figures for the sizing tests: a host, flat overheads, pods and synthetic boots."""

from __future__ import annotations

from guestagent.host.sizing.model import Line, OverheadModel, OverheadSample
from guestagent.host.sizing.plan import Container
from guestagent.sizes import MIB

HOST = 31753 * MIB  # The host of the issue: "maximum amount is 31753 MiB".
# Flat overheads, so every figure in the tests can be worked out by hand.
FLAT = OverheadModel(
    kernel=Line(40 * MIB, 0.0), daemons=Line(60 * MIB, 0.0), vmm=Line(100 * MIB, 0.0), source="flat"
)


def limits(*mib: int | None) -> tuple[Container, ...]:
    return tuple(Container(f"c{i}", None if m is None else m * MIB) for i, m in enumerate(mib))


def sample(vm_mib: int, present_mib: int | None = None) -> OverheadSample:
    """Synthetic boots: kernel 30 MiB + 2 %, daemons 50 MiB, VMM 80 MiB + 1 %."""
    size = vm_mib * MIB
    kernel = 30 * MIB + size // 50
    return OverheadSample(
        vm_size=size,
        present=(present_mib or vm_mib) * MIB,
        mem_total=size - kernel,
        mem_free=size // 2,
        used=50 * MIB,
        agent_rss=40 * MIB,
        qemu_rss=size // 2 + 80 * MIB + size // 100,
        guest_resident=size // 2,
        guest_resident_method="smaps",
        accel="tcg",
    )
