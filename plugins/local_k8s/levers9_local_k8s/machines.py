"""A worker Job and its pod, as the machine levers9 tracks (state, reason, where it runs).

========================================  ===========  ==========================================
what the API says                         state        reason
========================================  ===========  ==========================================
the Job is being deleted                  stopping
the Job failed (``Failed`` condition)     failed       the condition's reason and message, and
                                                       the container's exit code and reason
the Job completed (the worker exited 0)   terminated
no pod, its creation refused (the Job's   failed       ``the worker's pod cannot start:
``FailedCreate`` event: Pod Security...)               FailedCreate: <the API's words>``
the pod Pending, its container waiting    failed       ``the worker's pod cannot start:
on ErrImagePull, ImagePullBackOff,                     <reason>: <the kubelet's words>``
InvalidImageName, CreateContainerConfig-
Error... (:data:`levers9.kube.CANNOT_START`)
no pod yet, or the pod is Pending         pending      ``FailedScheduling: <the scheduler's
                                                       message>`` when the pod cannot be placed;
                                                       the container's waiting reason (an image
                                                       that cannot be pulled) otherwise
the pod is Running                        running
the pod Succeeded / Failed                terminated / failed (as the Job)
========================================  ===========  ==========================================

A pending machine's reason is not an end: the cluster may still make room (a
node autoscaler, a pod that finishes). The core waits until the machine's
registration deadline, then terminates it and counts the reason as the offer's
miss. A pod that can never start is: no deadline mends an image that cannot be
pulled or a pod the namespace's Pod Security level refuses, so the machine is
failed at once with the cluster's words (a quota refusal of the pod and a
Secret not there yet are waited for: they pass).
"""

from __future__ import annotations

from typing import Any

from levers9.hooks.types import Machine, MachineState, Pool
from levers9.kube import container_detail, start_failure, timestamp, unschedulable
from levers9.kube.jobs import MACHINE_LABEL

__all__ = ["machine_of"]


def _true_conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in status.get("conditions") or [] if c.get("status") == "True"}


def machine_of(
    pool: Pool,
    job: dict[str, Any],
    pod: dict[str, Any] | None,
    scheduling: str | None = None,
    refused: str | None = None,
) -> Machine:
    """The machine ``job`` (and its newest pod) stands for; ``scheduling``: a FailedScheduling event's message;
    ``refused``: why the Job's pod cannot be created (:func:`levers9.kube.create_failure` of its events)."""
    metadata = job.get("metadata") or {}
    status = job.get("status") or {}
    conditions = _true_conditions(status)
    pod_status = (pod or {}).get("status") or {}
    phase = pod_status.get("phase")
    reason: str | None = None
    if metadata.get("deletionTimestamp"):
        state = MachineState.STOPPING
    elif "Failed" in conditions or phase == "Failed":
        state = MachineState.FAILED
        failed = conditions.get("Failed") or {}
        said = ": ".join(str(w) for w in (failed.get("reason"), failed.get("message")) if w)
        detail = container_detail(pod) if pod else None
        reason = "; ".join(p for p in (said, detail) if p) or "the Job failed"
    elif "Complete" in conditions or phase == "Succeeded":
        state = MachineState.TERMINATED
        reason = "the worker exited"
    elif phase == "Running":
        state = MachineState.RUNNING
    elif (blocked := start_failure(pod) if pod is not None else refused) is not None:
        state = MachineState.FAILED
        reason = f"the worker's pod cannot start: {blocked}"
    else:
        state = MachineState.PENDING
        message = (unschedulable(pod) if pod else None) or scheduling
        if message:
            reason = f"FailedScheduling: {message}"
        elif pod is not None:
            reason = container_detail(pod)
    spec = (pod or {}).get("spec") or {}
    namespace = metadata.get("namespace") or ""
    return Machine(
        provider_id=str(metadata.get("name")),
        machine_id=(metadata.get("labels") or {}).get(MACHINE_LABEL),
        pool=pool.name,
        state=state,
        gpu=pool.gpu,
        gpu_count=pool.gpu_count,
        region=pool.region,
        address=pod_status.get("podIP"),
        created_at=timestamp(metadata.get("creationTimestamp")),
        provider_data={"namespace": namespace, **({"node": spec["nodeName"]} if spec.get("nodeName") else {})},
        reason=reason,
    )
