"""The objects one worker machine is made of in Kubernetes: a Job running the worker, and a Secret with its token.

Both are built from the provision request alone, so a retried provision
builds the very same objects and the API's 409 on the fixed names makes the
retry idempotent:

* **Job** ``levers9-<machine id>`` (lowercased, ``_`` -> ``-``), labels
  ``levers9/machine-id``, ``levers9/pool`` and ``levers9/owner`` on the Job,
  its pod and its Secret. The owner is the pool's name (unique on a
  controlplane; an attached cluster's pool is its agent's): ``local_k8s`` and
  an attached cluster's agent each list, adopt and delete only the Jobs and
  Secrets of their own owner, so two levers9 pools may share a namespace
  without one taking the other's workers for its own;
  ``backoffLimit: 0`` and ``restartPolicy: Never`` (a worker that dies is not
  restarted in place: levers9 replaces the machine); the container runs
  :func:`levers9.bootstrap.container_spec` of the request's bootstrap with the
  pool's ``worker_image``; requests are the pool's CPU and memory, the memory
  also its limit, and the GPUs the limit (and request) of the pool's
  ``gpu_resource_name``; the pool's node selector, tolerations, service
  account, pull secrets and priority class; when the offer names the label of
  a GPU type (``nvidia.com/gpu.product=NVIDIA-L4``) a required node affinity
  on it, so the pod lands on a node of that type and no other; the service
  account token is not mounted (the worker never calls the Kubernetes API).
* **A runc or gVisor pool** (:data:`~levers9.worker_container.OCI_RUNTIMES`):
  the worker runs containers of its own, which needs what
  :mod:`levers9.agent.runtime_access` lists for a Docker worker container. A
  pod gets it as ``securityContext.privileged: true`` (capabilities, no
  seccomp or AppArmor confinement, /proc unmasked, cgroups writable) and an
  ``emptyDir`` volume ``worker-state`` at ``/var/lib/levers9`` with
  ``LEVERS9_WORKER_STATE_DIR=/var/lib/levers9/worker``: the container's own
  root is overlayfs, on which image layers can be neither unpacked as an
  overlay's upper directory nor idmapped. Privileged is the operator's
  consent, never implied: such a pool whose settings leave ``privileged``
  false is refused (:func:`check_privileged`, a ValueError naming the pool,
  the runtime and the setting), at provision and by the provider's check.
  Such a pod needs a namespace whose Pod Security level is ``privileged``.
* **A pod that is not privileged** (a ``process`` pool whose ``privileged``
  setting is false) passes Pod Security's ``baseline`` level
  (:func:`pod_security_level`) and asks what ``restricted`` asks where the
  worker allows it: no privilege escalation, ``NET_RAW`` dropped, the
  runtime's default seccomp profile. It runs as root with the runtime's
  default capabilities otherwise, since the ``process`` runtime runs each
  call as ``nobody`` and a worker that cannot switch users refuses to run
  calls (``restricted``'s non-root and ``drop: [ALL]`` would take that away).
* **Secret** ``levers9-<machine id>-token`` holding the join token, read by
  the container through ``secretKeyRef`` (never in the Job's spec); it is
  created owned by the Job (:func:`owner_reference`), so deleting the Job
  (background propagation) deletes it too.

Shared by ``local_k8s`` (which creates these objects through the API) and
``attached_cluster`` (whose agent creates them in the customer's cluster), so
both build the same worker pod; what either's settings say about the pod is
read through :class:`PodSettings`, which ``local_k8s``'s settings satisfy as
they are and an attached cluster's give as a :class:`WorkerPod`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from levers9.bootstrap import container_spec
from levers9.hooks.types import ProvisionRequest
from levers9.kube.shapes import Toleration
from levers9.worker_container import OCI_RUNTIMES, STATE_DIR, STATE_MOUNT

__all__ = [
    "CONTAINER",
    "FINISHED_JOB_TTL_S",
    "MACHINE_LABEL",
    "OWNER_LABEL",
    "POOL_LABEL",
    "STATE_VOLUME",
    "STOP_GRACE_S",
    "PodSettings",
    "WorkerPod",
    "check_privileged",
    "job_manifest",
    "job_name",
    "owner_reference",
    "pod_security_level",
    "secret_manifest",
    "secret_name",
]

MACHINE_LABEL = "levers9/machine-id"
POOL_LABEL = "levers9/pool"
#: who acts on a worker's Job and Secret: the pool's name (see the module docstring)
OWNER_LABEL = "levers9/owner"
CONTAINER = "worker"
#: SIGTERM to SIGKILL for a worker pod: the worker stops its calls 3 s before (LEVERS9_STOP_GRACE_S)
STOP_GRACE_S = 30
#: the emptyDir volume of a runc or gvisor worker's state directory and image cache
STATE_VOLUME = "worker-state"
#: what a worker pod that is not privileged runs with (Pod Security ``baseline``; see the module docstring)
_CONFINED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["NET_RAW"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
#: seconds a finished worker Job is kept for inspection before Kubernetes deletes it, unless settings say otherwise
FINISHED_JOB_TTL_S = 3600
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


class PodSettings(Protocol):
    """What a pool's settings say about its worker pods (``LocalK8sSettings`` has these fields as they are)."""

    @property
    def namespace(self) -> str: ...
    @property
    def worker_image(self) -> str: ...
    @property
    def service_account(self) -> str | None: ...
    @property
    def node_selector(self) -> Mapping[str, str]: ...
    @property
    def tolerations(self) -> Sequence[Toleration]: ...
    @property
    def gpu_resource_name(self) -> str: ...
    @property
    def image_pull_secrets(self) -> Sequence[str]: ...
    @property
    def privileged(self) -> bool: ...
    @property
    def priority_class_name(self) -> str | None: ...
    @property
    def ttl_seconds_after_finished(self) -> int | None: ...
    @property
    def active_deadline_seconds(self) -> int | None: ...


