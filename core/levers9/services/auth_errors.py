"""The two ways a call is refused for who is calling, apart from the authenticator that decides them.

:class:`Unauthenticated` (no valid token) and :class:`PermissionDenied` (a valid
token asking outside its scope) live here, below both
:mod:`levers9.services.auth` (which raises them and keeps them importable) and
:mod:`levers9.services.revocation` (whose ``TokenRevoked`` is an
``Unauthenticated``), so that neither of those two imports the other back.
Every transport answers them through :mod:`levers9.services.errors`.
"""

from __future__ import annotations

__all__ = ["PermissionDenied", "Unauthenticated"]


class Unauthenticated(Exception):
    """No token, an unknown, revoked or expired token, or a token of the wrong kind for the call."""


class PermissionDenied(Exception):
    """A valid token asking for something outside its scope (another workspace's task, a user API with a worker token)."""
