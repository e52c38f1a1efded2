"""A refusal as the gRPC richer error model carries it: google.rpc.Status in the
grpc-status-details-bin trailer, with an ErrorInfo (the stable reason, and metadata naming
the values) and, for INVALID_ARGUMENT, a BadRequest naming the request field.

grpcio-status would add only to_status() over these few lines, so the agent uses the
messages (googleapis-common-protos) directly. They are imported on the first refusal, not
at start: a guest that is never refused never loads them.
"""

from __future__ import annotations

import grpc

from guestagent import errors

DETAILS_KEY = "grpc-status-details-bin"
# The reason of a failure that is a bug in this agent, not a refusal.
BUG_REASON = "INTERNAL_ERROR"


def status_details(code: grpc.StatusCode, message: str, error: Exception) -> bytes:
    """The serialized google.rpc.Status for a refusal (or a bug) with the given code."""
    from google.rpc import error_details_pb2, status_pb2

    status = status_pb2.Status(code=code.value[0], message=message)
    if isinstance(error, errors.AgentError):
        info = error_details_pb2.ErrorInfo(
            reason=error.reason, domain=errors.ERROR_DOMAIN, metadata=error.metadata
        )
    else:
        info = error_details_pb2.ErrorInfo(
            reason=BUG_REASON, domain=errors.ERROR_DOMAIN, metadata={"type": type(error).__name__}
        )
    status.details.add().Pack(info)
    if code is grpc.StatusCode.INVALID_ARGUMENT and isinstance(error, errors.AgentError):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=error.field, description=message
        )
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    return bytes(status.SerializeToString())


def details_metadata(
    code: grpc.StatusCode, message: str, error: Exception
) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata that carries the Status to the caller."""
    return ((DETAILS_KEY, status_details(code, message, error)),)
