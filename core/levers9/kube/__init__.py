"""Kubernetes objects as plain API JSON: quantities, what a pod asks, what a node holds, whether a pod fits.

One reading of the Kubernetes API's JSON (camelCase keys) for every part of
levers9 that places pods: the agent's Kubernetes backend
(:mod:`levers9.agent.k8s_workers`) checks that a worker's pod fits somewhere
*before* it creates the Job and reports each node's room in its inventory;
the ``local_k8s`` and ``attached_cluster`` plugins work out each node's room
for their offers. The kube-scheduler accepts a Job it cannot place and says so
only in an event, so a full cluster must be a refusal the controlplane fails
over on at once. Standard library only.

* quantities (``500m``, ``4Gi``, ``1.5``, ``2e3``) parsed exactly as
  :class:`fractions.Fraction` by the API server's grammar (``4G`` is 4·10⁹,
  ``4Gi`` 4·2³⁰; unlike :mod:`levers9.quantities`, what people write in
  levers9's config), and written back in a form the API reads;
* a pod's requests: its containers' sums (an init container's when larger),
  a limit standing in for a missing request, as the API server defaults it;
* a node's usage: the summed requests of the live pods bound to it, and their
  number under ``pods``;
* whether a pod fits a node now (:func:`misfit`): Ready, not cordoned unless
  tolerated, every ``NoSchedule``/``NoExecute`` taint tolerated, the pod's
  ``nodeSelector`` and required node affinity matched, one more pod and every
  request within ``status.allocatable`` less the usage;
* whether a worker's pod can never start (:func:`start_failure`,
  :func:`create_failure`): a container waiting on an image that cannot be
  pulled or on a configuration the kubelet refuses, or a Job whose pod the API
  refuses (Pod Security admission), which only the Job's ``FailedCreate``
  event says. Waiting out a deadline would change none of these.

A malformed quantity counts as none of it, never as unlimited.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from fractions import Fraction
from typing import Any

__all__ = [
    "api_status",
    "as_list",
    "as_object",
    "container_detail",
    "create_failure",
    "format_quantity",
    "misfit",
    "node_usage",
    "parse_quantity",
    "pod_asks",
    "quantity",
    "shown",
    "start_failure",
    "status_reason",
    "timestamp",
    "trimmed_node",
    "unschedulable",
    "unusable",
]

_ENDED = frozenset({"Succeeded", "Failed"})
_BLOCKING = frozenset({"NoSchedule", "NoExecute"})
_UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
#: node labels whose value changes without the node changing (GPU Feature Discovery stamps each labelling run)
_CHURNING_LABELS = frozenset({"nvidia.com/gfd.timestamp"})


# ---------------------------------------------------------------------------------------------- quantities

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(text: Any) -> Fraction:
    """A Kubernetes quantity (``500m``, ``4Gi``, ``1.5``, ``2e3``) exactly; ValueError naming it otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    if isinstance(text, int | float):
        return Fraction(str(text))
    found = _QUANTITY.match(str(text).strip())
    if found is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (like 500m, 4Gi, 2, 1.5, 1e3)")
    number, suffix = Fraction(found.group(1)), found.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def format_quantity(value: Fraction) -> str:
    """``value`` as a quantity the API (and :func:`parse_quantity`) reads back: ``3``, ``1500m`` (milli, rounded up)."""
    if value.denominator == 1:
        return str(value.numerator)
    millis = value * 1000
    return f"{-(-millis.numerator // millis.denominator)}m"


def quantity(values: Mapping[str, Any], name: str) -> Fraction:
    """One amount of a resource map; a malformed one counts as none (never as unlimited)."""
    try:
        return parse_quantity(values.get(name, 0))
    except ValueError:
        return Fraction(0)


