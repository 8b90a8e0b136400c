"""A workspace's secrets: write-only values that reach the functions naming them, listed by name only.

No function here returns a value: only :class:`~levers9.state.sql.secrets.SecretInfo`
(name and times). Values reach a call's environment on the worker side only
(see :mod:`levers9.services.fleet`).
"""

from __future__ import annotations

from levers9.services.access import own_workspace
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.errors import NotFound
from levers9.state.sql.records import SecretInfo
from levers9.state.sql.secrets import MAX_NAME, check_secret_name, check_secret_value

# the name and value rules, for transports that check a request before it is made
__all__ = [
    "MAX_NAME",
    "SecretInfo",
    "check_secret_name",
    "check_secret_value",
    "delete_secret",
    "list_secrets",
    "put_secret",
]


async def list_secrets(services: Services, principal: Principal) -> list[SecretInfo]:
    """The caller's workspace's secrets, by name."""
    return await services.secrets.list(own_workspace(principal, "list secrets"))


async def put_secret(services: Services, principal: Principal, name: str, value: str) -> tuple[SecretInfo, bool]:
    """Create a secret, or replace the value of one of the same name; (what is stored, whether it is new)."""
    return await services.secrets.put(own_workspace(principal, "create secrets"), name, value)


async def delete_secret(services: Services, principal: Principal, name: str) -> None:
    """Delete a secret of the caller's workspace; NotFound when it has none of that name."""
    if not await services.secrets.delete(own_workspace(principal, "delete secrets"), name):
        raise NotFound("secret", name)
