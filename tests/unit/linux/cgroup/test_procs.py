from __future__ import annotations

import pytest

from guestagent.linux.cgroup.procs import own_cgroup


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0::/\n", "/"),
        ("0::/system.slice/guestagent.service\n", "/system.slice/guestagent.service"),
        ("9:name=systemd:/\n4:memory:/x\n0::/guestagent\n", "/guestagent"),
        ("4:memory:/x\n1:cpu:/\n", None),  # cgroup v1 only
        ("", None),
    ],
)
def test_own_cgroup(text: str, expected: str | None) -> None:
    assert own_cgroup(text) == expected
