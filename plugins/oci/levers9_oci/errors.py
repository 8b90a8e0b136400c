"""How the OCI SDK's failures become levers9's typed errors (docs/architecture.md section 5.2, oci column).

:func:`translate` takes what an SDK call raised and says which
:class:`~levers9.hooks.errors.ProviderError` it means, or None when it means
nothing levers9 knows (the hook then lets the original propagate, and the core
reports it as a plugin error). ``code=`` is always OCI's own error code
(``InternalError``, ``LimitExceeded``...), or the SDK exception's name for a
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

__all__ = ["CAPACITY_MESSAGE", "is_service_error", "retry_after", "translate"]

#: the words of OCI's 500 ``InternalError`` that mean a shape is sold out in a domain
CAPACITY_MESSAGE = "out of host capacity"
#: 409 codes that will not clear by themselves (a retry token reused or invalidated, a lasting conflict)
_INVALID_409 = frozenset({"Conflict", "InvalidatedRetryToken"})


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


def _service_error(exc: Any, *, doing: str, where: str) -> ProviderError | None:
    status: int = exc.status
    code = str(exc.code or "")
    said = str(exc.message or "").strip() or f"HTTP {status}"
    request_id = getattr(exc, "request_id", None)
    text = f"OCI {doing} for {where} failed: {said} (HTTP {status}{f', opc-request-id {request_id}' if request_id else ''})"
    if status == 500 and CAPACITY_MESSAGE in said.lower():
        return InsufficientCapacity(text, code=code or "OutOfHostCapacity")
    if status == 400 and code in ("LimitExceeded", "QuotaExceeded"):
        kind = "service limit" if code == "LimitExceeded" else "compartment quota"
        return QuotaExceeded(f"{text}; raise the {kind} for this shape", code=code)
    if status == 429:
        return Throttled(text, code=code or "TooManyRequests", retry_after=retry_after(exc.headers))
    if status >= 500:
        return Throttled(text, code=code or f"HTTP{status}", retry_after=retry_after(exc.headers))
    if status == 401:
        return AuthenticationFailed(
            f"{text}; check the profile's user, tenancy, fingerprint and key (the public key must be uploaded)",
            code=code or "NotAuthenticated",
        )
    if status == 403:
        return PermissionDenied(f"{text}; a policy statement for this action is missing", code=code or "NotAuthorized")
    if status == 409 and code == "IncorrectState":
        return Throttled(text, code=code, retry_after=retry_after(exc.headers))
    if status in (400, 404, 422) or code in _INVALID_409:
        # 400 InvalidParameter, MissingParameter, CannotParseRequest, RelatedResourceNotAuthorizedOrNotFound (a
        # subnet or image), 404 NotAuthorizedOrNotFound (the compartment): the request names something wrong
        return InvalidRequest(text, code=code or f"HTTP{status}")
    return None
