"""EC2's error codes, as levers9's typed errors (docs/architecture.md section 5.2, the ec2 column).

:func:`translate` turns what botocore raised into the
:class:`~levers9.hooks.errors.ProviderError` the core acts on, with the EC2
code in ``code=`` and a message naming what was being done (the pool, region,
instance type and zone, as the caller words it in ``where``):

* capacity (``InsufficientInstanceCapacity`` and its kin, spot price too low,
  a type not sold in that zone) -> :class:`InsufficientCapacity`: the
  scheduler fails over to the next offer at once;
* the account's limits -> :class:`QuotaExceeded`;
* ``RequestLimitExceeded`` and any other 5xx -> :class:`Throttled`: the same
  call may succeed later;
* rejected or missing credentials -> :class:`AuthenticationFailed`;
* ``UnauthorizedOperation`` -> :class:`PermissionDenied`, EC2's message kept
  as it is (its encoded authorization message is left encoded: decoding it
  needs ``sts:DecodeAuthorizationMessage``, which the operator can run);
* parameters EC2 will never accept -> :class:`InvalidRequest`.

Anything else returns None and the caller lets the original exception
propagate (the core reports it as a plugin error naming the hook): only
failures whose meaning is known are typed. botocore is never imported here;
its exceptions are recognised by their class names and ``response`` shape, so
importing this module stays cheap.
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

__all__ = ["AMBIGUOUS", "error_code", "translate"]

CAPACITY = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
        "SpotMaxPriceTooLow",
        "Unsupported",
    }
)
QUOTA = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "VolumeLimitExceeded"})
THROTTLING = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
AUTHENTICATION = frozenset(
    {
        "AuthFailure",
        "OptInRequired",
        "Blocked",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
    }
)
PERMISSION = frozenset({"UnauthorizedOperation", "AccessDenied"})
INVALID = frozenset(
    {
        "InvalidParameterValue",
        "InvalidParameterCombination",
        "InvalidParameter",
        "MissingParameter",
        "InvalidSubnetID.NotFound",
        "InvalidSubnetID.Malformed",
        "InvalidGroup.NotFound",
        "InvalidGroupId.Malformed",
        "InvalidKeyPair.NotFound",
        "IdempotentParameterMismatch",
        "InvalidInstanceType",
    }
)
#: botocore's names for "the request may have reached EC2, but no answer came back"
AMBIGUOUS = frozenset({"ReadTimeoutError", "ConnectionClosedError"})
#: botocore's names for "no connection was made at all" (nothing was sent)
UNREACHABLE = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ConnectionError"})
#: how long to wait after EC2's RequestLimitExceeded before the core tries again
THROTTLE_RETRY_S = 5.0

_HINTS = {
    "OptInRequired": "; the account is not subscribed to EC2 in this region (opt in to the region first)",
    "Blocked": "; AWS has blocked the account",
    "IdempotentParameterMismatch": "; a launch with this machine id was already made with other parameters",
}


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def error_code(exc: BaseException) -> str | None:
    """EC2's error code of a botocore ``ClientError`` (``InsufficientInstanceCapacity``), else None."""
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = (response.get("Error") or {}).get("Code")
    return str(code) if code else None


def _status(exc: BaseException) -> int | None:
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return int(status) if isinstance(status, int) else None


def _message(exc: BaseException) -> str:
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        message = (response.get("Error") or {}).get("Message")
        if message:
            return str(message)
    return str(exc)


def translate(exc: BaseException, where: str) -> ProviderError | None:
    """The typed error for ``exc`` raised while doing ``where`` (``launching p5.48xlarge in us-east-1a for pool
    'train'``), or None when its meaning is not known (the caller then lets ``exc`` propagate)."""
    names = _class_names(exc)
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        return AuthenticationFailed(
            f"{where}: no AWS credentials found (no profile or *_env variables set for the pool, and the default "
            "chain found none)",
            code="NoCredentialsError",
        )
    if "ProfileNotFound" in names:
        return AuthenticationFailed(f"{where}: {exc}", code="ProfileNotFound")
    code = error_code(exc)
    if code is None:
        if names & UNREACHABLE or names & AMBIGUOUS:
            kind = next(iter(sorted(names & (UNREACHABLE | AMBIGUOUS))))
            return Throttled(f"{where}: EC2 did not answer ({exc})", code=kind, retry_after=THROTTLE_RETRY_S)
        return None
    text = f"{where}: {_message(exc)}{_HINTS.get(code, '')}"
    if code in CAPACITY:
        return InsufficientCapacity(text, code=code)
    if code in QUOTA:
        return QuotaExceeded(text, code=code)
    if code in THROTTLING:
        return Throttled(text, code=code, retry_after=THROTTLE_RETRY_S)
    if code in AUTHENTICATION:
        return AuthenticationFailed(text, code=code)
    if code in PERMISSION:
        return PermissionDenied(text, code=code)
    if code in INVALID or code.startswith("InvalidAMIID."):
        return InvalidRequest(text, code=code)
    status = _status(exc)
    if status is not None and status >= 500:
        return Throttled(text, code=code, retry_after=THROTTLE_RETRY_S)
    return None
