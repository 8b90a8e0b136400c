"""Joined machines: creating one (its join token and join command), listing them live, removing one.

The ``agent_machine`` kind of agent-backed pool (:mod:`levers9.services.agent_pools`):
what it shares with attached clusters is in :mod:`~levers9.services.agent_pools.common`.

A joined machine is a box whose ``levers9 agent`` joined a pool of the
``agent_machine`` provider; its id is its agent's id. Its row is in SQL
(:mod:`levers9.state.sql.joined_machines`), what it reports (inventory,
heartbeat) in Redis (:mod:`levers9.services.agent_store`).

Who may create for which pool: the pool must be configured, use the
``agent_machine`` provider, and belong to the caller's workspace. A workspace
user may create machines only for pools whose ``workspace`` is theirs; an
operator (a user token bound to no workspace) only for shared pools (no
``workspace``). The two never cross, because the provider serves a pool only
with agents of the pool's own workspace (an agent belongs to the workspace of
its join token): a machine created otherwise could never serve. Refusals name
the pool and the pools the caller may use (``ValueError`` for a pool that is
not there or not an agent pool, ``PermissionDenied`` for another workspace's).

The join token (:func:`levers9.services.agent_join.issue_join_token`) carries
the labels ``pool`` and ``name``; it is shown once, in the join command
(:func:`join_command`), and works once. Names are unique per workspace among
live machines (``AlreadyExists``); unknown names are ``NotFound``.

Removing (:func:`remove`): the scheduler's machines on the box (their
``provider_data["agent_id"]``) are stopped
(:func:`~levers9.services.agent_pools.common.stop_workers`); then the machine
is marked removed in SQL and its agent retired: its tokens revoked, marked
removed in Redis, its stream cut at once
(:func:`~levers9.services.agent_pools.common.retire_agent`). A removed
machine is refused at Join and Connect with a message saying it was removed.

Redis losing its contents (an embedded Redis whose ``levers9 up`` was killed)
loses no machine: when a joined machine's agent authenticates and Redis has no
registration for it, :data:`JOINED_MACHINES` reads it back from the SQL row
(its pool and name labels, which the provider selects agents by) for the
registry (:mod:`levers9.services.agent_pools.registry`) to write again.
"""

from __future__ import annotations

import base64
import logging
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from levers9.hooks.agent_providers import AGENT_MACHINE
from levers9.services.agent_join import JOIN_TTL_S, JoinToken
from levers9.services.agent_pools.common import (
    Inventory,
    inventory,
    issue_for_record,
    reported,
    retire_agent,
    stop_workers,
)
from levers9.services.agent_pools.registry import Registration
from levers9.services.auth import PermissionDenied, Principal
from levers9.state.errors import AlreadyExists, NotFound
from levers9.state.sql.joined_machines import JoinedMachineStore, check_machine_name
from levers9.state.sql.records import JoinedMachineRecord, TokenKind

if TYPE_CHECKING:
    from levers9.scheduler.pools import PoolSpec
    from levers9.services.core import Services
    from levers9.state.sql.records import MachineRecord

__all__ = [
    "JOINED_MACHINES",
    "JOIN_TTL_S",
    "PROVIDER",
    "CreatedMachine",
    "JoinedMachineKind",
    "JoinedMachineView",
    "RemovedMachine",
    "create",
    "join_command",
    "list_machines",
    "remove",
]

log = logging.getLogger(__name__)

PROVIDER = AGENT_MACHINE


@dataclass(frozen=True)
class CreatedMachine:
    machine: JoinedMachineRecord
    #: None: the machine existed and has joined (``existing_ok``): no token was issued
    join: JoinToken | None
    #: the controlplane's own advertised gRPC URL and CA, for a join command made here
    controlplane_url: str
    ca_pem: str
    #: the pool's ``ssh`` settings (paths, user, port, jump host; never a key) and its ``docker_host``, for
    #: ``machine create --ssh``
    ssh: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JoinedMachineView(Inventory):
    """A joined machine with what its agent last reported (zeros when it never did)."""

    machine: JoinedMachineRecord
    #: the box's Docker as the agent last reported it (empty: none reported), and its architecture
    docker_version: str = ""
    docker_runtimes: list[str] = field(default_factory=list)
    arch: str = ""

    @classmethod
    def of(cls, record: JoinedMachineRecord, found: Inventory) -> JoinedMachineView:
        """The view of ``record`` with its agent's report ``found``."""
        docker = found.details.get("docker")
        docker = docker if isinstance(docker, dict) else {}
        runtimes = docker.get("runtimes")
        return cls(
            record,
            docker_version=str(docker.get("version") or ""),
            docker_runtimes=[str(r) for r in runtimes] if isinstance(runtimes, list) else [],
            arch=str(found.details.get("arch") or ""),
            **reported(found),
        )


