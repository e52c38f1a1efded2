"""measure-overhead's pure half: QEMU's smaps, and which mapping is guest RAM."""

from __future__ import annotations

import pytest

from guestagent.host.measure import guest_ram_resident
from guestagent.host.sizing import MIB
from guestagent.linux.mm import Mapping, parse_smaps

SMAPS = """\
5624d164d000-5624d1a54000 r--p 00000000 fe:00 2170918                    /usr/bin/qemu-system-x86_64
Size:               4124 kB
Rss:                4100 kB
VmFlags: rd mr mw me sd
7fa3c4c00000-7fa3d7e00000 rw-p 00000000 00:00 0
Size:             313344 kB
Rss:              170000 kB
Pss:              170000 kB
7fa3e4000000-7fa424000000 rwxp 00000000 00:00 0
Size:            1048576 kB
Rss:              288000 kB
7fa500000000-7fa513200000 rw-p 00000000 00:00 0 [heap]
Size:             313344 kB
Rss:                1000 kB
"""


def test_parse_smaps() -> None:
    mappings = parse_smaps(SMAPS)
    assert [m.size for m in mappings] == [0x407000, 306 * MIB, 1024 * MIB, 306 * MIB]
    assert mappings[0].path == "/usr/bin/qemu-system-x86_64"
    assert mappings[1] == Mapping(306 * MIB, "rw-p", "", 170000 * 1024)
    assert mappings[3].path == "[heap]"


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
