"""Hostile and garbage input for every parser: each returns a value or raises a domain error
(which the servicer maps to a status code), never anything else. The example counts are
fixed, so each CI run tries the same number: FUZZ_EXAMPLES per parser."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guestagent.errors import AgentError
from guestagent.linux.blockdev import parse_mountinfo, probe_signatures
from guestagent.linux.cgroup.memory import parse_limit
from guestagent.linux.cgroup.name import cgroup_name
from guestagent.linux.device_selector import DeviceSelector
from guestagent.linux.keyed import parse_flat_keyed
from guestagent.linux.meminfo import parse_meminfo
from guestagent.linux.mm import parse_buddyinfo, parse_zoneinfo_present, rss_bytes
from guestagent.linux.psi import parse_pressure
from guestagent.linux.swaps import parse_swap_header
from guestagent.linux.watch import parse_inotify_events
from guestagent.transport.address import parse_address

# Thousands of examples: `make test` runs them, `make unit` does not.
pytestmark = pytest.mark.slow

FUZZ_EXAMPLES = 200

# Text shaped like kernel files: words, numbers, '=' and ':' and newlines, plus anything.
kernel_text = st.one_of(
    st.text(max_size=400),
    st.lists(
        st.lists(
            st.one_of(
                st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
                st.integers(-(2**70), 2**70).map(str),
                st.sampled_from(["kB", "=", ":", "-", "max", "some", "full", "Node", "zone"]),
                st.from_regex(r"[a-z0-9]{1,6}=[0-9.x-]{0,8}", fullmatch=True),
            ),
            max_size=12,
        ).map(" ".join),
        max_size=20,
    ).map("\n".join),
)

TEXT_PARSERS: list[Callable[[str], Any]] = [
    parse_meminfo,
    parse_pressure,
    parse_flat_keyed,
    parse_limit,
    parse_mountinfo,
    parse_buddyinfo,
    parse_zoneinfo_present,
    rss_bytes,
    parse_address,
    cgroup_name,
]


@pytest.mark.parametrize("parser", TEXT_PARSERS, ids=lambda p: p.__name__)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=kernel_text)
def test_text_parsers_fail_only_with_domain_errors(parser: Callable[[str], Any], text: str) -> None:
    with contextlib.suppress(AgentError):
        parser(text)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(data=st.binary(max_size=70_000), page=st.sampled_from([4096, 16384, 65536]))
def test_binary_probes_never_fail(data: bytes, page: int) -> None:
    probe_signatures(data, page)
    parse_swap_header(data, page)
    parse_inotify_events(data)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(
    path=st.one_of(st.none(), st.text(max_size=60)),
    serial=st.one_of(st.none(), st.text(max_size=30)),
)
def test_device_selectors_are_checked(path: str | None, serial: str | None) -> None:
    try:
        selector = DeviceSelector(path=path, serial=serial)
    except AgentError:
        return
    if selector.path is not None:
        assert selector.path.startswith("/dev/") and "/../" not in selector.path + "/"
    else:
        assert selector.serial and "/" not in selector.serial


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(name=st.text(alphabet=st.sampled_from("ab./\\x00-"), max_size=20))
def test_accepted_cgroup_names_cannot_climb(name: str) -> None:
    try:
        checked = cgroup_name(name)
    except AgentError:
        return
    parts = checked.split("/")
    assert not name.startswith("/") and ".." not in parts and "." not in parts and "" not in parts
    assert cgroup_name(checked) == checked  # Its one form: checked again, it is the same.
