"""One audit line per state-changing call: who asked for what, what came of it, how long.

The line is written when the call ends, whatever the outcome: a refusal or a rollback is
as much worth knowing as a change. The caller's own request is logged as it arrived (not
as decoded), so a request refused before decoding is on record too.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import grpc

from guestagent.jsonlog import EventLog

if TYPE_CHECKING:  # Imported with the contract's first call, not at start (agent/first_call.py).
    from google.protobuf.message import Message

LOGGER = "guestagent.audit"
# Audit lines stay on whatever --log-level says: they are the record of who changed what.
logging.getLogger(LOGGER).setLevel(logging.INFO)
log = EventLog(LOGGER)

Value = str | int | float | bool | list["Value"] | dict[str, "Value"]


def message_values(message: Message) -> dict[str, Value]:
    """The fields a caller set, by name; enums by their names, nested messages as dicts."""
    values: dict[str, Value] = {}
    for field, value in message.ListFields():
        if field.is_repeated:
            values[field.name] = [_field_value(field, item) for item in value]
        else:
            values[field.name] = _field_value(field, value)
    return values


def _field_value(field: object, value: object) -> Value:
    enum_type = getattr(field, "enum_type", None)
    if enum_type is not None and isinstance(value, int):
        described = enum_type.values_by_number.get(value)
        return described.name if described is not None else value
    if hasattr(value, "ListFields"):  # A nested message.
        return message_values(value)  # type: ignore[arg-type]
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


def audit(
    method: str,
    peer: str,
    request: Message,
    code: grpc.StatusCode,
    duration_s: float,
    details: str = "",
) -> None:
    fields: dict[str, Value] = {
        "method": method,
        "peer": peer,
        "request": message_values(request),
        "code": code.name,
        "duration_ms": round(duration_s * 1000, 3),
    }
    if details:
        fields["error"] = details
    log.info("audit", **fields)


def audit_undecodable(method: str, peer: str, size: int, details: str, started: float) -> None:
    """The audit line for a request that did not decode: its size stands for its fields."""
    log.info(
        "audit",
        method=method,
        peer=peer,
        request={"undecodable_bytes": size},
        code=grpc.StatusCode.INVALID_ARGUMENT.name,
        duration_ms=round((time.monotonic() - started) * 1000, 3),
        error=details,
    )


def audit_kernel_switch(setting: str, before: str, after: str, left_because: str) -> None:
    """The audit line for a kernel setting the agent changed (or meant to) as it started:
    a change to the whole guest, made by no caller, is on record as much as a call's."""
    fields: dict[str, Value] = {
        "method": "serve",
        "peer": "guestagent",
        "request": {"setting": setting, "before": before, "after": after},
        "code": grpc.StatusCode.OK.name if before != after else "UNCHANGED",
    }
    if left_because:
        fields["error"] = left_because
    log.info("audit", **fields)
