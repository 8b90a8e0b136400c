"""Who calls a gRPC method of the SDK's and CLI's services, where and with what role.

The token is the ``authorization: Bearer`` metadata; a token issued for its
whole workspace acts in the environment the ``x-levers9-environment`` metadata
names (default: main). Every method passes the role it needs
(:func:`levers9.services.access.require_role`): a token of the wrong kind is
UNAUTHENTICATED, as before roles existed; too small a role is PERMISSION_DENIED;
an environment the workspace does not have is NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Iterable

from levers9.services.access import in_environment, require_role
from levers9.services.auth import Principal, bearer
from levers9.services.core import Services
from levers9.state.sql.records import Role, TokenKind

__all__ = ["ENVIRONMENT_METADATA", "environment_of", "user_principal"]

#: the metadata key naming the environment a call acts in (the REST API's X-Levers9-Environment header)
ENVIRONMENT_METADATA = "x-levers9-environment"


def environment_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key.lower() == ENVIRONMENT_METADATA:
            text = value.decode() if isinstance(value, bytes) else value
            return text.strip() or None
    return None


async def user_principal(
    services: Services, metadata: Iterable[tuple[str, str | bytes]] | None, needed: Role, *, bound: bool = True
) -> Principal:
    """The user token's principal, in the environment the metadata names, allowed what ``needed`` allows;
    ``bound``: it must act in a workspace (an operator's token, bound to none, is refused)."""
    pairs = list(metadata or ())
    principal = await services.auth.verify(bearer(pairs), TokenKind.USER)
    principal = await in_environment(services, principal, environment_of(pairs))
    require_role(principal, needed)
    if bound:
        principal.require_workspace()
    return principal
