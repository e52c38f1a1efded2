from guestagent.linux.mm import parse_buddyinfo
from tests.fakes.root import BUDDYINFO


def test_buddyinfo_sums_zones_per_order() -> None:
    totals = parse_buddyinfo(BUDDYINFO)
    assert totals[0] == 13 and totals[1] == 23 and totals[10] == 755
    assert parse_buddyinfo(BUDDYINFO, node=1)[:2] == (10, 20)
