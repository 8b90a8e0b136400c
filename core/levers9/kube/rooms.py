"""What each node of the cluster can still take, read from the API's own JSON (nodes and the pods bound to them).

The offers and the check before a Job is created both come from here, so a
pool whose nodes are full fails over at once instead of leaving a pod pending
(the kube-scheduler accepts a Job it cannot place and says so only in an
event). For each node, :func:`rooms` works out:

* its GPU type, from its labels through :func:`levers9.gpu.from_k8s_labels`
  (GPU Feature Discovery, Karpenter, GKE, the AMD labeller: no hand
  labelling), and the label that said so (``nvidia.com/gpu.product=NVIDIA-L4``),
  which a Job then requires through node affinity so its pod lands on a node
  of that type;
* whether the pool's pods may go there at all: the pool's ``node_selector``
  matches, every ``NoSchedule``/``NoExecute`` taint is tolerated by the pool's
  ``tolerations``, the node is Ready and not cordoned;
* what is free: ``status.allocatable`` minus the requests of the pods bound to
  it that have not ended (an extended resource such as ``nvidia.com/gpu`` is
  requested through its limit when no request is given, as the API server
  defaults it).

Everything is computed from plain API JSON (camelCase keys), the same shape
the test data files hold. Quantities are parsed exactly
(:mod:`levers9.kube`, shared with the agent of an attached cluster); a node or
pod with a malformed quantity counts as having none of it, never as unlimited.
:func:`rooms_from_usage` does the same from a usage already summed per node
(what an attached cluster's agent reports). Both Kubernetes providers use this
module: ``local_k8s`` with the API's nodes and pods, ``attached_cluster`` with
its agent's usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from levers9.gpu import from_k8s_labels
from levers9.hooks.errors import InsufficientCapacity
from levers9.hooks.types import ProvisionRequest
from levers9.kube import node_usage, quantity
from levers9.kube.shapes import Toleration

__all__ = [
    "TYPE_LABELS",
    "NodeRoom",
    "check_room",
    "describe_misses",
    "gpu_label",
    "rooms",
    "rooms_from_usage",
    "tolerates",
]

#: the labels that name a node's GPU type, most precise first (the order :func:`from_k8s_labels` reads them)
TYPE_LABELS = (
    "nvidia.com/gpu.product",
    "karpenter.k8s.aws/instance-gpu-name",
    "cloud.google.com/gke-accelerator",
    "amd.com/gpu.product-name",
)
#: pod phases whose requests no longer hold a node's resources
_BLOCKING = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class NodeRoom:
    """One node as a pool sees it: its GPUs, what is free, and why the pool's pods cannot go there (if so)."""

    name: str
    #: canonical GPU type, or None (no GPUs, MIG slices, a type outside the catalog)
    gpu: str | None
    #: ``key=value`` of the label that names the GPU type; None when no label does
    type_label: str | None
    gpus_total: int
    gpus_free: int
    cpu_free_millicores: int
    memory_free_mib: int
    #: why the pool's pods may not be placed here at all (selector, taint, not ready); None when they may
    excluded: str | None = None

    def shortfall(self, gpu_count: int, cpu_millicores: int, memory_mib: int) -> str | None:
        """Why a worker of that size does not fit here now; None when it does."""
        if self.excluded:
            return self.excluded
        if gpu_count and self.gpus_free < gpu_count:
            return f"{self.gpus_free} of {self.gpus_total} GPUs free, {gpu_count} needed"
        if self.cpu_free_millicores < cpu_millicores:
            return f"{self.cpu_free_millicores}m CPU free, {cpu_millicores}m needed"
        if self.memory_free_mib < memory_mib:
            return f"{self.memory_free_mib} MiB memory free, {memory_mib} MiB needed"
        return None


def gpu_label(labels: Mapping[str, str]) -> str | None:
    """``key=value`` of the first label of :data:`TYPE_LABELS` the node has."""
    for key in TYPE_LABELS:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return f"{key}={value}"
    return None


def tolerates(tolerations: Iterable[Toleration], taint: Mapping[str, Any]) -> bool:
    """Whether one of ``tolerations`` tolerates ``taint``, by the API server's matching rules."""
    for toleration in tolerations:
        if toleration.effect and toleration.effect != taint.get("effect"):
            continue
        if not toleration.key:  # an empty key with Exists tolerates every taint
            return True
        if toleration.key != taint.get("key"):
            continue
        if toleration.operator == "Exists" or (toleration.value or "") == (taint.get("value") or ""):
            return True
    return False


