"""Attached clusters: joining one (its pool and its agent's join token), listing them live, their pools on every replica.

The ``attached_cluster`` kind of agent-backed pool (:mod:`levers9.services.agent_pools`):
what it shares with joined machines is in :mod:`~levers9.services.agent_pools.common`.

A workspace W attaches its own Kubernetes cluster with ``levers9 cluster join
NAME --gpu TYPE``. Nothing here reaches that cluster: the agent the printed
manifest starts there dials out (provider ``attached_cluster``), and the
``attached_cluster`` plugin sends it orders. Invariants:

* **A cluster is a pool of W's.** :func:`join` records the cluster (SQL,
  :class:`~levers9.state.sql.clusters.ClusterStore`, kind ``attached``) with
  the pool's whole config in its sealed settings, and the pool is named
  ``<NAME>.<8 hex of W's id>`` (:func:`pool_name`), so two workspaces may both
  call a cluster ``lab``. The pool's ``workspace`` is W: the scheduler never
  shows it to, nor places work of, another workspace, and the provider serves
  it only with W's agents whose ``cluster`` label is NAME.
* **Every replica has every cluster's pool.** :func:`sync_pools` reads the
  clusters from SQL and puts their pools into the scheduler's pool table (the
  same dict object every part of the process reads), adding the new, replacing
  the changed, dropping those no longer there; the replica that joined one
  syncs at once, every replica every :data:`SYNC_S` seconds
  (:func:`keep_pools`). A config pool's name is never replaced: a cluster whose
  pool name collides with one is skipped and logged.
* **Only a workspace's user token attaches** (``PermissionDenied`` otherwise).
  An operator's *shared* cluster is a pool of the config file (provider
  ``attached_cluster``, no workspace, serving every workspace): ``cluster join
  NAME --pool POOL`` with an operator's token issues its agent's token (labels
  as above, no workspace) and records nothing; ``remove`` by an operator
  revokes that cluster's agents and leaves the configured pool. A name already used in W is
  ``AlreadyExists``; a bad option (GPU type, sizes, namespace, image) is
  ``ValueError`` naming the option and what is accepted, and nothing is
  written.
* **Removing a cluster** (:func:`remove`) stops its pool's workers through
  the provider (terminate orders while the agent is connected,
  :func:`~levers9.services.agent_pools.common.stop_workers`), retires every
  agent of the cluster (:func:`~levers9.services.agent_pools.common.retire_agent`)
  with the removal words the agent acts on (it deletes its remaining worker
  Jobs and Secrets and exits), and deletes the record, so every replica drops
  the pool at its next sync. Unknown names are ``NotFound``.
* **Redis losing its contents** loses no cluster: an agent that
  authenticates with no registration in Redis is registered again from its
  cluster's record (:data:`ATTACHED_CLUSTERS`, through the registry of
  :mod:`levers9.services.agent_pools.registry`).
* **The join token** is single-use and expires (:data:`JOIN_TTL_S` unless
  asked otherwise), labelled ``cluster``, ``pool`` and ``name``; it is in the
  answer of :func:`join` only. The cluster's record keeps the id of the agent
  it was issued for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from levers9.cancelling import raise_if_cancelling
from levers9.config.load import hook_pool
from levers9.config.model import PoolConfig
from levers9.hooks.agent_providers import ATTACHED_CLUSTER
from levers9.scheduler.pools import PoolSpec
from levers9.services.agent_join import JOIN_TTL_S, JoinToken, issue_join_token
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
from levers9.state.sql.clusters import ClusterStore
from levers9.state.sql.models import utcnow
from levers9.state.sql.records import ClusterRecord, TokenKind

if TYPE_CHECKING:
    from levers9.services.core import Services

__all__ = [
    "ATTACHED_CLUSTERS",
    "JOIN_TTL_S",
    "KIND",
    "PROVIDER",
    "SYNC_S",
    "AttachedClusterKind",
    "ClusterOptions",
    "ClusterView",
    "JoinedCluster",
    "RemovedCluster",
    "join",
    "keep_pools",
    "list_clusters",
    "pool_name",
    "remove",
    "sync_pools",
]

log = logging.getLogger(__name__)

PROVIDER = ATTACHED_CLUSTER
KIND = "attached"
#: the kind a configured (operator's shared) cluster is listed with; it has no record of its own
CONFIGURED = "configured"
#: how often every replica re-reads the attached clusters' pools
SYNC_S = 5.0
#: the taints GPU nodes commonly carry (the NVIDIA GPU Operator, EKS and GKE GPU node groups, AMD's); a GPU
#: pool tolerates them unless its settings name tolerations of their own
GPU_TAINTS = ("nvidia.com/gpu", "amd.com/gpu")
#: the bounds of a cluster pool's numbers (one worker pod's size, the pool's workers), as the API states them
MAX_GPUS = 8
MAX_CPUS = 1024
MAX_MEMORY_MIB = 16 * 1024 * 1024
MAX_WORKERS = 10_000
MAX_IDLE_S = 30 * 86_400.0
#: cluster names are DNS labels short enough that ``<name>.<8 hex>`` is still a Kubernetes label value
MAX_NAME = 40


@dataclass(frozen=True)
class ClusterOptions:
    """What ``levers9 cluster join`` decides about the cluster's pool (the config file's pool fields)."""

    name: str
    gpu: str | None = None
    gpu_count: int | None = None
    #: CPU cores and memory (MiB, or a size like ``16GiB``) of one worker pod
    cpu: float = 1.0
    memory: int | str = 2048
    min_workers: int = 0
    max_workers: int = 10
    #: an idle worker above ``min_workers`` is released after this many seconds
    idle_timeout_s: float = 300.0
    runtime: str = "runc"
    namespace: str = "levers9"
    worker_image: str = ""
    #: further ``attached_cluster`` settings (tolerations, node_selector, privileged...), as the config file has them
    settings: Mapping[str, Any] = field(default_factory=dict)
    ttl_s: float = JOIN_TTL_S
    #: an operator's shared cluster: the configured ``attached_cluster`` pool whose agent joins (nothing is made)
    pool: str | None = None


@dataclass(frozen=True)
class JoinedCluster:
    cluster: ClusterRecord
    pool: PoolSpec
    join: JoinToken
    #: the controlplane's advertised gRPC URL and CA, for the agent's manifest
    controlplane_url: str
    ca_pem: str


@dataclass(frozen=True)
class ClusterView(Inventory):
    """A cluster with what its agent last reported (zeros when it never did)."""

    cluster: ClusterRecord
    pool: str
    gpu: str | None = None
    gpu_count: int = 0
    namespace: str = ""
    agent_id: str = ""
    #: the nodes the agent last reported
    nodes: int = 0


@dataclass(frozen=True)
class RemovedCluster:
    cluster: ClusterRecord
    #: the cluster's agents, revoked
    agents: list[str]
    #: scheduler machines stopped there, and those whose stop failed (the removed agent deletes its Jobs itself)
    terminated: list[str]
    not_terminated: list[str]


#: what a removed cluster's agent is told (it holds the words the agent deletes its workers on)
REMOVED = "this machine was removed: attached cluster {name} was removed (levers9 cluster remove)"


def pool_name(name: str, workspace_id: str) -> str:
    """``lab.1a2b3c4d``: the pool of cluster ``name`` of workspace ``workspace_id``, unique on the controlplane."""
    return f"{name}.{workspace_id.rsplit('_', 1)[-1][:8]}"


def _check_name(name: str) -> None:
    if not (0 < len(name) <= MAX_NAME and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)):
        raise ValueError(
            f"cluster name {name!r} is not valid: it must be 1-{MAX_NAME} lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (like gpu-lab)"
        )


def _pool_config(options: ClusterOptions) -> dict[str, Any]:
    settings = {**dict(options.settings), "cluster": options.name, "namespace": options.namespace}
    if options.gpu and "tolerations" not in settings:
        # GPU nodes are commonly tainted so that only pods asking for GPUs land there: tolerated unless told
        settings["tolerations"] = [{"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in GPU_TAINTS]
    if options.worker_image:
        settings["worker_image"] = options.worker_image
    config: dict[str, Any] = {
        "provider": PROVIDER,
        "runtime": options.runtime,
        "cpu": options.cpu,
        "memory": options.memory,
        "min_workers": options.min_workers,
        "max_workers": options.max_workers,
        "idle_timeout_s": options.idle_timeout_s,
        "settings": settings,
    }
    if options.gpu:
        config["gpu"] = options.gpu
        config["gpu_count"] = options.gpu_count or 1
    return config


def _errors(exc: ValidationError, prefix: str) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"] if isinstance(p, str | int))
        message = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{prefix}{where}: {message}" if where else f"{prefix.rstrip('.')}: {message}")
    return "; ".join(parts)


def build_pool(services: Services, name: str, workspace_id: str, config: Mapping[str, Any]) -> PoolSpec:
    """The scheduler's pool of a cluster's stored config. :raises ValueError: naming each bad field."""
    try:
        pool_config = PoolConfig.model_validate(dict(config))
    except ValidationError as exc:
        raise ValueError(_errors(exc, "")) from None
    hooks = services.hooks
    model = hooks.provider_settings_model(PROVIDER)
    try:
        settings = model.model_validate(pool_config.settings, context={"pool": name, "regions": []})
    except ValidationError as exc:
        raise ValueError(_errors(exc, "settings.")) from None
    if pool_config.runtime not in hooks.runtimes():
        raise ValueError(
            f"runtime {pool_config.runtime!r} is not installed here; installed: {', '.join(sorted(hooks.runtimes()))}"
        )
    pool = hook_pool(name, pool_config, settings)
    return PoolSpec.from_config(pool, pool_config, workspace=workspace_id)


async def join(services: Services, principal: Principal, options: ClusterOptions) -> JoinedCluster:
    """Record the cluster and its pool, and issue its agent's single-use join token (see the module docstring)."""
    if principal.kind is TokenKind.USER and principal.workspace_id is None and options.pool:
        return await _join_configured(services, principal, options)
    if options.pool:
        raise ValueError(
            "a pool is named only for an operator's shared cluster, configured in the config file; a workspace's "
            "cluster join makes the cluster's own pool (leave the pool out)"
        )
    workspace = _workspace_user(principal, "attach clusters")
    if PROVIDER not in services.hooks.providers():
        raise ValueError(f"the {PROVIDER} provider plugin is not loaded on this controlplane (levers9 plugins list)")
    _check_name(options.name)
    store = ClusterStore(services.db, services.box)
    if await store.by_name(workspace, options.name) is not None:
        raise AlreadyExists(f"this workspace already has a cluster named {options.name!r} (levers9 clusters)")
    name = pool_name(options.name, workspace)
    if name in services.pools and services.pools[name].workspace != workspace:
        raise AlreadyExists(f"pool {name!r} exists on this controlplane already; choose another cluster name")
    config = _pool_config(options)
    spec = build_pool(services, name, workspace, config)  # every bad option refused before anything is written

    async def write(issued: JoinToken) -> ClusterRecord:
        return await store.create(workspace, options.name, KIND, name, {"pool": config, "agent_id": issued.agent_id})

    labels = {"cluster": options.name, "pool": name, "name": options.name}
    token, record = await issue_for_record(services, principal, PROVIDER, labels, write, ttl_s=options.ttl_s)
    await sync_pools(services)
    return JoinedCluster(
        record, spec, token, services.scheduler.ctx.controlplane_url, services.scheduler.ctx.controlplane_ca
    )


