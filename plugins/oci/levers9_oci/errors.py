"""How the OCI SDK's failures become levers9's typed errors (docs/architecture.md section 5.2, oci column).

:data:`CODES` is the table: each (HTTP status, error code) of OCI's "API
Errors" reference (the errors every service returns, LaunchInstance among
them) to the :class:`~levers9.hooks.errors.ProviderError` it means.
:func:`translate` takes what an SDK call raised and says which error it
means, or None when it means nothing levers9 knows (the hook then lets the
original propagate, and the core reports it as a plugin error):

* capacity: a 500 ``InternalError`` whose message says "Out of host capacity"
  (:data:`CAPACITY_MESSAGES`; OCI has no code of its own for it) ->
  :class:`InsufficientCapacity`, read before the status, so a sold-out domain
  fails over at once instead of being retried as a server error;
* ``LimitExceeded`` (the tenancy's service limit, set by Oracle) and
  ``QuotaExceeded`` (a compartment quota, set by the tenancy's
  administrators), both 400 -> :class:`QuotaExceeded` with ``scope="region"``
  and a message saying which of the two to raise: service limits are per
  region (or per availability domain, which the region scope covers), and a
  quota statement may name a region or not, which the answer does not say; the
  narrower scope costs at most one refused launch in another region;
* 429 ``TooManyRequests``, the 409s the reference says to retry with backoff
  (``IncorrectState``, ``ExternalServerIncorrectState``), 500
  ``InternalServerError``/``InternalError``, 503 ``ServiceUnavailable`` ->
  :class:`Throttled`, with ``retry-after`` when OCI sends it;
* 401 ``NotAuthenticated``, 403 ``SignUpRequired`` (the tenancy has not
  opted in) -> :class:`AuthenticationFailed`; 403 ``NotAuthorized`` ->
  :class:`PermissionDenied`;
* the request's own mistakes (400 ``InvalidParameter``, ``MissingParameter``,
  ``CannotParseRequest``, ``RelatedResourceNotAuthorizedOrNotFound``, 404
  ``NotAuthorizedOrNotFound``, 409 ``Conflict``, ``InvalidatedRetryToken``,
  501 ``MethodNotImplemented``...) -> :class:`InvalidRequest`.

A code the table does not hold is judged by its status (429 and 5xx but 501:
throttled; 401; 403; 400, 404, 422 and 501: invalid); anything else is None.
``code=`` is always OCI's own error code, or the SDK exception's name for a
connection failure. Messages name what was being done and where (pool,
region, shape, domain, as the caller's ``where`` says), OCI's own message and
its ``opc-request-id``; never the request itself, which carries the signature.

The ``oci`` package is imported inside the functions only: importing this
module costs nothing.
"""

from __future__ import annotations

from typing import Any

from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)

__all__ = ["CAPACITY_MESSAGE", "CAPACITY_MESSAGES", "CODES", "is_service_error", "kind_of", "retry_after", "translate"]

#: the words of OCI's 500 ``InternalError`` that mean a shape is sold out in a domain
CAPACITY_MESSAGE = "out of host capacity"
#: every wording of that answer levers9 knows (lower case)
CAPACITY_MESSAGES = (CAPACITY_MESSAGE, "out of capacity")

#: OCI's API Errors table: (HTTP status, code) to what it means to levers9
CODES: dict[tuple[int, str], type[ProviderError]] = {
    (400, "CannotParseRequest"): InvalidRequest,
    (400, "InvalidParameter"): InvalidRequest,
    (400, "LimitExceeded"): QuotaExceeded,
    (400, "MissingParameter"): InvalidRequest,
    (400, "QuotaExceeded"): QuotaExceeded,
    (400, "RelatedResourceNotAuthorizedOrNotFound"): InvalidRequest,
    (401, "NotAuthenticated"): AuthenticationFailed,
    (403, "NotAllowed"): InvalidRequest,  # the operation must go to the home region
    (403, "NotAuthorized"): PermissionDenied,
    (403, "SignUpRequired"): AuthenticationFailed,
    (404, "InvalidParameter"): InvalidRequest,
    (404, "NotAuthorizedOrNotFound"): InvalidRequest,
    (404, "NotFound"): InvalidRequest,
    (404, "NamespaceNotFound"): InvalidRequest,
    (405, "MethodNotAllowed"): InvalidRequest,
    (409, "Conflict"): InvalidRequest,
    (409, "ExternalServerIncorrectState"): Throttled,
    (409, "IncorrectState"): Throttled,
    (409, "InvalidatedRetryToken"): InvalidRequest,
    (409, "NotAuthorizedOrResourceAlreadyExists"): InvalidRequest,
    (412, "NoEtagMatch"): InvalidRequest,
    (429, "TooManyRequests"): Throttled,
    (500, "InternalServerError"): Throttled,
    (500, "InternalError"): Throttled,  # InsufficientCapacity when it says "Out of host capacity"
    (501, "MethodNotImplemented"): InvalidRequest,
    (503, "ServiceUnavailable"): Throttled,
}
#: what the operator raises for each quota code
_QUOTA_HINTS = {
    "LimitExceeded": (
        "raise the tenancy's service limit for this shape in this region (Limits, Quotas and Usage in the "
        "Console, or a limit increase request)"
    ),
    "QuotaExceeded": "raise the compartment quota for this shape (a quota policy statement), or free some of it",
}