@dataclass(frozen=True)
class RemovedMachine:
    machine: JoinedMachineRecord
    #: scheduler machines stopped on the box, and those whose stop failed (the reconciler retries them)
    terminated: list[str]
    not_terminated: list[str]


def join_command(
    controlplane_url: str, token: str, *, ca_pem: str = "", wheel_url: str = "", wheel_sha256: str = ""
) -> str:
    """The command to run on the box: install levers9 from the controlplane's own wheel, then ``levers9 agent join``.

    The wheel (``wheel_url``, served by the controlplane: :mod:`levers9.controlplane.wheels`) is fetched with
    curl, trusting the controlplane's CA when there is one, its sha256 checked against ``wheel_sha256``, and that
    file pip-installed with the ``agent`` extra; only the distributions it requires come from the package index,
    by their own names. Never ``levers9`` by name: on the public index that name is another project's. Without a
    ``wheel_url`` the command assumes levers9 is on the box already (the worker image carries it).
    The token travels in ``LEVERS9_JOIN_TOKEN``, never in argv; a plain ``grpc://`` controlplane gets
    ``--insecure`` (development only); the CA, when there is one, travels base64-encoded.
    """
    ca_b64 = base64.b64encode(ca_pem.encode()).decode() if ca_pem else ""
    parts = [f"LEVERS9_JOIN_TOKEN={token}", "levers9", "agent", "join", "--controlplane", controlplane_url]
    if ca_b64:
        parts += ["--ca-b64", ca_b64]
    if controlplane_url.startswith("grpc://"):
        parts.append("--insecure")
    join = " ".join(parts)
    if not wheel_url:
        return join
    if not re.fullmatch(r"[0-9a-f]{64}", wheel_sha256):
        raise ValueError(f"wheel_sha256 {wheel_sha256!r} is not a sha256 in hex (64 characters 0-9, a-f)")
    filename = wheel_url.rsplit("/", 1)[-1]
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.whl", filename):
        raise ValueError(f"wheel_url {wheel_url!r} does not end in a wheel's file name")
    q = shlex.quote
    wheel = f'"$d"/{filename}'
    steps = ["d=$(mktemp -d)"]
    curl = f"curl -fsSL -o {wheel}"
    if ca_b64:
        steps.append(f'printf %s {ca_b64} | base64 -d > "$d"/ca.pem')
        curl += ' --cacert "$d"/ca.pem'
    steps += [
        f"{curl} {q(wheel_url)}",
        f'echo "{wheel_sha256}  $d/{filename}" | sha256sum -c -',
        f'pip install "levers9[agent] @ file://$d/{filename}"',
        join,
    ]
    return " && ".join(steps)


def _agent_pools(services: Services) -> dict[str, PoolSpec]:
    return {name: spec for name, spec in services.pools.items() if spec.pool.provider == PROVIDER}


def _usable(spec: PoolSpec, principal: Principal) -> bool:
    """The operator joins machines to the config's pools (one naming the workspace it serves too); a workspace to
    the pools it attached."""
    if spec.configured:
        return principal.workspace_id is None
    return spec.workspace == principal.workspace_root


def _check_pool(services: Services, principal: Principal, pool: str) -> PoolSpec:
    agent_pools = _agent_pools(services)
    usable = sorted(name for name, spec in agent_pools.items() if _usable(spec, principal))
    accepted = (
        f"pools you may join machines to: {', '.join(usable)}"
        if usable
        else (
            "you may join machines to no pool: configure a pool with 'provider: agent_machine'"
            + ("" if principal.workspace_id is None else " for this workspace")
        )
    )
    spec = services.pools.get(pool)
    if spec is None:
        raise ValueError(f"pool {pool!r} is not configured on this controlplane; {accepted}")
    if spec.pool.provider != PROVIDER:
        raise ValueError(
            f"pool {pool!r} uses provider {spec.pool.provider!r}; machines join pools of provider {PROVIDER!r} "
            f"only; {accepted}"
        )
    if not _usable(spec, principal):
        whose = "the operator's" if spec.configured else "another workspace's"
        who = "an operator" if principal.workspace_id is None else "this workspace"
        raise PermissionDenied(f"pool {pool!r} is {whose}: {who} may not join machines to it; {accepted}")
    return spec


