from guestagent.linux.mm import jit_code_rss_bytes, parse_buddyinfo, parse_smaps
from tests.unit.ops.test_compaction import BUDDYINFO


def test_buddyinfo_sums_zones_per_order() -> None:
    totals = parse_buddyinfo(BUDDYINFO)
    assert totals[0] == 13 and totals[1] == 23 and totals[10] == 755
    assert parse_buddyinfo(BUDDYINFO, node=1)[:2] == (10, 20)


# Cut from a QEMU 7.2 TCG guest's /proc/PID/smaps (2026-12-04): its 1 GiB of RAM, the 1 GiB
# translated-code buffer, a library's executable text and a heap.
QEMU_SMAPS = """\
55d0c1a00000-55d0c1b00000 rw-p 00000000 00:00 0   [heap]
Size:               1024 kB
Rss:                 900 kB
7f33bfc00000-7f33ffc00000 rw-p 00000000 00:00 0
Size:            1048576 kB
Rss:              501756 kB
Anonymous:        501756 kB
7f3440000000-7f347ffff000 rwxp 00000000 00:00 0
Size:            1048572 kB
Rss:             1048572 kB
Anonymous:       1048572 kB
7f3490000000-7f3490200000 r-xp 00000000 08:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               2048 kB
Rss:                1500 kB
VmFlags: rd ex mr mw me sd
"""


def test_jit_code_is_the_anonymous_writable_executable_mappings() -> None:
    assert jit_code_rss_bytes(parse_smaps(QEMU_SMAPS)) == 1048572 * 1024
    assert jit_code_rss_bytes(parse_smaps(QEMU_SMAPS.replace("rwxp", "rw-p"))) == 0
    assert jit_code_rss_bytes(parse_smaps("")) == 0
