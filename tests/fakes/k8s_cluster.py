"""A fake Kubernetes cluster for tests: an API server on 127.0.0.1, with a Job controller, a scheduler and a kubelet.

:class:`FakeCluster` serves :class:`tests.fakes.k8s_api.KubeApi` (the REST API,
the object store, admission) on ``http://127.0.0.1:<port>`` and writes a
kubeconfig (:meth:`FakeCluster.kubeconfig`) that the real ``kubernetes`` client
loads unchanged. One background thread (every ``tick_s``, 0.1 s by default) then
does what the cluster's components would do to the objects:

* **Job controller**: a Job that is neither finished, suspended nor being deleted,
  and has no live pod, gets one, named ``<job>-<5 characters>`` (the API server's
  name alphabet), from the Job's template, with the ``job-name``,
  ``batch.kubernetes.io/job-name``, ``controller-uid`` and
  ``batch.kubernetes.io/controller-uid`` labels and a controlling
  ``ownerReference`` to the Job. A pod the API refuses (quota, a missing
  ServiceAccount) is not created; the Job gets a Warning event ``FailedCreate``
  ``Error creating: <the API's message>`` and the controller tries again on later
  ticks. A succeeded pod completes the Job (``SuccessCriteriaMet`` and
  ``Complete``); failed pods beyond ``backoffLimit`` fail it (``FailureTarget``
  and ``Failed``, reason ``BackoffLimitExceeded``); ``activeDeadlineSeconds``
  fails it with ``DeadlineExceeded`` and deletes its pod; below the limit a
  failed pod is replaced at once (no back-off delay). ``status.active``,
  ``ready``, ``terminating``, ``succeeded``, ``failed``, ``startTime`` and
  ``completionTime`` are kept; ``ttlSecondsAfterFinished`` deletes a finished
  Job (foreground, as the TTL controller does).
* **Scheduler**: a pending pod without ``spec.nodeName`` is bound to the first
  node by name that passes, in the default scheduler's order: not
  ``spec.unschedulable`` (unless tolerated); every ``NoSchedule``/``NoExecute``
  taint tolerated; ``nodeSelector`` and required node affinity matched; the pod's
  requests (limits already defaulted into them) within ``status.allocatable``
  less the requests of the unfinished pods bound there, plus one pod within
  ``pods``. A pod that fits nowhere gets ``PodScheduled=False`` reason
  ``Unschedulable`` and one Warning event ``FailedScheduling`` from
  ``default-scheduler`` whose message counts the nodes per reason in the
  scheduler's words (``0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1
  node(s) had untolerated taint {nvidia.com/gpu: present}. preemption: 0/2 nodes
  are available: 1 No preemption victims found for incoming pod, 1 Preemption is
  not helpful for scheduling.``); retries of the same verdict bump the event's
  ``count`` at most every ``event_repeat_s``. No preemption is done.
* **Kubelet**: a bound pod is run on this host through
  :func:`levers9.testing.boot.emulated_boot`: a ``#!/bin/sh`` script that
  ``exec``\\ s the container's argv (``command`` + ``args``; with no ``command``,
  ``args`` alone, as an image without ENTRYPOINT runs them; with neither, the
  image's CMD, :data:`DEFAULT_COMMAND` = the worker image's ``levers9 worker``),
  with the environment from ``envFrom`` (``secretRef``) and ``env`` (``value``
  with ``$(VAR)`` expansion, ``valueFrom.secretKeyRef``, ``fieldRef`` for the
  pod's name, namespace, uid, node, service account, labels and annotations,
  ``resourceFieldRef``), ``HOSTNAME`` and, for a pod given GPUs,
  ``NVIDIA_VISIBLE_DEVICES`` (as NVIDIA's device plugin sets it). A missing Secret
  or key leaves the pod Pending with its container waiting, reason
  ``CreateContainerConfigError`` (retried every tick). An image marked
  :meth:`FakeCluster.unpullable` is never pulled: the pod stays Pending, its
  container waiting ``ErrImagePull`` with the registry's message, then
  ``ImagePullBackOff`` (``Back-off pulling image "..."``), alternating every
  ``event_repeat_s`` as the kubelet's back-off does, with ``Failed`` and
  ``BackOff`` events. ``secret`` volumes are
  written and ``emptyDir`` volumes made under the boot root at their
  ``mountPath``; any other volume is a ``CreateContainerConfigError``. The node's
  recorded ``nvidia-smi`` CSV (``gpus_csv``) is split among its pods: a pod asking
  ``nvidia.com/gpu: N`` gets N free GPUs of it, numbered from 0 as a container
  sees them. ``securityContext``: a container that is not ``privileged`` runs
  with the capability bounding set a container runtime gives by default
  (:data:`DEFAULT_CAPABILITIES`, containerd's set, plus
  ``capabilities.add``, minus ``capabilities.drop``; ``ALL`` means every
  one), through ``setpriv --bounding-set`` (util-linux) before its argv, so
  a worker that needs more (runc: ``SYS_ADMIN``) fails as on a real node;
  a privileged one keeps every capability. An ``emptyDir`` volume is also
  bound at its ``mountPath`` itself, in a mount namespace of the pod's own
  (``unshare --mount``, before the bounding set is dropped; a mount point
  missing on the host is made, and removed when the last pod using it
  ends), as a worker that runs containers keeps its state directory there
  (``LEVERS9_WORKER_STATE_DIR``) and must not write the host's. The boot reaches only the loopback ports of ``reachable_ports`` and
  this API server's (in its own network namespace where the host allows it;
  :meth:`FakeCluster.pod_isolation`). Phase: Pending -> Running when the process
  starts -> Succeeded or Failed by its exit status (``terminated.exitCode``,
  reason ``Completed`` or ``Error``; a command that cannot start: Failed with
  reason ``StartError``). Its output is the pod's log (``pods/log``). Deleting a
  running pod (directly, by its Job's deletion, by the garbage collector) sends
  its processes SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds``
  (default 30, capped by ``max_grace_s``), then removes the pod. Only
  ``restartPolicy: Never`` and one container per pod are run; init containers,
  several containers and images are not (the host's ``levers9`` is what runs,
  whatever ``image`` says).
* **Garbage collector and quota controller**: every tick deletes objects whose
  owners are all gone, finishes foreground deletions, and recomputes each
  ResourceQuota's ``status``.

Invariants: everything the thread does happens under the API's lock, except
starting and stopping processes; :meth:`FakeCluster.stop` joins the thread,
stops every pod's processes (SIGTERM, SIGKILL after ``max_grace_s``), closes the
server and removes the boot roots, so nothing it started outlives it. An
exception inside the thread does not stop it, and one inside a request is
answered 500 ``InternalError``; both are kept (:attr:`FakeCluster.errors`,
``FakeCluster.api.errors``) and :meth:`FakeCluster.stop` raises them, so a bug
of the fake fails the test that met it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import re
import shlex
import shutil
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from levers9.testing.boot import BootError, EmulatedBoot, emulated_boot
from tests.fakes.k8s_api import (
    RESOURCES,
    TERMINAL_PHASES,
    ApiError,
    Call,
    KubeApi,
    LabelRequirement,
    now_text,
    parse_quantity,
    pod_requests,
    random_suffix,
    resource,
)
from tests.fakes.local_server import LocalServer

__all__ = [
    "CPU_NODE",
    "DEFAULT_CAPABILITIES",
    "DEFAULT_COMMAND",
    "DEFAULT_TOKEN",
    "GPU_NODE",
    "GPU_RESOURCE",
    "NVIDIA_SMI_DATA",
    "RECORDED",
    "FakeCluster",
    "load_recorded_nodes",
    "running",
]

DEFAULT_TOKEN = "levers9-fake-k8s-token-0123456789abcdef"
#: the worker image's CMD (no ENTRYPOINT): what a container without ``command`` or ``args`` runs
DEFAULT_COMMAND = ("levers9", "worker")
GPU_RESOURCE = "nvidia.com/gpu"
#: the capabilities containerd gives a container that is not privileged (its default spec)
DEFAULT_CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
)
NVIDIA_SMI_DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "nvidia_smi"
JsonObject = dict[str, Any]

_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z0-9]+)\)")


class _ConfigError(Exception):
    """The container cannot be configured yet (CreateContainerConfigError): a Secret, key or volume is missing."""


@dataclass
class _Node:
    """What the kubelet of one node knows beyond its Node object: its GPUs and which pod holds each."""

    name: str
    gpus: list[tuple[str, str, str]]  # (uuid, name, memory MiB), in nvidia-smi's order
    holders: dict[int, str] = field(default_factory=dict)  # GPU index -> pod uid


@dataclass
class _Run:
    """A pod's container as the kubelet runs it."""

    uid: str
    namespace: str
    name: str
    node: str
    boot: EmulatedBoot
    container_id: str
    started: str
    stopping: bool = False


