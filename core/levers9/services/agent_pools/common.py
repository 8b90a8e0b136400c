"""What joined machines and attached clusters do alike: issuing the agent's token, reading its inventory, retiring it.

* :func:`issue_for_record`: the single-use join token for a new agent, with a
  record written after it; when writing the record fails the token is revoked,
  so no token is left that joins no pool.
* :func:`inventory`: an agent's last report as numbers (an agent's report is
  not trusted: what is not a number reads as none).
* :func:`stop_workers`: the scheduler's live machines of a pool that the
  agent runs are cordoned and terminated through the provisioner (which sends
  the agent its ``terminate`` orders while it is still joined; one that fails
  is left to the reconciler, which retries it) and their workers removed, their
  calls requeued.
* :func:`retire_agent`: every token of the agent (its credential and an unused
  join token) revoked, the agent marked removed in Redis, its stream cut on
  whichever replica holds it with the words the agent acts on. A failure to
  reach the other replicas is logged: the revoked credential is refused at the
  stream's next check anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from levers9.services.agent_join import JOIN_PREFIX, JOIN_TTL_S, JoinToken, issue_join_token
from levers9.services.agent_messages import publish_disconnect
from levers9.services.auth import Principal

if TYPE_CHECKING:
    from levers9.scheduler.pools import PoolSpec
    from levers9.services.agent_store import AgentRecord
    from levers9.services.core import Services
    from levers9.state.sql.records import MachineRecord

__all__ = [
    "LIVE_MACHINE_STATES",
    "Inventory",
    "as_int",
    "int_map",
    "inventory",
    "issue_for_record",
    "reported",
    "retire_agent",
    "stop_workers",
]

log = logging.getLogger(__name__)

#: machine records of the scheduler that may still have a worker running on the agent's side
LIVE_MACHINE_STATES = ("requested", "starting", "running", "draining", "terminating")

R = TypeVar("R")


def int_map(value: Any) -> dict[str, int]:
    """An inventory's ``{name: count}`` with whole numbers only (an agent's report is not trusted)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int | float)}


def as_int(value: Any) -> int:
    """An inventory's number, or 0 when it is not one."""
    return int(value) if isinstance(value, int | float) else 0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """An agent's last report, as both kinds list it (zeros when it never reported).

    Each kind's view extends it with its record (its fields are keyword-only, so a view's own come first).
    """

    connected: bool = False
    #: epoch seconds of its last message; 0: never connected
    last_seen: float = 0.0
    version: str = ""
    #: GPUs by canonical type: total and free
    gpus: dict[str, int] = field(default_factory=dict)
    free_gpus: dict[str, int] = field(default_factory=dict)
    cpu_millicores: int = 0
    memory_mib: int = 0
    free_cpu_millicores: int = 0
    free_memory_mib: int = 0
    #: levers9 machine ids of the workers running there
    workers: list[str] = field(default_factory=list)
    #: the report's ``details`` (Docker's version, a cluster's nodes...), as sent
    details: dict[str, Any] = field(default_factory=dict)


def reported(found: Inventory) -> dict[str, Any]:
    """``found``'s fields by name, to build a view of it (``View(record, **reported(found))``)."""
    return {f.name: getattr(found, f.name) for f in fields(Inventory)}


async def inventory(services: Services, agent: AgentRecord) -> Inventory:
    """``agent``'s last report, and whether its stream is open on some replica now."""
    capacity = agent.capacity
    free = _dict(capacity.get("free"))
    return Inventory(
        connected=await services.agents.owner(agent.id) is not None,
        last_seen=agent.last_seen,
        version=agent.version,
        gpus=int_map(capacity.get("gpus")),
        free_gpus=int_map(free.get("gpus")),
        cpu_millicores=as_int(capacity.get("cpu_millicores")),
        memory_mib=as_int(capacity.get("memory_mib")),
        free_cpu_millicores=as_int(free.get("cpu_millicores")),
        free_memory_mib=as_int(free.get("memory_mib")),
        workers=list(agent.machines),
        details=_dict(capacity.get("details")),
    )


async def issue_for_record(
    services: Services,
    principal: Principal,
    provider: str,
    labels: Mapping[str, str],
    record: Callable[[JoinToken], Awaitable[R]],
    *,
    ttl_s: float = JOIN_TTL_S,
) -> tuple[JoinToken, R]:
    """A join token for a new agent of ``provider``, then ``record(token)``; the token revoked if that fails."""
    issued = await issue_join_token(services, principal, provider, labels, ttl_s=ttl_s)
    try:
        written = await record(issued)
    except BaseException:
        await services.tokens.revoke_subject(f"{JOIN_PREFIX}{issued.agent_id}")  # a token for no pool
        raise
    return issued, written


async def stop_workers(
    services: Services, spec: PoolSpec, runs_there: Callable[[MachineRecord], bool], why: str, left: str
) -> tuple[list[str], list[str]]:
    """Stop the pool's live machines that ``runs_there``; the ids stopped, and those left to the reconciler.

    ``why`` is the terminate's reason, ``left`` the words each removed worker leaves with.
    """
    terminated: list[str] = []
    failed: list[str] = []
    scheduler = services.scheduler
    for machine in await services.machines.list(pool=spec.name, states=LIVE_MACHINE_STATES):
        if not runs_there(machine):
            continue
        if machine.worker_id:
            await scheduler.ctx.workers.cordon(machine.worker_id)
        if await scheduler.provisioner.terminate(spec, machine, why):
            terminated.append(machine.id)
        else:
            failed.append(machine.id)
        if machine.worker_id:
            await scheduler.remove_worker(machine.worker_id, left, force=True)
    return terminated, failed


async def retire_agent(services: Services, agent_id: str, message: str) -> None:
    """Revoke every token of ``agent_id``, mark it removed, and cut its stream with ``message``."""
    await services.tokens.revoke_subject(agent_id)
    await services.tokens.revoke_subject(f"{JOIN_PREFIX}{agent_id}")
    await services.agents.removed(agent_id)
    try:
        await publish_disconnect(services.redis, services.agents.prefix, agent_id, message)
    except Exception as exc:  # revoked already: the stream is refused at its next credential check
        log.warning("could not ask the replicas to cut agent %s's stream: %s", agent_id, exc)
