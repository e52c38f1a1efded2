"""Frozen records: dataclasses whose equality, hash, repr and immutability are methods shared by
every record, where `dataclass(frozen=True)` compiles six methods per class with exec.

Across the agent's hundred records those methods were 0.66 MiB of the 2.9 MiB its own modules
cost, and a third of its import time, in every guest (docs/measurements.md, 2026-12-05). Only
`__init__` is compiled per class, once, when the class is first constructed: its signature is
the record's. Most records are never built before the agent serves, and many never in a given
guest. Importing the daemon took 22 ms on the host with the __init__s compiled at import,
16-21 ms without, and they held 121 KiB (docs/measurements.md, 2026-12-06). A record is still
a dataclass: `fields`, `replace` and `asdict` work on it, and it compares, hashes and prints
as `dataclass(frozen=True)` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError, dataclass, fields
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")

# Kept on each record class for the shared methods, in field order: the fields that compare
# (and hash), and those that print.
COMPARED = "__record_compared__"
SHOWN = "__record_shown__"


def _values(record: Any) -> tuple[Any, ...]:
    return tuple(getattr(record, name) for name in getattr(type(record), COMPARED))


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in getattr(type(self), SHOWN))
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


def _check_init(cls: type, declared: tuple[Field[Any], ...]) -> None:
    """What dataclass refuses when it writes an __init__, refused when the class is defined
    rather than at its first construction."""
    defaulted = False
    for f in declared:
        if not f.init:
            raise TypeError(f"{cls.__qualname__}.{f.name}: a record's fields are all __init__'s")
        if f.default is not MISSING or f.default_factory is not MISSING:
            defaulted = True
        elif defaulted:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _compile_init(cls: type, declared: tuple[Field[Any], ...]) -> Callable[..., None]:
    """The record's __init__, as frozen dataclass's: each field set past the frozen
    __setattr__, defaults and default factories taken as dataclass takes them, then
    __post_init__ if the class has one. One exec, where frozen dataclass needs three."""
    env: dict[str, Any] = {"_record_set": object.__setattr__, "_record_missing": MISSING}
    params, body = [], []
    for f in declared:
        value = f.name
        if f.default is not MISSING:
            env[f"_record_default_{f.name}"] = f.default
            params.append(f"{f.name}=_record_default_{f.name}")
        elif f.default_factory is not MISSING:
            env[f"_record_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_record_missing")
            value = f"_record_factory_{f.name}() if {f.name} is _record_missing else {f.name}"
        else:
            params.append(f.name)
        body.append(f"    _record_set(self, {f.name!r}, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    exec(f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass"), env)
    init: Callable[..., None] = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _init_on_first_use(cls: type, declared: tuple[Field[Any], ...]) -> Callable[..., None]:
    """An __init__ that compiles the record's own, puts it on the class and calls it. A
    subclass that inherits it compiles this class's, not its own (`cls`, not type(self)).
    Two threads at once may both compile; both get the same method."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init = _compile_init(cls, declared)
        type.__setattr__(cls, "__init__", init)
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True)`, with the shared methods."""
    # Under -OO no class has a docstring, and dataclass would build each one from
    # inspect.signature: a tenth of the import time for text nothing reads.
    if cls.__doc__ is None:
        cls.__doc__ = cls.__name__
    # A class that writes __eq__ has __hash__ None in its body; dataclass adds one then too.
    own = {name for name, value in vars(cls).items() if value is not None}
    # Neither frozen nor with an __init__, dataclass compiles nothing: it only gathers the
    # fields. The methods frozen would compile come from here. dataclass refuses a non-frozen
    # subclass of a frozen one, so a record over a record (rare) is built frozen and its two
    # compiled methods replaced.
    under_frozen = any(
        getattr(getattr(base, "__dataclass_params__", None), "frozen", False)
        for base in cls.__mro__[1:]
    )
    built = dataclass(init=False, eq=False, repr=False, frozen=under_frozen)(cls)
    # Frozen it is, so a frozen dataclass may subclass a record (dataclass checks this flag).
    built.__dataclass_params__.frozen = True  # type: ignore[attr-defined]
    declared = fields(built)  # type: ignore[arg-type]
    setattr(built, COMPARED, tuple(f.name for f in declared if f.compare))
    setattr(built, SHOWN, tuple(f.name for f in declared if f.repr))
    if "__init__" not in own:
        _check_init(built, declared)
        setattr(built, "__init__", _init_on_first_use(built, declared))  # noqa: B010
    for name, method in SHARED.items():
        if name not in own:  # A method the class writes itself wins, as with dataclass.
            setattr(built, name, method)
    return built
