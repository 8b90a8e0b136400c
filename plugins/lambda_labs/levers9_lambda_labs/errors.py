"""How the Lambda Cloud API's failures become levers9's typed errors (docs/architecture.md section 5.2).

The API answers a failure with an HTTP status and the body
``{"error": {"code": ..., "message": ..., "suggestion": ...}}``; its reference
says to act on ``code``, never on the wording, so the mapping below reads the
code first and falls back on the status only where the code says nothing
levers9 knows:

* ``instance-operations/launch/insufficient-capacity`` (400): :class:`InsufficientCapacity`,
  the planner fails over to the next offer at once;
* ``global/quota-exceeded``: :class:`QuotaExceeded`;
* HTTP 429 (the API documents about one request per second and one launch per
  12 seconds, but no body for it): :class:`Throttled` with ``Retry-After`` when
  the API sends it, else the documented interval;
* ``global/invalid-api-key`` or any 401, ``global/account-inactive`` (a 403):
  :class:`AuthenticationFailed`, the key (or the account behind it) is refused;
* any other 403 (``global/invalid-address``, a billing problem, say): :class:`PermissionDenied`;
* ``global/invalid-parameters``, ``instance-operations/launch/file-system-in-wrong-region``,
  ``global/object-does-not-exist`` (an unknown SSH key, filesystem or type)
  and any other 4xx: :class:`InvalidRequest`;
* 5xx, 408 and the upstream ``provider/...`` codes: :class:`Throttled`, the same
  call may work later (a launch checks for its instance first, see
  :mod:`levers9_lambda_labs.provider`).

``code=`` carries the API's own code (``HTTP <status>`` when the body had
none); where the API gave no answer the plugin names the case itself:
``unreachable`` (no answer), ``api-key-unset``, and in the provider
``launch-paced``, ``user-data``, ``no-instance-type``, ``no-region``. Messages name the pool and what was being done (the instance type
and region for a launch) and quote the API's message and suggestion; they
never hold the API key, which no error body contains and no caller passes here.
"""

from __future__ import annotations

from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)

__all__ = [
    "ACCOUNT_INACTIVE",
    "FILE_SYSTEM_IN_WRONG_REGION",
    "INSUFFICIENT_CAPACITY",
    "INVALID_API_KEY",
    "INVALID_PARAMETERS",
    "NOT_FOUND",
    "QUOTA_EXCEEDED",
    "ApiFailure",
    "missing_key",
    "typed_error",
    "unreachable",
]

INSUFFICIENT_CAPACITY = "instance-operations/launch/insufficient-capacity"
FILE_SYSTEM_IN_WRONG_REGION = "instance-operations/launch/file-system-in-wrong-region"
QUOTA_EXCEEDED = "global/quota-exceeded"
INVALID_API_KEY = "global/invalid-api-key"
ACCOUNT_INACTIVE = "global/account-inactive"
INVALID_PARAMETERS = "global/invalid-parameters"
NOT_FOUND = "global/object-does-not-exist"
#: errors passed on from Lambda's upstream providers (outages, unavailability): transient
_UPSTREAM_PREFIX = "provider/"


class ApiFailure(Exception):
    """An error answer of the Cloud API: its HTTP status and the parts of its error body."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        suggestion: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, message)
        self.status = status
        #: the API's error code (``global/invalid-api-key``...), None when the body had none (a proxy's HTML page)
        self.code = code
        self.message = message
        self.suggestion = suggestion
        #: seconds from the ``Retry-After`` header, when the API sent one
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.code}: {self.message}" if self.code else f"HTTP {self.status}: {self.message}"

    @property
    def words(self) -> str:
        """The API's own message, with its suggestion when it gave one."""
        text = self.message.rstrip(".") or f"HTTP {self.status}"
        return f"{text} ({self.suggestion.rstrip('.')})" if self.suggestion else text


def typed_error(failure: ApiFailure, doing: str, *, default_retry_after: float) -> ProviderError:
    """The typed error for ``failure``; ``doing`` says what failed (``pool 'a': launching gpu_1x_a10 in us-east-1``)."""
    code = failure.code or f"HTTP {failure.status}"
    message = f"{doing}: {failure.words}"
    if failure.status == 429:
        retry = failure.retry_after if failure.retry_after is not None else default_retry_after
        return Throttled(
            f"{message}; the Cloud API allows about one request per second and one launch per 12 s",
            code=code,
            retry_after=retry,
        )
    if failure.code == INSUFFICIENT_CAPACITY:
        return InsufficientCapacity(message, code=code)
    if failure.code == QUOTA_EXCEEDED:
        return QuotaExceeded(f"{message}; ask Lambda support to raise the account's quota", code=code)
    if failure.code in (INVALID_API_KEY, ACCOUNT_INACTIVE) or failure.status == 401:
        return AuthenticationFailed(message, code=code)
    if failure.status == 403:
        return PermissionDenied(message, code=code)
    if failure.status >= 500 or failure.status == 408 or (failure.code or "").startswith(_UPSTREAM_PREFIX):
        return Throttled(message, code=code, retry_after=failure.retry_after)
    return InvalidRequest(message, code=code)


def unreachable(doing: str, detail: str, *, retry_after: float | None = None) -> Throttled:
    """No answer came (refused, reset, timed out): retryable, the call is safe to repeat."""
    return Throttled(f"{doing}: the Cloud API did not answer ({detail})", code="unreachable", retry_after=retry_after)


def missing_key(variable: str, pool: str) -> AuthenticationFailed:
    """The API key's environment variable is not set (its name is said, never a value)."""
    return AuthenticationFailed(
        f"pool {pool!r}: the environment variable {variable} that should hold the Lambda Cloud API key is not set "
        "(or empty) in the controlplane's environment",
        code="api-key-unset",
    )
