"""An attached cluster's Inventory message, made of what its agent's Kubernetes backend reads.

:func:`build_k8s_inventory` turns :meth:`levers9.agent.k8s_workers.K8sWorkers.inventory_details`
(the trimmed nodes, what the live pods request on each, the workers) into the
``agent_pb2.Inventory`` the controlplane stores. Invariants: CPU and memory
totals are the nodes' allocatable summed; free figures count only Ready,
uncordoned nodes, each its allocatable less what its live pods request (never
below zero); a node's GPUs are its device plugin's allocatable, else its
labelled count; a node with GPUs of no known type is named under
``details.unsupported_gpus`` rather than counted; the details go out as they
came (sorted JSON), so an unchanged cluster sends the same message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from levers9.kube import quantity, unusable
from levers9.proto.v1 import agent_pb2

__all__ = ["GPU_RESOURCES", "GpuType", "build_k8s_inventory"]

log = logging.getLogger(__name__)

#: the extended resources device plugins advertise whole GPUs as; the first one a node has counts
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
#: a node's canonical GPU type and labelled GPU count from its labels (``levers9.gpu.from_k8s_labels``)
GpuType = Callable[[Mapping[str, str]], tuple[str | None, int]]


def _gpu_count(allocatable: Mapping[str, Any], labelled: int) -> tuple[str | None, Fraction]:
    for resource in GPU_RESOURCES:
        if resource in allocatable:
            return resource, quantity(allocatable, resource)
    return None, Fraction(labelled)


def _floor(value: Fraction) -> int:
    return max(0, value.numerator // value.denominator)


def build_k8s_inventory(
    agent_id: str, details: Mapping[str, Any], *, gpu_type: GpuType | None = None
) -> agent_pb2.Inventory:
    """The Inventory message of :meth:`K8sWorkers.inventory_details` (``agent_id``: whose, for the log).

    CPU and memory are the nodes' allocatable, summed; the free figures count only Ready, uncordoned nodes, each
    its allocatable less what its live pods request. ``gpus``: per canonical GPU type (``gpu_type`` of each
    node's labels: pass ``levers9.gpu.from_k8s_labels``), the nodes' GPUs (the device plugin's allocatable
    ``nvidia.com/gpu`` or ``amd.com/gpu``, else the labelled count) and how many no pod requests; a node with
    GPUs of no known type is listed under ``details.unsupported_gpus`` instead. Without ``gpu_type`` (the agent's
    layer may not import :mod:`levers9.gpu`) ``gpus`` is empty and the controlplane types the nodes from their
    labels in ``details``. ``machines``: the workers whose pod runs.
    """
    nodes = [n for n in details.get("nodes") or [] if isinstance(n, dict)]
    requested = details.get("requested") or {}
    cpu = memory = Fraction(0)
    free_cpu = free_memory = Fraction(0)
    counts: dict[str, list[int]] = {}
    unsupported: list[str] = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        labels = (node.get("metadata") or {}).get("labels") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        used = {k: quantity(requested.get(name) or {}, k) for k in (requested.get(name) or {})}
        usable = unusable(node) is None and not (node.get("spec") or {}).get("unschedulable")
        node_cpu, node_memory = quantity(allocatable, "cpu"), quantity(allocatable, "memory")
        cpu += node_cpu
        memory += node_memory
        if usable:
            free_cpu += max(Fraction(0), node_cpu - used.get("cpu", Fraction(0)))
            free_memory += max(Fraction(0), node_memory - used.get("memory", Fraction(0)))
        if gpu_type is None:
            continue
        gpu, labelled = gpu_type(labels)
        resource, total = _gpu_count(allocatable, labelled)
        if total <= 0:
            continue
        if gpu is None:
            unsupported.append(name)
            continue
        held = used.get(resource, Fraction(0)) if resource else Fraction(0)
        entry = counts.setdefault(gpu, [0, 0])
        entry[0] += _floor(total)
        entry[1] += _floor(total - held) if usable else 0
    reported = dict(details)
    if unsupported:
        reported["unsupported_gpus"] = unsupported
    workers = [w for w in details.get("workers") or [] if isinstance(w, dict)]
    machines = sorted(
        str(w["machine_id"])
        for w in workers
        if w.get("machine_id") and w.get("phase") == "Running" and not w.get("deleting")
    )
    log.debug("agent %s: inventory of %d nodes, %d workers", agent_id, len(nodes), len(workers))
    return agent_pb2.Inventory(
        cpu_millicores=_floor(cpu * 1000),
        memory_mib=_floor(memory / 2**20),
        free_cpu_millicores=_floor(free_cpu * 1000),
        free_memory_mib=_floor(free_memory / 2**20),
        gpus=[agent_pb2.GpuCapacity(gpu=name, count=n, free=free) for name, (n, free) in sorted(counts.items())],
        machines=machines,
        details_json=json.dumps(reported, sort_keys=True, separators=(",", ":")),
    )
