"""measure-overhead's pure half: QEMU's smaps, and which mapping is guest RAM."""

from __future__ import annotations

import pytest

from guestagent.host.sizing.measure import guest_ram_resident
from guestagent.host.vmm.rss import parse_smaps
from guestagent.sizes import MIB
from tests.fakes.smaps import SMAPS


@pytest.mark.parametrize(
    ("ram_sizes", "resident"),
    [
        ([306 * MIB], 170000 * 1024),  # the executable 1 GiB TCG buffer is not RAM
        ([1024 * MIB], None),
        ([306 * MIB, 306 * MIB], None),  # two backends, one mapping: not one to one
        ([], 0),
    ],
)
def test_guest_ram_resident(ram_sizes: list[int], resident: int | None) -> None:
    assert guest_ram_resident(parse_smaps(SMAPS), ram_sizes) == resident
