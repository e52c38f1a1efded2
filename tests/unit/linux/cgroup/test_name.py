from __future__ import annotations

from pathlib import Path

import pytest

from guestagent.errors import QUOTE_MAX, InvalidArgument
from guestagent.linux.cgroup.name import PATH_MAX, CgroupName, cgroup_name


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("pod", "pod"),
        ("pod/ctr", "pod/ctr"),
        ("pod/ctr/", "pod/ctr"),
        ("pod//ctr//", "pod/ctr"),
        ("..pod/ctr.", "..pod/ctr."),
    ],
)
def test_valid_names_in_their_one_form(text: str, name: str) -> None:
    checked = cgroup_name(text)
    assert (type(checked), checked) == (CgroupName, name)


def test_the_lineage_is_the_ancestors_then_the_cgroup() -> None:
    assert cgroup_name("a//b/c/").lineage == ("a", "a/b", "a/b/c")
    assert cgroup_name("a").lineage == ("a",)
    assert {type(name) for name in cgroup_name("a/b").lineage} == {CgroupName}


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("/pod", "absolute"),
        ("..", "'..'"),
        ("pod/../../etc", "'..'"),
        ("pod/..//", "'..'"),
        ("./pod", "'.'"),
        ("pod\x00x", "NUL"),
    ],
)
def test_refused_names(name: str, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason) as refused:
        cgroup_name(name)
    assert refused.value.reason == "CGROUP_PATH_INVALID"


def test_a_path_over_path_max_says_its_length() -> None:
    with pytest.raises(InvalidArgument, match=f"of {PATH_MAX + 1} bytes is over {PATH_MAX}"):
        cgroup_name("a/" * (PATH_MAX // 2) + "b")


def test_a_long_component_is_quoted_to_the_contracts_length() -> None:
    """docs/contract.md: a quoted value is cut to QUOTE_MAX characters, this one too."""
    part = "c" * 300
    with pytest.raises(InvalidArgument, match="300 bytes, over 255") as refused:
        cgroup_name(f"pod/{part}")
    assert f"'{'c' * QUOTE_MAX}'... (300 characters)" in str(refused.value)


def test_the_contract_states_the_quote_length_the_code_uses() -> None:
    contract = (Path(__file__).parents[4] / "docs/contract.md").read_text()
    assert f"is cut to {QUOTE_MAX} characters" in " ".join(contract.split())
