"""The ``local_k8s`` provider's hooks: nodes as offers, one Job per worker, labels to find them again.

* offers (:meth:`K8sProvider.levers9_gpu_offers`): the nodes (``list_node``) and the
  pods bound to them (``list_pod_for_all_namespaces``) give each node's GPU
  type and free GPUs (:mod:`levers9.kube.rooms`); one offer per GPU-type
  label among the nodes the pool may use (``instance_type`` is that label,
  ``nvidia.com/gpu.product=NVIDIA-L4``), ``available`` when one of them has
  ``gpu_count`` GPUs free now, else ``unavailable``; no price, no zone. A CPU
  pool has none.
* provision: a Job that already exists for the machine id (a retry) is
  answered as it is. Otherwise, before anything is created, the same room
  computation must find a node where the worker fits now (else
  ``InsufficientCapacity`` naming each node's shortfall: the scheduler fails
  over at once rather than leaving a pod pending), and the namespace's
  ResourceQuotas must have room for one more Job, pod, its CPU, memory and
  GPUs (else ``QuotaExceeded`` naming the quota). Then the Job
  (:mod:`levers9.kube.jobs`), and the Secret with the token, owned by the
  Job from its creation (the pod waits for it, as a kubelet retries a missing
  Secret). A Secret that cannot be created takes its Job with it.
* terminate: the Job deleted with ``propagationPolicy: Background`` (the API's
  default for a Job orphans its pod), then the Secret in case it was never
  owned; 404 is success for both.
* list: the pool's own Jobs (labelled ``levers9/pool`` and ``levers9/owner``
  with its name: never an attached cluster agent's in the same namespace),
  each with its newest pod (:mod:`levers9_local_k8s.machines`); a pending pod
  the scheduler cannot place carries its ``FailedScheduling`` message as the
  machine's reason; a pod that can never start (an image that cannot be
  pulled; a Job whose pod the API refuses, Pod Security admission, read from
  the Job's ``FailedCreate`` events) is FAILED at once with the cluster's
  words, so the call does not wait out the registration deadline.
* check: the namespace is readable, and a SelfSubjectAccessReview says these
  credentials may create Jobs and Secrets there and list nodes.

Every API failure is translated by :mod:`levers9_local_k8s.errors` with a
message naming the pool, the namespace and the object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from typing import Any, NoReturn, TypeVar

from levers9.gpu.catalog import CATALOG
from levers9.hooks.errors import InvalidRequest, ProviderError, QuotaExceeded
from levers9.hooks.markers import hookimpl
from levers9.hooks.provider import ProviderPlugin
from levers9.hooks.spec import SPEC_VERSION
from levers9.hooks.types import (
    Availability,
    GpuOffer,
    Machine,
    Pool,
    ProviderCheck,
    ProvisionRequest,
    settings_of,
)
from levers9.kube import api_status, create_failure, parse_quantity, unschedulable
from levers9.kube.jobs import (
    MACHINE_LABEL,
    OWNER_LABEL,
    POOL_LABEL,
    check_privileged,
    job_manifest,
    job_name,
    owner_reference,
    secret_manifest,
    secret_name,
)
from levers9.kube.rooms import NodeRoom, check_room, rooms
from levers9_local_k8s.client import Clients, Cluster
from levers9_local_k8s.errors import translate
from levers9_local_k8s.machines import machine_of
from levers9_local_k8s.settings import LocalK8sSettings

__all__ = ["K8sProvider"]

T = TypeVar("T")


def _settings(pool: Pool) -> LocalK8sSettings:
    return settings_of(pool, LocalK8sSettings)


def _typed(where: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except ProviderError:
        raise
    except Exception as exc:
        typed = translate(exc, where)
        if typed is None:
            raise
        raise typed from None


def _fail(exc: Exception, where: str) -> NoReturn:
    typed = translate(exc, where)
    if typed is None:
        raise exc
    raise typed from None


class K8sProvider(ProviderPlugin):
    """The ``local_k8s`` plugin object, its methods the hooks; its state: the API clients of the pools' clusters."""

    LEVERS9_SPEC_VERSION = SPEC_VERSION
    settings_model = LocalK8sSettings

    def __init__(self) -> None:
        super().__init__()
        self.clients = Clients()

    def close(self) -> None:
        self.clients.close()

    def _cluster(self, settings: LocalK8sSettings, where: str) -> Cluster:
        return _typed(where, lambda: self.clients.cluster(settings))

    def _rooms(self, cluster: Cluster, settings: LocalK8sSettings, where: str) -> list[NodeRoom]:
        nodes = _typed(where, cluster.nodes)
        pods = _typed(where, lambda: cluster.pods())
        return rooms(
            nodes,
            pods,
            gpu_resource=settings.gpu_resource_name,
            node_selector=settings.node_selector,
            tolerations=settings.tolerations,
        )

    # ------------------------------------------------------------------ offers

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if not pool.gpu or pool.gpu_count < 1:
            return []
        settings = _settings(pool)
        where = f"reading the nodes for pool {pool.name!r}"
        found = self._rooms(self._cluster(settings, where), settings, where)
        by_label: dict[str, list[NodeRoom]] = {}
        for room in found:
            if room.excluded or room.gpu != pool.gpu or room.gpus_total < pool.gpu_count or room.type_label is None:
                continue
            by_label.setdefault(room.type_label, []).append(room)
        offers = []
        for label, nodes in sorted(by_label.items()):
            free = any(n.gpus_free >= pool.gpu_count for n in nodes)
            offers.append(
                GpuOffer(
                    gpu=pool.gpu,
                    gpu_count=pool.gpu_count,
                    gpu_memory_mib=CATALOG[pool.gpu].memory_mib,
                    region=pool.region,
                    instance_type=label,
                    availability=Availability.AVAILABLE if free else Availability.UNAVAILABLE,
                )
            )
        return offers

    # ------------------------------------------------------------------ provision

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        pool = request.pool
        settings = _settings(pool)
        namespace, name = settings.namespace, job_name(request.machine_id)
        where = f"pool {pool.name!r}: Job {name} in namespace {namespace}"
        try:  # before anything is asked of the cluster: a runc or gvisor pool needs the operator's consent
            check_privileged(pool.name, pool.runtime, settings.privileged)
        except ValueError as exc:
            raise InvalidRequest(str(exc), code="PrivilegedNeeded") from None
        cluster = self._cluster(settings, where)
        existing = self._existing(cluster, namespace, name, where)
        if existing is not None:
            return machine_of(pool, existing, None).model_copy(update={"machine_id": request.machine_id})
        self._check_room(cluster, request, settings, where)
        self._check_quota(cluster, request, settings, where)
        try:
            job = cluster.create_job(namespace, job_manifest(request, settings))
        except Exception as exc:
            if api_status(exc) != 409:
                _fail(exc, where)
            job = _typed(where, lambda: cluster.job(namespace, name))  # a retry whose first answer was lost
        # the token's Secret, owned by the Job from its creation: deleting the Job deletes it, and nothing else
        # ever holds it unowned (the pod waits for it, as a kubelet retries a missing Secret)
        secret = secret_manifest(request, settings)
        secret["metadata"]["ownerReferences"] = [owner_reference(job)]
        try:
            cluster.create_secret(namespace, secret)
        except Exception as exc:
            if api_status(exc) != 409:  # 409: the same machine's Secret, made by the first try
                with contextlib.suppress(Exception):  # best effort: the failure below is what matters
                    cluster.delete_job(namespace, name)
                _fail(exc, f"{where}: creating its Secret")
        return machine_of(pool, job, None).model_copy(update={"machine_id": request.machine_id})

    def _existing(self, cluster: Cluster, namespace: str, name: str, where: str) -> dict[str, Any] | None:
        try:
            return cluster.job(namespace, name)
        except Exception as exc:
            if api_status(exc) == 404:
                return None
            _fail(exc, where)

    def _check_room(self, cluster: Cluster, request: ProvisionRequest, settings: LocalK8sSettings, where: str) -> None:
        check_room(self._rooms(cluster, settings, where), request, where, "the cluster has no nodes")

    def _check_quota(self, cluster: Cluster, request: ProvisionRequest, settings: LocalK8sSettings, where: str) -> None:
        resources = request.resources
        gpu = settings.gpu_resource_name
        asked: dict[str, Fraction] = {
            "count/jobs.batch": Fraction(1),
            "pods": Fraction(1),
            "count/pods": Fraction(1),
            "count/secrets": Fraction(1),
            "secrets": Fraction(1),
            "requests.cpu": Fraction(resources.cpu_millicores, 1000),
            "cpu": Fraction(resources.cpu_millicores, 1000),
            "requests.memory": Fraction(resources.memory_mib * 1024 * 1024),
            "memory": Fraction(resources.memory_mib * 1024 * 1024),
            "limits.memory": Fraction(resources.memory_mib * 1024 * 1024),
        }
        if resources.gpu_count:
            asked[f"requests.{gpu}"] = Fraction(resources.gpu_count)
            asked[f"limits.{gpu}"] = Fraction(resources.gpu_count)
        for quota in _typed(where, lambda: cluster.quotas(settings.namespace)):
            status = quota.get("status") or {}
            hard, used = status.get("hard") or {}, status.get("used") or {}
            for resource, amount in asked.items():
                if resource not in hard:
                    continue
                try:
                    limit, held = parse_quantity(hard[resource]), parse_quantity(used.get(resource, 0))
                except ValueError:
                    continue
                if held + amount > limit:
                    name = (quota.get("metadata") or {}).get("name")
                    raise QuotaExceeded(
                        f"{where}: ResourceQuota {name} allows {resource}={hard[resource]} in namespace "
                        f"{settings.namespace}, {used.get(resource, 0)} is used, a worker needs {_shown(amount)} more",
                        code="ExceededQuota",
                    )

    # ------------------------------------------------------------------ terminate, list

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        settings = _settings(pool)
        namespace = str(machine.provider_data.get("namespace") or settings.namespace)
        where = f"pool {pool.name!r}: deleting Job {machine.provider_id} in namespace {namespace}"
        cluster = self._cluster(settings, where)
        try:
            cluster.delete_job(namespace, machine.provider_id)
        except Exception as exc:
            if api_status(exc) != 404:
                _fail(exc, where)
        if machine.machine_id:
            try:
                cluster.delete_secret(namespace, secret_name(machine.machine_id))
            except Exception as exc:
                if api_status(exc) != 404:
                    _fail(exc, f"{where}: its Secret")

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        settings = _settings(pool)
        namespace = settings.namespace
        where = f"listing the Jobs of pool {pool.name!r} in namespace {namespace}"
        cluster = self._cluster(settings, where)
        selector = f"{POOL_LABEL}={pool.name},{OWNER_LABEL}={pool.name}"  # its own Jobs only, not an agent's
        jobs = _typed(where, lambda: cluster.jobs(namespace, selector))
        pods = _typed(where, lambda: cluster.pods(namespace, selector))
        newest: dict[str, dict[str, Any]] = {}
        for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or "")):
            machine_id = ((pod.get("metadata") or {}).get("labels") or {}).get(MACHINE_LABEL)
            if machine_id:
                newest[machine_id] = pod
        machines = []
        for job in jobs:
            machine_id = ((job.get("metadata") or {}).get("labels") or {}).get(MACHINE_LABEL) or ""
            owned = newest.get(machine_id)
            scheduling: str | None = None
            refused: str | None = None
            if owned is not None and (owned.get("status") or {}).get("phase") == "Pending" and not unschedulable(owned):
                scheduling = self._failed_scheduling(cluster, namespace, owned, where)
            if owned is None and not _finished(job):
                refused = self._failed_create(cluster, namespace, job, where)
            machines.append(machine_of(pool, job, owned, scheduling, refused))
        return machines

    def _failed_create(self, cluster: Cluster, namespace: str, job: dict[str, Any], where: str) -> str | None:
        name = (job.get("metadata") or {}).get("name")
        selector = f"involvedObject.kind=Job,involvedObject.name={name},reason=FailedCreate"
        return create_failure(_typed(where, lambda: cluster.events(namespace, selector)))

    def _failed_scheduling(self, cluster: Cluster, namespace: str, pod: dict[str, Any], where: str) -> str | None:
        name = (pod.get("metadata") or {}).get("name")
        found = _typed(where, lambda: cluster.events(namespace, f"involvedObject.name={name},reason=FailedScheduling"))
        if not found:
            return None
        latest = max(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return str(latest.get("message") or "") or None

    # ------------------------------------------------------------------ check

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = _settings(pool)
        namespace = settings.namespace
        where = f"checking pool {pool.name!r} in namespace {namespace}"
        try:
            check_privileged(pool.name, pool.runtime, settings.privileged)
        except ValueError as exc:
            return ProviderCheck(ok=False, message=str(exc), hint="runc and gvisor workers run in privileged pods")
        try:
            cluster = self._cluster(settings, where)
            _typed(where, lambda: cluster.namespace(namespace))
            missing = []
            for verb, resource, group, scope in (
                ("create", "jobs", "batch", namespace),
                ("delete", "jobs", "batch", namespace),
                ("create", "secrets", "", namespace),
                ("list", "nodes", "", None),
                ("list", "pods", "", None),
            ):
                allowed, _ = _typed(where, partial(cluster.allowed, verb, resource, scope, group))
                if not allowed:
                    missing.append(f"{verb} {resource}" + (f" in {scope}" if scope else " (cluster-wide)"))
        except ProviderError as exc:
            return ProviderCheck(ok=False, message=str(exc), hint=_hint(exc, settings))
        if missing:
            return ProviderCheck(
                ok=False,
                message=f"pool {pool.name!r}: the credentials may not {', '.join(missing)}",
                hint="grant them in the Role and ClusterRole `levers9 kubernetes manifests` writes",
            )
        return ProviderCheck(
            ok=True,
            message=f"namespace {namespace} readable; Jobs and Secrets may be created there, nodes and pods listed",
        )


def _finished(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)


def _shown(amount: Fraction) -> str:
    return str(amount.numerator) if amount.denominator == 1 else f"{float(amount):g}"


def _hint(exc: ProviderError, settings: LocalK8sSettings) -> str:
    code = exc.code or ""
    if code == "Kubeconfig":
        return "point the pool's kubeconfig at a readable file (or 'in-cluster'), and its context at one it has"
    if code == "NotFound":
        return f"create the namespace: kubectl create namespace {settings.namespace}"
    if code == "Unreachable":
        return "check that the API server in the kubeconfig is reachable from the controlplane"
    return "fix the pool's settings or the credentials' RBAC, and run `levers9 check` again"