def _floor(value: Fraction) -> int:
    return max(0, value.numerator // value.denominator)


def _excluded(
    node: Mapping[str, Any], node_selector: Mapping[str, str], tolerations: Sequence[Toleration]
) -> str | None:
    metadata, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    labels = metadata.get("labels") or {}
    wrong = [f"{k}={v}" for k, v in node_selector.items() if labels.get(k) != v]
    if wrong:
        return f"does not match the pool's node_selector ({', '.join(wrong)})"
    if spec.get("unschedulable"):
        return "is cordoned (unschedulable)"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in _BLOCKING and not tolerates(tolerations, taint):
            shown = f"{taint.get('key')}={taint.get('value')}" if taint.get("value") else str(taint.get("key"))
            return f"has the taint {shown}:{taint.get('effect')}, which the pool's tolerations do not tolerate"
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    if ready and ready[0].get("status") != "True":
        return "is not Ready"
    return None


def rooms(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    gpu_resource: str,
    node_selector: Mapping[str, str],
    tolerations: Sequence[Toleration],
) -> list[NodeRoom]:
    """Every node, with its GPU type, what is free on it and whether the pool's pods may go there."""
    return rooms_from_usage(
        nodes, node_usage(pods), gpu_resource=gpu_resource, node_selector=node_selector, tolerations=tolerations
    )


def rooms_from_usage(
    nodes: Iterable[Mapping[str, Any]],
    held: Mapping[str, Mapping[str, Fraction]],
    *,
    gpu_resource: str,
    node_selector: Mapping[str, str],
    tolerations: Sequence[Toleration],
) -> list[NodeRoom]:
    """:func:`rooms` from what the live pods hold on each node (:func:`levers9.kube.node_usage`)."""
    found: list[NodeRoom] = []
    for node in nodes:
        metadata, status = node.get("metadata") or {}, node.get("status") or {}
        name = str(metadata.get("name") or "")
        labels = metadata.get("labels") or {}
        allocatable = status.get("allocatable") or {}
        used = held.get(name, {})
        gpu, labelled = from_k8s_labels(labels)
        gpus_total = int(quantity(allocatable, gpu_resource)) if gpu_resource in allocatable else labelled
        gpus_free = max(0, int(quantity(allocatable, gpu_resource) - used.get(gpu_resource, Fraction(0))))
        cpu_free = quantity(allocatable, "cpu") - used.get("cpu", Fraction(0))
        memory_free = quantity(allocatable, "memory") - used.get("memory", Fraction(0))
        found.append(
            NodeRoom(
                name=name,
                gpu=gpu,
                type_label=gpu_label(labels),
                gpus_total=gpus_total,
                gpus_free=gpus_free,
                cpu_free_millicores=_floor(cpu_free * 1000),
                memory_free_mib=_floor(memory_free / (1024 * 1024)),
                excluded=_excluded(node, node_selector, tolerations),
            )
        )
    return sorted(found, key=lambda r: r.name)


def describe_misses(misses: Sequence[tuple[str, str]], limit: int = 4) -> str:
    """``node-a: 0 of 1 GPUs free, 1 needed; node-b: is cordoned`` for the first ``limit`` nodes, and a count."""
    shown = "; ".join(f"{name}: {why}" for name, why in misses[:limit])
    more = len(misses) - limit
    return shown + (f"; and {more} more nodes" if more > 0 else "")


def check_room(rooms: Iterable[NodeRoom], request: ProvisionRequest, where: str, no_nodes: str) -> None:
    """Return when one of ``rooms`` can take the request's worker; else raise InsufficientCapacity naming each miss.

    A node misses when it is not of the offer's instance type (its type label), has no GPUs of the request's type,
    or lacks room (:meth:`NodeRoom.shortfall`). ``no_nodes`` is what the error says when there were no rooms at all
    (a cluster with no nodes, an agent that reported none). Both Kubernetes providers check with this before they
    create a Job, so a refusal reads the same from either.
    """
    resources = request.resources
    label = request.offer.instance_type if request.offer is not None else None
    misses: list[tuple[str, str]] = []
    for room in rooms:
        if label and room.type_label != label:
            misses.append((room.name, f"not a {label} node"))
            continue
        if resources.gpu_count and room.gpu != resources.gpu:
            misses.append((room.name, f"has no {resources.gpu} GPUs"))
            continue
        short = room.shortfall(resources.gpu_count, resources.cpu_millicores, resources.memory_mib)
        if short is None:
            return
        misses.append((room.name, short))
    shape = f"{resources.gpu_count}x {resources.gpu}, " if resources.gpu_count else ""
    raise InsufficientCapacity(
        f"{where}: no node has room for a worker ({shape}{resources.cpu_millicores}m CPU, "
        f"{resources.memory_mib} MiB) now: {describe_misses(misses) or no_nodes}",
        code="NoNodeFits",
    )