def _workspace_user(principal: Principal, doing: str) -> str:
    if principal.kind is not TokenKind.USER:
        raise PermissionDenied(f"only a user token may {doing}, not a {principal.kind.value} token")
    if principal.workspace_id is None:
        raise PermissionDenied(
            f"an operator's token belongs to no workspace, and an attached cluster belongs to one: {doing} with a "
            "token of that workspace; an operator's shared cluster is a pool of the config file, whose agent joins "
            "with 'levers9 cluster join NAME --pool POOL'"
        )
    return principal.workspace_root or principal.workspace_id


def _configured_record(name: str, spec: PoolSpec) -> ClusterRecord:
    """What an operator's shared cluster is listed as: no record of its own, its configured pool's."""
    return ClusterRecord(
        id=f"pool:{spec.name}",
        workspace_id="",
        name=name,
        kind=CONFIGURED,
        pool=spec.name,
        has_settings=False,
        created_at=utcnow(),
    )


def _configured(services: Services) -> dict[str, PoolSpec]:
    """The operator's clusters: the config file's ``attached_cluster`` pools, by their cluster's name."""
    return {
        str(getattr(spec.pool.settings, "cluster", "")): spec
        for spec in services.pools.values()
        if spec.pool.provider == PROVIDER and spec.configured
    }


