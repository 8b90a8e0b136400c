"""The ``attached_cluster`` provider's hooks: offers from the cluster agent's inventory, Jobs created by its orders.

The controlplane never reaches an attached cluster's API: everything it knows
is what the cluster's agent last reported (:mod:`levers9_attached_cluster.inventory`),
and everything it does there is an order down the agent's stream, carried out
by the agent's Kubernetes backend (``levers9.agent.k8s_workers``).

The cluster's agents. A pool is served by the agents of provider
``attached_cluster``, of the pool's own workspace (``pool.workspace``), whose
join token's ``cluster`` label is the pool's ``settings.cluster``: one
workspace's pool never sees, and never orders, another workspace's cluster,
whatever the clusters are called. An agent *serves* while it is connected and
was heard from within ``heartbeat_timeout_s``; when a cluster was joined again
(several agents), the one heard from most recently is the cluster's.

* offers: for a GPU pool, the serving agent's nodes as ``local_k8s`` reads its
  own (:func:`levers9.kube.rooms.rooms_from_usage` with the pool's node
  selector, tolerations and GPU resource): one offer per GPU-type label
  (``instance_type`` ``nvidia.com/gpu.product=NVIDIA-L4``, which the Job then
  requires through node affinity), ``available`` when one such node has
  ``gpu_count`` GPUs free now, else ``unavailable`` (the scheduler skips it);
  no price, no zone. A CPU pool and a process without an agent hub
  (``levers9 offers`` from a config file) have none, which is no failure; a
  GPU pool whose cluster has no serving agent is :class:`InsufficientCapacity`
  naming why, so the planner waits for the agent's offers instead of starting
  a Job without node affinity (it could land on a node of another GPU type).
* provision: no serving agent is :class:`InsufficientCapacity` naming the
  cluster and why (never connected, not connected, silent for N s); a pool
  whose ``namespace`` is not the one the agent works in is
  :class:`InvalidRequest` naming both. Unless the agent already reports a Job
  for the machine (a retry), a node of the reported inventory must have room
  for the worker now, else :class:`InsufficientCapacity` naming each node's
  shortfall (code ``NoNodeFits``) before any order is sent, so the scheduler
  fails over at once. The Job and its token Secret are the ones ``local_k8s``
  makes (:mod:`levers9.kube.jobs`, from the pool's settings as
  :func:`pod_settings` gives them); they go in a ``provision`` order with
  the idempotency key ``prov-<machine id>``. The agent checks them, room and
  the namespace's ResourceQuotas again, exactly, and a refusal is the typed
  error its ``error_kind`` names (``quota_exceeded`` -> :class:`QuotaExceeded`,
  ``insufficient_capacity`` -> :class:`InsufficientCapacity`...); no
  acknowledgement in time is a plain :class:`ProviderError`. The machine is the
  Job: ``provider_id`` its name, ``provider_data`` ``{"agent_id", "namespace",
  "job", "reachable": False}`` (nothing reaches into the customer's cluster, so
  its workers open their tunnels when they register and the gateway reaches
  their serving containers through them).
* terminate: a ``terminate`` order (by machine id: the agent deletes the Jobs,
  their pods and the Secrets labelled with it) to ``provider_data["agent_id"]``,
  or, when that agent is not connected, to a connected agent of the same
  cluster (the cluster is the state, not the agent). None connected while the
  machine's agent is known is :class:`AgentOffline`, retryable: the reconciler
  tries again. An agent no longer known (removed) has nothing left to stop:
  success, as for a machine no agent reports.
* list: the pool's workers in the most recent report of the cluster's agents,
  each as ``local_k8s`` maps a Job and its pod (a pod the scheduler cannot
  place is pending with ``FailedScheduling: <message>``). An agent silent past
  ``heartbeat_timeout_s`` has every machine reported FAILED ("agent <agent id> of
  cluster <c> silent for N s"), so their calls are requeued.
* check: whether an agent of the cluster is connected, and what it reports.

Nothing heavy is imported: no ``kubernetes`` client, the hub comes from
``levers9_startup``. Secret values travel only inside the provision order and
are never logged nor put into an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from levers9.gpu.catalog import CATALOG
from levers9.hooks.agent_providers import AgentBackedProvider, AgentOffline
from levers9.hooks.context import AgentAck, AgentInventory, AgentOrder, PluginContext
from levers9.hooks.errors import (
    ERROR_KINDS,
    InsufficientCapacity,
    InvalidRequest,
    ProviderError,
    Throttled,
)
from levers9.hooks.markers import hookimpl
from levers9.hooks.spec import SPEC_VERSION
from levers9.hooks.types import (
    Availability,
    GpuOffer,
    Machine,
    MachineState,
    Pool,
    ProviderCheck,
    ProvisionRequest,
    settings_of,
)
from levers9.kube.jobs import WorkerPod, check_privileged, job_manifest, job_name, secret_manifest
from levers9.kube.rooms import NodeRoom, check_room
from levers9_attached_cluster.inventory import machine_of, node_rooms, reported_namespace, workers
from levers9_attached_cluster.settings import AttachedClusterSettings

__all__ = ["PROVIDER", "AgentOffline", "AttachedClusterProvider", "pod_settings"]

PROVIDER = "attached_cluster"
#: the longest a provision order waits for its acknowledgement (the hook's own deadline is 120 s)
PROVISION_ORDER_S = 110.0
#: the longest a terminate order waits (the hook's deadline is 30 s)
TERMINATE_ORDER_S = 20.0


def _settings(pool: Pool) -> AttachedClusterSettings:
    return settings_of(pool, AttachedClusterSettings)


def pod_settings(settings: AttachedClusterSettings) -> WorkerPod:
    """What makes :mod:`levers9.kube.jobs` build this pool's Job and Secret, as it builds ``local_k8s``'s.

    Every field the two providers share is carried over; what ``local_k8s`` has and an attached cluster does
    not (a kubeconfig, a priority class, a deadline) is left at its default: no kubeconfig is ever read here.
    """
    return WorkerPod(
        namespace=settings.namespace,
        worker_image=settings.worker_image,
        service_account=settings.service_account,
        node_selector=dict(settings.node_selector),
        tolerations=list(settings.tolerations),
        gpu_resource_name=settings.gpu_resource_name,
        image_pull_secrets=list(settings.image_pull_secrets),
        privileged=settings.privileged,
    )


def _retyped(exc: ProviderError, where: str) -> ProviderError:
    """``exc`` as the same kind of error, its message led by ``where`` (the pool and cluster)."""
    cls = type(exc)
    if cls not in (*ERROR_KINDS.values(), ProviderError, AgentOffline):
        return exc
    retyped = cls(f"{where}: {exc.message}", code=exc.code)
    if isinstance(exc, Throttled) and isinstance(retyped, Throttled):
        retyped.retry_after = exc.retry_after
    return retyped


def _refusal(ack: AgentAck, order: AgentOrder, where: str) -> ProviderError:
    """A refusing acknowledgement (from a hub that answers it rather than raising it) as its typed error."""
    cls = ERROR_KINDS.get(ack.error_kind or "", ProviderError)
    return cls(f"{where}: agent {order.agent_id} refused the {order.kind} order: {ack.error or 'no reason given'}")


class AttachedClusterProvider(AgentBackedProvider):
    """The ``attached_cluster`` plugin object, its methods the hooks; its state: the plugin context (its agent
    hub, from ``levers9_startup``) and a clock."""

    LEVERS9_SPEC_VERSION = SPEC_VERSION
    settings_model = AttachedClusterSettings
    provider_name = PROVIDER
    agents_of = "the clusters'"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)

    # -------------------------------------------------------------------------- the cluster's agents

    def agents(self, pool: Pool) -> list[AgentInventory]:
        """Every agent of the pool's cluster (connected or not) of the pool's workspace, most recently heard first."""
        hub = self.hub_context().agents
        assert hub is not None
        cluster = _settings(pool).cluster
        found = [
            a
            for a in hub.inventories(PROVIDER, workspace=pool.workspace)
            if a.workspace == pool.workspace and a.labels.get("cluster") == cluster
        ]
        return sorted(found, key=lambda a: (-a.last_seen, a.agent_id))

    def serves(self, pool: Pool, agent: AgentInventory) -> bool:
        return agent.connected and self.silent_for(agent) <= _settings(pool).heartbeat_timeout_s

    def serving(self, pool: Pool) -> AgentInventory | None:
        """The agent that serves the pool's cluster now: connected, heard from in time, the most recent one."""
        return next((a for a in self.agents(pool) if self.serves(pool, a)), None)

    def _why_not_served(self, pool: Pool, known: list[AgentInventory]) -> str:
        settings = _settings(pool)
        if not known:
            return (
                f"no agent of cluster {settings.cluster!r} has joined; apply the manifest that 'levers9 cluster "
                f"join {settings.cluster}' printed in that cluster"
            )
        agent = known[0]
        silent = self.silent_for(agent)
        if agent.last_seen <= 0:
            return f"the agent {agent.agent_id} of cluster {settings.cluster!r} never connected"
        if not agent.connected:
            return (
                f"the agent {agent.agent_id} of cluster {settings.cluster!r} is not connected (last heard from "
                f"{silent:.0f} s ago)"
            )
        return (
            f"the agent {agent.agent_id} of cluster {settings.cluster!r} is silent for {silent:.0f} s (more than the "
            f"pool's heartbeat_timeout_s, {settings.heartbeat_timeout_s:g} s)"
        )

    # -------------------------------------------------------------------------- offers

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if not pool.gpu or pool.gpu_count < 1 or not self.has_hub:
            # outside a controlplane no agent connects: nothing to offer, which is no failure of the pool's
            return []
        known = self.agents(pool)
        agent = next((a for a in known if self.serves(pool, a)), None)
        if agent is None:
            # no answer rather than "nothing": the planner waits for the cluster's offers instead of starting
            # the pool's own shape, a Job without node affinity that could land on any GPU node
            raise InsufficientCapacity(
                f"pool {pool.name!r}: {self._why_not_served(pool, known)}", code="AgentNotServing"
            )
        by_label: dict[str, list[NodeRoom]] = {}
        for room in node_rooms(agent, _settings(pool)):
            if room.excluded or room.gpu != pool.gpu or room.gpus_total < pool.gpu_count or room.type_label is None:
                continue
            by_label.setdefault(room.type_label, []).append(room)
        gpu_type = CATALOG.get(pool.gpu)
        memory = gpu_type.memory_mib if gpu_type is not None else 1
        return [
            GpuOffer(
                gpu=pool.gpu,
                gpu_count=pool.gpu_count,
                gpu_memory_mib=max(1, memory),
                region=pool.region,
                instance_type=label,
                availability=Availability.AVAILABLE
                if any(n.gpus_free >= pool.gpu_count for n in nodes)
                else Availability.UNAVAILABLE,
            )
            for label, nodes in sorted(by_label.items())
        ]

    # -------------------------------------------------------------------------- provision

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        ctx = self.hub_context()
        pool = request.pool
        settings = _settings(pool)
        where = f"pool {pool.name!r} (cluster {settings.cluster!r})"
        try:  # a runc or gvisor pool's pod is privileged only with the operator's consent
            check_privileged(pool.name, pool.runtime, settings.privileged)
        except ValueError as exc:
            raise InvalidRequest(str(exc), code="PrivilegedNeeded") from None
        known = self.agents(pool)
        agent = next((a for a in known if self.serves(pool, a)), None)
        if agent is None:
            raise InsufficientCapacity(f"{where}: {self._why_not_served(pool, known)}", code="AgentNotServing")
        namespace = reported_namespace(agent)
        if namespace is not None and namespace != settings.namespace:
            raise InvalidRequest(
                f"{where}: the pool's namespace is {settings.namespace!r} but the cluster's agent {agent.agent_id} "
                f"creates worker Jobs in namespace {namespace!r}; set the pool's namespace to {namespace!r}"
            )
        retried = any(
            w.get("machine_id") == request.machine_id and not w.get("deleting") for w in workers(agent)
        )  # a retry: the agent answers with the Job that exists, whatever room is left
        if not retried:
            self._check_room(agent, request, settings, where)
        pod = pod_settings(settings)
        try:
            job, secret = job_manifest(request, pod), secret_manifest(request, pod)
        except ValueError as exc:  # the bootstrap cannot be written as a container's command and environment
            raise InvalidRequest(f"{where}: {exc}") from None
        order = AgentOrder(
            agent_id=agent.agent_id,
            kind="provision",
            payload={"machine_id": request.machine_id, "job": job, "secret": secret},
            order_id=f"prov-{request.machine_id}",
        )
        try:
            ack = self._send(ctx, order, min(settings.order_timeout_s, PROVISION_ORDER_S), where)
        except TimeoutError as exc:  # the agent may still carry it out: the reconciler finds the Job in its report
            raise ProviderError(f"{where}: {exc}") from None
        name = str(ack.result.get("job") or job_name(request.machine_id))
        gpu_count = request.resources.gpu_count if request.resources.gpu else 0
        return Machine(
            provider_id=name,
            machine_id=request.machine_id,
            pool=pool.name,
            state=MachineState.PENDING,
            gpu=request.resources.gpu if gpu_count else None,
            gpu_count=gpu_count,
            region=pool.region,
            instance_type=request.offer.instance_type if request.offer is not None else None,
            labels={"agent": agent.agent_id},
            provider_data={
                "agent_id": agent.agent_id,
                "namespace": str(ack.result.get("namespace") or settings.namespace),
                "job": name,
                # the controlplane has no way into the customer's cluster: its workers serve through their tunnels
                "reachable": False,
            },
        )

    def _send(self, ctx: PluginContext, order: AgentOrder, timeout: float, where: str) -> AgentAck:
        """The order's acknowledgement; a refusal as its typed error. :raises TimeoutError: none came in time."""
        try:
            ack = ctx.send_order(order, timeout=timeout)
        except ProviderError as exc:
            raise _retyped(exc, where) from None
        if not ack.ok:
            raise _refusal(ack, order, where)
        return ack

    def _check_room(
        self, agent: AgentInventory, request: ProvisionRequest, settings: AttachedClusterSettings, where: str
    ) -> None:
        """Raise InsufficientCapacity, naming each node's shortfall, unless a reported node can take the worker."""
        check_room(node_rooms(agent, settings), request, where, "the agent reported no nodes")

    # -------------------------------------------------------------------------- terminate, list

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        ctx = self.hub_context()
        settings = _settings(pool)
        where = f"pool {pool.name!r} (cluster {settings.cluster!r}): stopping {machine.provider_id}"
        known = self.agents(pool)
        agent_id = str(machine.provider_data.get("agent_id") or "")
        machine_id = machine.machine_id or next(
            (str(w["machine_id"]) for a in known for w in workers(a) if w.get("job") == machine.provider_id), ""
        )
        if not machine_id:  # untagged, and no agent reports a Job of that name: nothing of levers9's to stop
            return
        connected = [a for a in known if a.connected]
        target = next((a for a in connected if a.agent_id == agent_id), None) or next(iter(connected), None)
        if target is None:
            if agent_id and all(a.agent_id != agent_id for a in known):
                return  # its agent was removed: nothing of it can run for levers9 any more
            if not known:
                return  # no agent of the cluster is known at all
            raise AgentOffline(
                f"{where}: {self._why_not_served(pool, known)}; it is stopped once an agent of the cluster reconnects"
            )
        order = AgentOrder(
            agent_id=target.agent_id,
            kind="terminate",
            payload={"machine_id": machine_id},
            order_id=f"term-{machine_id}",
        )
        try:
            self._send(ctx, order, min(settings.order_timeout_s, TERMINATE_ORDER_S), where)
        except InsufficientCapacity as exc:  # the hub's "not connected": it went away since its last report
            raise AgentOffline(f"{exc.message}; it is stopped once the agent reconnects") from None
        except TimeoutError as exc:  # the same order (same id) may be acknowledged on a later try
            raise AgentOffline(f"{where}: {exc}") from None

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        settings = _settings(pool)
        reported = [a for a in self.agents(pool) if isinstance(a.capacity.get("details"), dict)]
        if not reported:
            return []
        agent = reported[0]  # the cluster's most recent report: an older agent's is stale
        silent = self.silent_for(agent)
        machines = []
        for worker in workers(agent, pool.name):
            machine = machine_of(pool, worker, agent.agent_id)
            if silent > settings.heartbeat_timeout_s:
                machine = machine.model_copy(
                    update={
                        "state": MachineState.FAILED,
                        "reason": f"agent {agent.agent_id} of cluster {settings.cluster!r} silent for {silent:.0f} s",
                    }
                )
            machines.append(machine)
        return machines

    # -------------------------------------------------------------------------- check

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = _settings(pool)
        try:
            check_privileged(pool.name, pool.runtime, settings.privileged)
        except ValueError as exc:
            return ProviderCheck(
                ok=False, message=str(exc), hint="the cluster's agent must also run with allow_privileged"
            )
        if not self.has_hub:
            return ProviderCheck(
                ok=True,
                message="no agent hub here: an attached cluster's agent is seen by a running controlplane only",
                hint="run 'levers9 check' against the controlplane to see it",
            )
        known = self.agents(pool)
        agent = next((a for a in known if self.serves(pool, a)), None)
        if agent is None:
            return ProviderCheck(
                ok=False,
                message=f"pool {pool.name!r}: {self._why_not_served(pool, known)}",
                hint=f"make sure the levers9 agent runs in cluster {settings.cluster!r} and can reach the "
                "controlplane; 'kubectl logs' of its Deployment says why it does not connect",
            )
        namespace = reported_namespace(agent)
        if namespace is not None and namespace != settings.namespace:
            return ProviderCheck(
                ok=False,
                message=f"pool {pool.name!r}: its namespace is {settings.namespace!r}, the agent of cluster "
                f"{settings.cluster!r} creates worker Jobs in {namespace!r}",
                hint=f"set the pool's namespace to {namespace!r}",
            )
        rooms = node_rooms(agent, settings)
        usable = [r for r in rooms if not r.excluded]
        what = f"{len(usable)} of {len(rooms)} nodes usable by the pool"
        if pool.gpu:
            typed = [r for r in usable if r.gpu == pool.gpu]
            what += f", {sum(r.gpus_free for r in typed)} of {sum(r.gpus_total for r in typed)} {pool.gpu} GPUs free"
        return ProviderCheck(
            ok=True,
            message=f"agent {agent.agent_id} of cluster {settings.cluster!r} connected (heard from "
            f"{self.silent_for(agent):.0f} s ago): {what}",
        )
