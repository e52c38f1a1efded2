from guestagent.linux.mm import Mapping, jit_code_rss_bytes, parse_buddyinfo, parse_smaps
from tests.fakes.root import BUDDYINFO

MIB = 1 << 20


def test_buddyinfo_sums_zones_per_order() -> None:
    totals = parse_buddyinfo(BUDDYINFO)
    assert totals[0] == 13 and totals[1] == 23 and totals[10] == 755
    assert parse_buddyinfo(BUDDYINFO, node=1)[:2] == (10, 20)


# A QEMU's /proc/PID/smaps under TCG: its binary, 306 MiB of guest RAM, the 1 GiB
# translated-code buffer (rwxp) and a heap.
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


def test_jit_code_is_the_anonymous_writable_executable_mappings() -> None:
    assert jit_code_rss_bytes(parse_smaps(SMAPS)) == 288000 * 1024
    assert jit_code_rss_bytes(parse_smaps(SMAPS.replace("rwxp", "rw-p"))) == 0
    assert jit_code_rss_bytes(parse_smaps("")) == 0
