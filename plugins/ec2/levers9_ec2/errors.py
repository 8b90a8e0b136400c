"""EC2's error codes, as levers9's typed errors (docs/architecture.md section 5.2, the ec2 column).

:data:`CODES` is the table: every error code RunInstances (and the describe
calls around it) can answer, by EC2's API reference ("Error codes for the
Amazon EC2 API": the common client codes, the client codes of the actions
levers9 calls, the server codes) and botocore's retry data (``_retry.json``
and its standard retry mode's throttling and transient codes), to the
:class:`~levers9.hooks.errors.ProviderError` it means. :func:`translate`
turns what botocore raised into that error, with the EC2 code in ``code=``
and a message naming what was being done (the pool, region, instance type
and zone, as the caller words it in ``where``):

* capacity -> :class:`InsufficientCapacity`, the scheduler fails over to the
  next offer at once. EC2 answers most of these as *server* errors (HTTP 500:
  ``InsufficientInstanceCapacity``, ``InsufficientVolumeCapacity``,
  ``InsufficientAddressCapacity``...), so the table is read before the
  status: a 500 is a capacity answer when its code says so, and only an
  unknown 5xx is taken for a transient failure. The launch client has
  botocore's retries off (:mod:`levers9_ec2.session`), so such a 500 reaches
  the scheduler in one call instead of four;
* ``IdempotentInstanceTerminated`` is capacity too: RunInstances was asked
  again with the ClientToken (the machine id) of a launch whose instance has
  since been terminated, which for a levers9 machine means EC2 took it back
  (a spot interruption, a failed start) before its worker came. The token is
  spent, so retrying (:class:`Throttled`) would fail for ever, and nothing is
  wrong with the request (:class:`InvalidRequest` would take the pool out for
  the operator); as a capacity miss the scheduler marks that very offer (type,
  zone, market) unavailable for ``unavailable_ttl_s`` and the next launch, a
  new machine id, goes to another offer, as after a preemption;
* the account's limits -> :class:`QuotaExceeded` with ``scope="region"``:
  EC2's quotas (vCPUs of running On-Demand or spot instances per instance
  class, instances, EBS storage and IOPS, network interfaces) are per account
  *and region*, so the scheduler skips every offer of the region, not just the
  zone; the message names the quota to raise (:data:`QUOTA_LIMITS`);
* throttling and transient server failures (``RequestLimitExceeded``,
  ``InternalError``, ``ServiceUnavailable``, any 5xx not in the table) ->
  :class:`Throttled`: the same call may succeed later;
* rejected or missing credentials, an account EC2 will not serve (blocked,
  not opted in to the region, pending verification) -> :class:`AuthenticationFailed`;
* ``UnauthorizedOperation`` -> :class:`PermissionDenied`, EC2's message kept
  as it is (its encoded authorization message is left encoded: decoding it
  needs ``sts:DecodeAuthorizationMessage``, which the operator can run);
* parameters EC2 will never accept, and any code ending ``.NotFound`` or
  ``.Malformed`` (a named resource EC2 does not have) -> :class:`InvalidRequest`.

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

__all__ = ["AMBIGUOUS", "CODES", "QUOTA_LIMITS", "error_code", "kind_of", "translate"]

_CAPACITY = (
    # server errors (HTTP 500): EC2 has none of this left in the zone right now
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientAddressCapacity",
    "InsufficientVolumeCapacity",
    "InsufficientReservedInstanceCapacity",
    # client errors (HTTP 400) that say the same of this offer
    "InsufficientReservedInstancesCapacity",
    "InsufficientFreeAddressesInSubnet",
    "ReservationCapacityExceeded",
    "UnfulfillableCapacity",
    "SpotMaxPriceTooLow",
    "Unsupported",
    "IdempotentInstanceTerminated",
)
#: the account limits EC2 names in a refused launch, and the quota the operator raises (all per region)
QUOTA_LIMITS: dict[str, str] = {
    "VcpuLimitExceeded": "the vCPU quota 'Running On-Demand <class> instances' of this instance type's class",
    "InstanceLimitExceeded": "the On-Demand instance limit of this instance type",
    "MaxSpotInstanceCountExceeded": "the vCPU quota 'All <class> Spot Instance Requests' of this instance type's class",
    "VolumeLimitExceeded": "the EBS storage quota of the root volume's type (or lower root_volume_gib)",
    "MaxIOPSLimitExceeded": "the EBS IOPS quota of the root volume's type",
    "NetworkInterfaceLimitExceeded": "the VPC quota 'Network interfaces per Region'",
    "ResourceLimitExceeded": "the EC2 resource limit EC2's message names",
}
_THROTTLE = (
    # botocore's _retry.json (ec2) and standard retry mode: throttling
    "RequestLimitExceeded",
    "EC2ThrottledException",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "RequestThrottled",
    "TooManyRequestsException",
    "BandwidthLimitExceeded",
    "SlowDown",
    # transient: botocore's standard mode, and EC2's server errors that are not capacity
    "PriorRequestNotComplete",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
)
_AUTHENTICATION = (
    "AuthFailure",
    "Blocked",
    "OptInRequired",
    "PendingVerification",
    "IncompleteSignature",
    "InvalidClientTokenId",
    "MissingAuthenticationToken",
    "SignatureDoesNotMatch",
    "RequestExpired",
    "ExpiredToken",
    "UnrecognizedClientException",
)
_PERMISSION = ("UnauthorizedOperation", "AccessDenied")
_INVALID = (
    # common client errors of every action
    "IdempotentParameterMismatch",
    "InvalidAction",
    "InvalidCharacter",
    "InvalidParameter",
    "InvalidParameterCombination",
    "InvalidParameterDependency",
    "InvalidParameterValue",
    "InvalidQueryParameter",
    "MalformedQueryString",
    "MissingAction",
    "MissingParameter",
    "UnknownParameter",
    "UnsupportedInstanceAttribute",
    "UnsupportedOperation",
    "UnsupportedProtocol",
    "ValidationError",
    # RunInstances' own: what the pool's settings name and EC2 does not have or take
    "InvalidAMIID.Malformed",
    "InvalidAMIID.NotFound",
    "InvalidAMIID.Unavailable",
    "InvalidBlockDeviceMapping",
    "InvalidGroup.NotFound",
    "InvalidGroupId.Malformed",
    "InvalidSecurityGroupID.NotFound",
    "InvalidInstanceType",
    "InvalidKeyPair.Format",
    "InvalidKeyPair.NotFound",
    "InvalidNetworkInterfaceID.NotFound",
    "InvalidPlacementGroup.Unknown",
    "InvalidSnapshot.NotFound",
    "InvalidSubnet",
    "InvalidSubnetID.Malformed",
    "InvalidSubnetID.NotFound",
    "InvalidUserData.Malformed",
    "InvalidVpcID.NotFound",
)

#: every EC2 error code levers9 knows, to the typed error it raises (the table test holds it to the API reference)
CODES: dict[str, type[ProviderError]] = {
    **dict.fromkeys(_CAPACITY, InsufficientCapacity),
    **dict.fromkeys(QUOTA_LIMITS, QuotaExceeded),
    **dict.fromkeys(_THROTTLE, Throttled),
    **dict.fromkeys(_AUTHENTICATION, AuthenticationFailed),
    **dict.fromkeys(_PERMISSION, PermissionDenied),
    **dict.fromkeys(_INVALID, InvalidRequest),
}
#: botocore's names for "the request may have reached EC2, but no answer came back"
AMBIGUOUS = frozenset({"ReadTimeoutError", "ConnectionClosedError"})
#: botocore's names for "no connection was made at all" (nothing was sent)
UNREACHABLE = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ConnectionError"})
#: how long to wait after EC2's RequestLimitExceeded before the core tries again
THROTTLE_RETRY_S = 5.0

_HINTS = {
    "OptInRequired": "; the account is not subscribed to EC2 in this region (opt in to the region first)",
    "Blocked": "; AWS has blocked the account",
    "PendingVerification": "; AWS is still verifying the account (it can launch once that is done)",
    "IdempotentParameterMismatch": "; a launch with this machine id was already made with other parameters",
    "IdempotentInstanceTerminated": (
        "; the instance this machine id launched has been terminated since (a spot interruption?): "
        "this offer is skipped and the next launch is a new machine"
    ),
    "InsufficientFreeAddressesInSubnet": "; the pool's subnet in this zone has no free address left",
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
    known = kind_of(code)
    if known is QuotaExceeded:
        limit = QUOTA_LIMITS[_bare(code)]
        text = f"{where}: {_message(exc)}; raise {limit} in this region (Service Quotas)"
        return QuotaExceeded(text, code=code, scope="region")
    text = f"{where}: {_message(exc)}{_HINTS.get(_bare(code), '')}"
    if known is Throttled:
        return Throttled(text, code=code, retry_after=THROTTLE_RETRY_S)
    if known is not None:
        return known(text, code=code)
    status = _status(exc)
    if status is not None and status >= 500:
        return Throttled(text, code=code, retry_after=THROTTLE_RETRY_S)
    return None


def _bare(code: str) -> str:
    """The code without the ``Client.``/``Server.`` prefix older EC2 answers and state reasons carry."""
    for prefix in ("Client.", "Server."):
        if code.startswith(prefix):
            return code[len(prefix) :]
    return code


def kind_of(code: str) -> type[ProviderError] | None:
    """The typed error EC2's ``code`` means (:data:`CODES`; any other ``*.NotFound``/``*.Malformed`` is
    :class:`InvalidRequest`), or None when levers9 does not know it."""
    bare = _bare(code)
    known = CODES.get(bare)
    if known is None and bare.endswith((".NotFound", ".Malformed")):
        return InvalidRequest
    return known
