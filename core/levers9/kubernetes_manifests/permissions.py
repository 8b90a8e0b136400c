"""The Kubernetes API calls the ``local_k8s`` provider makes, and the RBAC rules that allow exactly those.

:data:`LOCAL_K8S_CALLS` is the one list: each entry names a method of the
``kubernetes`` Python client, the RBAC attributes of the request it sends (API
group, resource, verb) and whether the rule is cluster-wide (a ClusterRole) or
in a worker namespace (a Role), with why the provider needs it. The Role and
ClusterRole the manifests carry are built from it and from nothing else
(:func:`namespaced_rules`, :func:`cluster_rules`), so a grant cannot appear
without a call that needs it. ``tests/deploy`` sends each call with the real
client to a recording server and checks the attributes written here against
the request, and checks that every client method the provider's code names is
listed.

Cluster-wide reads are the least the offers need: GPUs free on a node are its
allocatable GPUs minus those requested by the node's pods in *every* namespace,
so pods are listed across namespaces; nodes and namespaces are cluster-scoped.

An attached cluster's agent is granted less (:data:`AGENT_CALLS`): the
customer's cluster is not the operator's. Its Role reads no Secret but its own
credential (``resourceNames``) and lists none; its ClusterRole lists nodes
only. Listing every pod of the cluster is an *optional* call (``optional``:
in no rule the manifest writes): the agent tries it for exact room, and
without it counts only its namespace's pods (the customer may grant it, see
docs/deploy.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AGENT_CALLS", "LOCAL_K8S_CALLS", "ApiCall", "cluster_rules", "namespaced_rules"]


@dataclass(frozen=True)
class ApiCall:
    """One call of the ``kubernetes`` client and the RBAC rule that allows it."""

    #: ``Class.method`` of ``kubernetes.client``, e.g. ``BatchV1Api.create_namespaced_job``
    method: str
    #: the API group ("" for the core group)
    group: str
    resource: str
    verb: str
    #: True: a ClusterRole rule; False: a Role rule in each worker namespace
    cluster: bool
    #: what the provider does with it
    why: str
    #: the only objects the rule allows (RBAC ``resourceNames``); empty: any
    names: tuple[str, ...] = ()
    #: made when allowed, done without otherwise: no rule grants it
    optional: bool = False


LOCAL_K8S_CALLS: tuple[ApiCall, ...] = (
    ApiCall(
        "CoreV1Api.list_node",
        "",
        "nodes",
        "list",
        True,
        "offers: GPU Feature Discovery labels, allocatable GPUs and taints of each node",
    ),
    ApiCall(
        "CoreV1Api.list_pod_for_all_namespaces",
        "",
        "pods",
        "list",
        True,
        "offers: GPUs already requested by each node's pods, whatever their namespace",
    ),
    ApiCall("CoreV1Api.read_namespace", "", "namespaces", "get", True, "levers9 check: the worker namespace exists"),
    ApiCall(
        "AuthorizationV1Api.create_self_subject_access_review",
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "create",
        True,
        "levers9 check: may this controlplane create Jobs",
    ),
    ApiCall(
        "CoreV1Api.list_namespaced_resource_quota",
        "",
        "resourcequotas",
        "list",
        False,
        "quota checked before a Job is created, so a full namespace fails over at once",
    ),
    ApiCall(
        "CoreV1Api.create_namespaced_secret",
        "",
        "secrets",
        "create",
        False,
        "the worker's token, in a Secret owned by its Job, which the Job's pod reads",
    ),
    ApiCall(
        "CoreV1Api.delete_namespaced_secret",
        "",
        "secrets",
        "delete",
        False,
        "terminate: the token Secret too, should its Job be gone already",
    ),
    ApiCall("BatchV1Api.create_namespaced_job", "batch", "jobs", "create", False, "provision: one Job per worker"),
    ApiCall(
        "BatchV1Api.read_namespaced_job",
        "batch",
        "jobs",
        "get",
        False,
        "a provision retried after 409 AlreadyExists: the Job already made",
    ),
    ApiCall(
        "BatchV1Api.list_namespaced_job", "batch", "jobs", "list", False, "list machines: the pool's Jobs by label"
    ),
    ApiCall(
        "BatchV1Api.delete_namespaced_job",
        "batch",
        "jobs",
        "delete",
        False,
        "terminate, with background propagation so the pod and the Secret go too",
    ),
    ApiCall("CoreV1Api.list_namespaced_pod", "", "pods", "list", False, "the phase of each Job's pod"),
    ApiCall(
        "CoreV1Api.list_namespaced_event",
        "",
        "events",
        "list",
        False,
        "FailedScheduling: why a worker's pod is still pending (a capacity miss)",
    ),
)

#: the calls of an attached cluster's agent (``levers9.agent.k8s_api``): the Role in its namespace and the
#: ClusterRole ``levers9 cluster join`` writes are built from these alone
AGENT_CALLS: tuple[ApiCall, ...] = (
    ApiCall(
        "CoreV1Api.list_node",
        "",
        "nodes",
        "list",
        True,
        "inventory and the room check: GPU labels, allocatable and taints of each node",
    ),
    ApiCall(
        "CoreV1Api.list_pod_for_all_namespaces",
        "",
        "pods",
        "list",
        True,
        "exact room: what each node's pods hold, whatever their namespace (not granted by the manifest: "
        "without it the agent counts its own namespace's pods)",
        optional=True,
    ),
    ApiCall(
        "CoreV1Api.list_namespaced_resource_quota",
        "",
        "resourcequotas",
        "list",
        False,
        "quota checked before a Job is created, so a full namespace fails over at once",
    ),
    ApiCall("BatchV1Api.create_namespaced_job", "batch", "jobs", "create", False, "provision: one Job per worker"),
    ApiCall(
        "BatchV1Api.read_namespaced_job",
        "batch",
        "jobs",
        "get",
        False,
        "a provision order seen again: the machine's Job already made",
    ),
    ApiCall("BatchV1Api.list_namespaced_job", "batch", "jobs", "list", False, "the workers, by label"),
    ApiCall(
        "BatchV1Api.delete_namespaced_job",
        "batch",
        "jobs",
        "delete",
        False,
        "terminate, with background propagation so the pod and the Secret go too",
    ),
    ApiCall(
        "CoreV1Api.create_namespaced_secret",
        "",
        "secrets",
        "create",
        False,
        "the worker's token in a Secret owned by its Job; the agent's own credential once joined",
    ),
    ApiCall(
        "CoreV1Api.read_namespaced_secret",
        "",
        "secrets",
        "get",
        False,
        "the agent's credential, read back when its pod restarts",
        names=("levers9-agent-credential",),
    ),
    ApiCall(
        "CoreV1Api.delete_namespaced_secret",
        "",
        "secrets",
        "delete",
        False,
        "terminate: the token Secret its Job names",
    ),
    ApiCall("CoreV1Api.list_namespaced_pod", "", "pods", "list", False, "the phase of each Job's pod"),
    ApiCall(
        "CoreV1Api.list_namespaced_event",
        "",
        "events",
        "list",
        False,
        "FailedScheduling: why a worker's pod is still pending",
    ),
)


def _rules(calls: tuple[ApiCall, ...]) -> list[dict[str, Any]]:
    """RBAC rules for ``calls`` (the optional ones left out): one per (group, resource, resourceNames), verbs
    sorted, rules in a stable order."""
    verbs: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
    for call in calls:
        if not call.optional:
            verbs.setdefault((call.group, call.resource, call.names), set()).add(call.verb)
    rules: list[dict[str, Any]] = []
    for (group, resource, names), found in sorted(verbs.items()):
        rule: dict[str, Any] = {"apiGroups": [group], "resources": [resource]}
        if names:
            rule["resourceNames"] = list(names)
        rule["verbs"] = sorted(found)
        rules.append(rule)
    return rules


def namespaced_rules(calls: tuple[ApiCall, ...] = LOCAL_K8S_CALLS) -> list[dict[str, Any]]:
    """The Role's rules: what the provider does in a worker namespace."""
    return _rules(tuple(c for c in calls if not c.cluster))


def cluster_rules(calls: tuple[ApiCall, ...] = LOCAL_K8S_CALLS) -> list[dict[str, Any]]:
    """The ClusterRole's rules: the cluster-wide reads (and the access review) the provider makes."""
    return _rules(tuple(c for c in calls if c.cluster))
