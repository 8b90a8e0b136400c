"""The errors plugins raise and the core understands.

Providers translate their SDK's failures into these so the scheduler can act on
them without knowing any SDK: capacity and quota errors fail over to the next
candidate at once, throttling is retried with backoff, a refused payment stops
the pool until the account is paid for, authentication and invalid-request
errors are reported to the operator and not retried.
"""

from __future__ import annotations


class Levers9Error(Exception):
    """Base of every error levers9 raises on purpose."""


class ProviderError(Levers9Error):
    """A provider refused or failed an operation.

    ``retryable`` tells the scheduler whether the same call may succeed later
    without anyone changing anything. ``plugin`` is filled in by the core when
    the error crosses the hook boundary, so messages always name the plugin.
    """

    retryable: bool = False
    #: short machine-readable kind, used in placement reports and metrics
    kind: str = "provider_error"

    def __init__(self, message: str, *, plugin: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.plugin = plugin
        #: the provider's own error code (``InsufficientInstanceCapacity``, ``OutOfHostCapacity``...)
        self.code = code

    def __str__(self) -> str:
        where = f"[{self.plugin}] " if self.plugin else ""
        code = f" ({self.code})" if self.code else ""
        return f"{where}{self.message}{code}"


class InsufficientCapacity(ProviderError):
    """The provider has no machine of this kind free right now (not the caller's fault).

    The scheduler marks the (pool, GPU type, region) unavailable for a while and
    tries the next candidate immediately.
    """

    kind = "insufficient_capacity"


class QuotaExceeded(ProviderError):
    """The account's limit for this kind of machine is reached.

    Unlike a capacity miss, a quota does not lapse on its own in another zone:
    the limit holds for a whole region (EC2's ``VcpuLimitExceeded``, OCI's
    ``LimitExceeded``), or for the whole account. ``scope`` says which
    (:data:`QUOTA_SCOPES`): the scheduler skips every offer of the pool in
    that region (``"region"``, the default) or everywhere (``"account"``) for
    ``unavailable_ttl_s`` at once, instead of trying zone after zone, and
    shows the quota as the pool's reason so the operator can raise it.
    """

    kind = "quota_exceeded"

    def __init__(
        self,
        message: str,
        *,
        plugin: str | None = None,
        code: str | None = None,
        scope: str = "region",
    ) -> None:
        super().__init__(message, plugin=plugin, code=code)
        if scope not in QUOTA_SCOPES:
            raise ValueError(f"QuotaExceeded scope {scope!r} is not one of {', '.join(QUOTA_SCOPES)}")
        self.scope = scope


#: what a :class:`QuotaExceeded` holds for: every offer of the pool in the offer's region, or the whole account
QUOTA_SCOPES = ("region", "account")


class BillingRefused(ProviderError):
    """The provider will not start anything on this account until it is paid for.

    An insufficient balance or credit (a prepaid marketplace's account run
    dry), a declined card, an account suspended for billing. Like a quota of
    the whole account, no other offer, zone or region of the provider escapes
    it, and it does not lapse on its own: the scheduler skips the whole pool
    at once (for ``unavailable_ttl_s``, then asks again), and ``levers9
    pools`` and ``levers9 check`` show the pool as unavailable with this
    error and a request to top up the account. Not a :class:`QuotaExceeded`:
    raising the limit would not help, paying would.
    """

    kind = "billing_refused"


class AuthenticationFailed(ProviderError):
    """The provider rejected the credentials; retrying will not help."""

    kind = "authentication_failed"


class PermissionDenied(ProviderError):
    """The credentials were accepted but may not do this (IAM or RBAC denied the action); retrying will not help.

    Reported to the operator with the action and the provider's own words; the
    pool is skipped like a capacity miss until someone grants the permission.
    """

    kind = "permission_denied"


class Throttled(ProviderError):
    """The provider asked us to slow down; the same call may succeed after ``retry_after`` seconds."""

    kind = "throttled"
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        plugin: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, plugin=plugin, code=code)
        self.retry_after = retry_after


class InvalidRequest(ProviderError):
    """The request cannot be satisfied by this provider as asked (bad settings, unknown shape, too many GPUs)."""

    kind = "invalid_request"


class IdentityRejected(Levers9Error):
    """What a worker showed does not prove it runs on the machine its join token was issued to.

    Raised by ``levers9_verify_identity``: a missing, malformed, unsigned or
    mismatched identity. The registration is refused and the join token is
    not spent, so a thief who read the token cannot burn it either.
    """


class CheckpointUnavailable(Levers9Error):
    """Checkpointing was asked of a host or runtime that cannot do it; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RestoreFailed(Levers9Error):
    """Restoring a checkpoint failed; the caller should start the container cold and mark the checkpoint failed."""


class PluginError(Levers9Error):
    """A plugin misbehaved: it raised something untyped, returned the wrong type, or is missing a hook.

    Always names the plugin and the hook, so an operator knows whom to blame.
    """

    def __init__(self, plugin: str, hook: str, message: str) -> None:
        super().__init__(f"plugin {plugin!r}, hook {hook}: {message}")
        self.plugin = plugin
        self.hook = hook
        self.message = message


class PluginTimeout(PluginError):
    """A plugin's hook did not answer within its deadline."""

    def __init__(self, plugin: str, hook: str, timeout: float) -> None:
        super().__init__(plugin, hook, f"did not answer within {timeout:g} s")
        self.timeout = timeout


class PluginLoadError(Levers9Error):
    """Raised in strict mode when any plugin failed to load; lists every failure."""

    def __init__(self, failures: list[tuple[str, str]]) -> None:
        lines = "\n".join(f"  {name}: {error}" for name, error in failures)
        super().__init__(f"{len(failures)} plugin(s) failed to load:\n{lines}")
        self.failures = failures


class UnknownPlugin(Levers9Error):
    """A provider or runtime name that no loaded plugin answers to."""


#: the typed provider errors an agent's refusal may name, by their ``kind`` (an acknowledgement's ``error_kind``);
#: any other kind is a plain :class:`ProviderError`
ERROR_KINDS: dict[str, type[ProviderError]] = {
    cls.kind: cls
    for cls in (
        InsufficientCapacity,
        QuotaExceeded,
        BillingRefused,
        AuthenticationFailed,
        PermissionDenied,
        InvalidRequest,
        Throttled,
    )
}

__all__ = [
    "ERROR_KINDS",
    "AuthenticationFailed",
    "BillingRefused",
    "CheckpointUnavailable",
    "IdentityRejected",
    "InsufficientCapacity",
    "InvalidRequest",
    "Levers9Error",
    "PermissionDenied",
    "PluginError",
    "PluginLoadError",
    "PluginTimeout",
    "ProviderError",
    "QuotaExceeded",
    "RestoreFailed",
    "Throttled",
    "UnknownPlugin",
]
