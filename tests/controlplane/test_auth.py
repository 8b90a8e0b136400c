"""Token checks on real stores (SQLite and PostgreSQL): cached, and looked up once however many ask at once."""

from __future__ import annotations

import asyncio

import pytest

from levers9.services.auth import Authenticator, Unauthenticated
from levers9.services.core import Services
from levers9.state.sql.records import TokenRecord
from levers9.state.sql.workspaces import TokenStore


class CountingTokens(TokenStore):
    """The real token store, counting its lookups."""

    lookups = 0

    async def verify(self, token: str, *, kind: str | None = None) -> TokenRecord | None:
        self.lookups += 1
        return await super().verify(token, kind=kind)


async def test_many_requests_with_one_uncached_token_share_one_lookup(services: Services) -> None:
    tokens = CountingTokens(services.db)
    now = [0.0]
    auth = Authenticator(tokens, cache_s=10, clock=lambda: now[0])
    workspace = await services.workspaces.get_or_create("team-a")
    record, token = await services.tokens.issue("user", workspace_id=workspace.id, subject="a")
    principals = await asyncio.gather(*(auth.verify(token) for _ in range(50)))
    assert {p.token_id for p in principals} == {record.id}
    assert tokens.lookups == 1
    await auth.verify(token)
    assert tokens.lookups == 1  # cached
    now[0] = 11.0  # the entry expired: again one lookup for a crowd
    await asyncio.gather(*(auth.verify(token) for _ in range(50)))
    assert tokens.lookups == 2
    unknown = await asyncio.gather(*(auth.verify("l9_user_nope") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(e, Unauthenticated) for e in unknown)
    assert tokens.lookups == 3
    with pytest.raises(Unauthenticated, match="unknown, revoked or expired"):
        await auth.verify("l9_user_nope")  # an unknown token is never cached
    assert tokens.lookups == 4
