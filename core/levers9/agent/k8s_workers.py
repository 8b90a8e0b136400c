"""The Kubernetes side of the agent: worker Jobs created, deleted and listed in the agent's own namespace.

It lives in the agent because only the agent uses it (:mod:`levers9.agent.daemon`
and its Kubernetes backend, in the customer's cluster); the controlplane's side of
the same pools is the ``attached_cluster`` plugin and
:mod:`levers9.services.agent_pools`, which never import it.

An agent that runs inside a customer's cluster (``attached_cluster``) carries
out the controlplane's orders through that cluster's API instead of Docker.
The controlplane builds each worker's Job and token Secret (the very objects
``local_k8s`` creates, ``levers9.kube.jobs``) and sends them in the
``provision`` order; :class:`K8sWorkers` checks them
(:mod:`levers9.agent.k8s_objects`), checks that they fit
(:mod:`levers9.kube`), creates them, and reads back what runs,
through :mod:`levers9.agent.k8s_api`. Everything is plain API JSON. The
orders, with the method names of :class:`~levers9.agent.docker_workers.DockerWorkers`:

* ``provision`` ``{"machine_id", "job", "secret"}`` -> ``{"machine_id", "job",
  "namespace", "uid"}``: the Job, then the Secret owned by it (its
  ``ownerReferences`` name the Job's uid, so deleting the Job deletes it);
* ``terminate`` ``{"machine_id"}`` -> ``{"machine_id", "deleted": ["Job ns/name",
  "Secret ns/name"...]}``: the agent's Jobs labelled with the machine id,
  deleted with ``propagationPolicy: Background`` (their pods go with them),
  and the token Secret each one's pod reads (by name: the agent may list no
  Secret; the Secret is owned by its Job, so the garbage collector would take
  it anyway);
* ``list`` -> ``{"workers": [WorkerJob.info()...]}``: every Job of the agent's
  in the namespace with its newest pod's phase, node,
  and the scheduler's message when the pod cannot be placed (its
  ``PodScheduled=False/Unschedulable`` condition, else its ``FailedScheduling``
  event), and ``cannot_start`` when it never will: its container waits on an
  image that cannot be pulled or a configuration the kubelet refuses
  (:func:`levers9.kube.start_failure`), or, with no pod, the Job's
  ``FailedCreate`` event says the API refused its pod (Pod Security
  admission; :func:`levers9.kube.create_failure`). The controlplane fails
  such a machine at once instead of waiting out its registration deadline.

Invariants:

* **The cluster is the state.** Nothing about the workers is kept in memory
  or on disk: every answer is read from the API, so a restarted agent knows
  what the one before it created.
* **Only its own.** The agent's workers are the Jobs and Secrets labelled
  ``levers9/machine-id`` *and* ``levers9/owner=<its owner>`` (its cluster's
  pool; it labels what it creates so, :func:`check_provision`); it lists,
  adopts and deletes nothing else, so a ``local_k8s`` pool's Jobs (or another
  cluster's agent's) in the same namespace are never taken for its own, not
  even by ``remove_mine`` when the cluster is removed. A Job of the order's
  name owned by someone else is refused (``invalid_request``), never adopted.
  :meth:`K8sWorkers.others` names the workers of other owners in the
  namespace, which the daemon refuses to share unless told
  (``--share-namespace``).
* **Idempotent by machine id.** A provision order for a machine whose Job
  exists answers with that Job (a 409 on create is read back the same way),
  and creates its Secret if the first try did not get that far (409 on the
  Secret is fine); a Job of that name labelled for another machine is
  refused. Terminate of what is not there succeeds (404 is success). Orders
  are carried out one at a time, so two provisions never both take the last
  free GPU.
* **Refused before anything is created**, so the controlplane fails over at
  once: an order whose objects are not allowed (``invalid_request``, every
  problem named); no node where the pod fits now (``insufficient_capacity``,
  each node's shortfall named: the kube-scheduler would accept the Job and
  leave its pod pending); no room in one of the namespace's ResourceQuotas for
  one more Job, pod, Secret and the pod's requests and limits
  (``quota_exceeded``: a GPU quota rejects the *pod*, later and only in an
  event). A Secret that cannot be created takes its Job with it (background
  deletion) and the order is refused.
* API failures are refusals with the kinds of :func:`levers9.agent.k8s_api.refusal`
  (``permission_denied``, ``quota_exceeded``, ``authentication_failed``,
  ``invalid_request``, ``throttled``); the controlplane turns each into its
  typed error.
* Secret values are never logged nor put into an answer, a listing or an error.
* **Room without reading the whole cluster.** What each node's pods hold is
  read from every namespace when the agent may list pods cluster-wide (the
  manifest does not grant it; a customer may), else from its own namespace's
  pods only, said once in the log: a node's GPU held by another namespace's
  pod then shows as free, the kube-scheduler leaves the worker's pod pending
  and the listing says why (``FailedScheduling``).

:meth:`K8sWorkers.inventory_details` is the Inventory's ``details`` (the nodes
trimmed to what placement needs, what the live pods request on each, the
workers); :func:`~levers9.agent.k8s_inventory.build_k8s_inventory` (re-exported
here) is the Inventory message made of it.
Calls block: the daemon runs them in threads.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any

from levers9.agent.docker_workers import OrderRefused
from levers9.agent.k8s_api import K8sApi, in_cluster_client, open_api, raise_refusal, typed
from levers9.agent.k8s_inventory import GPU_RESOURCES, GpuType, build_k8s_inventory
from levers9.agent.k8s_objects import (
    MACHINE_LABEL,
    OWNER_LABEL,
    POOL_LABEL,
    ProvisionObjects,
    check_provision,
    machine_id_of,
)
from levers9.kube import (
    api_status,
    as_list,
    as_object,
    container_detail,
    create_failure,
    format_quantity,
    misfit,
    node_usage,
    parse_quantity,
    pod_asks,
    shown,
    start_failure,
    trimmed_node,
    unschedulable,
)

__all__ = ["GPU_RESOURCES", "GpuType", "K8sWorkers", "WorkerJob", "build_k8s_inventory"]

log = logging.getLogger(__name__)

_INVALID = "invalid_request"
_NO_ROOM = "insufficient_capacity"
_QUOTA = "quota_exceeded"
_THROTTLED = "throttled"
#: resources a ResourceQuota also counts under their bare name (``cpu`` = ``requests.cpu``)
_BARE_QUOTA = frozenset({"cpu", "memory", "ephemeral-storage"})


# ---------------------------------------------------------------------------------------------- workers


@dataclass(frozen=True)
class WorkerJob:
    """One worker Job of the namespace and its newest pod, as the ``list`` order and the inventory show them."""

    machine_id: str
    pool: str
    job: str
    namespace: str
    uid: str
    created_at: str | None
    #: the Job is being deleted
    deleting: bool
    #: ``Complete`` or ``Failed`` once the Job finished; None while it runs
    finished: str | None
    #: the Failed condition's reason and message
    finished_reason: str | None
    pod: str | None
    #: the newest pod's phase (None: no pod yet)
    phase: str | None
    node: str | None
    pod_ip: str | None
    #: the scheduler's message for a pod it cannot place (PodScheduled=False/Unschedulable, or FailedScheduling)
    unschedulable: str | None
    #: what the container's state says when it is not running: ``ErrImagePull: ...``, ``container exited 1 (Error)``
    container: str | None
    #: why the worker's pod will never start (``ErrImagePull: ...``, ``FailedCreate: ... violates PodSecurity ...``)
    cannot_start: str | None = None

    def info(self) -> dict[str, Any]:
        return {
            "machine_id": self.machine_id,
            "pool": self.pool,
            "job": self.job,
            "namespace": self.namespace,
            "uid": self.uid,
            "created_at": self.created_at,
            "deleting": self.deleting,
            "finished": self.finished,
            "finished_reason": self.finished_reason,
            "pod": self.pod,
            "phase": self.phase,
            "node": self.node,
            "pod_ip": self.pod_ip,
            "unschedulable": self.unschedulable,
            "container": self.container,
            "cannot_start": self.cannot_start,
        }


def _worker(
    job: Mapping[str, Any], pod: Mapping[str, Any] | None, scheduling: str | None, refused: str | None = None
) -> WorkerJob:
    metadata, status = job.get("metadata") or {}, job.get("status") or {}
    labels = metadata.get("labels") or {}
    finished: str | None = None
    finished_reason: str | None = None
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            finished = str(condition["type"])
            if finished == "Failed":
                said = ": ".join(str(w) for w in (condition.get("reason"), condition.get("message")) if w)
                finished_reason = said or "the Job failed"
    pod_metadata = (pod or {}).get("metadata") or {}
    pod_spec, pod_status = (pod or {}).get("spec") or {}, (pod or {}).get("status") or {}
    phase = pod_status.get("phase") if pod is not None else None
    waiting_for_a_node: str | None = None
    cannot_start: str | None = None
    if pod is not None and phase == "Pending":
        waiting_for_a_node = unschedulable(pod) or scheduling
        cannot_start = start_failure(pod)
    elif pod is None and finished is None:
        cannot_start = refused
    return WorkerJob(
        machine_id=str(labels.get(MACHINE_LABEL) or ""),
        pool=str(labels.get(POOL_LABEL) or ""),
        job=str(metadata.get("name") or ""),
        namespace=str(metadata.get("namespace") or ""),
        uid=str(metadata.get("uid") or ""),
        created_at=metadata.get("creationTimestamp"),
        deleting=bool(metadata.get("deletionTimestamp")),
        finished=finished,
        finished_reason=finished_reason,
        pod=pod_metadata.get("name"),
        phase=phase,
        node=pod_spec.get("nodeName"),
        pod_ip=pod_status.get("podIP"),
        unschedulable=waiting_for_a_node,
        container=container_detail(pod) if pod is not None and phase != "Running" else None,
        cannot_start=cannot_start,
    )


def _owner_of(labels: Mapping[str, Any]) -> str:
    """Who a worker Job belongs to, in words: ``levers9 pool 'gpu'``, or a Job of a levers9 without owner labels."""
    owner = labels.get(OWNER_LABEL)
    if owner:
        return f"levers9 pool {owner!r}"
    pool = labels.get(POOL_LABEL)
    return f"levers9 pool {pool!r} (no {OWNER_LABEL} label)" if pool else f"another levers9 (no {OWNER_LABEL} label)"


def _secrets_of(job: Mapping[str, Any]) -> set[str]:
    """The Secrets a worker Job's pod reads (its token's: :func:`check_provision` allows no other)."""
    pod = as_object(as_object(as_object(job.get("spec")).get("template")).get("spec"))
    names = {
        str(as_object(v.get("secret")).get("secretName"))
        for v in as_list(pod.get("volumes"))
        if isinstance(v, dict) and as_object(v.get("secret")).get("secretName")
    }
    for container in as_list(pod.get("containers")):
        for item in as_list(as_object(container).get("env")):
            ref = as_object(as_object(as_object(item).get("valueFrom")).get("secretKeyRef"))
            if ref.get("name"):
                names.add(str(ref["name"]))
        for item in as_list(as_object(container).get("envFrom")):
            ref = as_object(as_object(item).get("secretRef"))
            if ref.get("name"):
                names.add(str(ref["name"]))
    return names


def _owned_by(pod: Mapping[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in (pod.get("metadata") or {}).get("ownerReferences") or [])


# ---------------------------------------------------------------------------------------------- the manager


class K8sWorkers:
    """The agent's worker Jobs in one namespace of its cluster (see the module docstring).

    ``api_client_factory`` makes the ``kubernetes.client.ApiClient`` on first use (default: the pod's
    in-cluster service account, :func:`~levers9.agent.k8s_api.in_cluster_client`); :meth:`close` closes it.
    ``allow_privileged``: Jobs may run privileged containers (the runc and gvisor runtimes need it).
    ``insecure``: workers may dial a plain-text controlplane (development only).
    ``owner``: the ``levers9/owner`` label value of this agent's workers (default: ``agent_id``).
    """

    def __init__(
        self,
        namespace: str,
        *,
        agent_id: str,
        api_client_factory: Callable[[], Any] | None = None,
        allow_privileged: bool = False,
        insecure: bool = False,
        owner: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.agent_id = agent_id
        self.owner = owner or agent_id
        #: the label selector of this agent's workers (Jobs, their pods, their Secrets)
        self.mine = f"{MACHINE_LABEL},{OWNER_LABEL}={self.owner}"
        self.allow_privileged = allow_privileged
        self.insecure = insecure
        self._factory = api_client_factory or in_cluster_client
        self._orders = threading.Lock()
        self._api_lock = threading.Lock()
        self._made: K8sApi | None = None
        #: False once listing every pod of the cluster was refused (403): its own namespace's pods are counted
        self._all_pods = True

    def close(self) -> None:
        with self._api_lock:
            made, self._made = self._made, None
        if made is not None:
            made.api_client.close()

    def _api(self) -> K8sApi:
        """The API, made on first use. :raises OrderRefused: (plain) no client can be made here."""
        with self._api_lock:
            if self._made is None:
                self._made = open_api(self._factory)
            return self._made

    # -------------------------------------------------------------------------- reading

    def _view(
        self, api: K8sApi, *, besides: str | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Fraction]]]:
        """The trimmed nodes, by name, and what the live pods hold on each; ``besides``: not counting the pods
        of that machine's own Job (an order retried after its first answer was lost finds its pod running)."""
        where = "reading the cluster's nodes and pods"
        nodes = typed(where, api.nodes)
        pods = self._live_pods(api, where)
        if besides is not None:
            pods = [p for p in pods if not self._of_machine(p, besides)]
        return sorted((trimmed_node(n) for n in nodes), key=lambda n: n["metadata"]["name"]), node_usage(pods)

    def _live_pods(self, api: K8sApi, where: str) -> list[dict[str, Any]]:
        """The live pods of the cluster, or, without the right to list them all, of the agent's namespace."""
        if self._all_pods:
            try:
                return api.live_pods()
            except Exception as exc:
                if api_status(exc) != 403:
                    raise_refusal(exc, where)
                self._all_pods = False
                log.warning(
                    "this agent may not list the pods of every namespace: a node's room counts the pods of "
                    "namespace %s only (grant 'list pods' cluster-wide to its ServiceAccount for exact room)",
                    self.namespace,
                )
        return typed(where, partial(api.namespace_live_pods, self.namespace))

    def _of_machine(self, pod: Mapping[str, Any], machine_id: str) -> bool:
        metadata = as_object(pod.get("metadata"))
        labels = as_object(metadata.get("labels"))
        return metadata.get("namespace") == self.namespace and labels.get(MACHINE_LABEL) == machine_id

    def workers(self) -> list[WorkerJob]:
        """Every worker Job of the namespace with its newest pod, by machine id. :raises OrderRefused:."""
        api = self._api()
        where = f"listing the worker Jobs in namespace {self.namespace}"
        jobs = typed(where, partial(api.jobs, self.namespace, self.mine))
        pods = typed(where, partial(api.pods, self.namespace, self.mine))
        found = []
        for job in jobs:
            uid = as_object(job.get("metadata")).get("uid") or ""
            owned = [p for p in pods if _owned_by(p, uid)]
            newest = max(
                owned,
                key=lambda p: (str(p["metadata"].get("creationTimestamp") or ""), str(p["metadata"].get("name"))),
                default=None,
            )
            scheduling = refused = None
            # a pod the scheduler cannot place says so in its PodScheduled condition; else in a FailedScheduling event
            pending = newest is not None and as_object(newest.get("status")).get("phase") == "Pending"
            if newest is not None and pending and not unschedulable(newest):
                scheduling = self._failed_scheduling(api, str(newest["metadata"].get("name")), where)
            if newest is None:  # a pod the API refuses is only in the Job's FailedCreate events
                refused = self._failed_create(api, str(as_object(job.get("metadata")).get("name")), where)
            found.append(_worker(job, newest, scheduling, refused))
        return sorted(found, key=lambda w: (w.machine_id, w.job))

    def _failed_scheduling(self, api: K8sApi, pod_name: str, where: str) -> str | None:
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod_name},reason=FailedScheduling"
        events = typed(where, partial(api.events, self.namespace, selector))
        if not events:
            return None
        latest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return str(latest.get("message") or "") or None

    def _failed_create(self, api: K8sApi, job_name: str, where: str) -> str | None:
        selector = f"involvedObject.kind=Job,involvedObject.name={job_name},reason=FailedCreate"
        return create_failure(typed(where, partial(api.events, self.namespace, selector)))

    def list_containers(self) -> dict[str, Any]:
        """The ``list`` order's result: this namespace's workers."""
        return {"workers": [w.info() for w in self.workers()]}

    def inventory_details(self) -> dict[str, Any]:
        """The Inventory's ``details``: the trimmed nodes, what live pods request on each, and the workers.

        ``{"namespace", "nodes": [Node JSON trimmed to metadata.name/labels, spec.taints/unschedulable,
        status.allocatable and the Ready condition], "requested": {node: {resource: quantity, "pods": count}},
        "workers": [WorkerJob.info()...]}``: a node's free room is its allocatable less its ``requested``.
        Nodes keep their Node shape, so the controlplane's side can read them as ``local_k8s`` reads the API's.
        The same for an unchanged cluster (sorted; no heartbeat times), so no new inventory goes out then.
        :raises OrderRefused:.
        """
        nodes, usage = self._view(self._api())
        requested = {
            node: {name: format_quantity(amount) for name, amount in sorted(held.items())}
            for node, held in sorted(usage.items())
        }
        workers = [w.info() for w in self.workers()]
        return {"namespace": self.namespace, "nodes": nodes, "requested": requested, "workers": workers}

    # -------------------------------------------------------------------------- orders

    def provision(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Create the order's Job and Secret, or answer with the machine's Job that exists. :raises OrderRefused:."""
        objects = check_provision(
            payload, self.namespace, owner=self.owner, allow_privileged=self.allow_privileged, insecure=self.insecure
        )
        with self._orders:
            return self._provision(objects)

    def _provision(self, objects: ProvisionObjects) -> dict[str, Any]:
        api = self._api()
        namespace, name = self.namespace, objects.job_name
        where = f"machine {objects.machine_id}: Job {name} in namespace {namespace}"
        job = self._existing(api, objects, where)
        if job is None:
            self._check_room(api, objects, where)
            self._check_quota(api, objects, where)
            try:
                job = api.create_job(namespace, objects.job)
                log.info("created worker Job %s/%s for machine %s", namespace, name, objects.machine_id)
            except Exception as exc:
                if api_status(exc) != 409:
                    raise_refusal(exc, f"{where}: creating it")
                job = self._existing(api, objects, where)  # a retry whose first answer was lost
                if job is None:  # deleted again in between
                    raise OrderRefused(f"{where}: it existed a moment ago and is gone; try again", _THROTTLED) from None
        uid = str(as_object(job.get("metadata")).get("uid") or "")
        secret = copy.deepcopy(objects.secret)
        secret["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ]
        try:
            api.create_secret(namespace, secret)
        except Exception as exc:
            if api_status(exc) != 409:  # 409: the same machine's Secret, made by the first try
                with contextlib.suppress(Exception):  # best effort: the failure below is what matters
                    api.delete_job(namespace, name)
                raise_refusal(exc, f"{where}: creating its Secret {objects.secret_name} (the Job was deleted again)")
        return {"machine_id": objects.machine_id, "job": name, "namespace": namespace, "uid": uid}

    def _existing(self, api: K8sApi, objects: ProvisionObjects, where: str) -> dict[str, Any] | None:
        """The machine's Job when it exists; None when it does not. :raises OrderRefused: another machine's."""
        try:
            job = api.job(self.namespace, objects.job_name)
        except Exception as exc:
            if api_status(exc) == 404:
                return None
            raise_refusal(exc, where)
        labels = as_object(as_object(job.get("metadata")).get("labels"))
        if labels.get(OWNER_LABEL) != self.owner:
            raise OrderRefused(
                f"{where}: a Job of that name exists and is not this agent's: it belongs to "
                f"{_owner_of(labels)}; it is left alone",
                _INVALID,
            )
        machine = labels.get(MACHINE_LABEL)
        if machine != objects.machine_id:
            raise OrderRefused(
                f"{where}: a Job of that name exists for machine {machine!r}; Job names must be unique per machine",
                _INVALID,
            )
        return job

    def _check_room(self, api: K8sApi, objects: ProvisionObjects, where: str) -> None:
        pod = objects.job["spec"]["template"]["spec"]
        requests, _ = pod_asks(pod)
        nodes, usage = self._view(api, besides=objects.machine_id)
        misses: list[str] = []
        for node in nodes:
            node_name = node["metadata"]["name"]
            why = misfit(pod, requests, node, usage.get(node_name, {}))
            if why is None:
                return
            misses.append(f"{node_name}: {why}")
        asked = ", ".join(f"{name}={format_quantity(amount)}" for name, amount in sorted(requests.items()))
        listed = "; ".join(misses[:4]) + (f"; and {len(misses) - 4} more nodes" if len(misses) > 4 else "")
        raise OrderRefused(
            f"{where}: no node has room for the worker's pod ({asked or 'no requests'}) now: "
            f"{listed or 'the cluster has no nodes'}",
            _NO_ROOM,
        )

    def _check_quota(self, api: K8sApi, objects: ProvisionObjects, where: str) -> None:
        requests, limits = pod_asks(objects.job["spec"]["template"]["spec"])
        asked = dict.fromkeys(("count/jobs.batch", "pods", "count/pods", "secrets", "count/secrets"), Fraction(1))
        for name, amount in requests.items():
            asked[f"requests.{name}"] = amount
            if name in _BARE_QUOTA:
                asked[name] = amount
        for name, amount in limits.items():
            asked[f"limits.{name}"] = amount
        for quota in typed(where, partial(api.quotas, self.namespace)):
            status = as_object(quota.get("status"))
            hard, used = as_object(status.get("hard")), as_object(status.get("used"))
            for resource, amount in sorted(asked.items()):
                if resource not in hard:
                    continue
                try:
                    limit, held = parse_quantity(hard[resource]), parse_quantity(used.get(resource, 0))
                except ValueError:
                    continue
                if held + amount > limit:
                    raise OrderRefused(
                        f"{where}: ResourceQuota {as_object(quota.get('metadata')).get('name')} allows "
                        f"{resource}={hard[resource]} in namespace {self.namespace}, {used.get(resource, 0)} is "
                        f"used, the worker needs {shown(amount)} more",
                        _QUOTA,
                    )

    def terminate(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Delete the machine's Jobs (background: their pods follow) and Secrets; done when none is there."""
        machine_id = machine_id_of(payload, "terminate")
        with self._orders:
            return {"machine_id": machine_id, "deleted": self._terminate(machine_id)}

    def _terminate(self, machine_id: str) -> list[str]:
        api = self._api()
        namespace = self.namespace
        where = f"machine {machine_id}: deleting its Job and Secret in namespace {namespace}"
        deleted: list[str] = []
        jobs = typed(where, partial(api.jobs, namespace, f"{MACHINE_LABEL}={machine_id},{OWNER_LABEL}={self.owner}"))
        secrets = sorted({name for job in jobs for name in _secrets_of(job)})
        for kind, names, delete in (
            ("Job", [str(as_object(j.get("metadata")).get("name")) for j in jobs], api.delete_job),
            ("Secret", secrets, api.delete_secret),
        ):
            for name in names:
                try:
                    delete(namespace, name)
                except Exception as exc:
                    if api_status(exc) == 404:
                        continue
                    raise_refusal(exc, f"{where}: {kind} {name}")
                deleted.append(f"{kind} {namespace}/{name}")
                log.info("deleted worker %s %s/%s of machine %s", kind, namespace, name, machine_id)
        return deleted

    def others(self) -> list[str]:
        """The worker Jobs of the namespace that are not this agent's: ``Job NAME of <owner>`` each, sorted.

        :raises OrderRefused:."""
        api = self._api()
        where = f"listing the worker Jobs in namespace {self.namespace}"
        found = []
        for job in typed(where, partial(api.jobs, self.namespace, MACHINE_LABEL)):
            metadata = as_object(job.get("metadata"))
            labels = as_object(metadata.get("labels"))
            if labels.get(OWNER_LABEL) != self.owner:
                found.append(f"Job {metadata.get('name')} of {_owner_of(labels)}")
        return sorted(found)

    def remove_mine(self) -> list[str]:
        """Delete every worker Job and Secret of this agent's (the cluster was removed); their machine ids.

        Another owner's (a ``local_k8s`` pool's in the same namespace) are left alone."""
        api = self._api()
        where = f"listing the worker Jobs and Secrets in namespace {self.namespace}"
        found: set[str] = set()
        for item in typed(where, partial(api.jobs, self.namespace, self.mine)):
            machine_id = as_object(as_object(item.get("metadata")).get("labels")).get(MACHINE_LABEL)
            if machine_id:
                found.add(str(machine_id))
        for machine_id in sorted(found):
            with self._orders:
                self._terminate(machine_id)
        return sorted(found)
