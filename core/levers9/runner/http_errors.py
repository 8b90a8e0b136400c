"""Every error type the gateway and the serving containers answer with, in one table.

An error answer is always JSON, ``{"error": {"type": TYPE, "message": ...}}``,
with ``content-type: application/json``; ``message`` says what went wrong and,
for bad input, what would be accepted. TYPE is snake_case, as in the REST API
under ``/api/v1``, and one condition has one type on every route: a body that is not JSON is ``invalid_json`` on
``/endpoint``, ``/queue`` and ``/job`` alike, whether the gateway or the
container read it. 4xx means the request was wrong, 5xx that the deployment or
levers9 failed it.

Invariant: every type that is answered is a key of :data:`ERROR_TYPES`
(:func:`error_body` refuses any other), so this table is the whole list. It
includes the REST API's domain error types (``levers9.controlplane.http.ERRORS``)
with the same statuses, because a refusal to enqueue a call is passed on with
the type the REST API gives it.

Only the standard library is imported: the runner inside every container uses
this module through :mod:`levers9.runner.serving`.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ALREADY_EXISTS",
    "BAD_GATEWAY",
    "CONFLICT",
    "ERROR_TYPES",
    "HANDLER_ERROR",
    "INSUFFICIENT_STORAGE",
    "INTERNAL",
    "INVALID_ARGUMENTS",
    "INVALID_JSON",
    "INVALID_REQUEST",
    "INVALID_TRANSITION",
    "METHOD_NOT_ALLOWED",
    "NOT_FOUND",
    "NO_CONTAINER",
    "OVERLOADED",
    "PERMISSION_DENIED",
    "RESULT_NOT_JSON",
    "TIMEOUT",
    "TOO_DEEP_MESSAGE",
    "TOO_LARGE",
    "UNAUTHENTICATED",
    "error_body",
]

#: 404: no such deployment (or another workspace's, or no version of it serving), no such version
#: (``/v0``, ``/v01``...), no such task, a box port the box does not have, a path that goes nowhere
NOT_FOUND = "not_found"
#: 401: no token, or one that is not a valid user token
UNAUTHENTICATED = "unauthenticated"
#: 405: the route takes another method (``allow`` says which)
METHOD_NOT_ALLOWED = "method_not_allowed"
#: 400: a malformed HTTP request, or a call the deployment can never run
INVALID_REQUEST = "invalid_request"
#: 400: the body is not JSON, or nests arrays and objects too deeply to be read
INVALID_JSON = "invalid_json"
#: 422: the arguments do not fit the function's signature (an unknown or missing one); the message gives it
INVALID_ARGUMENTS = "invalid_arguments"
#: 413: the body is over the size limit
TOO_LARGE = "too_large"
#: 429: as many requests as ``max_pending`` already wait for a container (``retry-after`` is set)
OVERLOADED = "overloaded"
#: 504: no container was ready within ``start_timeout`` (the message names the last failed start)
NO_CONTAINER = "no_container"
#: 504: the container did not begin its answer within the deployment's ``timeout``
TIMEOUT = "timeout"
#: 502: the container broke off while it had the request (it died, or broke its response)
BAD_GATEWAY = "bad_gateway"
#: 500: the deployment's code raised, or ended without answering; ``exception`` names the exception's class
HANDLER_ERROR = "handler_error"
#: 500: the function's return value cannot be written as JSON
RESULT_NOT_JSON = "result_not_json"
#: 500: a fault in levers9 itself; the log has the details
INTERNAL = "internal"
#: 403, 409: the REST API's domain errors, passed on when enqueueing a call is refused
PERMISSION_DENIED = "permission_denied"
ALREADY_EXISTS = "already_exists"
CONFLICT = "conflict"
INVALID_TRANSITION = "invalid_transition"
#: 507: the controlplane's data directory is full; new work is refused until space is freed there
INSUFFICIENT_STORAGE = "insufficient_storage"

#: type -> the HTTP status it is answered with
ERROR_TYPES: dict[str, int] = {
    NOT_FOUND: 404,
    UNAUTHENTICATED: 401,
    METHOD_NOT_ALLOWED: 405,
    INVALID_REQUEST: 400,
    INVALID_JSON: 400,
    TOO_LARGE: 413,
    INVALID_ARGUMENTS: 422,
    OVERLOADED: 429,
    NO_CONTAINER: 504,
    TIMEOUT: 504,
    BAD_GATEWAY: 502,
    HANDLER_ERROR: 500,
    RESULT_NOT_JSON: 500,
    INTERNAL: 500,
    PERMISSION_DENIED: 403,
    ALREADY_EXISTS: 409,
    CONFLICT: 409,
    INVALID_TRANSITION: 409,
    INSUFFICIENT_STORAGE: 507,
}

#: the message for a JSON body whose nesting is deeper than the parser can follow (it raised RecursionError)
TOO_DEEP_MESSAGE = (
    "the body is not JSON that can be read: its arrays and objects nest too deeply; "
    "nest them at most a few hundred levels deep"
)


def error_body(kind: str, message: str, **extra: str) -> bytes:
    """The JSON of an error answer of type ``kind`` (a key of :data:`ERROR_TYPES`); ``extra`` fields go beside."""
    if kind not in ERROR_TYPES:
        raise ValueError(f"unknown error type {kind!r}: add it to ERROR_TYPES in levers9.runner.http_errors")
    detail: dict[str, Any] = {"type": kind, "message": message, **extra}
    return json.dumps({"error": detail}).encode()
