"""The domain errors every service raises, and the one table that answers them over HTTP.

Services raise what went wrong in the caller's terms: :class:`NotFound` (also
for what exists but is not the caller's, so ids cannot be probed),
:class:`PermissionDenied`, :class:`Unauthenticated`, :class:`ValueError` and its
subclasses for invalid input (each naming the field and what it accepts),
:class:`DataDirectoryFull` for work refused while the data directory has no
room (507 here, ``RESOURCE_EXHAUSTED`` over gRPC). Each
transport maps them once: HTTP here, in :data:`ERRORS` (shared by the REST API
and the gateway, so the gateway need not import the controlplane), gRPC in
:mod:`levers9.controlplane.grpc_errors`.
"""

from __future__ import annotations

import pydantic

from levers9.scheduler.candidates import NoPoolOffers
from levers9.services.auth import PermissionDenied, Unauthenticated
from levers9.state.errors import AlreadyExists, Conflict, DataDirectoryFull, InvalidTransition, NotFound

__all__ = [
    "ERRORS",
    "AlreadyExists",
    "Conflict",
    "DataDirectoryFull",
    "InvalidTransition",
    "NoPoolOffers",
    "NotFound",
    "PermissionDenied",
    "Unauthenticated",
    "error_answer",
]

#: the one place that decides how a domain error is answered over HTTP: (exception, status, error type);
#: the first entry the exception is an instance of wins
ERRORS: tuple[tuple[type[Exception], int, str], ...] = (
    (NotFound, 404, "not_found"),
    (AlreadyExists, 409, "already_exists"),
    (Conflict, 409, "conflict"),
    (InvalidTransition, 409, "invalid_transition"),
    (Unauthenticated, 401, "unauthenticated"),
    (PermissionDenied, 403, "permission_denied"),
    # the request may be fine: the server has no room for it now (and its health check says so)
    (DataDirectoryFull, 507, "insufficient_storage"),
    (ValueError, 400, "invalid_request"),
)


def error_answer(exc: BaseException) -> tuple[int, str] | None:
    """The (status, type) :data:`ERRORS` gives ``exc``, or None when it is not a domain error (a bug: 500)."""
    if isinstance(exc, pydantic.ValidationError):
        # A ValueError, but raised by a model the server built itself, never by what the client sent.
        return None
    for kind, status, name in ERRORS:
        if isinstance(exc, kind):
            return status, name
    return None