def shown(value: Fraction) -> str:
    """A number for a message: ``3``, ``0.5``."""
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def timestamp(stamp: Any) -> datetime | None:
    """An API timestamp (``2026-12-07T05:06:15Z``, RFC 3339) as an aware datetime; None when absent or malformed."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def as_object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (what is malformed is the API server's to refuse)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def _container_asks(container: Mapping[str, Any]) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """(requests, limits) of one container; a limit stands in for a missing request, as the API server defaults it."""
    resources = as_object(container.get("resources"))
    limits: dict[str, Fraction] = {}
    for name, amount in as_object(resources.get("limits")).items():
        with contextlib.suppress(ValueError):
            limits[name] = parse_quantity(amount)
    requests = dict(limits)
    for name, amount in as_object(resources.get("requests")).items():
        with contextlib.suppress(ValueError):
            requests[name] = parse_quantity(amount)
    return requests, limits


def pod_asks(pod_spec: Mapping[str, Any]) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """(requests, limits) of a pod: its containers' sums, or an init container's when that is larger."""
    totals: list[dict[str, Fraction]] = [{}, {}]
    for container in as_list(pod_spec.get("containers")):
        for total, asked in zip(totals, _container_asks(as_object(container)), strict=True):
            for name, amount in asked.items():
                total[name] = total.get(name, Fraction(0)) + amount
    for container in as_list(pod_spec.get("initContainers")):
        for total, asked in zip(totals, _container_asks(as_object(container)), strict=True):
            for name, amount in asked.items():
                total[name] = max(total.get(name, Fraction(0)), amount)
    return totals[0], totals[1]


# ---------------------------------------------------------------------------------------------- nodes


def trimmed_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What placement needs of a Node, without what changes while the node does not (heartbeats, images,
    addresses, GPU Feature Discovery's timestamp label), so an unchanged cluster sends no new inventory."""
    metadata, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    trimmed_spec: dict[str, Any] = {}
    taints = [
        {k: taint[k] for k in ("key", "value", "effect") if taint.get(k)}
        for taint in spec.get("taints") or []
        if isinstance(taint, dict)
    ]
    if taints:
        trimmed_spec["taints"] = taints
    if spec.get("unschedulable"):
        trimmed_spec["unschedulable"] = True
    ready = [
        {"type": "Ready", "status": str(c.get("status"))}
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") == "Ready"
    ]
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k not in _CHURNING_LABELS}
    return {
        "metadata": {"name": str(metadata.get("name") or ""), "labels": labels},
        "spec": trimmed_spec,
        "status": {"allocatable": dict(status.get("allocatable") or {}), "conditions": ready},
    }


