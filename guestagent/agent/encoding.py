"""Answers onto the wire by convention: a message's field takes the domain value's field of
the same name, or of that name without its unit suffix (`current_bytes` <- `current`,
`onlined_blocks` <- `onlined`), since the wire names units and the domain does not. A nested
value of a declared type is encoded the same way; None leaves a field unset.

Each domain type is declared once with its message (`declare`) and with what the convention
cannot do: fields whose conversion is real (an enum, a limit where None means unlimited,
seconds to microseconds), fields renamed, domain fields the wire does not carry, and message
fields the caller fills from other values. tests/unit/agent/test_wire.py checks every
declaration against both sides, so a field added on one side only fails there rather than
going silently missing from the answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from typing import Any, TypeVar

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from guestagent.records import record

UNIT_SUFFIXES = ("_bytes", "_blocks")

M = TypeVar("M", bound=Message)
# A message field converted by hand: the domain field it is made from, and how.
Converted = tuple[str, Callable[[Any], Any]]


@record
class Pair:
    """A domain dataclass and the message it is encoded as."""

    domain: type
    message: type[Message]
    by_hand: Mapping[str, Converted] = field(default_factory=dict)
    # Message fields taken from a domain field of another name, same value.
    renamed: Mapping[str, str] = field(default_factory=dict)
    # Domain fields the message does not carry.
    off_wire: frozenset[str] = frozenset()
    # Message fields the caller fills from values other than this one.
    elsewhere: frozenset[str] = frozenset()

    def source(self, message_field: str) -> str | None:
        """The domain field a message field takes by convention, None when it has none."""
        if message_field in self.renamed:
            return self.renamed[message_field]
        names = domain_fields(self.domain)
        if message_field in names:
            return message_field
        for suffix in UNIT_SUFFIXES:
            if message_field.endswith(suffix) and message_field[: -len(suffix)] in names:
                return message_field[: -len(suffix)]
        return None


def domain_fields(domain: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(domain))


PAIRS: dict[type, Pair] = {}


def declare(
    domain: type,
    message: type[Message],
    *,
    by_hand: Mapping[str, Converted] | None = None,
    renamed: Mapping[str, str] | None = None,
    off_wire: Iterable[str] = (),
    elsewhere: Iterable[str] = (),
) -> None:
    """How a domain type goes on the wire (once per type)."""
    PAIRS[domain] = Pair(
        domain, message, by_hand or {}, renamed or {}, frozenset(off_wire), frozenset(elsewhere)
    )


def mismatches(pair: Pair) -> list[str]:
    """What a declaration leaves unaccounted for: a message field with no source, a domain
    field that reaches no message field, a declared name neither side has. Empty when the
    two sides agree."""
    on_wire = tuple(f.name for f in pair.message.DESCRIPTOR.fields)
    domain = domain_fields(pair.domain)
    message_name, domain_name = pair.message.DESCRIPTOR.name, pair.domain.__name__
    special = {*pair.by_hand, *pair.elsewhere}
    problems = [
        f"{message_name}.{name} takes no field of {domain_name}"
        for name in on_wire
        if name not in special and pair.source(name) is None
    ]
    used = {pair.source(name) for name in on_wire if name not in special}
    used |= {source for source, _ in pair.by_hand.values()}
    problems += [
        f"{domain_name}.{name} reaches no field of {message_name}"
        for name in domain
        if name not in used and name not in pair.off_wire
    ]
    problems += [
        f"{message_name} has no field {name}, which the declaration names"
        for name in [*pair.by_hand, *pair.renamed, *pair.elsewhere]
        if name not in on_wire
    ]
    problems += [
        f"{domain_name} has no field {name}, which the declaration names"
        for name in [*pair.off_wire, *pair.renamed.values()]
        + [source for source, _ in pair.by_hand.values()]
        if name not in domain
    ]
    return problems


def encode(value: Any, message: type[M]) -> M:
    """The message for a value of a declared type."""
    return message(**_fields(value))


def encoder(message: type[M]) -> Callable[[Any], M]:
    """The encoder of one answer type, for the servicer's table of RPCs."""
    return lambda value: encode(value, message)


def _fields(value: Any) -> dict[str, Any]:
    """The message's fields for a declared value, as its constructor takes them (the
    constructor is the fast way to fill a message: 3x setting fields one by one)."""
    fields = {}
    for name, source, convert, nested, repeated in _plan(type(value)):
        part = getattr(value, source)
        if convert is not None:
            part = convert(part)
        if part is None:
            continue
        if nested is not None:
            part = [_message(nested, item) for item in part] if repeated else _message(nested, part)
        fields[name] = part
    return fields


def _message(cls: type[Message], value: Any) -> Message:
    return value if isinstance(value, Message) else cls(**_fields(value))


# A message field: its name, its source in the domain value, the conversion (None: as it
# is), the class of its message (None: a scalar or a map, taken as it is), and whether it
# is repeated.
Step = tuple[str, str, Callable[[Any], Any] | None, type[Message] | None, bool]
_PLANS: dict[type, tuple[Step, ...]] = {}


def _plan(domain: type) -> tuple[Step, ...]:
    """Each message field's source and conversion, worked out once per type."""
    if domain not in _PLANS:
        pair = PAIRS[domain]
        steps: list[Step] = []
        # A map field reads as a Mapping on a message. Not `GetOptions().map_entry`: that
        # loads descriptor.proto's message classes (descriptor_pb2), 0.48 MiB of anonymous
        # memory that nothing else in the agent uses (docs/measurements.md, 2026-12-06).
        empty = pair.message()
        for descriptor in pair.message.DESCRIPTOR.fields:
            name = descriptor.name
            kind = descriptor.message_type
            # upb's descriptor is not the type the stubs name; GetMessageClass takes either.
            is_map = isinstance(getattr(empty, name), Mapping)
            nested = None if kind is None or is_map else GetMessageClass(kind)  # type: ignore[arg-type]
            repeated = descriptor.is_repeated
            if name in pair.by_hand:
                source, convert = pair.by_hand[name]
                steps.append((name, source, convert, nested, repeated))
            elif name not in pair.elsewhere and (source_name := pair.source(name)) is not None:
                steps.append((name, source_name, None, nested, repeated))
        _PLANS[domain] = tuple(steps)
    return _PLANS[domain]
