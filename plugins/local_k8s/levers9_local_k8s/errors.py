"""The Kubernetes API's answers, as levers9's typed errors (docs/architecture.md section 5.2, the local_k8s column).

:func:`translate` turns what the ``kubernetes`` client raised into the
:class:`~levers9.hooks.errors.ProviderError` the core acts on. The API's
``Status`` body gives the reason (``Forbidden``, ``AlreadyExists``...) and the
message, kept as the API wrote it; ``code=`` carries the reason:

* 401 -> :class:`AuthenticationFailed` (an expired or wrong token, a kubeconfig
  for another cluster);
* 403 whose message says ``exceeded quota`` -> :class:`QuotaExceeded`; any other
  403 -> :class:`PermissionDenied` (RBAC), naming the verb and resource the API
  named;
* 429, 5xx, and a connection that failed or timed out -> :class:`Throttled`
  (retryable: provisioning is idempotent per machine id, a Job name);
* 400, 404 (of what a create names: the namespace), 409 on anything but the
  caller's own retry, 422 -> :class:`InvalidRequest`.

The client is never imported here: its exceptions are recognised by their
``status``/``body`` attributes and the urllib3 ones by class name, so importing
this module stays cheap. An exception neither shape explains returns None and
the caller lets it propagate (the core reports it as a plugin error).
"""

from __future__ import annotations

from typing import Any

from levers9.hooks.errors import (
    AuthenticationFailed,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.kube import api_status, status_reason

__all__ = ["translate"]

#: urllib3's names for a request that got no answer (the builtin ConnectionError and TimeoutError are caught by type)
_NO_ANSWER = frozenset(
    {"MaxRetryError", "NewConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ProtocolError"}
)


def translate(exc: BaseException, where: str) -> ProviderError | None:
    """The typed error for ``exc``, raised while ``where`` (``creating Job levers9-m1 in namespace levers9``)."""
    status = api_status(exc)
    if status is None:
        if type(exc).__name__ in _NO_ANSWER or isinstance(exc, ConnectionError | TimeoutError):
            return Throttled(
                f"{where}: the Kubernetes API did not answer ({type(exc).__name__}: {exc})", code="Unreachable"
            )
        return None
    reason, message = status_reason(exc)
    said = f"{where}: {message or reason or f'HTTP {status}'}"
    if status == 401:
        return AuthenticationFailed(said + " (the credentials were rejected)", code=reason or "Unauthorized")
    if status == 403:
        if "exceeded quota" in message:
            return QuotaExceeded(said, code="ExceededQuota")
        return PermissionDenied(said, code=reason or "Forbidden")
    if status == 429 or status >= 500:
        retry_after = _retry_after(exc)
        return Throttled(said, code=reason or str(status), retry_after=retry_after)
    if status in (400, 404, 409, 422):
        return InvalidRequest(said, code=reason or str(status))
    return None


def _retry_after(exc: Any) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    try:
        value = headers.get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None