@dataclass(frozen=True)
class WorkerPod:
    """:class:`PodSettings` built field by field, for settings that name only some of them (an attached cluster)."""

    namespace: str
    worker_image: str
    service_account: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Toleration] = ()
    gpu_resource_name: str = "nvidia.com/gpu"
    image_pull_secrets: Sequence[str] = ()
    privileged: bool = False
    priority_class_name: str | None = None
    ttl_seconds_after_finished: int | None = FINISHED_JOB_TTL_S
    active_deadline_seconds: int | None = None


def job_name(machine_id: str) -> str:
    """``levers9-<machine id>`` as a DNS label (at most 63 characters)."""
    name = "levers9-" + _NOT_NAME.sub("-", machine_id.lower()).strip("-")
    return name[:63].rstrip("-")


def secret_name(machine_id: str) -> str:
    return job_name(machine_id) + "-token"


def _labels(request: ProvisionRequest) -> dict[str, str]:
    return {
        MACHINE_LABEL: request.machine_id,
        POOL_LABEL: request.pool.name,
        OWNER_LABEL: request.pool.name,
        "app.kubernetes.io/name": "levers9-worker",
        "app.kubernetes.io/managed-by": "levers9",
    }


def secret_manifest(request: ProvisionRequest, settings: PodSettings) -> dict[str, Any]:
    spec = container_spec(request.bootstrap.model_copy(update={"worker_image": settings.worker_image}))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(request.machine_id),
            "namespace": settings.namespace,
            "labels": _labels(request),
        },
        "type": "Opaque",
        "stringData": dict(spec.secret_env),
    }


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The ownerReference that ties an object's life to ``job`` (as the API returned it, with its uid)."""
    metadata = job.get("metadata") or {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": metadata.get("name"),
        "uid": metadata.get("uid"),
        "controller": False,
        "blockOwnerDeletion": False,
    }


