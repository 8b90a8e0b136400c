"""The registry of agent-backed pool kinds that token checking restores registrations through.

An agent that authenticates while Redis has no registration for it (Redis lost
its contents) is registered again from SQL; which SQL depends on the agent's kind
(a joined machine's row, a cluster's record). :class:`AgentPools` holds one
:class:`AgentPoolKind` per kind and asks each in turn; it is built where the
services are wired (:func:`levers9.services.core.open_services`) and handed to
:mod:`levers9.services.agent_join` through the services, so token checking never
imports the kinds' modules (they import it: it issues their join tokens).

Invariants: a registration that exists is never overwritten (:meth:`AgentPools.restore`
answers False); at most one kind restores an agent (the first that knows it); an
agent no kind knows stays unregistered, and its Hello names its provider itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from levers9.services.agent_join import JOIN_TTL_S

if TYPE_CHECKING:
    from levers9.services.core import Services

__all__ = ["AgentPoolKind", "AgentPools", "Registration"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    """What an agent is registered with in Redis: its provider, workspace and labels (the provider selects by them)."""

    provider: str
    workspace: str | None
    labels: dict[str, str]
    #: for the log line: "machine gpu-box-1, pool gpus"
    what: str


class AgentPoolKind(Protocol):
    """One kind of agent-backed pool: the provider it serves, and how an agent's registration is read back from SQL."""

    @property
    def provider(self) -> str: ...

    async def registration(self, services: Services, agent_id: str) -> Registration | None:
        """The registration of ``agent_id`` as this kind's SQL records it; None when it is not one of this kind's."""
        ...


class AgentPools:
    """The kinds of agent-backed pools this controlplane serves, asked in order."""

    def __init__(self, kinds: Sequence[AgentPoolKind]) -> None:
        providers = [kind.provider for kind in kinds]
        if len(set(providers)) != len(providers):
            raise ValueError(f"agent pool kinds must serve distinct providers, got {providers}")
        self.kinds = tuple(kinds)

    def providers(self) -> list[str]:
        return [kind.provider for kind in self.kinds]

    async def restore(self, services: Services, agent_id: str) -> bool:
        """Register ``agent_id`` again from SQL when Redis has no registration for it; whether it did."""
        if await services.agents.get(agent_id) is not None:
            return False
        for kind in self.kinds:
            found = await kind.registration(services, agent_id)
            if found is None:
                continue
            # pending until the agent's Hello, which follows at once, marks it joined for good
            await services.agents.register(
                agent_id, provider=found.provider, workspace=found.workspace, labels=found.labels, ttl_s=JOIN_TTL_S
            )
            log.warning("agent %s (%s) registered again from the database", agent_id, found.what)
            return True
        return False
