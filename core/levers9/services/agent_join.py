"""Joining agents: the single-use join token, spending it for the agent's own credential, and who an agent is.

An operator or a workspace user issues a join token (:func:`issue_join_token`)
for one new agent of one provider: a token of kind ``agent`` whose subject is
``join:<agent id>``, expiring (an hour unless told, at most 30 days), stored
hashed like every token. The agent's registration (provider, the issuer's
labels) is written to Redis (:mod:`levers9.services.agent_store`) and expires
with the token unless the agent joins.

:func:`join` spends the token with one conditional update
(``TokenStore.exchange``), so a second Join with it is refused even when both
race, and in the same transaction issues the agent's own credential: kind
``agent``, subject the agent id, the join token's workspace (None: an
operator's agent), never expiring, revocable like any token
(``TokenStore.revoke_subject(agent_id)`` for every token of an agent).
Refusals are :class:`~levers9.services.auth.Unauthenticated` and say which it
was: unknown, already used (when), expired (when), or not a join token; none of
them tells a holder of no token anything it did not know.

:func:`authenticate_agent` accepts only an agent's credential: a join token is
refused there with what to do instead, and the workspace always comes from the
credential in SQL, so no agent can speak for another or for another workspace.

Agent-backed pools (:mod:`levers9.services.agent_pools`) are above this module
and never imported here: an agent that authenticates while Redis has no
registration for it is registered again through the registry handed in as
``services.agent_pools`` (:mod:`levers9.services.agent_pools.registry`).

Joined machines (:mod:`levers9.services.agent_pools.joined_machines`). A join flips the
machine's SQL row (if it has one) to ``joined`` with its host name. A machine
removed with ``levers9 machine remove`` has every token revoked and is marked
removed in SQL and in Redis; its Join and its Connect are then refused with
:func:`removed_message` (Unauthenticated), never with the generic "unknown or
revoked", so its owner knows to create it again rather than retry.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from levers9.hooks.agent_providers import AGENT_MACHINE, ATTACHED_CLUSTER
from levers9.services.auth import PermissionDenied as AccessDenied
from levers9.services.auth import Principal, Unauthenticated
from levers9.state.sql.joined_machines import JoinedMachineStore
from levers9.state.sql.models import new_id
from levers9.state.sql.records import TokenKind
from levers9.state.sql.workspaces import TokenRefused

if TYPE_CHECKING:
    from levers9.services.core import Services

__all__ = [
    "JOIN_PREFIX",
    "JOIN_TTL_S",
    "MAX_JOIN_TTL_S",
    "AgentIdentity",
    "JoinToken",
    "JoinedAgent",
    "authenticate_agent",
    "check_labels",
    "issue_join_token",
    "join",
    "removed_message",
]

log = logging.getLogger(__name__)

#: a join token's lifetime unless the issuer says otherwise, and the longest it may have
JOIN_TTL_S = 3600.0
MAX_JOIN_TTL_S = 30 * 86_400.0
#: the subject of a join token is this and the agent's id; the agent's credential's is the id alone
JOIN_PREFIX = "join:"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_MAX_LABELS = 32


@dataclass(frozen=True)
class JoinToken:
    agent_id: str
    #: shown this once: the agent spends it with Join
    token: str
    provider: str
    workspace: str | None
    expires_at: datetime | None


@dataclass(frozen=True)
class JoinedAgent:
    agent_id: str
    #: the agent's own credential, shown this once
    token: str
    #: empty when the registration was lost with Redis (the agent's Hello names it again)
    provider: str
    workspace: str | None
    labels: dict[str, str]


@dataclass(frozen=True)
class AgentIdentity:
    agent_id: str
    workspace: str | None
    token_id: str


def check_labels(labels: Mapping[str, str] | None, what: str) -> dict[str, str]:
    found = dict(labels or {})
    if len(found) > _MAX_LABELS:
        raise ValueError(f"{what}: at most {_MAX_LABELS} labels, got {len(found)}")
    for key, value in found.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise ValueError(f"{what}: label {key!r} must be 1-63 lowercase letters, digits, '_', '.' or '-'")
        if not isinstance(value, str) or len(value) > 256:
            raise ValueError(f"{what}: label {key!r} must have a text value of at most 256 characters")
    return found


async def issue_join_token(
    services: Services,
    principal: Principal,
    provider: str,
    labels: Mapping[str, str] | None = None,
    *,
    ttl_s: float = JOIN_TTL_S,
) -> JoinToken:
    """A single-use join token for a new agent of ``provider``, in the caller's workspace (None: an operator's)."""
    if principal.kind is not TokenKind.USER:
        raise AccessDenied(f"only a user token may issue join tokens, not a {principal.kind.value} token")
    known = services.hooks.providers()
    if provider not in known:
        raise ValueError(f"provider {provider!r} is not loaded; agents can join one of: {', '.join(sorted(known))}")
    if not (isinstance(ttl_s, int | float) and 0 < ttl_s <= MAX_JOIN_TTL_S):  # NaN fails this too
        raise ValueError(f"ttl_s must be above 0 and at most {MAX_JOIN_TTL_S:.0f} seconds (30 days), got {ttl_s}")
    issued_labels = check_labels(labels, "join token")
    agent_id = new_id("agt")
    workspace = principal.workspace_id
    await services.agents.register(agent_id, provider=provider, workspace=workspace, labels=issued_labels, ttl_s=ttl_s)
    record, token = await services.tokens.issue(
        TokenKind.AGENT.value, workspace_id=workspace, subject=f"{JOIN_PREFIX}{agent_id}", ttl_s=ttl_s
    )
    return JoinToken(agent_id, token, provider, workspace, record.expires_at)


def removed_message(agent_id: str, provider: str = AGENT_MACHINE) -> str:
    """Why a removed agent is refused, and what its owner does instead; it starts with the words the agent acts on
    (``levers9.agent.daemon.REMOVED``: it deletes its workers before it exits)."""
    if provider == ATTACHED_CLUSTER:
        return (
            f"this machine was removed: its attached cluster was removed (levers9 cluster remove); agent {agent_id} "
            "may not join or connect again. To attach the cluster again, run 'levers9 cluster join NAME' and apply "
            "the manifest it writes, after deleting the Secret levers9-agent-credential"
        )
    return (
        f"this machine was removed (levers9 machine remove); agent {agent_id} may not join or connect again. "
        "To join the box again, create a new machine ('levers9 machine create --pool POOL') and run the join "
        "command it prints"
    )


async def _removed(services: Services, agent_id: str) -> str | None:
    """The provider of ``agent_id`` when it was removed; None when it was not."""
    row = await JoinedMachineStore(services.db).get(agent_id)
    if row is not None:
        return row.provider if row.state == "removed" else None
    known = await services.agents.get(agent_id)
    return known.provider if known is not None and known.removed else None


def _refusal(exc: TokenRefused) -> str:
    when = exc.when.isoformat(timespec="seconds") if exc.when is not None else ""
    new = "ask for a new one ('levers9 machine create' or 'levers9 cluster join' prints it)"
    if exc.reason == "used":
        return (
            f"this join token was already used (at {when}); a join token works once, and the agent that used "
            f"it holds its own credential: to join another agent, {new}"
        )
    if exc.reason == "expired":
        return f"this join token expired at {when}; {new}"
    if exc.reason == "wrong kind":
        return "this is not a join token: Join takes the single-use token 'levers9 machine create' printed"
    return f"this join token is unknown: check it was copied whole, or {new}"


async def join(services: Services, join_token: str, *, version: str = "", hostname: str = "") -> JoinedAgent:
    """Spend ``join_token`` (once) for the agent's id and its own credential (:class:`Unauthenticated` if refused)."""
    if not join_token:
        raise Unauthenticated("no join token: Join takes the token 'levers9 machine create' printed")
    try:
        _, record, token = await services.tokens.exchange(
            join_token, kind=TokenKind.AGENT.value, subject_prefix=JOIN_PREFIX, issue_kind=TokenKind.AGENT.value
        )
    except TokenRefused as exc:
        if exc.reason == "used":
            spent = await services.tokens.find(join_token)
            subject = (spent.subject or "") if spent is not None else ""
            removed = await _removed(services, subject[len(JOIN_PREFIX) :]) if subject.startswith(JOIN_PREFIX) else None
            if removed is not None:
                raise Unauthenticated(removed_message(subject[len(JOIN_PREFIX) :], removed)) from None
        raise Unauthenticated(_refusal(exc)) from None
    agent_id = record.subject or ""
    registration = await services.agents.joined(
        agent_id, workspace=record.workspace_id, version=version[:64], hostname=hostname[:255]
    )
    await JoinedMachineStore(services.db).mark_joined(agent_id, hostname=hostname[:255])
    log.info("agent %s joined (%s, workspace %s)", agent_id, registration.provider or "?", record.workspace_id)
    return JoinedAgent(agent_id, token, registration.provider, record.workspace_id, registration.labels)


async def authenticate_agent(services: Services, token: str | None) -> AgentIdentity:
    """The agent behind its credential; a join token, or any other kind of token, is refused."""
    try:
        principal = await services.auth.verify(token, TokenKind.AGENT)
    except Unauthenticated:
        found = await services.tokens.find(token) if token else None
        subject = (found.subject or "") if found is not None else ""
        removed = await _removed(services, subject) if subject and not subject.startswith(JOIN_PREFIX) else None
        if removed is not None:
            raise Unauthenticated(removed_message(subject, removed)) from None
        raise
    subject = principal.subject or ""
    if not subject or subject.startswith(JOIN_PREFIX):
        raise Unauthenticated(
            "this is a join token: call Join with it first, then connect with the agent credential Join returns"
        )
    known = await services.agents.get(subject)
    if known is not None and known.removed:  # revoked in SQL too; the auth cache may not know yet
        raise Unauthenticated(removed_message(subject, known.provider))
    if known is None:  # Redis lost its contents: the agent's pool kind says from SQL what it serves
        await services.agent_pools.restore(services, subject)
    return AgentIdentity(subject, principal.workspace_id, principal.token_id)