def _toleration(toleration: Toleration) -> dict[str, Any]:
    shown: dict[str, Any] = {"operator": toleration.operator}
    if toleration.key:
        shown["key"] = toleration.key
    if toleration.value:
        shown["value"] = toleration.value
    if toleration.effect:
        shown["effect"] = toleration.effect
    if toleration.toleration_seconds is not None:
        shown["tolerationSeconds"] = toleration.toleration_seconds
    return shown


def check_privileged(pool: str, runtime: str, privileged: bool, *, setting: str = "settings.privileged") -> None:
    """ValueError when pool ``pool``'s ``runtime`` needs a privileged worker pod and ``privileged`` is false."""
    if runtime in OCI_RUNTIMES and not privileged:
        raise ValueError(
            f"pool {pool!r} runs runtime {runtime!r}, whose workers start containers inside their pod: that needs "
            f"a privileged pod, which this pool's {setting} (false) does not allow; set {setting}: true to consent, "
            "or use runtime 'process'"
        )


def pod_security_level(privileged: bool) -> str:
    """The Pod Security Standard level a worker namespace must allow: ``privileged`` for a privileged pool
    (runtimes runc and gvisor need it), else ``baseline``, which every other worker pod passes."""
    return "privileged" if privileged else "baseline"


def job_manifest(request: ProvisionRequest, settings: PodSettings) -> dict[str, Any]:
    """The Job of ``request`` (see the module docstring); ValueError for a runc or gvisor pool not privileged."""
    runtime = request.pool.runtime
    check_privileged(request.pool.name, runtime, settings.privileged)
    nested = runtime in OCI_RUNTIMES
    bootstrap = request.bootstrap.model_copy(update={"worker_image": settings.worker_image})
    environment = dict(bootstrap.environment)
    environment.setdefault("LEVERS9_STOP_GRACE_S", str(STOP_GRACE_S))
    if nested:
        environment["LEVERS9_WORKER_STATE_DIR"] = STATE_DIR
    spec = container_spec(bootstrap.model_copy(update={"environment": environment}))
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in spec.env.items()]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name(request.machine_id), "key": k}}}
        for k in spec.secret_env
    ]
    resources = request.resources
    requests: dict[str, str] = {"cpu": f"{resources.cpu_millicores}m", "memory": f"{resources.memory_mib}Mi"}
    limits: dict[str, str] = {"memory": f"{resources.memory_mib}Mi"}
    if resources.gpu_count:
        requests[settings.gpu_resource_name] = str(resources.gpu_count)
        limits[settings.gpu_resource_name] = str(resources.gpu_count)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": list(spec.command),
        "env": env,
        "resources": {"requests": requests, "limits": limits},
    }
    container["securityContext"] = {"privileged": True} if settings.privileged else copy.deepcopy(_CONFINED)
    if nested:
        container["volumeMounts"] = [{"name": STATE_VOLUME, "mountPath": STATE_MOUNT}]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        # no service-link variables (LEVERS9_GRPC_PORT...) from the controlplane's Services in the namespace
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": STOP_GRACE_S,
        "containers": [container],
    }
    if nested:
        pod["volumes"] = [{"name": STATE_VOLUME, "emptyDir": {}}]
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    if settings.node_selector:
        pod["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod["tolerations"] = [_toleration(t) for t in settings.tolerations]
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    if settings.priority_class_name:
        pod["priorityClassName"] = settings.priority_class_name
    type_label = request.offer.instance_type if request.offer is not None else None
    if type_label and "=" in type_label:
        key, _, value = type_label.partition("=")
        term = {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        pod["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": _labels(request)}, "spec": pod},
    }
    if settings.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = settings.ttl_seconds_after_finished
    if settings.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(request.machine_id), "namespace": settings.namespace, "labels": _labels(request)},
        "spec": job_spec,
    }