async def _join_configured(services: Services, principal: Principal, options: ClusterOptions) -> JoinedCluster:
    """An operator's shared cluster: a join token for the agent of the configured pool ``options.pool``."""
    configured = _configured(services)
    shown = ", ".join(f"{spec.name} (cluster {name})" for name, spec in sorted(configured.items())) or "none"
    spec = services.pools.get(options.pool or "")
    if spec is None or spec.pool.provider != PROVIDER or not spec.configured:
        raise ValueError(f"pool {options.pool!r} is not a configured attached_cluster pool; configured: {shown}")
    cluster = str(getattr(spec.pool.settings, "cluster", ""))
    if cluster != options.name:
        raise ValueError(f"pool {spec.name!r} is served by cluster {cluster!r}, not {options.name!r}: join that name")
    token = await issue_join_token(
        services, principal, PROVIDER, {"cluster": cluster, "pool": spec.name, "name": cluster}, ttl_s=options.ttl_s
    )
    record = _configured_record(cluster, spec)
    return JoinedCluster(
        record, spec, token, services.scheduler.ctx.controlplane_url, services.scheduler.ctx.controlplane_ca
    )


async def remove(services: Services, principal: Principal, name: str) -> RemovedCluster:
    """Stop the cluster's workers, revoke its agents and cut their streams, forget it (see the module docstring)."""
    store = ClusterStore(services.db, services.box)
    workspace: str | None
    if principal.kind is TokenKind.USER and principal.workspace_id is None:
        # an operator's shared cluster: its agents go, its pool stays in the config file
        workspace, shared = None, _configured(services).get(name)
        if shared is None:
            raise NotFound("configured attached cluster", name)
        record = _configured_record(name, shared)
        agents: set[str] = set()
    else:
        workspace = _workspace_user(principal, "remove clusters")
        found = await store.by_name(workspace, name)
        if found is None or found.kind != KIND:
            raise NotFound("attached cluster", name)
        record = found
        settings = await store.settings(record.id) or {}
        agents = {str(settings["agent_id"])} if settings.get("agent_id") else set()
    agents |= {
        a.id
        for a in await services.agents.all()
        if a.provider == PROVIDER and a.workspace == workspace and a.labels.get("cluster") == name
    }
    why = f"attached cluster {name} is being removed"
    terminated: list[str] = []
    failed: list[str] = []
    spec = services.pools.get(record.pool)
    if spec is not None and spec.pool.provider == PROVIDER:
        terminated, failed = await stop_workers(
            services, spec, lambda _: True, why, "left: its attached cluster was removed"
        )
    for agent_id in sorted(agents):
        await retire_agent(services, agent_id, REMOVED.format(name=name))
    if record.kind == KIND:
        await store.delete(record.id)
        await sync_pools(services)
    log.info(
        "attached cluster %s (%s) removed: %d workers stopped, %d left to its agent, agents %s revoked",
        name,
        record.id,
        len(terminated),
        len(failed),
        ", ".join(sorted(agents)) or "none",
    )
    return RemovedCluster(record, sorted(agents), terminated, failed)


