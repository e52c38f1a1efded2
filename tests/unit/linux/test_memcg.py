import pytest

from guestagent.linux.memcg import same_limit
from guestagent.sizes import MIB

PAGE = 4096


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("max", "max", True),
        ("max\n", "max", True),
        ("4096", "4097", True),  # the kernel keeps whole pages
        ("4096", "8191", True),
        ("4096", "8192", False),
        ("0", "max", False),
        (str(2**63 - 1), "max", True),  # as large as the kernel counts: it shows "max"
        (str(2**64), "max", True),
        (str(64 * MIB), "max", False),
    ],
)
def test_same_limit(a: str, b: str, same: bool) -> None:
    assert same_limit(a, b, PAGE) is same
    assert same_limit(b, a, PAGE) is same
