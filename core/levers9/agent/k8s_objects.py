"""A ``provision`` order's Job and Secret, checked before the agent creates anything in its cluster.

The controlplane builds each worker's Job and token Secret (the objects
``levers9.kube.jobs`` makes) and sends them in the order's payload
``{"machine_id", "job", "secret"}``. :func:`check_provision` makes sure they are
what a levers9 worker needs and nothing more, so an agent never creates, on
the controlplane's word, something that reaches beyond its namespace:

* a ``batch/v1`` Job and a ``v1`` Secret, each with a ``metadata.name``, both
  in the agent's namespace (left out: set to it), both labelled
  ``levers9/machine-id`` with the order's machine id (the pod template gets
  the label when it has none; another machine's is refused); the Job, its pod
  template and the Secret are labelled ``levers9/owner`` with the agent's own
  owner (its pool), whatever the order said: the agent lists and deletes only
  what carries it, so what it creates must;
* the Job's pod does not use the node's network, processes or IPC
  (``hostNetwork``, ``hostPID``, ``hostIPC``), mounts no service-account token
  (``automountServiceAccountToken: false``), has only ``emptyDir`` volumes and
  the order's Secret (no ``hostPath``, no other Secret, ConfigMap or claim);
* its containers (init containers too) bind no host port, read no Secret but
  the order's and no ConfigMap through ``env`` or ``envFrom``, ask only
  well-formed quantities, and, unless the agent runs with
  ``allow_privileged`` (the runc and gvisor runtimes need it), are not
  privileged, add no capabilities and allow no privilege escalation;
* a worker reaches the controlplane over TLS only: a plain-text
  ``LEVERS9_CONTROLPLANE_URL`` is refused unless the agent runs with
  ``insecure`` (development only), as the Docker side does.

Every problem found is named in one :class:`~levers9.agent.docker_workers.OrderRefused`
(``invalid_request``). The order's own objects are never changed: the checked
ones are deep copies. Secret values are never part of a message.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from levers9.agent.docker_workers import OrderRefused
from levers9.kube import as_list, as_object, parse_quantity

__all__ = ["MACHINE_LABEL", "OWNER_LABEL", "POOL_LABEL", "ProvisionObjects", "check_provision", "machine_id_of"]

#: the label that ties a Job, its pod and its Secret to a levers9 machine (as ``levers9.kube.jobs`` sets it)
MACHINE_LABEL = "levers9/machine-id"
POOL_LABEL = "levers9/pool"
#: whose worker a Job is: a pool's name (as ``levers9.kube.jobs`` sets it); the agent's is its cluster's pool
OWNER_LABEL = "levers9/owner"
_INVALID = "invalid_request"
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class ProvisionObjects:
    """A ``provision`` order's Job and Secret, checked, with the agent's namespace set (deep copies)."""

    machine_id: str
    job: dict[str, Any]
    secret: dict[str, Any]

    @property
    def job_name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def secret_name(self) -> str:
        return str(self.secret["metadata"]["name"])


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _check_object(
    obj: Any, what: str, api_version: str, kind: str, namespace: str, machine_id: str, problems: list[str]
) -> None:
    if not _is_object(obj):
        problems.append(f"'{what}' must be a {kind} object, got {type(obj).__name__}")
        return
    if (obj.get("apiVersion"), obj.get("kind")) != (api_version, kind):
        problems.append(
            f"'{what}' must be apiVersion {api_version} kind {kind}, got apiVersion {obj.get('apiVersion')!r} "
            f"kind {obj.get('kind')!r}"
        )
    metadata = obj.get("metadata")
    if not _is_object(metadata):
        problems.append(f"'{what}' has no metadata object")
        return
    if not isinstance(metadata.get("name"), str) or not metadata["name"]:
        problems.append(f"'{what}' needs metadata.name")
    given = metadata.get("namespace")
    if given not in (None, "", namespace):
        problems.append(f"'{what}' is for namespace {given!r}; this agent creates in namespace {namespace!r} only")
    labels = metadata.get("labels")
    label = labels.get(MACHINE_LABEL) if _is_object(labels) else None
    if label != machine_id:
        problems.append(f"'{what}' must be labelled {MACHINE_LABEL}={machine_id} (the order's machine), got {label!r}")


def _check_pod(pod: Mapping[str, Any], secret: str, allow_privileged: bool, problems: list[str]) -> None:
    for field, meaning in (
        ("hostNetwork", "the node's network"),
        ("hostPID", "the node's processes"),
        ("hostIPC", "the node's IPC namespace"),
    ):
        if pod.get(field):
            problems.append(f"the Job's pod may not set {field} (it would share {meaning})")
    if pod.get("automountServiceAccountToken") is not False:
        problems.append(
            "the Job's pod must set automountServiceAccountToken: false (a worker never calls the Kubernetes API, "
            "and a mounted token could be this agent's)"
        )
    for volume in as_list(pod.get("volumes")):
        volume = as_object(volume)
        name = volume.get("name")
        kinds = sorted(set(volume) - {"name"})
        mounted = as_object(volume.get("secret")).get("secretName")
        if kinds == ["emptyDir"] or (kinds == ["secret"] and mounted == secret):
            continue
        if "hostPath" in kinds:
            problems.append(f"the Job's pod may not mount hostPath volume {name!r} (the node's file system)")
        elif kinds == ["secret"]:
            problems.append(f"the Job's pod may mount Secret {secret!r} only; volume {name!r} is Secret {mounted!r}")
        else:
            problems.append(
                f"the Job's pod may have emptyDir volumes and Secret {secret!r} only; volume {name!r} is "
                f"{', '.join(kinds) or 'empty'}"
            )
    if not as_list(pod.get("containers")):
        problems.append("the Job's pod has no containers")
    for key in _CONTAINER_LISTS:
        for container in as_list(pod.get(key)):
            if not _is_object(container):
                problems.append(f"the Job's pod has a container that is not an object: {container!r}")
                continue
            _check_container(container, secret, allow_privileged, problems)


def _check_container(container: Mapping[str, Any], secret: str, allow_privileged: bool, problems: list[str]) -> None:
    name = container.get("name")
    if not allow_privileged:
        _check_unprivileged(name, as_object(container.get("securityContext")), problems)
    for port in as_list(container.get("ports")):
        if as_object(port).get("hostPort"):
            problems.append(f"container {name!r} may not use hostPort {port['hostPort']} (a port of the node)")
    _check_resources(name, as_object(container.get("resources")), problems)
    _check_env(name, container, secret, problems)


def _check_unprivileged(name: object, context: Mapping[str, Any], problems: list[str]) -> None:
    """What a container of an agent without allow_privileged may not ask for."""
    if context.get("privileged"):
        problems.append(
            f"container {name!r} may not be privileged: this agent runs without allow_privileged, which a "
            "pool of runtime runc or gvisor needs (run the agent with allow_privileged, or use runtime 'process')"
        )
    if context.get("allowPrivilegeEscalation"):
        problems.append(
            f"container {name!r} may not set allowPrivilegeEscalation (this agent runs without allow_privileged)"
        )
    added = as_object(context.get("capabilities")).get("add")
    if added:
        problems.append(
            f"container {name!r} may not add capabilities {added} (this agent runs without allow_privileged)"
        )


def _check_resources(name: object, resources: Mapping[str, Any], problems: list[str]) -> None:
    for which in ("requests", "limits"):
        for resource, amount in as_object(resources.get(which)).items():
            try:
                parse_quantity(amount)
            except ValueError as exc:
                problems.append(f"container {name!r}: resources.{which}.{resource}: {exc}")


def _check_env(name: object, container: Mapping[str, Any], secret: str, problems: list[str]) -> None:
    """A container's env and envFrom may read the order's Secret and nothing else (no other Secret, no ConfigMap)."""
    for item in as_list(container.get("env")):
        source = as_object(as_object(item).get("valueFrom"))
        if "secretKeyRef" in source and as_object(source["secretKeyRef"]).get("name") != secret:
            problems.append(
                f"container {name!r}: env {item.get('name')!r} may read Secret {secret!r} only, not "
                f"{as_object(source['secretKeyRef']).get('name')!r}"
            )
        if "configMapKeyRef" in source:
            problems.append(f"container {name!r}: env {item.get('name')!r} may not read a ConfigMap")
    for item in as_list(container.get("envFrom")):
        item = as_object(item)
        if "secretRef" in item and as_object(item["secretRef"]).get("name") != secret:
            problems.append(
                f"container {name!r}: envFrom may read Secret {secret!r} only, not {as_object(item['secretRef']).get('name')!r}"
            )
        if "configMapRef" in item:
            problems.append(f"container {name!r}: envFrom may not read a ConfigMap")


def _controlplane_urls(pod: Mapping[str, Any]) -> list[str]:
    return [
        str(item.get("value") or "")
        for container in as_list(pod.get("containers"))
        for item in as_list(as_object(container).get("env"))
        if as_object(item).get("name") == "LEVERS9_CONTROLPLANE_URL" and "value" in item
    ]


def _check_tls(pod: Mapping[str, Any], machine_id: str, insecure: bool, problems: list[str]) -> None:
    from levers9.proto.target import TargetError, parse_targets

    for url in _controlplane_urls(pod):
        if not url:
            continue
        try:
            _, tls = parse_targets(url)
        except TargetError as exc:
            problems.append(f"LEVERS9_CONTROLPLANE_URL: {exc}")
            continue
        if not tls and not insecure:
            problems.append(
                f"the worker of machine {machine_id} would reach the controlplane in plain text ({url}): workers "
                "reach it over TLS only; serve the controlplane with listen.tls (grpcs://), or run this agent "
                "with --insecure on a development cluster"
            )


def check_provision(
    payload: Mapping[str, Any],
    namespace: str,
    *,
    owner: str,
    allow_privileged: bool = False,
    insecure: bool = False,
) -> ProvisionObjects:
    """The order's Job and Secret, checked (see the module docstring), as copies with ``namespace`` set and
    labelled ``levers9/owner=<owner>`` (the Job, its pod template and the Secret).

    :raises OrderRefused: (invalid_request) naming every problem found.
    """
    machine_id = payload.get("machine_id")
    if not isinstance(machine_id, str) or not _LABEL_VALUE.match(machine_id):
        raise OrderRefused(
            f"provision order: 'machine_id' must be a label value (1-63 letters, digits, '-_.', starting and "
            f"ending with a letter or digit), got {machine_id!r}",
            _INVALID,
        )
    job, secret = payload.get("job"), payload.get("secret")
    problems: list[str] = []
    _check_object(job, "job", "batch/v1", "Job", namespace, machine_id, problems)
    _check_object(secret, "secret", "v1", "Secret", namespace, machine_id, problems)
    if problems:  # the pod is not looked at in objects of the wrong shape
        raise OrderRefused(f"provision order for machine {machine_id}: " + "; ".join(problems), _INVALID)
    assert isinstance(job, dict)
    assert isinstance(secret, dict)
    job, secret = copy.deepcopy(job), copy.deepcopy(secret)
    secret_name = str(secret["metadata"]["name"])
    template = as_object(job.get("spec")).get("template")
    pod = as_object(template).get("spec")
    metadata = as_object(template).setdefault("metadata", {})
    if not _is_object(pod) or not _is_object(metadata) or not _is_object(metadata.setdefault("labels", {})):
        problems.append("'job' has no spec.template.spec (the pod), or its metadata.labels is not an object")
    else:
        assert isinstance(pod, dict)
        template_labels = metadata["labels"]
        if template_labels.get(MACHINE_LABEL, machine_id) != machine_id:
            problems.append(
                f"the Job's pod template is labelled {MACHINE_LABEL}={template_labels[MACHINE_LABEL]}, "
                f"not the order's machine {machine_id}"
            )
        template_labels[MACHINE_LABEL] = machine_id
        _check_pod(pod, secret_name, allow_privileged, problems)
        _check_tls(pod, machine_id, insecure, problems)
    if problems:
        raise OrderRefused(f"provision order for machine {machine_id}: " + "; ".join(problems), _INVALID)
    job["metadata"]["namespace"] = namespace
    secret["metadata"]["namespace"] = namespace
    for labels in (job["metadata"]["labels"], secret["metadata"]["labels"], metadata["labels"]):
        labels[OWNER_LABEL] = owner
    secret["metadata"].pop("ownerReferences", None)  # set to the Job once it exists
    return ProvisionObjects(machine_id=machine_id, job=job, secret=secret)


def machine_id_of(payload: Mapping[str, Any], order: str) -> str:
    """The order's ``machine_id``, a label value; :class:`OrderRefused` (invalid_request) otherwise."""
    machine_id = payload.get("machine_id")
    if not isinstance(machine_id, str) or not _LABEL_VALUE.match(machine_id):
        raise OrderRefused(f"{order} order: 'machine_id' must be a label value, got {machine_id!r}", _INVALID)
    return machine_id