class AttachedClusterKind:
    """Attached clusters as a kind of agent-backed pool (:mod:`levers9.services.agent_pools.registry`)."""

    provider = PROVIDER

    async def registration(self, services: Services, agent_id: str) -> Registration | None:
        """A cluster agent's registration from its cluster's record; None when no cluster's token was issued to it.

        The cluster and pool an agent serves are labels of its registration in Redis, which the
        ``attached_cluster`` provider selects agents by; Redis may lose them (an embedded one does whenever
        ``levers9 up`` is killed). The record keeps the id of the agent its token was issued for.
        """
        for record, settings in await ClusterStore(services.db, services.box).list_kind(KIND):
            if (settings or {}).get("agent_id") == agent_id:
                labels = {"cluster": record.name, "pool": record.pool, "name": record.name}
                return Registration(PROVIDER, record.workspace_id, labels, f"cluster {record.name}, pool {record.pool}")
        return None


#: the attached clusters' strategy, for the registry :func:`levers9.services.core.open_services` builds
ATTACHED_CLUSTERS = AttachedClusterKind()


async def list_clusters(services: Services, principal: Principal) -> list[ClusterView]:
    """The caller's workspace's attached clusters (an operator's: the configured shared ones), connected or not,
    with their agents' last report."""
    workspace = principal.workspace_root
    if workspace is None:
        records = [_configured_record(name, spec) for name, spec in sorted(_configured(services).items())]
    else:
        records = [r for r in await ClusterStore(services.db, services.box).list(workspace) if r.kind == KIND]
    agents = [
        a for a in await services.agents.all() if a.provider == PROVIDER and a.workspace == workspace and not a.removed
    ]
    views = []
    for record in records:
        spec = services.pools.get(record.pool)
        settings = getattr(spec.pool.settings, "namespace", "") if spec is not None else ""
        mine = sorted((a for a in agents if a.labels.get("cluster") == record.name), key=lambda a: a.last_seen)
        base = ClusterView(
            record,
            record.pool,
            gpu=spec.gpu if spec else None,
            gpu_count=spec.gpu_count if spec else 0,
            namespace=settings,
        )
        if not mine:
            views.append(base)
            continue
        agent = mine[-1]
        found = await inventory(services, agent)
        nodes = found.details.get("nodes")
        views.append(
            dataclasses.replace(
                base, agent_id=agent.id, nodes=len(nodes) if isinstance(nodes, list) else 0, **reported(found)
            )
        )
    return views