@dataclass
class _Start:
    """A container the kubelet decided to start (computed under the lock, started outside it)."""

    uid: str
    namespace: str
    name: str
    node: str
    argv: list[str]
    env: dict[str, str]
    files: dict[str, bytes]
    dirs: list[str]
    gpus: str | None
    #: the capability bounding set (lowercase, no ``cap_``); None: privileged, every capability
    capabilities: tuple[str, ...] | None = None
    #: emptyDir mount paths, bound at their own path in the pod's mount namespace
    binds: tuple[str, ...] = ()


def _gpu_lines(gpus_csv: str | Path | None) -> list[tuple[str, str, str]]:
    """The GPUs of a recorded ``nvidia-smi --query-gpu=index,uuid,name,memory.total`` CSV (text, path or file name)."""
    if gpus_csv is None:
        return []
    text: str
    if isinstance(gpus_csv, Path):
        text = gpus_csv.read_text()
    elif "\n" not in gpus_csv and gpus_csv.endswith((".csv", ".txt")):
        candidate = Path(gpus_csv)
        text = (candidate if candidate.is_absolute() else NVIDIA_SMI_DATA / candidate).read_text()
    else:
        text = gpus_csv
    lines: list[tuple[str, str, str]] = []
    for number, line in enumerate(text.strip().splitlines(), 1):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            raise ValueError(f"gpus_csv line {number} {line!r} is not 'index, uuid, name, memory.total'")
        lines.append((parts[1], parts[2], parts[3]))
    return lines


def _taint(spec: Mapping[str, str] | str) -> JsonObject:
    """A taint from ``{"key", "value", "effect"}`` or ``"key=value:Effect"`` / ``"key:Effect"``."""
    if isinstance(spec, str):
        rest, _, effect = spec.rpartition(":")
        key, _, value = rest.partition("=")
        spec = {"key": key, "value": value, "effect": effect}
    taint = {"key": spec["key"], "effect": spec["effect"]}
    if spec.get("value"):
        taint["value"] = spec["value"]
    if taint["effect"] not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not taint["key"]:
        raise ValueError(f"taint {spec!r}: needs a key and an effect of NoSchedule, PreferNoSchedule or NoExecute")
    return taint


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        operator = toleration.get("operator") or "Equal"
        key = toleration.get("key") or ""
        if not key and operator == "Exists":
            return True
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _node_affinity_matches(pod: JsonObject, node: JsonObject) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        expressions = [
            LabelRequirement(e["key"], e["operator"], tuple(e.get("values") or ()))
            for e in term.get("matchExpressions") or []
        ]
        fields = [
            LabelRequirement(e["key"], e["operator"], tuple(e.get("values") or ()))
            for e in term.get("matchFields") or []
        ]
        if (
            (expressions or fields)
            and all(r.matches(labels) for r in expressions)
            and all(r.matches({"metadata.name": node["metadata"]["name"]}) for r in fields)
        ):
            return True
    return False


