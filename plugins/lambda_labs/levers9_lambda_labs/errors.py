"""How the Lambda Cloud API's failures become levers9's typed errors (docs/architecture.md section 5.2).

The API answers a failure with an HTTP status and the body
``{"error": {"code": ..., "message": ..., "suggestion": ...}}``; its reference
says to act on ``code``, never on the wording. :data:`CODES` is the table of
the codes the reference documents, to what each means; the status decides
only where the code says nothing levers9 knows:

* ``instance-operations/launch/insufficient-capacity`` (400, whatever status
  it comes with): :class:`InsufficientCapacity`, the planner fails over to the
  next offer at once;
* ``global/quota-exceeded`` (400): :class:`QuotaExceeded` with
  ``scope="account"``: Lambda's quotas belong to the account, not to a
  region, so the scheduler skips every Lambda offer of the account instead of
  trying region after region; the message says to ask Lambda to raise it;
* HTTP 429 (the API documents about one request per second and one launch per
  12 seconds, but no body for it): :class:`Throttled` with ``Retry-After`` when
  the API sends it, else the documented interval;
* ``global/invalid-api-key`` (401) or any 401, ``global/account-inactive`` (a 403):
  :class:`AuthenticationFailed`, the key (or the account behind it) is refused;
* ``global/invalid-address`` (403, a request from an address the account does
  not allow) and any other 403: :class:`PermissionDenied`;
* ``global/invalid-parameters``, ``instance-operations/launch/file-system-in-wrong-region``,
  ``instance-operations/launch/file-systems-not-supported``, ``ssh-keys/key-in-use``,
  ``global/object-does-not-exist`` (an unknown SSH key, filesystem or type)
  and any other 4xx: :class:`InvalidRequest`;
* ``global/unknown`` (500), any 5xx, 408 and the upstream ``provider/...``
  codes: :class:`Throttled`, the same call may work later (a launch checks for
  its instance first, see :mod:`levers9_lambda_labs.provider`).

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
    "CODES",
    "FILE_SYSTEMS_NOT_SUPPORTED",
    "FILE_SYSTEM_IN_WRONG_REGION",
    "INSUFFICIENT_CAPACITY",
    "INVALID_ADDRESS",
    "INVALID_API_KEY",
    "INVALID_PARAMETERS",
    "NOT_FOUND",
    "QUOTA_EXCEEDED",
    "SSH_KEY_IN_USE",
    "UNKNOWN",
    "ApiFailure",
    "kind_of",
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
FILE_SYSTEMS_NOT_SUPPORTED = "instance-operations/launch/file-systems-not-supported"
INVALID_ADDRESS = "global/invalid-address"
UNKNOWN = "global/unknown"
SSH_KEY_IN_USE = "ssh-keys/key-in-use"
#: errors passed on from Lambda's upstream providers (outages, unavailability): transient
_UPSTREAM_PREFIX = "provider/"

#: the error codes the Cloud API reference documents, to the typed error each means
CODES: dict[str, type[ProviderError]] = {
    INSUFFICIENT_CAPACITY: InsufficientCapacity,
    QUOTA_EXCEEDED: QuotaExceeded,
    INVALID_API_KEY: AuthenticationFailed,
    ACCOUNT_INACTIVE: AuthenticationFailed,
    INVALID_ADDRESS: PermissionDenied,
    INVALID_PARAMETERS: InvalidRequest,
    NOT_FOUND: InvalidRequest,
    FILE_SYSTEM_IN_WRONG_REGION: InvalidRequest,
    FILE_SYSTEMS_NOT_SUPPORTED: InvalidRequest,
    SSH_KEY_IN_USE: InvalidRequest,
    UNKNOWN: Throttled,
}


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


def kind_of(status: int, code: str | None) -> type[ProviderError]:
    """The typed error an answer of ``status`` with ``code`` (None: the body had none) means."""
    if status == 429:
        return Throttled
    known = CODES.get(code or "")
    if known is not None:
        return known
    if status == 401:
        return AuthenticationFailed
    if status == 403:
        return PermissionDenied
    if status >= 500 or status == 408 or (code or "").startswith(_UPSTREAM_PREFIX):
        return Throttled
    return InvalidRequest


def typed_error(failure: ApiFailure, doing: str, *, default_retry_after: float) -> ProviderError:
    """The typed error for ``failure``; ``doing`` says what failed (``pool 'a': launching gpu_1x_a10 in us-east-1``)."""
    code = failure.code or f"HTTP {failure.status}"
    message = f"{doing}: {failure.words}"
    kind = kind_of(failure.status, failure.code)
    if failure.status == 429:
        retry = failure.retry_after if failure.retry_after is not None else default_retry_after
        return Throttled(
            f"{message}; the Cloud API allows about one request per second and one launch per 12 s",
            code=code,
            retry_after=retry,
        )
    if kind is QuotaExceeded:
        return QuotaExceeded(
            f"{message}; the quota is the whole account's, in every region: ask Lambda support to raise it",
            code=code,
            scope="account",
        )
    if kind is Throttled:
        return Throttled(message, code=code, retry_after=failure.retry_after)
    return kind(message, code=code)


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
