from __future__ import annotations

from pathlib import Path

import pytest

from guestagent.errors import QUOTE_MAX, InvalidArgument
from guestagent.linux.cgroup.name import validate_cgroup_name


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("pod", ("pod",)),
        ("pod/ctr", ("pod", "ctr")),
        ("pod/ctr/", ("pod", "ctr")),
        ("pod//ctr//", ("pod", "ctr")),
    ],
)
def test_valid_names(name: str, parts: tuple[str, ...]) -> None:
    assert validate_cgroup_name(name) == parts


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
    with pytest.raises(InvalidArgument, match=reason):
        validate_cgroup_name(name)


def test_a_long_component_is_quoted_to_the_contracts_length() -> None:
    """docs/contract.md: a quoted value is cut to QUOTE_MAX characters, this one too."""
    part = "c" * 300
    with pytest.raises(InvalidArgument, match="300 bytes, over 255") as refused:
        validate_cgroup_name(f"pod/{part}")
    assert f"'{'c' * QUOTE_MAX}'... (300 characters)" in str(refused.value)


def test_the_contract_states_the_quote_length_the_code_uses() -> None:
    contract = (Path(__file__).parents[4] / "docs/contract.md").read_text()
    assert f"is cut to {QUOTE_MAX} characters" in " ".join(contract.split())