async def create(
    services: Services,
    principal: Principal,
    pool: str,
    name: str | None = None,
    *,
    ttl_s: float = JOIN_TTL_S,
    existing_ok: bool = False,
) -> CreatedMachine:
    """Record a pending machine for ``pool`` and issue its single-use join token (see the module docstring).

    ``existing_ok`` (with a ``name``): a machine of that name in ``pool`` that has joined is answered as it is
    (``join`` None), one that never joined (pending: its box never used the token) is removed and made again;
    one in another pool is still refused.
    """
    if principal.kind is not TokenKind.USER:
        raise PermissionDenied(f"only a user token may create machines, not a {principal.kind.value} token")
    spec = _check_pool(services, principal, pool)
    store = JoinedMachineStore(services.db)
    if name:
        check_machine_name(name)
        try:
            found = await store.by_name(principal.workspace_root, name)
        except NotFound:
            pass
        else:
            if not existing_ok or found.pool != pool:
                where = "" if found.pool == pool else f" in pool {found.pool!r}"
                raise AlreadyExists(
                    f"a machine named {name!r} exists already{where}: choose another --name, or remove it first "
                    f"(levers9 machine remove {name})"
                )
            ctx = services.scheduler.ctx
            if found.state == "joined":
                return CreatedMachine(found, None, ctx.controlplane_url, ctx.controlplane_ca, _ssh(spec))
            log.info("machine %s (%s) never joined: removed to be created again", found.name, found.id)
            await remove(services, principal, name)
    labels = {"pool": pool} | ({"name": name} if name else {})

    async def write(issued: JoinToken) -> JoinedMachineRecord:
        return await store.create(
            issued.agent_id,
            name=name or issued.agent_id,
            workspace_id=principal.workspace_root,
            pool=pool,
            provider=PROVIDER,
            created_by=principal.token_id,
        )

    issued, record = await issue_for_record(services, principal, PROVIDER, labels, write, ttl_s=ttl_s)
    log.info("machine %s (%s) created for pool %s", record.name, record.id, pool)
    ctx = services.scheduler.ctx
    return CreatedMachine(record, issued, ctx.controlplane_url, ctx.controlplane_ca, _ssh(spec))


def _ssh(spec: PoolSpec) -> dict[str, Any]:
    """The pool's ``ssh`` settings, and its ``docker_host`` (the Docker the box's agent and checks use)."""
    settings = spec.pool.settings
    dump = getattr(getattr(settings, "ssh", None), "model_dump", None)
    found: dict[str, Any] = dict(dump(mode="json")) if callable(dump) else {}
    docker_host = getattr(settings, "docker_host", None)
    if isinstance(docker_host, str) and docker_host:
        found["docker_host"] = docker_host
    return found


async def list_machines(services: Services, principal: Principal) -> list[JoinedMachineView]:
    """The caller's workspace's live machines (an operator's: the operator's own), with their live inventory."""
    records = await JoinedMachineStore(services.db).list(principal.workspace_root)
    views = []
    for record in records:
        agent = await services.agents.get(record.id)
        views.append(
            JoinedMachineView.of(record, await inventory(services, agent)) if agent else JoinedMachineView(record)
        )
    return views


async def remove(services: Services, principal: Principal, name: str) -> RemovedMachine:
    """Drain and stop the machine's workers, revoke its agent, mark it removed, cut its stream."""
    if principal.kind is not TokenKind.USER:
        raise PermissionDenied(f"only a user token may remove machines, not a {principal.kind.value} token")
    store = JoinedMachineStore(services.db)
    record = await store.by_name(principal.workspace_root, name)
    agent_id = record.id
    why = f"joined machine {record.name} ({agent_id}) is being removed"
    terminated: list[str] = []
    failed: list[str] = []
    spec = services.pools.get(record.pool)
    if spec is not None:

        def on_box(machine: MachineRecord) -> bool:
            return (machine.provider_data or {}).get("agent_id") == agent_id or machine.zone == agent_id

        terminated, failed = await stop_workers(services, spec, on_box, why, "left: its joined machine was removed")
    removed = await store.mark_removed(agent_id)
    await retire_agent(services, agent_id, f"this machine was removed ({why})")
    log.info(
        "machine %s (%s) removed: %d workers stopped, %d left to the reconciler",
        record.name,
        agent_id,
        len(terminated),
        len(failed),
    )
    return RemovedMachine(removed, terminated, failed)


class JoinedMachineKind:
    """Joined machines as a kind of agent-backed pool (:mod:`levers9.services.agent_pools.registry`)."""

    provider = PROVIDER

    async def registration(self, services: Services, agent_id: str) -> Registration | None:
        """A joined machine's registration from its SQL row (its pool and name); None unless it has joined.

        Redis may lose its contents (an embedded one does whenever ``levers9 up`` is killed). The pool a machine
        joined for is a label of its registration there, which the ``agent_machine`` provider selects agents by;
        without it the machine would never serve again.
        """
        row = await JoinedMachineStore(services.db).get(agent_id)
        if row is None or row.state != "joined":
            return None
        labels = {"pool": row.pool, "name": row.name}
        return Registration(row.provider, row.workspace_id, labels, f"machine {row.name}, pool {row.pool}")


#: the joined machines' strategy, for the registry :func:`levers9.services.core.open_services` builds
JOINED_MACHINES = JoinedMachineKind()


def epoch(value: datetime | None) -> float:
    """A record's time as epoch seconds (0 for none), as the transports send it."""
    return value.timestamp() if value is not None else 0.0
