"""What an agent's stream carries, as the hub sees it: the inventory it reports and the commands sent down to it.

Plain frozen values, so :mod:`levers9.services.agents` (the hub) and
:mod:`levers9.controlplane.grpc_agent` (the transport, which translates the
protobuf messages to and from these) share one vocabulary. A message that
breaks the protocol is :class:`AgentProtocolError`, which the transport answers
with INVALID_ARGUMENT; a stream the hub ends is :class:`AgentLapsed` (silent) or
:class:`AgentCut` (cut off on purpose). Also here: how a refusing acknowledgement's
``error_kind`` maps to the provider errors (:data:`ERROR_KINDS`), and the
"cut this agent's stream" notice any process can publish to every replica
(:func:`publish_disconnect`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from levers9.hooks.errors import (
    ERROR_KINDS,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "ANY_WORKSPACE",
    "ERROR_KINDS",
    "AgentCut",
    "AgentLapsed",
    "AgentProtocolError",
    "AnyWorkspace",
    "Command",
    "InventoryReport",
    "OrderCommand",
    "Ping",
    "Welcome",
    "json_object",
    "publish_disconnect",
]


class AgentProtocolError(ValueError):
    """The agent broke the protocol (a message before Hello, a Hello twice, a result that is not a JSON object)."""


class AgentLapsed(Exception):
    """The agent's stream was silent for three heartbeat periods: it is disconnected and must dial again."""


class AgentCut(AgentLapsed):
    """The controlplane ended the agent's stream on purpose (its machine was removed); the message says why."""


class AnyWorkspace:
    """The type of :data:`ANY_WORKSPACE`."""

    def __repr__(self) -> str:
        return "ANY_WORKSPACE"


#: ``inventories(workspace=ANY_WORKSPACE)``: every workspace's agents (the default); None: the operator's
ANY_WORKSPACE = AnyWorkspace()


@dataclass(frozen=True)
class InventoryReport:
    cpu_millicores: int = 0
    memory_mib: int = 0
    free_cpu_millicores: int = 0
    free_memory_mib: int = 0
    #: (GPU type as the agent names it, count, free)
    gpus: tuple[tuple[str, int, int], ...] = ()
    machines: tuple[str, ...] = ()
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Welcome:
    agent_id: str
    heartbeat_s: float


@dataclass(frozen=True)
class OrderCommand:
    order_id: str
    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Ping:
    pass


Command = Welcome | OrderCommand | Ping


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object (empty: ``{}``); :class:`AgentProtocolError` naming ``what`` otherwise."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise AgentProtocolError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise AgentProtocolError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


#: an acknowledgement's ``error_kind`` -> the provider error :meth:`AgentHub.send` raises (others: ProviderError)


async def publish_disconnect(
    redis: Redis, prefix: str, agent_id: str, reason: str, *, sender: str = "services"
) -> None:
    """Ask every replica's hub to end ``agent_id``'s stream now (see the module docstring); raises what Redis
    raises (the caller's revocation still cuts the agent off within the auth cache's lifetime)."""
    message = {"from": sender, "t": "cut", "agent": agent_id, "reason": reason[:500]}
    await redis.publish(f"{prefix}agents", json.dumps(message))