def node_usage(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Fraction]]:
    """Per node, the summed requests of the live pods bound to it, and their number under ``pods``."""
    held: dict[str, dict[str, Fraction]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        on_node = held.setdefault(str(node_name), {})
        requests, _ = pod_asks(pod.get("spec") or {})
        for name, amount in [*requests.items(), ("pods", Fraction(1))]:
            on_node[name] = on_node.get(name, Fraction(0)) + amount
    return held


def unusable(node: Mapping[str, Any]) -> str | None:
    """Why no new pod goes on ``node`` whatever it tolerates (not Ready); None when it may."""
    ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    if ready and ready[0].get("status") != "True":
        return "is not Ready"
    return None


def _tolerated(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        operator = toleration.get("operator") or "Equal"
        key = toleration.get("key") or ""
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _requirement_matches(expression: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator = expression.get("key"), expression.get("operator")
    wanted = [str(v) for v in expression.get("values") or []]
    present = key in values
    value = values.get(str(key), "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _affinity_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    fields = {"metadata.name": str(metadata.get("name") or "")}
    for term in required.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        by_field = term.get("matchFields") or []
        if not (expressions or by_field):  # an empty term matches no node
            continue
        if all(_requirement_matches(e, labels) for e in expressions) and all(
            _requirement_matches(f, fields) for f in by_field
        ):
            return True
    return False


def misfit(
    pod: Mapping[str, Any],
    requests: Mapping[str, Fraction],
    node: Mapping[str, Any],
    used: Mapping[str, Fraction],
) -> str | None:
    """Why the pod (spec ``pod``, asking ``requests``) cannot go on ``node`` now; None when it fits."""
    down = unusable(node)
    if down:
        return down
    spec, labels = node.get("spec") or {}, (node.get("metadata") or {}).get("labels") or {}
    tolerations = [t for t in pod.get("tolerations") or [] if isinstance(t, dict)]
    if spec.get("unschedulable") and not _tolerated(tolerations, {"key": _UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return "is cordoned (unschedulable)"
    for taint in spec.get("taints") or []:
        if taint.get("key") == _UNSCHEDULABLE_TAINT:
            continue
        if taint.get("effect") in _BLOCKING and not _tolerated(tolerations, taint):
            named = f"{taint.get('key')}={taint.get('value')}" if taint.get("value") else str(taint.get("key"))
            return f"has the taint {named}:{taint.get('effect')}, which the pod does not tolerate"
    wrong = [f"{k}={v}" for k, v in (pod.get("nodeSelector") or {}).items() if labels.get(k) != v]
    if wrong:
        return f"does not match the pod's nodeSelector ({', '.join(wrong)})"
    if not _affinity_matches(pod, node):
        return "does not match the pod's required node affinity"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    if "pods" in allocatable and used.get("pods", Fraction(0)) + 1 > quantity(allocatable, "pods"):
        return f"already runs {shown(used.get('pods', Fraction(0)))} of {allocatable['pods']} pods"
    for name, amount in sorted(requests.items()):
        if amount <= 0:
            continue
        total = quantity(allocatable, name)
        free = max(Fraction(0), total - used.get(name, Fraction(0)))
        if amount > free:
            return f"{format_quantity(free)} of {format_quantity(total)} {name} free, {format_quantity(amount)} needed"
    return None


# ---------------------------------------------------------------------------------------------- pods and errors


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message for a pod it could not place (its PodScheduled condition); None otherwise."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return str(condition.get("message") or "the pod cannot be scheduled")
    return None


def container_detail(pod: Mapping[str, Any]) -> str | None:
    """Why a pod's container is not running: ``container exited 1 (Error)``, ``ErrImagePull: ...``; else None."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        state = container.get("state") or {}
        if "terminated" in state:
            ended = state["terminated"] or {}
            return f"container exited {ended.get('exitCode')} ({ended.get('reason') or 'no reason'})"
        waiting = state.get("waiting") or {}
        if waiting.get("reason"):
            message = waiting.get("message")
            return f"{waiting['reason']}: {message}" if message else str(waiting["reason"])
    return None


#: container waiting reasons no wait mends: the image cannot be pulled (the kubelet alternates ErrImagePull with
#: its back-off), its name is invalid, or the container cannot be configured or created as the pod asks
CANNOT_START = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
_MISSING_SECRET = re.compile(r'^secret "[^"]+" not found$')


def start_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pending pod's container will never start (``ErrImagePull: <the kubelet's words>``); None: it may.

    A ``CreateContainerConfigError`` for a Secret that is not there yet is not one: a worker's token Secret is
    created just after its Job, and the kubelet retries until it appears."""
    for container in as_list(as_object(pod.get("status")).get("containerStatuses")):
        waiting = as_object(as_object(as_object(container).get("state")).get("waiting"))
        reason, message = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
        if reason not in CANNOT_START:
            continue
        if reason == "CreateContainerConfigError" and _MISSING_SECRET.match(message):
            continue
        return f"{reason}: {message}" if message else reason
    return None


def create_failure(events: Iterable[Mapping[str, Any]]) -> str | None:
    """Why a Job's pod can never be created, from the Job's ``FailedCreate`` events (the newest); None: it may be.

    A refusal for quota is not one (pods that end free it); anything else the API refuses the pod for (Pod
    Security admission: ``violates PodSecurity "restricted:latest": ...``, a missing ServiceAccount) is."""
    found = [e for e in events if e.get("reason") == "FailedCreate" and e.get("message")]
    if not found:
        return None
    newest = max(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    message = str(newest["message"])
    if "exceeded quota" in message or "failed quota" in message:
        return None
    return f"FailedCreate: {message}"


def api_status(exc: BaseException) -> int | None:
    """The HTTP status of the ``kubernetes`` client's ``ApiException`` (recognised by name, so the client need not
    be imported); None for anything else."""
    status = getattr(exc, "status", None)
    api_error = any(kind.__name__ == "ApiException" for kind in type(exc).__mro__)  # NotFoundException...
    return status if isinstance(status, int) and api_error else None


def status_reason(exc: BaseException) -> tuple[str, str]:
    """The API's ``Status`` body's (reason, message), or the HTTP reason and the raw body when it is not one."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        parsed = json.loads(body) if isinstance(body, str) and body else {}
    except ValueError:
        parsed = {}
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return str(parsed.get("reason") or ""), str(parsed.get("message") or "")
    return str(getattr(exc, "reason", "") or ""), str(body or "")[:300]
