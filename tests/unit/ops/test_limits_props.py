from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guestagent.errors import InvalidArgument
from guestagent.linux.abi import LONG_MAX
from guestagent.ops.limits import MemorySpec, cgroup_values

bytes_ = st.integers(min_value=1, max_value=LONG_MAX)
not_given = st.sampled_from([None, 0])
# Any int64 and a little beyond, weighted towards the edges where the rules change.
anything = st.one_of(
    st.none(),
    st.sampled_from([0, -1, -2, 1, LONG_MAX, LONG_MAX + 1]),
    st.integers(min_value=-(2**64), max_value=2**64),
)


def written_numbers(spec: MemorySpec) -> list[str]:
    values = cgroup_values(spec)
    return [v for v in (values.memory_max, values.swap_max, values.memory_low) if v is not None]


@given(limit=bytes_, data=st.data())
def test_swap_plus_limit_is_the_total(limit: int, data: st.DataObject) -> None:
    total = data.draw(st.integers(min_value=limit, max_value=LONG_MAX))
    values = cgroup_values(MemorySpec(limit=limit, swap=total))
    assert values.memory_max == str(limit)
    assert values.swap_max is not None
    assert int(values.swap_max) + limit == total


@st.composite
def valid_specs(draw: st.DrawFn) -> MemorySpec:
    limit = draw(st.one_of(not_given, st.just(-1), bytes_))
    if limit in (None, 0):
        swap = draw(st.one_of(not_given, st.just(-1)))
    elif limit == -1:
        swap = draw(st.one_of(not_given, st.just(-1), bytes_))
    else:
        swap = draw(st.one_of(not_given, st.just(-1), st.integers(limit, LONG_MAX)))
    reservation = draw(st.one_of(not_given, st.just(-1), bytes_))
    return MemorySpec(limit, swap, reservation)


@given(valid_specs())
def test_valid_specs_never_write_a_negative_number(spec: MemorySpec) -> None:
    for value in written_numbers(spec):
        assert value == "max" or (value.isdigit() and 0 <= int(value) <= LONG_MAX)


@given(valid_specs())
def test_swap_never_exceeds_what_the_total_allows(spec: MemorySpec) -> None:
    values = cgroup_values(spec)
    if spec.limit and spec.limit > 0 and spec.swap and spec.swap > 0:
        assert values.swap_max is not None
        assert int(values.swap_max) + spec.limit <= spec.swap


@st.composite
def invalid_specs(draw: st.DrawFn) -> tuple[MemorySpec, list[int]]:
    """A spec that breaks one rule, and the numbers its error must name."""
    bad_number = st.one_of(
        st.integers(max_value=-2), st.integers(min_value=LONG_MAX + 1, max_value=2**70)
    )
    case = draw(st.sampled_from(["limit", "swap", "reservation", "no limit", "total too small"]))
    if case == "limit":
        limit = draw(bad_number)
        return MemorySpec(limit=limit, swap=draw(st.none() | bytes_)), [limit]
    if case == "swap":
        swap = draw(bad_number)
        return MemorySpec(limit=draw(st.none() | bytes_), swap=swap), [swap]
    if case == "reservation":
        reservation = draw(bad_number)
        return MemorySpec(reservation=reservation), [reservation]
    if case == "no limit":
        swap = draw(bytes_)
        return MemorySpec(limit=draw(not_given), swap=swap), [swap]
    limit = draw(st.integers(min_value=2, max_value=LONG_MAX))
    swap = draw(st.integers(min_value=1, max_value=limit - 1))
    return MemorySpec(limit=limit, swap=swap), [swap, limit]


@given(invalid_specs())
def test_invalid_specs_raise_and_name_the_values(case: tuple[MemorySpec, list[int]]) -> None:
    spec, numbers = case
    with pytest.raises(InvalidArgument) as raised:
        cgroup_values(spec)
    for number in numbers:
        assert str(number) in str(raised.value)


@given(st.builds(MemorySpec, anything, anything, anything))
def test_any_spec_is_values_or_invalid_argument(spec: MemorySpec) -> None:
    try:
        numbers = written_numbers(spec)
    except InvalidArgument:
        return
    for value in numbers:
        assert value == "max" or (value.isdigit() and int(value) <= LONG_MAX)


@given(st.builds(MemorySpec, anything, anything, anything))
def test_zero_and_none_are_the_same(spec: MemorySpec) -> None:
    zeroed = dataclasses.replace(
        spec, **{f.name: 0 for f in dataclasses.fields(spec) if getattr(spec, f.name) is None}
    )

    def outcome(s: MemorySpec) -> object:
        try:
            return cgroup_values(s)
        except InvalidArgument as e:
            return str(e)

    assert outcome(spec) == outcome(zeroed)
