"""Who is calling: bearer tokens checked against their hashes in SQL, with a short in-process cache.

Every call is authenticated, and a hot path (a worker streaming thousands of
results, a map submitting batches) must not pay a SQL round trip per call; a
verified token is therefore remembered for ``cache_s`` seconds. Revocation takes
effect within that window on every replica. Expiry never waits for the window:
a cached token is refused from the moment its ``expires_at`` passes, so a token
issued for 2 seconds works for 2 seconds, never for the rest of a cache entry.

A call is checked once, when it starts; a stream that stays open (a watch, a
log stream, a worker's session) holds its token in :attr:`Authenticator.streams`
(:mod:`levers9.services.revocation`) and ends when the token is revoked:
:meth:`Authenticator.revoked` drops the token from the cache and ends its
streams on this replica, and the event hub calls it on every other replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from levers9.services.auth_errors import PermissionDenied, Unauthenticated
from levers9.services.revocation import RECHECK_S, OpenStreams
from levers9.state.crypto import hash_token
from levers9.state.sql.members import MemberStore
from levers9.state.sql.records import MAIN_ENVIRONMENT, Role, TokenKind, TokenRecord, WorkspaceRecord
from levers9.state.sql.workspaces import TokenStore, WorkspaceStore

__all__ = ["CACHE_S", "Authenticator", "PermissionDenied", "Principal", "Unauthenticated", "bearer"]

CACHE_S = 10.0


@dataclass(frozen=True)
class Principal:
    token_id: str
    kind: TokenKind
    #: the environment the caller acts in (a workspace's own id is its main environment); None for
    #: controlplane-wide tokens (operators, machines of shared pools). Everything isolated by workspace id
    #: (apps, tasks, secrets, volumes, sandboxes) is therefore isolated by environment.
    workspace_id: str | None
    #: the machine id of a machine token, the user name of a user token
    subject: str | None
    #: the most the caller may do: the token's role, and never more than its person's role in the workspace
    role: Role = Role.OWNER
    #: the person the token acts for (None: a service token, or one made before sign-in existed)
    user_id: str | None = None
    #: the workspace ``workspace_id`` is an environment of (None: ``workspace_id`` is the workspace itself)
    parent_id: str | None = None
    environment: str = MAIN_ENVIRONMENT
    #: the token was issued for this one environment and cannot act in the workspace's others
    environment_bound: bool = False

    @property
    def workspace_root(self) -> str | None:
        """The workspace (not environment) the caller acts in: whose members, pools and clusters apply."""
        return self.parent_id or self.workspace_id

    def in_environment(self, environment: WorkspaceRecord) -> Principal:
        """The same caller acting in another environment of its workspace."""
        return dataclasses.replace(
            self, workspace_id=environment.id, parent_id=environment.parent_id, environment=environment.environment
        )

    def require_workspace(self) -> str:
        if self.workspace_id is None:
            raise PermissionDenied(f"a {self.kind.value} token is not bound to a workspace")
        return self.workspace_id


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header, if present."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class Authenticator:
    def __init__(
        self,
        tokens: TokenStore,
        *,
        workspaces: WorkspaceStore | None = None,
        members: MemberStore | None = None,
        cache_s: float = CACHE_S,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float | None = None,
    ) -> None:
        """``recheck_s``: how often open streams' tokens are checked in SQL (None: the default,
        :data:`levers9.services.revocation.RECHECK_S`)."""
        self._tokens = tokens
        self._workspaces = workspaces or WorkspaceStore(tokens.db)
        self._members = members or MemberStore(tokens.db)
        self._recheck_s = recheck_s
        #: by token hash: (when the entry ends on ``clock``, when the token itself expires, who it is)
        self._cache: dict[str, tuple[float, datetime | None, Principal]] = {}
        #: environments by (workspace id, name), for tokens that pick one per request: (when it ends, the record)
        self._environments: dict[tuple[str, str], tuple[float, WorkspaceRecord | None]] = {}
        #: lookups on their way, by token hash: a busy caller's many requests share one when the entry expires
        self._lookups: dict[str, asyncio.Future[Principal | None]] = {}
        self._cache_s = cache_s
        self._clock = clock

    async def verify(self, token: str | None, *kinds: TokenKind) -> Principal:
        """The principal behind ``token``; raises :class:`Unauthenticated` unless it is valid and of one of ``kinds``."""
        if not token:
            raise Unauthenticated(
                "no token: send 'authorization: Bearer <token>' (see 'levers9 up' or ~/.levers9/config)"
            )
        key = hash_token(token)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now and (hit[1] is None or hit[1] > datetime.now(UTC)):
            principal = hit[2]
        else:
            lookup = self._lookups.get(key)
            if lookup is None:
                lookup = self._lookups[key] = asyncio.ensure_future(self._lookup(key, token))
                lookup.add_done_callback(lambda _: self._lookups.pop(key, None))
            found = await asyncio.shield(lookup)
            if found is None:
                raise Unauthenticated("the token is unknown, revoked or expired")
            principal = found
        if kinds and principal.kind not in kinds:
            wanted = " or ".join(k.value for k in kinds)
            raise Unauthenticated(f"this call needs a {wanted} token, not a {principal.kind.value} token")
        return principal

    def cached(self, token: str, *kinds: TokenKind) -> Principal | None:
        """The principal behind ``token`` when this replica verified it lately and it is of one of ``kinds``;
        None otherwise, when :meth:`verify` must decide (a miss is never a refusal)."""
        hit = self._cache.get(hash_token(token))
        if hit is None or hit[0] <= self._clock() or (hit[1] is not None and hit[1] <= datetime.now(UTC)):
            return None
        principal = hit[2]
        return principal if not kinds or principal.kind in kinds else None

    async def _lookup(self, key: str, token: str) -> Principal | None:
        record = await self._tokens.verify(token)
        if record is None:
            self._cache.pop(key, None)
            return None
        principal = await self._principal(record)
        if principal is None:
            self._cache.pop(key, None)
            return None
        if len(self._cache) > 10_000:
            self._cache.clear()
        # the wall-clock expiry is checked on every hit: the entry's own lifetime is on ``clock``, which
        # need not be the wall clock (monotonic, or a test's), so it cannot be capped by it
        self._cache[key] = (self._clock() + self._cache_s, record.expires_at, principal)
        return principal

    async def _principal(self, record: TokenRecord) -> Principal | None:
        """Who the token acts as; None when its person is no longer a member of its workspace."""
        role = record.role or Role.OWNER
        if record.workspace_id is None:
            return Principal(record.id, record.kind, None, record.subject, role=role, user_id=record.user_id)
        scope = await self._workspaces.get(record.workspace_id)
        if scope is None:
            return None
        if record.user_id is not None:
            held = await self._members.role_of(scope.root_id, record.user_id)
            if held is None:
                return None  # removed from the workspace: the tokens they held there stop working
            role = held if held.rank < role.rank else role
        return Principal(
            record.id,
            record.kind,
            scope.id,
            record.subject,
            role=role,
            user_id=record.user_id,
            parent_id=scope.parent_id,
            environment=scope.environment,
            environment_bound=scope.parent_id is not None,
        )

    async def environment(self, workspace_id: str, name: str) -> WorkspaceRecord | None:
        """The workspace's environment ``name`` (None: it has none), remembered for ``cache_s``: a request that
        names its environment costs no SQL round trip while the entry lasts."""
        key = (workspace_id, name)
        hit = self._environments.get(key)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        found = await self._workspaces.environment(workspace_id, name)
        if len(self._environments) > 10_000:
            self._environments.clear()
        self._environments[key] = (self._clock() + self._cache_s, found)
        return found

    def forget_environment(self, workspace_id: str, name: str) -> None:
        self._environments.pop((workspace_id, name), None)

    def forget_user(self, user_id: str) -> None:
        """A person's role changed: drop their tokens' cached principals here, so the new role holds at once on
        this replica (on the others within ``cache_s``)."""
        for key, (_, _, principal) in list(self._cache.items()):
            if principal.user_id == user_id:
                del self._cache[key]

    def forget(self, token_id: str) -> None:
        """Drop a revoked token from the cache at once (on this replica)."""
        for key, (_, _, principal) in list(self._cache.items()):
            if principal.token_id == token_id:
                del self._cache[key]

    @functools.cached_property
    def streams(self) -> OpenStreams:
        """The streams open on this replica, by token: ended when their token is revoked."""
        return OpenStreams(self._tokens.invalid, recheck_s=self._recheck_s or RECHECK_S)

    def revoked(self, token_ids: Iterable[str]) -> int:
        """These tokens were revoked: forget them and end their open streams here; how many streams ended."""
        ids = set(token_ids)
        for key, (_, _, principal) in list(self._cache.items()):
            if principal.token_id in ids:
                del self._cache[key]
        return self.streams.end(ids)