class FakeCluster:
    """A fake cluster; use as a context manager (or :meth:`start` / :meth:`stop`). See the module docstring.

    ``namespace``: created at start (beside ``default`` and ``kube-system``), with a ``default`` ServiceAccount.
    ``reachable_ports``: host loopback ports pods may reach (the controlplane's gRPC port, say), beside this
    server's. ``max_grace_s``: the most a deleted pod's processes are given between SIGTERM and SIGKILL.
    ``isolate``: passed to :func:`~levers9.testing.boot.emulated_boot` (None: a network namespace where possible).
    """

    def __init__(
        self,
        namespace: str = "levers9",
        *,
        token: str = DEFAULT_TOKEN,
        user: str = "levers9-test",
        reachable_ports: Sequence[int] = (),
        max_grace_s: float = 2.0,
        isolate: bool | None = None,
        tick_s: float = 0.1,
        event_repeat_s: float = 5.0,
        default_command: Sequence[str] = DEFAULT_COMMAND,
    ) -> None:
        self.namespace = namespace
        self.token = token
        self.user = user
        self.max_grace_s = max_grace_s
        self.isolate = isolate
        self.tick_s = tick_s
        self.event_repeat_s = event_repeat_s
        self.default_command = list(default_command)
        self.port = 0
        self.api = KubeApi(tokens=[token], user=user, server_address=lambda: f"127.0.0.1:{self.port}")
        #: tracebacks of exceptions raised inside the controller thread (re-raised by :meth:`stop`)
        self.errors: list[str] = []
        self._reachable = set(reachable_ports)
        self._nodes: dict[str, _Node] = {}
        self._runs: dict[str, _Run] = {}
        self._stoppers: list[threading.Thread] = []
        self._job_times: dict[str, dict[str, float]] = {}  # job uid -> {"started", "finished"}
        self._job_pods: dict[str, set[str]] = {}  # job uid -> uids of its pods seen so far
        self._isolation: dict[str, str] = {}  # pod uid -> how its container was isolated
        self._mount_points: dict[str, set[str]] = {}  # a mount point this fake made -> uids of the pods binding it
        self._unpullable: dict[str, str] = {}  # image -> the registry's answer to a pull
        self._pull_tries: dict[str, float] = {}  # pod uid -> when its waiting reason last changed
        self._stopping = threading.Event()
        self._scheduling_paused = False
        self._thread: threading.Thread | None = None
        self._server: LocalServer | None = None
        self._root: Path | None = None
        with self.api.lock:
            for name in dict.fromkeys(("default", "kube-system", namespace)):
                self.api.ensure_namespace(name)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The API server's address, as the kubeconfig names it."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def root(self) -> Path | None:
        """The directory under which each pod's boot root lies (``<root>/<namespace>_<pod>``); None when stopped."""
        return self._root

    def start(self) -> FakeCluster:
        self._root = Path(tempfile.mkdtemp(prefix="l9-fake-k8s-"))
        self._server = LocalServer(_handler(self.api), name="fake-k8s-api", poll_interval=0.05)
        self.port = self._server.port
        self._thread = threading.Thread(target=self._loop, name="fake-k8s-controllers", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the controllers, every pod's processes and the server; remove the boot roots. Idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        with self.api.lock:
            for run in self._runs.values():
                if not run.stopping:
                    self._stop_run(run, self.max_grace_s, remove_pod=False)
            stoppers = list(self._stoppers)
        for stopper in stoppers:
            stopper.join(self.max_grace_s + 30)
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        errors = [*self.errors, *self.api.errors]
        self.errors.clear()
        self.api.errors.clear()
        if errors:
            raise RuntimeError("the fake cluster failed (a bug of the fake):\n" + "\n".join(errors))

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what tests set

    def kubeconfig(self, path: str | Path, *, token: str | None = None, context: str = "fake") -> Path:
        """Write a kubeconfig for this cluster (``token``: another bearer token, to test a wrong one); its path."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": self.user, "user": {"token": self.token if token is None else token}}],
            "contexts": [
                {"name": context, "context": {"cluster": "fake", "user": self.user, "namespace": self.namespace}}
            ],
            "current-context": context,
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def set_reachable_ports(self, ports: Iterable[int]) -> None:
        """The host loopback ports pods started from now on may reach (beside the API server's)."""
        with self.api.lock:
            self._reachable = set(ports)

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        taints: Iterable[Mapping[str, str] | str] = (),
        gpus_csv: str | Path | None = None,
        unschedulable: bool = False,
    ) -> JsonObject:
        """Add a Ready node; ``gpus_csv``: its ``nvidia-smi`` CSV (text, a path, or a file of ``tests/data/gpu/nvidia_smi``).

        ``allocatable`` defaults to 4 cpus, 16Gi and 110 pods; ``capacity`` to ``allocatable``. Taints are
        ``{"key", "value", "effect"}`` or ``"key=value:Effect"``. Returns the stored Node (a copy).
        """
        taints = list(taints)
        allocatable = dict(allocatable or {"cpu": "4", "memory": "16Gi", "pods": "110"})
        allocatable.setdefault("pods", "110")
        node: JsonObject = {
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"taints": [_taint(t) for t in taints]} if taints else {},
            "status": {"capacity": dict(capacity or allocatable), "allocatable": allocatable},
        }
        return self.add_node_object(node, gpus_csv=gpus_csv, unschedulable=unschedulable)

    def add_node_object(
        self, node: Mapping[str, Any], *, gpus_csv: str | Path | None = None, unschedulable: bool | None = None
    ) -> JsonObject:
        """Add a node from a Node object (as ``kubectl get node -o json`` prints it); missing status is filled in."""
        obj = copy.deepcopy(dict(node))
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = obj.setdefault("metadata", {})
        name = meta["name"]
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            meta.pop(key, None)
        labels = meta.setdefault("labels", {})
        for key, value in (
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", "amd64"),
        ):
            labels.setdefault(key, value)
        spec = obj.setdefault("spec", {})
        if unschedulable is not None:
            spec["unschedulable"] = unschedulable
        if not spec.get("unschedulable"):
            spec.pop("unschedulable", None)
        taints = [t for t in spec.get("taints") or [] if t.get("key") != "node.kubernetes.io/unschedulable"]
        if spec.get("unschedulable"):
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": now_text()})
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        status = obj.setdefault("status", {})
        status.setdefault("allocatable", {"cpu": "4", "memory": "16Gi", "pods": "110"})
        status.setdefault("capacity", dict(status["allocatable"]))
        stamp = now_text()
        status["conditions"] = [
            {
                "type": kind,
                "status": "False",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
                "reason": reason,
                "message": message,
            }
            for kind, reason, message in (
                ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            )
        ] + [
            {
                "type": "Ready",
                "status": "True",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            }
        ]
        gpus = _gpu_lines(gpus_csv)
        with self.api.lock:
            if self.api.get("nodes", None, name) is not None:
                raise ValueError(f"node {name!r} already exists in the fake cluster")
            wanted = parse_quantity(status["capacity"].get(GPU_RESOURCE, "0"))
            if gpus and len(gpus) < wanted:
                raise ValueError(f"node {name!r}: capacity {GPU_RESOURCE}={wanted} but gpus_csv lists {len(gpus)} GPUs")
            number = len(self._nodes) + 1
            status.setdefault(
                "addresses",
                [
                    {"type": "InternalIP", "address": f"10.0.{number // 250}.{number % 250 + 1}"},
                    {"type": "Hostname", "address": name},
                ],
            )
            status.setdefault("daemonEndpoints", {"kubeletEndpoint": {"Port": 10250}})
            status.setdefault(
                "nodeInfo",
                {
                    "machineID": hashlib.md5(name.encode()).hexdigest(),
                    "systemUUID": str(hashlib.md5(name.encode()).hexdigest()),
                    "bootID": hashlib.sha1(name.encode()).hexdigest()[:32],
                    "kernelVersion": "6.1.0-fake",
                    "osImage": "levers9 fake node",
                    "containerRuntimeVersion": "containerd://1.7.20",
                    "kubeletVersion": "v1.31.0",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            )
            self.api.store(resource("nodes"), obj)
            self._nodes[name] = _Node(name, gpus)
            return copy.deepcopy(obj)

    def load_nodes(self, path: str | Path, *, gpus_csv: Mapping[str, str | Path] | None = None) -> list[str]:
        """Add the nodes of a JSON file (a Node or a List of Nodes); ``gpus_csv`` per node name. Their names."""
        data = json.loads(Path(path).read_text())
        items = data["items"] if data.get("kind", "").endswith("List") else [data]
        names = []
        for item in items:
            name = item["metadata"]["name"]
            self.add_node_object(item, gpus_csv=(gpus_csv or {}).get(name))
            names.append(name)
        return names

    def unpullable(self, image: str, message: str | None = None) -> None:
        """Pulls of ``image`` fail from now on with ``message`` (default: the registry's "not found", as containerd
        words it); see the module docstring."""
        said = message or (
            f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": {image}: not found'
        )
        with self.api.lock:
            self._unpullable[image] = said

    def label_namespace(self, name: str, labels: Mapping[str, str]) -> None:
        """Add ``labels`` to namespace ``name`` (``kubectl label namespace``), e.g. a Pod Security level."""
        with self.api.lock:
            namespace = self.api.get("namespaces", None, name)
            if namespace is None:
                raise KeyError(f"no namespace {name}")
            namespace["metadata"].setdefault("labels", {}).update(labels)
            self.api.bump(namespace)

    def pause_scheduling(self) -> None:
        """Leave new pods unbound until :meth:`resume_scheduling` (pods are then bound in creation order): the
        way to stage a race where another pod takes the room a provider saw free."""
        self._scheduling_paused = True

    def resume_scheduling(self) -> None:
        self._scheduling_paused = False

    def deny(self, verb: str, resource_name: str, namespace: str | None = None, group: str | None = None) -> None:
        """Deny ``verb`` on ``resource_name`` (``"jobs"``, ``"pods/log"``; ``"*"`` for any), in ``namespace``
        (None: everywhere): requests get RBAC's 403 and SelfSubjectAccessReviews answer ``allowed: false``."""
        self.api.deny(verb, resource_name, namespace, group)

    def allow(self, verb: str, resource_name: str, namespace: str | None = None, group: str | None = None) -> None:
        """Undo the same :meth:`deny`."""
        self.api.allow(verb, resource_name, namespace, group)

    def fail(self, method: str, path_regex: str, status: int, reason: str, message: str, times: int | None = 1) -> None:
        """Answer the next ``times`` requests (None: all, until :meth:`clear_faults`) whose method is ``method``
        (``"*"``: any) and whose path matches ``path_regex`` (``re.search``) with this ``Status``."""
        self.api.fail(method, path_regex, status, reason, message, times)

    def clear_faults(self) -> None:
        self.api.clear_faults()

    # ------------------------------------------------------------------ what tests read

    @property
    def calls(self) -> list[Call]:
        """``(method, path, status)`` of every request so far, in order (paths without the query)."""
        with self.api.lock:
            return list(self.api.calls)

    def created(self, kind: str) -> list[JsonObject]:
        """The request body of every successful create of ``kind`` (``"jobs"`` or ``"Job"``...), as sent."""
        plural = _plural(kind)
        with self.api.lock:
            return copy.deepcopy(self.api.created.get(plural, []))

    def objects(self, kind: str, namespace: str | None = None) -> list[JsonObject]:
        """Copies of the stored objects of ``kind`` (plural ``"pods"`` or kind ``"Pod"``), in ``namespace`` or all."""
        plural = _plural(kind)
        with self.api.lock:
            return copy.deepcopy(self.api.items(plural, namespace))

    def pods(self, namespace: str | None = None) -> list[JsonObject]:
        return self.objects("pods", namespace)

    def events(self, namespace: str | None = None) -> list[JsonObject]:
        return self.objects("events", namespace)

    def running_processes(self) -> list[int]:
        """Live process ids of every pod's container (and anything it started), finished or stopping included."""
        with self.api.lock:
            runs = list(self._runs.values())
        return sorted({pid for run in runs for pid in run.boot.pids()})

    def pod_root(self, namespace: str, name: str) -> Path | None:
        """Where the pod's container runs (its ``LEVERS9_BOOT_ROOT``), while it has processes; else None."""
        with self.api.lock:
            pod = self.api.get("pods", namespace, name)
            run = self._runs.get(pod["metadata"]["uid"]) if pod is not None else None
            return run.boot.root if run is not None else None

    def pod_isolation(self, namespace: str, name: str) -> str | None:
        """How the pod's container was kept apart (:attr:`EmulatedBoot.isolation`); None if it never started."""
        with self.api.lock:
            pod = self.api.get("pods", namespace, name)
            return self._isolation.get(pod["metadata"]["uid"]) if pod is not None else None

    def leftovers(self) -> list[str]:
        """``"Job ns/name"``, ``"Pod ns/name"``, ``"Secret ns/name"`` for each still present; empty when clean."""
        with self.api.lock:
            return [
                f"{RESOURCES[('batch' if plural == 'jobs' else '', plural)].kind} {o['metadata']['namespace']}/{o['metadata']['name']}"
                for plural in ("jobs", "pods", "secrets")
                for o in self.api.items(plural)
            ]

    # ------------------------------------------------------------------ the controller thread

    def _loop(self) -> None:
        while not self._stopping.wait(self.tick_s):
            try:
                self._tick()
            except Exception:
                self.errors.append(traceback.format_exc())

    def _tick(self) -> None:
        """One pass of every controller (the thread calls this every ``tick_s``)."""
        with self.api.lock:
            self._job_controller()
            self._schedule()
            starts = self._kubelet()
            self.api.collect_garbage()
            self.api.refresh_quotas()
        for start in starts:
            if self._stopping.is_set():
                self._release(start.uid)
                continue
            self._start(start)

    # ------------------------------------------------------------------ Job controller (lock held)

    def _job_event(self, job: JsonObject, event_type: str, reason: str, message: str) -> None:
        self.api.record_event(
            job, "Job", event_type, reason, message, "job-controller", repeat_after_s=self.event_repeat_s
        )

    def _job_controller(self) -> None:
        now = time.time()
        jobs = self.api.items("jobs")
        present = {j["metadata"]["uid"] for j in jobs}
        for table in (self._job_times, self._job_pods):
            for uid in set(table) - present:
                del table[uid]
        for job in jobs:
            meta, spec = job["metadata"], job["spec"]
            status = job.setdefault("status", {})
            before = copy.deepcopy(status)
            times = self._job_times.setdefault(meta["uid"], {})
            conditions = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
            if conditions & {"Complete", "Failed"}:
                ttl = spec.get("ttlSecondsAfterFinished")
                finished = times.setdefault("finished", now)
                if ttl is not None and not meta.get("deletionTimestamp") and now >= finished + ttl:
                    self.api.delete(
                        resource("jobs", "batch"), meta["namespace"], meta["name"], {"propagationPolicy": "Foreground"}
                    )
                continue
            if meta.get("deletionTimestamp") or spec.get("suspend"):
                continue
            if "started" not in times:
                times["started"] = now
                status["startTime"] = now_text()
            pods = [
                p
                for p in self.api.items("pods", meta["namespace"])
                if any(
                    r.get("uid") == meta["uid"] and r.get("controller")
                    for r in p["metadata"].get("ownerReferences") or []
                )
            ]
            counted = self.api.counted.setdefault(meta["uid"], {})
            seen = self._job_pods.setdefault(meta["uid"], set())
            current = {p["metadata"]["uid"] for p in pods}
            for vanished in seen - current:  # removed before it finished: the Job counts it as failed
                counted.setdefault(vanished, "Failed")
            seen.intersection_update(current)
            for pod in pods:
                phase = (pod.get("status") or {}).get("phase")
                seen.add(pod["metadata"]["uid"])
                if phase in TERMINAL_PHASES:
                    counted[pod["metadata"]["uid"]] = phase
            succeeded = sum(1 for v in counted.values() if v == "Succeeded")
            failed = sum(1 for v in counted.values() if v == "Failed")
            live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
            active = [p for p in live if not p["metadata"].get("deletionTimestamp")]
            terminating = [p for p in live if p["metadata"].get("deletionTimestamp")]
            deadline = spec.get("activeDeadlineSeconds")
            if succeeded >= 1:
                self._finish(job, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")
                times["finished"] = now
                self._job_event(job, "Normal", "Completed", "Job completed")
            elif failed > spec.get("backoffLimit", 6):
                self._finish(job, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                times["finished"] = now
                self._kill(active)
                self._job_event(job, "Warning", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            elif deadline is not None and now >= times["started"] + deadline:
                self._finish(job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
                times["finished"] = now
                for pod in active:
                    self._job_event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")
                self._kill(active)
                self._job_event(job, "Warning", "DeadlineExceeded", "Job was active longer than specified deadline")
            elif not live:
                created = self._create_job_pod(job)
                if created is not None:
                    active.append(created)
            finished = bool({"Complete", "Failed"} & _true_conditions(job))
            running_now = sum(1 for p in active if (p.get("status") or {}).get("phase") == "Running")
            status["ready"] = 0 if finished else running_now
            status["terminating"] = len(terminating)
            for key, value in (
                ("active", 0 if finished else len(active)),
                ("succeeded", succeeded),
                ("failed", failed),
            ):
                if value:
                    status[key] = value
                else:
                    status.pop(key, None)
            status.setdefault("uncountedTerminatedPods", {})
            if status != before:
                self.api.bump(job)

    def _finish(self, job: JsonObject, kind: str, reason: str, message: str) -> None:
        stamp = now_text()
        first = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
        status = job["status"]
        status["conditions"] = [
            *(status.get("conditions") or []),
            *(
                {
                    "type": t,
                    "status": "True",
                    "lastProbeTime": stamp,
                    "lastTransitionTime": stamp,
                    "reason": reason,
                    "message": message,
                }
                for t in (first, kind)
            ),
        ]
        if kind == "Complete":
            status["completionTime"] = stamp

    def _kill(self, pods: Iterable[JsonObject]) -> None:
        for pod in pods:
            with contextlib.suppress(ApiError):
                self.api.delete(resource("pods"), pod["metadata"]["namespace"], pod["metadata"]["name"], {})

    def _create_job_pod(self, job: JsonObject) -> JsonObject | None:
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        template_meta = template.get("metadata") or {}
        name = f"{meta['name']}-{random_suffix()}"
        while self.api.get("pods", meta["namespace"], name) is not None:
            name = f"{meta['name']}-{random_suffix()}"
        pod_meta: JsonObject = {
            "name": name,
            "generateName": f"{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": dict(template_meta.get("labels") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if template_meta.get("annotations"):
            pod_meta["annotations"] = dict(template_meta["annotations"])
        pod = {"metadata": pod_meta, "spec": template["spec"]}
        try:
            created = self.api.create_pod(pod)
        except ApiError as error:
            self._job_event(job, "Warning", "FailedCreate", f"Error creating: {error.message}")
            return None
        self._job_event(job, "Normal", "SuccessfulCreate", f"Created pod: {name}")
        return created

    # ------------------------------------------------------------------ scheduler (lock held)

    def _schedule(self) -> None:
        if self._scheduling_paused:
            return
        nodes = self.api.items("nodes")
        used: dict[str, dict[str, Fraction]] = {n["metadata"]["name"]: {} for n in nodes}
        for pod in self.api.items("pods"):
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name in used and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                usage = used[node_name]
                for key, amount in [*pod_requests(pod).items(), ("pods", Fraction(1))]:
                    usage[key] = usage.get(key, Fraction(0)) + amount
        for pod in self.api.items("pods"):
            spec, status = pod["spec"], pod.setdefault("status", {})
            if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Pending":
                continue
            if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            verdicts: list[tuple[list[str], bool]] = []
            chosen = None
            for node in nodes:
                reasons, resolvable = self._filter(pod, node, used[node["metadata"]["name"]])
                if not reasons:
                    chosen = node
                    break
                verdicts.append((reasons, resolvable))
            if chosen is not None:
                node_name = chosen["metadata"]["name"]
                spec["nodeName"] = node_name
                usage = used[node_name]
                for key, amount in [*pod_requests(pod).items(), ("pods", Fraction(1))]:
                    usage[key] = usage.get(key, Fraction(0)) + amount
                _set_condition(status, "PodScheduled", "True")
                self.api.bump(pod)
                meta = pod["metadata"]
                self.api.record_event(
                    pod,
                    "Pod",
                    "Normal",
                    "Scheduled",
                    f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}",
                    "default-scheduler",
                )
                continue
            message = _fit_error(len(nodes), verdicts)
            if _set_condition(status, "PodScheduled", "False", "Unschedulable", message):
                self.api.bump(pod)
            self.api.record_event(
                pod,
                "Pod",
                "Warning",
                "FailedScheduling",
                message,
                "default-scheduler",
                repeat_after_s=self.event_repeat_s,
            )

    def _filter(self, pod: JsonObject, node: JsonObject, used: Mapping[str, Fraction]) -> tuple[list[str], bool]:
        """Why ``pod`` cannot go on ``node`` (empty: it fits), and whether preemption could in principle help."""
        spec, node_spec = pod["spec"], node.get("spec") or {}
        tolerations = spec.get("tolerations") or []
        if node_spec.get("unschedulable") and not _tolerates(
            tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        ):
            return ["node(s) were unschedulable"], False
        for taint in node_spec.get("taints") or []:
            if taint.get("key") == "node.kubernetes.io/unschedulable":
                continue
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
                return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"], False
        if not _node_affinity_matches(pod, node):
            return ["node(s) didn't match Pod's node affinity/selector"], False
        allocatable = {k: parse_quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        reasons = []
        if used.get("pods", 0) + 1 > allocatable.get("pods", Fraction(110)):
            reasons.append("Too many pods")
        for name, amount in sorted(pod_requests(pod).items()):
            if amount > 0 and used.get(name, 0) + amount > allocatable.get(name, Fraction(0)):
                reasons.append(f"Insufficient {name}")
        return reasons, True

    # ------------------------------------------------------------------ kubelet (lock held, except _start)

    def _kubelet(self) -> list[_Start]:
        starts: list[_Start] = []
        pods = {p["metadata"]["uid"]: p for p in self.api.items("pods")}
        for uid in set(self._isolation) - set(pods):
            del self._isolation[uid]
        for uid in set(self._pull_tries) - set(pods):
            del self._pull_tries[uid]
        for uid, run in list(self._runs.items()):
            if run.stopping:
                continue
            pod = pods.get(uid)
            if pod is None:  # removed without the kubelet (a forced delete)
                self._stop_run(run, self.max_grace_s, remove_pod=False)
            elif pod["metadata"].get("deletionTimestamp"):
                grace = min(float(pod["metadata"].get("deletionGracePeriodSeconds") or 0), self.max_grace_s)
                self.api.record_event(
                    pod,
                    "Pod",
                    "Normal",
                    "Killing",
                    f"Stopping container {pod['spec']['containers'][0]['name']}",
                    "kubelet",
                    run.node,
                )
                self._stop_run(run, grace, remove_pod=True)
            elif run.boot.process.poll() is not None:
                self._container_ended(pod, run)
        for uid, pod in pods.items():
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name or uid in self._runs or node_name not in self._nodes:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self.api.remove("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
                self.api.refresh_quotas(pod["metadata"]["namespace"])
                continue
            if (pod.get("status") or {}).get("phase") != "Pending":
                continue
            if self._not_pulled(pod, node_name):
                continue
            try:
                start = self._prepare(pod, self._nodes[node_name])
            except _ConfigError as problem:
                self._waiting(pod, "CreateContainerConfigError", str(problem))
                self.api.record_event(
                    pod, "Pod", "Warning", "Failed", f"Error: {problem}", "kubelet", node_name, self.event_repeat_s
                )
                continue
            self._waiting(pod, "ContainerCreating", None)
            starts.append(start)
        return starts

    def _not_pulled(self, pod: JsonObject, node_name: str) -> bool:
        """Whether the pod's image cannot be pulled (its container then waits, alternating as the kubelet does)."""
        image = pod["spec"]["containers"][0].get("image") or ""
        said = self._unpullable.get(image)
        if said is None:
            return False
        uid = pod["metadata"]["uid"]
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        now_reason = ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")
        last = self._pull_tries.get(uid)
        pulling = now_reason in ("ErrImagePull", "ImagePullBackOff")
        if pulling and last is not None and time.monotonic() - last < self.event_repeat_s:
            return True
        self._pull_tries[uid] = time.monotonic()
        if now_reason == "ErrImagePull":
            message = f'Back-off pulling image "{image}"'
            self._waiting(pod, "ImagePullBackOff", message)
            self.api.record_event(pod, "Pod", "Normal", "BackOff", message, "kubelet", node_name, self.event_repeat_s)
        else:
            self._waiting(pod, "ErrImagePull", said)
            self.api.record_event(
                pod,
                "Pod",
                "Warning",
                "Failed",
                f'Failed to pull image "{image}": {said}',
                "kubelet",
                node_name,
                self.event_repeat_s,
            )
        return True

    def _waiting(self, pod: JsonObject, reason: str, message: str | None) -> None:
        container = pod["spec"]["containers"][0]
        state: JsonObject = {"reason": reason}
        if message:
            state["message"] = message
        statuses = [
            {
                "name": container["name"],
                "state": {"waiting": state},
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "image": container["image"],
                "imageID": "",
                "started": False,
            }
        ]
        status = pod["status"]
        if status.get("containerStatuses") != statuses:
            status["containerStatuses"] = statuses
            status.setdefault("hostIP", self._host_ip(pod["spec"]["nodeName"]))
            status.setdefault("startTime", now_text())
            names = f"containers with unready status: [{container['name']}]"
            _set_condition(status, "Initialized", "True")
            _set_condition(status, "Ready", "False", "ContainersNotReady", names)
            _set_condition(status, "ContainersReady", "False", "ContainersNotReady", names)
            self.api.bump(pod)

    def _host_ip(self, node_name: str) -> str:
        node = self.api.get("nodes", None, node_name) or {}
        addresses = (node.get("status") or {}).get("addresses") or []
        return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "127.0.0.1")

    def _prepare(self, pod: JsonObject, node: _Node) -> _Start:
        """The argv, environment, files and GPUs of the pod's container; :class:`_ConfigError` if it cannot be set up."""
        meta, spec = pod["metadata"], pod["spec"]
        namespace = meta["namespace"]
        if spec.get("initContainers"):
            raise _ConfigError("the fake kubelet does not run init containers")
        if len(spec["containers"]) != 1:
            raise _ConfigError("the fake kubelet runs pods of exactly one container")
        container = spec["containers"][0]

        def secret(name: str, optional: bool) -> dict[str, str] | None:
            found = self.api.get("secrets", namespace, name)
            if found is None:
                if optional:
                    return None
                raise _ConfigError(f'secret "{name}" not found')
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in (found.get("data") or {}).items()}

        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix") or ""
            if source.get("secretRef"):
                values = secret(source["secretRef"]["name"], bool(source["secretRef"].get("optional")))
                env.update({prefix + k: v for k, v in (values or {}).items()})
            elif source.get("configMapRef") and not source["configMapRef"].get("optional"):
                raise _ConfigError(f'configmap "{source["configMapRef"]["name"]}" not found')
        for item in container.get("env") or []:
            name = item["name"]
            source = item.get("valueFrom")
            if source is None:
                env[name] = _expand(item.get("value") or "", env)
            elif source.get("secretKeyRef"):
                ref = source["secretKeyRef"]
                values = secret(ref["name"], bool(ref.get("optional")))
                if values is None:
                    continue
                if ref["key"] not in values:
                    if ref.get("optional"):
                        continue
                    raise _ConfigError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
                env[name] = values[ref["key"]]
            elif source.get("fieldRef"):
                env[name] = self._field(pod, source["fieldRef"]["fieldPath"])
            elif source.get("resourceFieldRef"):
                env[name] = _resource_field(container, source["resourceFieldRef"])
            elif source.get("configMapKeyRef") and not source["configMapKeyRef"].get("optional"):
                raise _ConfigError(f'configmap "{source["configMapKeyRef"]["name"]}" not found')
        env.setdefault("HOSTNAME", meta["name"])
        files: dict[str, bytes] = {}
        dirs: list[str] = []
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            target = mount["mountPath"].rstrip("/")
            if "secret" in volume:
                ref = volume["secret"]
                values = secret(ref.get("secretName", ""), bool(ref.get("optional")))
                items = ref.get("items") or [{"key": k, "path": k} for k in sorted(values or {})]
                dirs.append(target)
                for item in items:
                    if values is not None and item["key"] in values:
                        files[f"{target}/{item['path']}"] = values[item["key"]].encode()
            elif "emptyDir" in volume:
                dirs.append(target)
            else:
                kinds = sorted(set(volume) - {"name"})
                raise _ConfigError(
                    f"the fake kubelet mounts secret and emptyDir volumes only (volume {mount['name']} is {', '.join(kinds)})"
                )
        command = container.get("command") or []
        args = container.get("args") or []
        argv = [*command, *args] if command else list(args) if args else list(self.default_command)
        argv = [_expand(word, env) for word in argv]
        wanted = int(pod_requests(pod).get(GPU_RESOURCE, Fraction(0)))
        free = [i for i in range(len(node.gpus)) if i not in node.holders][:wanted]
        gpus = None
        if free:
            for index in free:
                node.holders[index] = meta["uid"]
            gpus = "".join(
                f"{n}, {node.gpus[i][0]}, {node.gpus[i][1]}, {node.gpus[i][2]}\n" for n, i in enumerate(free)
            )
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(node.gpus[i][0] for i in free)
        context = container.get("securityContext") or {}
        privileged = bool(context.get("privileged"))
        empty = [
            m["mountPath"].rstrip("/") for m in container.get("volumeMounts") or [] if "emptyDir" in volumes[m["name"]]
        ]
        return _Start(
            meta["uid"],
            namespace,
            meta["name"],
            node.name,
            argv,
            env,
            files,
            dirs,
            gpus,
            None if privileged else _bounding_set(context.get("capabilities") or {}),
            tuple(empty),
        )

    def _field(self, pod: JsonObject, path: str) -> str:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            "status.hostIP": status.get("hostIP") or self._host_ip(spec.get("nodeName", "")),
            "status.podIP": status.get("podIP", ""),
            "status.podIPs": status.get("podIP", ""),
        }
        if path in simple:
            return str(simple[path])
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        raise _ConfigError(f"unsupported fieldRef {path!r}")

    def _start(self, start: _Start) -> None:
        """Start the container's boot (no lock held while it starts), then record it or undo it."""
        assert self._root is not None
        root = self._root / f"{start.namespace}_{start.name}"
        shutil.rmtree(root, ignore_errors=True)
        error: str | None = None
        boot: EmulatedBoot | None = None
        try:
            for directory in start.dirs:
                (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for path, data in start.files.items():
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                target.chmod(0o644)
            script = self._script(root, start)
            with self.api.lock:
                ports = sorted(self._reachable | {self.port})
            boot = emulated_boot(
                script, root, ports=ports, isolate=self.isolate, gpus=start.gpus, environment=start.env
            )
        except (OSError, BootError) as exc:
            error = f"failed to start the container: {exc}"
        with self.api.lock:
            pod = self.api.get("pods", start.namespace, start.name)
            current = pod is not None and pod["metadata"]["uid"] == start.uid
            if boot is None:
                self._release(start.uid)
                shutil.rmtree(root, ignore_errors=True)
                if current and pod is not None:
                    self._terminated(pod, 128, "StartError", now_text(), error)
                return
            run = _Run(
                start.uid,
                start.namespace,
                start.name,
                start.node,
                boot,
                hashlib.sha256(start.uid.encode()).hexdigest(),
                now_text(),
            )
            self._runs[start.uid] = run
            self._isolation[start.uid] = boot.isolation
            if not current or pod is None or pod["metadata"].get("deletionTimestamp"):
                self._stop_run(run, 0, remove_pod=False)
                return
            log_path = boot.log_path
            self.api.live_logs[start.uid] = lambda: _read(log_path)
            self._running(pod, run)

    def _script(self, root: Path, start: _Start) -> str:
        """The boot script of a container: its binds (a mount namespace of its own), its bounding set, its argv."""
        argv = list(start.argv)
        if start.capabilities is not None:
            allowed = ",".join(f"+{c}" for c in start.capabilities)
            argv = ["setpriv", "--bounding-set", f"-all{',' if allowed else ''}{allowed}", "--", *argv]
        if not start.binds:
            return "#!/bin/sh\nexec " + shlex.join(argv) + "\n"
        lines = [
            "#!/bin/sh",
            "set -e",
            '[ "${1:-}" = in-namespace ] || exec unshare --mount --propagation private -- "$0" in-namespace',
        ]
        for target in start.binds:
            lines.append(shlex.join(["mount", "--bind", str(root / target.lstrip("/")), target]))
            with self.api.lock:
                if target not in self._mount_points and not Path(target).exists():
                    Path(target).mkdir(parents=True)
                    self._mount_points[target] = set()
                if target in self._mount_points:
                    self._mount_points[target].add(start.uid)
        return "\n".join([*lines, "exec " + shlex.join(argv)]) + "\n"

    def _unbind(self, uid: str) -> None:
        """Remove the mount points made for pod ``uid`` that no other pod uses (made empty by this fake)."""
        with self.api.lock:
            for users in self._mount_points.values():
                users.discard(uid)
            done = [t for t, users in self._mount_points.items() if not users]
            for target in done:
                del self._mount_points[target]
        for target in done:
            with contextlib.suppress(OSError):
                Path(target).rmdir()

    def _running(self, pod: JsonObject, run: _Run) -> None:
        container = pod["spec"]["containers"][0]
        status = pod["status"]
        status["phase"] = "Running"
        status["containerStatuses"] = [
            {
                "name": container["name"],
                "state": {"running": {"startedAt": run.started}},
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": container["image"],
                "imageID": _image_id(container["image"]),
                "containerID": f"containerd://{run.container_id}",
                "started": True,
            }
        ]
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"):
            _set_condition(status, kind, "True")
        self.api.bump(pod)
        name = container["name"]
        self.api.record_event(pod, "Pod", "Normal", "Created", f"Created container {name}", "kubelet", run.node)
        self.api.record_event(pod, "Pod", "Normal", "Started", f"Started container {name}", "kubelet", run.node)

    def _container_ended(self, pod: JsonObject, run: _Run) -> None:
        code = run.boot.process.returncode
        exit_code = code if code >= 0 else 128 - code
        self.api.logs[run.uid] = _read(run.boot.log_path)
        self.api.live_logs.pop(run.uid, None)
        self._terminated(
            pod, exit_code, "Completed" if exit_code == 0 else "Error", run.started, None, run.container_id
        )
        self._stop_run(run, 0, remove_pod=False)

    def _terminated(
        self,
        pod: JsonObject,
        exit_code: int,
        reason: str,
        started: str,
        message: str | None,
        container_id: str | None = None,
    ) -> None:
        container = pod["spec"]["containers"][0]
        status = pod["status"]
        status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        terminated: JsonObject = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": now_text(),
        }
        if message:
            terminated["message"] = message
        if container_id:
            terminated["containerID"] = f"containerd://{container_id}"
        entry: JsonObject = {
            "name": container["name"],
            "state": {"terminated": terminated},
            "lastState": {},
            "ready": False,
            "restartCount": 0,
            "image": container["image"],
            "imageID": _image_id(container["image"]),
            "started": False,
        }
        if container_id:
            entry["containerID"] = f"containerd://{container_id}"
        status["containerStatuses"] = [entry]
        why = "PodCompleted" if exit_code == 0 else "PodFailed"
        _set_condition(status, "PodReadyToStartContainers", "False")
        _set_condition(status, "Ready", "False", why)
        _set_condition(status, "ContainersReady", "False", why)
        self.api.bump(pod)
        self.api.refresh_quotas(pod["metadata"]["namespace"])

    def _release(self, uid: str) -> None:
        self._unbind(uid)
        for node in self._nodes.values():
            for index in [i for i, holder in node.holders.items() if holder == uid]:
                del node.holders[index]

    def _stop_run(self, run: _Run, grace: float, *, remove_pod: bool) -> None:
        """Stop the container's processes on a thread of its own; then forget it (and remove its pod if asked)."""
        run.stopping = True

        def stop() -> None:
            try:
                run.boot.stop(grace=grace)
            finally:
                with self.api.lock:
                    self._runs.pop(run.uid, None)
                    self.api.live_logs.pop(run.uid, None)
                    self._release(run.uid)
                    pod = self.api.get("pods", run.namespace, run.name)
                    if remove_pod and pod is not None and pod["metadata"]["uid"] == run.uid:
                        self.api.remove("pods", run.namespace, run.name)
                        self.api.refresh_quotas(run.namespace)
                    with contextlib.suppress(ValueError):
                        self._stoppers.remove(threading.current_thread())

        thread = threading.Thread(target=stop, name=f"fake-k8s-stop-{run.name}", daemon=True)
        self._stoppers.append(thread)
        thread.start()


# --------------------------------------------------------------------------- helpers


def _bounding_set(capabilities: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The bounding set of a container that is not privileged: the default set, plus ``add``, minus ``drop``.

    None: every capability (``add: [ALL]`` and nothing dropped).
    """

    def names(key: str) -> set[str]:
        return {str(c).upper().removeprefix("CAP_") for c in capabilities.get(key) or []}

    added, dropped = names("add"), names("drop")
    if "ALL" in added and not dropped:
        return None
    kept = (set() if "ALL" in dropped else set(DEFAULT_CAPABILITIES) | added) - dropped - {"ALL"}
    if "ALL" in dropped:
        kept = added - {"ALL"}
    return tuple(sorted(c.lower() for c in kept))


def _plural(kind: str) -> str:
    for (_, plural), res in RESOURCES.items():
        if kind in (plural, res.kind):
            return plural
    raise KeyError(f"the fake cluster has no kind {kind!r}; it knows {', '.join(sorted(p for _, p in RESOURCES))}")


def _true_conditions(job: JsonObject) -> set[str]:
    return {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def _set_condition(
    status: JsonObject, kind: str, value: str, reason: str | None = None, message: str | None = None
) -> bool:
    """Set a pod condition; True when it changed. ``lastTransitionTime`` moves only when ``status`` does."""
    conditions = status.setdefault("conditions", [])
    existing = next((c for c in conditions if c["type"] == kind), None)
    wanted: JsonObject = {"type": kind, "status": value, "lastProbeTime": None}
    if reason:
        wanted["reason"] = reason
    if message:
        wanted["message"] = message
    if existing is not None:
        same = all(existing.get(k) == wanted.get(k) for k in ("status", "reason", "message"))
        if same:
            return False
        wanted["lastTransitionTime"] = existing["lastTransitionTime"] if existing["status"] == value else now_text()
        conditions[conditions.index(existing)] = wanted
    else:
        wanted["lastTransitionTime"] = now_text()
        conditions.append(wanted)
    return True


def _fit_error(total: int, verdicts: list[tuple[list[str], bool]]) -> str:
    """The default scheduler's FitError text for ``total`` nodes and why each one failed."""
    if total == 0:
        return "no nodes available to schedule pods"
    reasons = Counter(reason for found, _ in verdicts for reason in found)
    preemption = Counter(
        "No preemption victims found for incoming pod" if resolvable else "Preemption is not helpful for scheduling"
        for _, resolvable in verdicts
    )
    filters = ", ".join(sorted(f"{n} {reason}" for reason, n in reasons.items()))
    victims = ", ".join(sorted(f"{n} {reason}" for reason, n in preemption.items()))
    return f"0/{total} nodes are available: {filters}. preemption: 0/{total} nodes are available: {victims}."


def _expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` references to variables defined so far, as the kubelet expands them; ``$$`` is a literal ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(replace, text)


def _resource_field(container: JsonObject, ref: Mapping[str, Any]) -> str:
    which, _, name = str(ref.get("resource", "")).partition(".")
    value = ((container.get("resources") or {}).get(which) or {}).get(name)
    amount = parse_quantity(value) if value is not None else Fraction(0)
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(-(-amount // divisor))


def _image_id(image: str) -> str:
    repository = image.split("@", 1)[0].rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image.split("@", 1)[0]
    return f"{repository}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _handler(api: KubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fake-kube-apiserver"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, content_type, payload = api.handle(self.command, self.path, self.headers.get("Authorization"), raw)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    return Handler


def running(**kwargs: Any) -> Iterator[FakeCluster]:
    """A started fake cluster for a fixture: ``yield from running(...)``; stopped afterwards."""
    cluster = FakeCluster(**kwargs).start()
    try:
        yield cluster
    finally:
        cluster.stop()


#: the recorded Node objects (tests/data/k8s): an EKS g6.xlarge with one L4 and GPU Feature Discovery's labels,
#: tainted nvidia.com/gpu=present:NoSchedule, and an m6i.xlarge without GPUs
RECORDED = Path(__file__).resolve().parents[1] / "data" / "k8s"
GPU_NODE = "ip-10-0-41-27.ec2.internal"
CPU_NODE = "ip-10-0-12-190.ec2.internal"


def load_recorded_nodes(cluster: FakeCluster) -> FakeCluster:
    """Give ``cluster`` the recorded GPU node (with an L4's nvidia-smi) and CPU node."""
    cluster.load_nodes(RECORDED / "node_gpu_l4.json", gpus_csv={GPU_NODE: "l4_1x.csv"})
    cluster.load_nodes(RECORDED / "node_cpu.json")
    return cluster


@contextlib.contextmanager
def recorded_cluster(namespace: str, *, max_grace_s: float = 2.0) -> Iterator[FakeCluster]:
    """A started cluster with the recorded nodes (a test fixture's body); on the way out no Job, pod or Secret may
    be left (background deletion waited for) and no controller may have failed."""
    from tests.fixtures.wait import wait_for

    with FakeCluster(namespace, max_grace_s=max_grace_s) as fake:
        yield load_recorded_nodes(fake)
        wait_for(lambda: not fake.leftovers(), "no Job, pod or Secret left", why=lambda: "\n".join(fake.leftovers()))
        assert fake.errors == []
