from __future__ import annotations

import pytest

from guestagent.linux.giveback_sources import (
    Protection,
    protected_of,
    read_giveback_sources,
    read_protected,
    read_reporting_order,
    read_swap_barred,
)
from guestagent.linux.meminfo import read_system_memory
from guestagent.linux.mm import zoneinfo_sum
from tests.fakes.root import FakeRoot

ZONEINFO = """\
Node 0, zone      DMA
  pages free     3840
        min      32
        low      40
        high     48
        spanned  4095
        present  3998
  pagesets
    cpu: 0
              count: 0
              high:  0
Node 0, zone    DMA32
  pages free     302000
        min      2900
        low      3625
        high     4350
"""


def test_high_watermarks_sum_zones_not_pagesets() -> None:
    assert zoneinfo_sum(ZONEINFO, "high") == 48 + 4350


@pytest.mark.parametrize(
    ("current", "protection", "protected"),
    [(100, 0, 0), (100, 40, 40), (100, None, 100), (30, 40, 30)],
)
def test_protection_is_what_min_or_low_covers_of_use(
    current: int, protection: int | None, protected: int
) -> None:
    assert protected_of(current, protection) == protected


def test_protections_sum_the_top_level(fake_root: FakeRoot) -> None:
    for name, current, low in (("a", 100, "50"), ("b", 10, "max"), ("a/inner", 90, "90")):
        for file, text in (
            ("memory.current", str(current)),
            ("memory.low", low),
            ("memory.min", "0"),
        ):
            fake_root.write(f"sys/fs/cgroup/{name}/{file}", text + "\n")
    assert read_protected(fake_root.fs) == (Protection("a", 100, 50), Protection("b", 10, 10))


def test_a_memcg_may_not_swap_when_it_or_an_ancestor_has_swap_max_0(fake_root: FakeRoot) -> None:
    for name, swap_max in (("a", "0"), ("a/b", "max"), ("c", "max"), ("c/d", "0"), ("e", "64M")):
        fake_root.write(f"sys/fs/cgroup/{name}/memory.swap.max", swap_max + "\n")
    paths = {"/", "/a", "/a/b", "/c", "/c/d", "/c/d/gone", "/e"}
    assert read_swap_barred(fake_root.fs, paths) == {"/a", "/a/b", "/c/d", "/c/d/gone"}


def test_reporting_order_from_the_module_parameter_when_sane(fake_root: FakeRoot) -> None:
    assert read_reporting_order(fake_root.fs, 11, 4096) == 9
    fake_root.write("sys/module/page_reporting/parameters/page_reporting_order", "5\n")
    assert read_reporting_order(fake_root.fs, 11, 4096) == 5
    fake_root.write("sys/module/page_reporting/parameters/page_reporting_order", "4294967295\n")
    assert read_reporting_order(fake_root.fs, 11, 4096) == 9


def test_guest_figures_from_a_fake_kernel(fake_root: FakeRoot) -> None:
    fake_root.write("proc/zoneinfo", ZONEINFO)
    fake_root.write("proc/buddyinfo", "Node 0, zone DMA32 4 0 0 0 0 0 0 0 0 2 1\n")
    figures = read_giveback_sources(fake_root.fs, read_system_memory(fake_root.fs), None, 4096)
    assert figures.mem_total == 498764 * 1024 and figures.swap_room == 1048572 * 1024
    assert figures.lru == (20480 + 10240 + 40960 + 30720) * 1024
    assert figures.reclaimable_slab == 8192 * 1024
    assert figures.watermarks == (48 + 4350) * 4096
    assert figures.free_blocks[9:] == (2, 1) and figures.reporting_order == 9
