"""Frozen records: dataclasses whose equality, hash, repr and immutability are methods shared by
every record, where `dataclass(frozen=True)` compiles six methods per class with exec.

Across the agent's hundred records those methods were 0.66 MiB of the 2.9 MiB its own modules
cost, and a third of its import time, in every guest (docs/measurements.md, 2026-12-05). Only
`__init__` is still compiled per class: its signature is the record's. A record is still a
dataclass: `fields`, `replace` and `asdict` work on it, and it compares, hashes and prints as
`dataclass(frozen=True)` would.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, fields
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")

# The field names in order, kept on each record class for the shared methods.
NAMES = "__record_names__"


def _values(record: Any) -> tuple[Any, ...]:
    return tuple(getattr(record, name) for name in getattr(type(record), NAMES))


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in getattr(type(self), NAMES))
    return f"{type(self).__qualname__}({shown})"


def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


SHARED = {
    "__eq__": _eq,
    "__hash__": _hash,
    "__repr__": _repr,
    "__setattr__": _setattr,
    "__delattr__": _delattr,
}


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True)`, with the shared methods."""
    # Under -OO no class has a docstring, and dataclass would build each one from
    # inspect.signature: a tenth of the import time for text nothing reads.
    if cls.__doc__ is None:
        cls.__doc__ = cls.__name__
    # A class that writes __eq__ has __hash__ None in its body; dataclass adds one then too.
    own = {name for name, value in vars(cls).items() if value is not None}
    # Frozen, for an __init__ that sets fields past the frozen __setattr__; the two methods
    # frozen compiles are replaced below and freed.
    built = dataclass(frozen=True, eq=False, repr=False)(cls)
    setattr(built, NAMES, tuple(f.name for f in fields(built)))  # type: ignore[arg-type]
    for name, method in SHARED.items():
        if name not in own:  # A method the class writes itself wins, as with dataclass.
            setattr(built, name, method)
    return built
