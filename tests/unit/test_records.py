"""Frozen records behave as dataclass(frozen=True) does: the same equality, hash, repr and
immutability, and the dataclasses functions work on them."""

from __future__ import annotations

import dataclasses
import inspect
import sys

import pytest

from guestagent.records import record


@record
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StockPoint:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@record
class Labelled(Point):
    label: str = ""


@record
class Gathered:
    items: list[int] = dataclasses.field(default_factory=list)
    total: int = -1

    def __post_init__(self) -> None:
        if self.total == -1:
            object.__setattr__(self, "total", sum(self.items))


@dataclasses.dataclass(frozen=True)
class Extended(Point):
    """A frozen dataclass may subclass a record, as the tests' fake kernel does."""

    note: str = dataclasses.field(default="", compare=False)


@record
class Written:
    value: int

    def __repr__(self) -> str:
        return f"<{self.value}>"


CASES = [(1, 2, ()), (0, 0, ("a",)), (-5, 7, ("b", "c"))]


@pytest.mark.parametrize("args", CASES)
def test_same_repr_and_hash_as_a_frozen_dataclass(args: tuple[int, int, tuple[str, ...]]) -> None:
    mine, stock = Point(*args), StockPoint(*args)
    assert repr(mine) == repr(stock).replace("StockPoint", "Point")
    assert hash(mine) == hash(stock)


def test_equality_is_by_class_and_fields() -> None:
    assert Point(1, 2) == Point(1, 2)
    assert Point(1, 2) != Point(1, 3)
    assert Point(1, 2) != StockPoint(1, 2)  # type: ignore[comparison-overlap]
    assert Point(1, 2) != Labelled(1, 2)  # A subclass is another record, as with dataclass.
    assert Point(1, 2).__eq__(object()) is NotImplemented
    assert len({Point(1, 2), Point(1, 2), Point(2, 1)}) == 2


def test_frozen() -> None:
    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="'x'"):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="'y'"):
        del point.y
    assert point.x == 1


def test_dataclass_functions_and_inheritance() -> None:
    labelled = Labelled(1, 2, ("t",), "l")
    assert dataclasses.is_dataclass(labelled)
    assert [f.name for f in dataclasses.fields(labelled)] == ["x", "y", "tags", "label"]
    assert dataclasses.replace(labelled, y=9) == Labelled(1, 9, ("t",), "l")
    assert dataclasses.asdict(labelled) == {"x": 1, "y": 2, "tags": ("t",), "label": "l"}
    assert repr(labelled) == "Labelled(x=1, y=2, tags=('t',), label='l')"
    assert hash(labelled) == hash((1, 2, ("t",), "l"))


def test_a_method_the_class_writes_wins() -> None:
    assert repr(Written(3)) == "<3>"
    assert Written(3) == Written(3)


def compiled_methods(cls: type) -> list[str]:
    return [
        name
        for name, value in vars(cls).items()
        if callable(value) and getattr(value, "__code__", None) is not None
        if value.__code__.co_filename == "<string>"
    ]


def test_no_method_compiled_but_init() -> None:
    """What the module is for: one exec'd method per class, not six."""
    Point(1)
    assert compiled_methods(Point) == ["__init__"]


def test_init_is_compiled_at_the_first_construction() -> None:
    @record
    class Fresh:
        a: int
        b: str = "b"

    assert compiled_methods(Fresh) == []
    assert Fresh(1) == Fresh(a=1, b="b")
    assert compiled_methods(Fresh) == ["__init__"]
    assert str(inspect.signature(Fresh)) == "(a, b='b')"
    assert Fresh(2, "c").b == "c"


def test_a_refused_first_construction_still_compiles() -> None:
    @record
    class Fresh:
        a: int

    with pytest.raises(TypeError, match="positional argument"):
        Fresh(1, 2)  # type: ignore[call-arg]
    assert compiled_methods(Fresh) == ["__init__"]
    assert Fresh(3).a == 3


def test_a_subclass_builds_with_the_init_it_inherits() -> None:
    @record
    class Base:
        a: int

    class Plain(Base):
        pass

    @record
    class Derived(Base):
        b: int = 0

    assert (Plain(1).a, type(Plain(1))) == (1, Plain)
    assert compiled_methods(Base) == ["__init__"] and compiled_methods(Plain) == []
    assert Derived(1, 2).b == 2 and compiled_methods(Derived) == ["__init__"]


def test_docstring_is_not_built_from_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under -OO (no docstrings) dataclass would call inspect.signature for each class."""

    class Bare:
        a: int

    Bare.__doc__ = None
    called: list[object] = []

    def signature(*args: object, **kwargs: object) -> str:
        called.append(args)
        return "()"

    monkeypatch.setattr(sys.modules["inspect"], "signature", signature)
    assert record(Bare).__doc__ == "Bare"
    assert called == []


def test_defaults_factories_and_post_init() -> None:
    first, second = Gathered(), Gathered()
    assert first.items == [] and first.items is not second.items
    assert Gathered([1, 2]).total == 3
    assert Gathered([1, 2], total=7).total == 7
    assert Point(x=3).y == 0
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, (), 4)  # type: ignore[call-arg]


def test_a_default_before_a_required_field_is_refused() -> None:
    class Bad:
        a: int = 0
        b: int

    with pytest.raises(TypeError, match="'b' follows default"):
        record(Bad)  # At the definition, not the first construction.


def test_subclasses() -> None:
    """A frozen dataclass over a record, and a record over a record, stay frozen."""
    extended = Extended(1, 2, (), note="a")
    assert extended == Extended(1, 2, (), note="b")  # note does not compare
    with pytest.raises(dataclasses.FrozenInstanceError):
        extended.x = 5  # type: ignore[misc]
    labelled = Labelled(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        labelled.label = "x"  # type: ignore[misc]