def is_service_error(exc: BaseException, status: int | None = None, *codes: str) -> bool:
    """True when ``exc`` is an OCI ``ServiceError`` (of ``status`` and one of ``codes``, when given)."""
    import oci

    if not isinstance(exc, oci.exceptions.ServiceError):
        return False
    return (status is None or exc.status == status) and (not codes or exc.code in codes)


def retry_after(headers: Any) -> float | None:
    """Seconds from a ``retry-after`` header (OCI sends whole seconds), or None."""
    if headers is None:
        return None
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
    except AttributeError:
        return None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def translate(exc: BaseException, *, doing: str, where: str) -> ProviderError | None:
    """The typed error ``exc`` (raised by the SDK while ``doing`` something for ``where``) means, or None."""
    import oci

    if isinstance(exc, oci.exceptions.ServiceError):
        return _service_error(exc, doing=doing, where=where)
    if isinstance(exc, oci.exceptions.RequestException | oci.exceptions.ConnectTimeout):
        # refused, reset, timed out, DNS or TLS: nothing was answered; the core retries (docs/plugins.md §10)
        return Throttled(
            f"OCI {doing} for {where} got no answer ({type(exc).__name__}); levers9 retries",
            code=type(exc).__name__,
        )
    return None


def kind_of(status: int, code: str, message: str = "") -> type[ProviderError] | None:
    """The typed error OCI's answer ``status``/``code`` (saying ``message``) means, or None (see the module
    docstring)."""
    if status == 500 and any(words in message.lower() for words in CAPACITY_MESSAGES):
        return InsufficientCapacity
    known = CODES.get((status, code))
    if known is not None:
        return known
    if status == 429 or (status >= 500 and status != 501):
        return Throttled
    if status == 401:
        return AuthenticationFailed
    if status == 403:
        return PermissionDenied
    if status in (400, 404, 422, 501):
        return InvalidRequest
    return None


def _service_error(exc: Any, *, doing: str, where: str) -> ProviderError | None:
    status: int = exc.status
    code = str(exc.code or "")
    said = str(exc.message or "").strip() or f"HTTP {status}"
    request_id = getattr(exc, "request_id", None)
    text = f"OCI {doing} for {where} failed: {said} (HTTP {status}{f', opc-request-id {request_id}' if request_id else ''})"
    kind = kind_of(status, code, said)
    if kind is None:
        return None
    if kind is InsufficientCapacity:
        return InsufficientCapacity(text, code=code or "OutOfHostCapacity")
    if kind is QuotaExceeded:
        return QuotaExceeded(
            f"{text}; {_QUOTA_HINTS.get(code, _QUOTA_HINTS['LimitExceeded'])}", code=code, scope="region"
        )
    if kind is Throttled:
        return Throttled(text, code=code or f"HTTP{status}", retry_after=retry_after(exc.headers))
    if kind is AuthenticationFailed:
        hint = (
            "the tenancy must opt in (sign up) to this service first"
            if code == "SignUpRequired"
            else "check the profile's user, tenancy, fingerprint and key (the public key must be uploaded)"
        )
        return AuthenticationFailed(f"{text}; {hint}", code=code or "NotAuthenticated")
    if kind is PermissionDenied:
        return PermissionDenied(f"{text}; a policy statement for this action is missing", code=code or "NotAuthorized")
    return kind(text, code=code or f"HTTP{status}")
