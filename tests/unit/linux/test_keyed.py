import pytest

from guestagent.errors import KernelFormat
from guestagent.linux.keyed import parse_flat_keyed

VMSTAT = "compact_stall 1\ncompact_success 2\nnr_free_pages 9\n"


@pytest.mark.parametrize(
    ("text", "prefix", "expected"),
    [
        ("low 0\noom_kill 7\n", "", {"low": 0, "oom_kill": 7}),
        (VMSTAT, "compact_", {"compact_stall": 1, "compact_success": 2}),
        (VMSTAT, "pgmajfault", {}),
        # Only the lines asked for are checked: a malformed other line does not fail.
        ("compact_stall 1\nnr_free_pages x\n\n", "compact_", {"compact_stall": 1}),
    ],
)
def test_flat_keyed(text: str, prefix: str, expected: dict[str, int]) -> None:
    assert parse_flat_keyed(text, prefix) == expected


@pytest.mark.parametrize(
    ("text", "prefix", "error"),
    [
        ("low 0 1\n", "", "is not 'key value'"),
        ("low\n", "", "is not 'key value'"),
        ("low 0\n\n", "", "is not 'key value'"),
        ("low x\n", "", "non-integer"),
        ("compact_stall 1 2\n", "compact_", "is not 'key value'"),
        ("compact_stall x\n", "compact_", "non-integer"),
    ],
)
def test_flat_keyed_rejects_malformed(text: str, prefix: str, error: str) -> None:
    with pytest.raises(KernelFormat, match=error):
        parse_flat_keyed(text, prefix)
