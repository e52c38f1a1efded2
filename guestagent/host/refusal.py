"""A refusal as the agent sends it: the status code, the message, and from the
google.rpc.Status in the grpc-status-details-bin trailer, the stable reason (ErrorInfo), the
values it names and, for INVALID_ARGUMENT, the request fields at fault (BadRequest).

A client decides on `reason`, never on the message text (docs/contract.md lists them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    message: str
    # ErrorInfo.reason; "" from an agent older than reasons (or a status from gRPC itself,
    # such as UNAVAILABLE when the agent cannot be reached).
    reason: str = ""
    domain: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    # (field, description) of each BadRequest.FieldViolation.
    field_violations: tuple[tuple[str, str], ...] = ()


def refusal_from(
    code: grpc.StatusCode, message: str, trailer: Iterable[tuple[str, str | bytes]]
) -> Refusal:
    """A refusal from its code, message and trailing metadata."""
    from google.rpc import error_details_pb2, status_pb2

    blob = next((value for key, value in trailer if key == DETAILS_KEY), None)
    if not isinstance(blob, bytes):
        return Refusal(code, message)
    status = status_pb2.Status.FromString(blob)
    info = error_details_pb2.ErrorInfo()
    violations: list[tuple[str, str]] = []
    for detail in status.details:
        request = error_details_pb2.BadRequest()
        if detail.Unpack(request):
            violations.extend((v.field, v.description) for v in request.field_violations)
        else:
            detail.Unpack(info)
    return Refusal(code, message, info.reason, info.domain, dict(info.metadata), tuple(violations))


def refusal_of(error: Any) -> Refusal:
    """The refusal a failed call (a grpc.RpcError that is also a grpc.Call) carries."""
    trailer = getattr(error, "trailing_metadata", None)  # Not on a channel's own errors.
    return refusal_from(error.code(), error.details() or "", (trailer and trailer()) or ())
