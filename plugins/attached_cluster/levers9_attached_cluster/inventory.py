"""What an attached cluster's agent last reported, read as the controlplane's side needs it: room, and machines.

A Kubernetes agent's inventory lands in ``AgentInventory.capacity["details"]``
as ``{"namespace", "nodes": [trimmed Node JSON], "requested": {node: {resource:
quantity string, "pods": n}}, "workers": [WorkerJob.info()...]}`` (see
``levers9.agent.k8s_workers``). Two readings of it live here:

* :func:`node_rooms`: what each node can still take for a pool, by the very
  rules ``local_k8s`` applies to its own cluster
  (:func:`levers9.kube.rooms.rooms_from_usage`: GPU type from the node's
  labels, the pool's node selector and tolerations, Ready and uncordoned,
  allocatable less what live pods request). A quantity the agent sent that does
  not parse counts as nothing held (the agent checks room again, exactly,
  before it creates anything); a report that is not of that shape is no nodes.
* :func:`machine_of`: one reported worker as the :class:`Machine` levers9
  tracks, in the states ``local_k8s`` gives a Job and its pod (``levers9_local_k8s.machines``):

  ============================================  ==========  ========================================
  the worker as reported                        state       reason
  ============================================  ==========  ========================================
  ``deleting`` (the Job is being deleted)       stopping
  ``finished: Failed`` or pod phase Failed      failed      the Job's reason, the container's exit
  ``finished: Complete`` or phase Succeeded     terminated  "the worker exited"
  pod phase Running                             running
  ``cannot_start`` (an image that cannot be     failed      "the worker's pod cannot start: "
  pulled, a pod Pod Security refuses...)                    and the agent's words
  no pod yet, or the pod Pending                pending     ``FailedScheduling: <the scheduler's
                                                            message>`` when the pod cannot be placed,
                                                            else what the container waits for
  ============================================  ==========  ========================================

  A pending machine's reason is no end: the core waits until its registration
  deadline, then terminates it and counts the reason as the offer's miss. A
  worker that cannot start is failed at once (no wait mends it).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from levers9.hooks.context import AgentInventory
from levers9.hooks.types import Machine, MachineState, Pool
from levers9.kube import parse_quantity, timestamp
from levers9.kube.rooms import NodeRoom, rooms_from_usage
from levers9_attached_cluster.settings import AttachedClusterSettings

__all__ = ["details", "machine_of", "node_rooms", "reported_namespace", "usage", "workers"]


def details(agent: AgentInventory) -> dict[str, Any]:
    """The agent's ``capacity["details"]``; empty when it reported none (not yet, or not a Kubernetes agent)."""
    found = agent.capacity.get("details")
    return found if isinstance(found, dict) else {}


def reported_namespace(agent: AgentInventory) -> str | None:
    """The namespace the agent creates worker Jobs in, as it reported it; None before its first inventory."""
    namespace = details(agent).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else None


def workers(agent: AgentInventory, pool: str | None = None) -> list[dict[str, Any]]:
    """The workers the agent reported (``WorkerJob.info()`` dicts with a machine id), of ``pool`` only when given."""
    found = details(agent).get("workers")
    if not isinstance(found, list):
        return []
    return [w for w in found if isinstance(w, dict) and w.get("machine_id") and (pool is None or w.get("pool") == pool)]


def usage(requested: Any) -> dict[str, dict[str, Fraction]]:
    """``details["requested"]`` as amounts: ``{node: {resource: Fraction}}`` (an unreadable quantity: left out)."""
    held: dict[str, dict[str, Fraction]] = {}
    if not isinstance(requested, Mapping):
        return held
    for node, asks in requested.items():
        if not isinstance(asks, Mapping):
            continue
        amounts = held.setdefault(str(node), {})
        for resource, amount in asks.items():
            try:
                amounts[str(resource)] = parse_quantity(amount)
            except (TypeError, ValueError):
                continue
    return held


def node_rooms(agent: AgentInventory, settings: AttachedClusterSettings) -> list[NodeRoom]:
    """Every node the agent reported, with its GPU type, what is free on it and whether the pool may use it."""
    reported = details(agent)
    nodes = [n for n in reported.get("nodes") or [] if isinstance(n, dict)]
    return rooms_from_usage(
        nodes,
        usage(reported.get("requested")),
        gpu_resource=settings.gpu_resource_name,
        node_selector=settings.node_selector,
        tolerations=settings.tolerations,
    )


def _state(worker: Mapping[str, Any]) -> tuple[MachineState, str | None]:
    phase, finished = worker.get("phase"), worker.get("finished")
    if worker.get("deleting"):
        return MachineState.STOPPING, None
    if finished == "Failed" or phase == "Failed":
        said = [str(w) for w in (worker.get("finished_reason"), worker.get("container")) if w]
        return MachineState.FAILED, "; ".join(said) or "the Job failed"
    if finished == "Complete" or phase == "Succeeded":
        return MachineState.TERMINATED, "the worker exited"
    if phase == "Running":
        return MachineState.RUNNING, None
    if worker.get("cannot_start"):
        return MachineState.FAILED, f"the worker's pod cannot start: {worker['cannot_start']}"
    if worker.get("unschedulable"):
        return MachineState.PENDING, f"FailedScheduling: {worker['unschedulable']}"
    container = worker.get("container")
    return MachineState.PENDING, str(container) if container else None


def machine_of(pool: Pool, worker: Mapping[str, Any], agent_id: str) -> Machine:
    """The machine ``worker`` (one entry of the agent's ``details["workers"]``) stands for; see the table above."""
    state, reason = _state(worker)
    provider_data: dict[str, Any] = {
        "agent_id": agent_id,
        "namespace": str(worker.get("namespace") or ""),
        "job": str(worker.get("job") or ""),
        # the controlplane has no way into the customer's cluster: its workers serve through their tunnels
        "reachable": False,
    }
    if worker.get("node"):
        provider_data["node"] = str(worker["node"])
    gpu_count = pool.gpu_count if pool.gpu else 0
    return Machine(
        provider_id=str(worker.get("job") or ""),
        machine_id=str(worker["machine_id"]),
        pool=pool.name,
        state=state,
        gpu=pool.gpu if gpu_count else None,
        gpu_count=gpu_count,
        region=pool.region,
        address=worker.get("pod_ip") or None,
        created_at=timestamp(worker.get("created_at")),
        labels={"agent": agent_id},
        provider_data=provider_data,
        reason=reason,
    )