async def sync_pools(services: Services) -> list[str]:
    """Make the scheduler's pool table hold exactly the attached clusters' pools; the names that changed."""
    pools = services.pools
    found: dict[str, PoolSpec] = {}
    for record, settings in await ClusterStore(services.db, services.box).list_kind(KIND):
        config = (settings or {}).get("pool")
        if not isinstance(config, dict):
            log.error("attached cluster %s (%s) has no pool config; it serves nothing", record.name, record.id)
            continue
        configured = pools.get(record.pool)
        if configured is not None and configured.pool.provider != PROVIDER:
            log.error(
                "attached cluster %s: its pool %r collides with a config pool; it serves nothing",
                record.name,
                record.pool,
            )
            continue
        try:
            found[record.pool] = build_pool(services, record.pool, record.workspace_id, config)
        except ValueError as exc:
            log.error("attached cluster %s (%s): its pool is not valid here: %s", record.name, record.id, exc)
    changed = []
    for name in [
        n for n, spec in pools.items() if spec.pool.provider == PROVIDER and not spec.configured and n not in found
    ]:
        del pools[name]
        changed.append(name)
    for name, spec in found.items():
        if pools.get(name) != spec:
            pools[name] = spec
            changed.append(name)
    if changed:
        services.scheduler.ctx.planner_wanted.set()
        log.info("attached clusters' pools now: %s", ", ".join(sorted(found)) or "none")
    return changed


async def keep_pools(services: Services, every_s: float = SYNC_S) -> None:
    """:func:`sync_pools` every ``every_s`` seconds until cancelled; a failed pass is logged and retried."""
    while True:
        try:
            await sync_pools(services)
        except Exception as exc:
            raise_if_cancelling(exc)
            log.exception("reading the attached clusters' pools failed; retrying in %g s", every_s)
        await asyncio.sleep(every_s)
