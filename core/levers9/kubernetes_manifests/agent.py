"""The manifest ``levers9 cluster join`` writes: the agent of an attached cluster, and exactly the rights it needs.

The customer applies it with their own kube context; nothing in it lets the
controlplane reach into their cluster.

**The namespace is not in it.** ``kubectl delete -f`` of the manifest must
remove the agent and nothing else: the namespace may hold other things (a
``local_k8s`` pool's workers, the controlplane itself, whose default namespace
is also ``levers9``). So the namespace is made by a step of its own
(:func:`apply_lines`: ``kubectl create namespace`` when it is missing, then
``kubectl apply -f``), and removing the agent is :func:`delete_lines` (by its
labels, since the manifest file, which holds the join token, is deleted once
applied) or ``kubectl delete -f`` of the file; neither removes the namespace.
Its objects:

* the **ServiceAccount** ``levers9-agent`` and its rights, built from
  :data:`~levers9.kubernetes_manifests.permissions.AGENT_CALLS` and from
  nothing else: a Role in the namespace (worker Jobs; Secrets it may create
  and delete by name but list none, and read only its own credential; pods,
  events, quotas) and a ClusterRole that lists nodes only (no pod of another
  namespace is read unless the customer grants it);
* the **Secret** ``levers9-agent-join`` with the single-use join token (the
  only copy: it is in this file and in no log);
* the agent's **Deployment**: one replica, ``Recreate`` (two agents of one
  cluster never run at once), running ``levers9 agent join --kubernetes`` as
  nobody, read-only root, no privileges; the token reaches it through a
  ``secretKeyRef`` only. Once joined, the agent keeps its own credential in the
  Secret ``levers9-agent-credential`` and a restarted pod runs with that: the
  spent join token is never needed again.

Every object carries ``app.kubernetes.io/*`` labels naming the cluster. The
worker Jobs the agent creates later are not part of it (the agent deletes
them when the cluster is removed). Their pods need the namespace's Pod
Security level to allow them: ``baseline`` for the ``process`` runtime,
``privileged`` for ``runc`` and ``gvisor`` (with ``allow_privileged``);
:func:`apply_lines` labels a namespace it creates so.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from levers9.__about__ import __version__
from levers9.kubernetes_manifests.permissions import AGENT_CALLS, cluster_rules, namespaced_rules

__all__ = [
    "AGENT",
    "CREDENTIAL_SECRET",
    "JOIN_SECRET",
    "JOIN_TOKEN_KEY",
    "AgentManifest",
    "apply_line",
    "apply_lines",
    "delete_lines",
    "render_agent",
]

AGENT = "levers9-agent"
JOIN_SECRET = "levers9-agent-join"
#: where the agent keeps the credential it got for the join token (it creates it; the Role lets it)
CREDENTIAL_SECRET = "levers9-agent-credential"
JOIN_TOKEN_KEY = "LEVERS9_JOIN_TOKEN"
RUN_AS = 65534
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class AgentManifest:
    """What the manifest of one attached cluster is made of."""

    #: the cluster's name on the controlplane
    cluster: str
    #: where the agent and its worker Jobs live
    namespace: str
    #: an image with levers9 and its Kubernetes client (levers9's k8s extra: the ``kubernetes`` package)
    image: str
    controlplane_url: str
    join_token: str
    #: PEM of the CA the controlplane's certificate is signed by; empty: the system trust store
    ca_pem: str = ""
    #: worker pods may run privileged containers (the runc and gvisor runtimes need it)
    allow_privileged: bool = False
    image_pull_secrets: tuple[str, ...] = ()
    #: the agent starts even when the namespace holds another levers9 pool's worker Jobs
    share_namespace: bool = False

    def check(self) -> None:
        """:raises ValueError: naming each field that Kubernetes would refuse."""
        problems = []
        for field, value in (("cluster", self.cluster), ("namespace", self.namespace)):
            if not (len(value) <= 63 and _DNS_LABEL.fullmatch(value)):
                problems.append(f"{field} {value!r} must be a DNS label (lowercase letters, digits, '-')")
        if not self.image or any(c.isspace() for c in self.image):
            problems.append(f"image {self.image!r} must be an image reference like registry.example.com/levers9:1.0")
        if not self.controlplane_url.startswith(("grpcs://", "grpc://")):
            problems.append(f"controlplane_url {self.controlplane_url!r} must be grpcs://host:port")
        if not self.join_token:
            problems.append("join_token is empty")
        if problems:
            raise ValueError("; ".join(problems))


def _labels(cluster: str) -> dict[str, str]:
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)[:63].strip("-_.") or "unknown"
    return {
        "app.kubernetes.io/name": "levers9",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/component": "agent",
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/managed-by": "levers9",
    }


def agent_command(manifest: AgentManifest) -> list[str]:
    """The agent container's command: join (or, once joined, run with the credential Secret)."""
    command = [
        "levers9",
        "agent",
        "join",
        "--kubernetes",
        "--namespace",
        manifest.namespace,
        "--controlplane",
        manifest.controlplane_url,
    ]
    if manifest.ca_pem:
        command += ["--ca-b64", base64.b64encode(manifest.ca_pem.encode()).decode()]
    if manifest.controlplane_url.startswith("grpc://"):
        command.append("--insecure")
    if manifest.allow_privileged:
        command.append("--allow-privileged")
    if manifest.share_namespace:
        command.append("--share-namespace")
    return command


def render_agent(manifest: AgentManifest) -> list[dict[str, Any]]:
    """The objects, in the order ``kubectl apply`` needs them. :raises ValueError: see :meth:`AgentManifest.check`."""
    manifest.check()
    ns, labels = manifest.namespace, _labels(manifest.cluster)
    rbac = "rbac.authorization.k8s.io"
    cluster_role = f"{AGENT}-{ns}"

    def meta(name: str, namespaced: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name}
        if namespaced:
            out["namespace"] = ns
        out["labels"] = dict(labels)
        return out

    subject = [{"kind": "ServiceAccount", "name": AGENT, "namespace": ns}]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": AGENT,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "agent",
                "image": manifest.image,
                "command": agent_command(manifest),
                "env": [
                    {
                        "name": JOIN_TOKEN_KEY,
                        "valueFrom": {"secretKeyRef": {"name": JOIN_SECRET, "key": JOIN_TOKEN_KEY, "optional": True}},
                    },
                    {"name": "HOME", "value": "/tmp"},
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if manifest.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in manifest.image_pull_secrets]
    return [  # no Namespace: see the module docstring
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(AGENT)},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta(AGENT), "rules": namespaced_rules(AGENT_CALLS)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta(AGENT),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": AGENT},
            "subjects": subject,
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": meta(cluster_role, namespaced=False),
            "rules": cluster_rules(AGENT_CALLS),
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta(cluster_role, namespaced=False),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": cluster_role},
            "subjects": subject,
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(JOIN_SECRET),
            "type": "Opaque",
            "stringData": {JOIN_TOKEN_KEY: manifest.join_token},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(AGENT),
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {
                    "matchLabels": {
                        "app.kubernetes.io/instance": manifest.cluster,
                        "app.kubernetes.io/component": "agent",
                    }
                },
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        },
    ]


def apply_line(path: str) -> str:
    """The command that applies the manifest (the namespace must exist: :func:`apply_lines`)."""
    return f"kubectl apply -f {path}"


def apply_lines(path: str, namespace: str, *, allow_privileged: bool = False) -> list[str]:
    """The commands the customer runs, with their own kube context: the namespace when it is missing (labelled
    with the Pod Security level its workers need), then the manifest."""
    level = "privileged" if allow_privileged else "baseline"
    return [
        f"kubectl get namespace {namespace} >/dev/null 2>&1 || {{ kubectl create namespace {namespace} && "
        f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce={level}; }}",
        apply_line(path),
    ]


def delete_lines(cluster: str, namespace: str) -> list[str]:
    """The commands that remove cluster ``cluster``'s agent (its manifest's objects and the credential it kept)
    and leave the namespace and everything else in it."""
    selector = f"app.kubernetes.io/instance={cluster},app.kubernetes.io/component=agent"
    return [
        f"kubectl -n {namespace} delete deployment,rolebinding,role,serviceaccount,secret -l {selector}",
        f"kubectl -n {namespace} delete secret {CREDENTIAL_SECRET} --ignore-not-found",
        f"kubectl delete clusterrolebinding,clusterrole -l {selector}",
    ]
