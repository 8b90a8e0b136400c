"""The Kubernetes objects that run the levers9 controlplane for a team, as plain dicts: :func:`render`.

:func:`render` is pure: options and a config in, a list of objects out, in the
order ``kubectl apply`` should create them (namespaces, the ServiceAccount and
its RBAC, the ConfigMap, the Services, the Deployment, the
PodDisruptionBudget). Invariants of what it renders:

* **No credential in any object.** The database URL, the Redis URL and the
  secret key reach the pods only through ``secretKeyRef``; the TLS files
  through a Secret volume. The ConfigMap's file has no URL
  (:mod:`levers9.kubernetes_manifests.pod_config`).
* **Least RBAC.** The Role (in each worker namespace) and the ClusterRole
  allow exactly :data:`~levers9.kubernetes_manifests.permissions.LOCAL_K8S_CALLS`;
  with no worker namespace there is neither, and the pods get no API token.
* **Failover.** ``replicas`` pods spread over nodes (a hard spread on the node,
  a soft one on the zone), a PodDisruptionBudget keeping one when there are two
  or more, a rolling update that starts a new pod before stopping an old one.
* **Probes on the REST API.** Readiness is :data:`READINESS_PATH` (the health
  route: 503 while PostgreSQL or Redis does not answer, so the Services stop
  sending to that pod). Liveness and start-up ask :data:`LIVENESS_PATH`, which
  the same HTTP server answers without touching PostgreSQL or Redis: a
  database outage must not restart every replica; a wedged server still fails it.
* **Non-root.** The pods run as uid/gid 65534 (``nobody``, which the worker
  image's ``/etc/passwd`` has), read-only root filesystem, no capabilities.
* Every object carries ``app.kubernetes.io/name=levers9``, its component and
  the levers9 version.

Failures raise :class:`~levers9.kubernetes_manifests.options.ManifestError`
naming the option or the config field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from levers9.__about__ import __version__
from levers9.kubernetes_manifests import pod_config as pc
from levers9.kubernetes_manifests.options import ManifestError, ManifestOptions
from levers9.kubernetes_manifests.permissions import cluster_rules, namespaced_rules

__all__ = [
    "GRPC_SERVICE",
    "HTTP_SERVICE",
    "LIVENESS_PATH",
    "METRICS_PATH",
    "NAME",
    "READINESS_PATH",
    "render",
    "to_yaml",
]

NAME = "levers9"
GRPC_SERVICE = "levers9-grpc"
HTTP_SERVICE = "levers9-http"
CONFIG_MAP = "levers9-config"
ROLE = "levers9-local-k8s"
#: the REST route that says whether this replica's PostgreSQL and Redis answer (200 or 503), no token needed
READINESS_PATH = "/api/v1/health"
#: a REST route the HTTP server answers from memory: the API's OpenAPI document
LIVENESS_PATH = "/api/v1/openapi.json"
#: where the metrics port answers Prometheus
METRICS_PATH = "/metrics"
#: ``nobody``: the user the pods run as
RUN_AS = 65534
#: seconds between SIGTERM and SIGKILL: the server's graceful stop (calls in flight, the scheduler, the stores)
GRACE_S = 60


def _version_label() -> str:
    """The levers9 version as a label value (at most 63 of letters, digits, '-', '_', '.')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)[:63].strip("-_.") or "unknown"


class _Names:
    """Labels and selectors of one installation (one namespace)."""

    def __init__(self, options: ManifestOptions) -> None:
        self.namespace = options.namespace
        self.selector = {
            "app.kubernetes.io/name": NAME,
            "app.kubernetes.io/instance": options.namespace,
            "app.kubernetes.io/component": "controlplane",
        }

    def labels(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": NAME,
            "app.kubernetes.io/instance": self.namespace,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/version": _version_label(),
            "app.kubernetes.io/managed-by": NAME,
        }

    def meta(self, name: str, component: str, namespace: str | None = "") -> dict[str, Any]:
        """``metadata``: ``namespace=""`` is the controlplane's, None a cluster-scoped object."""
        out: dict[str, Any] = {"name": name}
        if namespace is not None:
            out["namespace"] = namespace or self.namespace
        out["labels"] = self.labels(component)
        return out


def render(
    options: ManifestOptions, config: Mapping[str, Any] | None = None, *, worker_image: str | None = None
) -> list[dict[str, Any]]:
    """The objects, in apply order. ``config`` is the operator's levers9 config file, parsed; None: a starter
    config with one ``local_k8s`` CPU pool running ``worker_image`` (default ``levers9/worker:<version>``)."""
    names = _Names(options)
    workers = options.workers_in
    if config is None:
        if not workers:
            raise ManifestError("worker_namespaces: the default config has a local_k8s pool, which needs one")
        from levers9.images.worker import default_tag

        config = pc.default_config(workers[0], worker_image or default_tag())
    elif worker_image is not None:
        raise ManifestError("worker_image: only for the default config; name images in your config's pools")
    pod = pc.pod_config(config, options, GRPC_SERVICE)
    objects: list[dict[str, Any]] = [_namespace(names, options.namespace, "controlplane")]
    objects += [_namespace(names, ns, "workers") for ns in workers if ns != options.namespace]
    objects.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": names.meta(NAME, "controlplane")})
    if workers:
        objects += _rbac(names, workers)
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": names.meta(CONFIG_MAP, "controlplane"),
            "data": {"levers9.yaml": pod.text()},
        }
    )
    objects.append(_service(names, options, GRPC_SERVICE, "grpc", pod.grpc_port, "grpc"))
    objects.append(_service(names, options, HTTP_SERVICE, "https" if pod.tls else "http", pod.http_port, "http"))
    objects.append(_deployment(names, options, pod, bool(workers)))
    if options.replicas >= 2:
        objects.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": names.meta(NAME, "controlplane"),
                "spec": {"minAvailable": 1, "selector": {"matchLabels": names.selector}},
            }
        )
    return objects


def _namespace(names: _Names, name: str, component: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": names.meta(name, component, None)}


def cluster_role_name(namespace: str) -> str:
    """The ClusterRole (and its binding) of the installation in ``namespace``: cluster-scoped, so named for it."""
    return f"{ROLE}-{namespace}"


def _rbac(names: _Names, workers: tuple[str, ...]) -> list[dict[str, Any]]:
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": names.namespace}]
    rbac = "rbac.authorization.k8s.io"
    out: list[dict[str, Any]] = []
    for ns in workers:
        out.append(
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "Role",
                "metadata": names.meta(ROLE, "local-k8s", ns),
                "rules": namespaced_rules(),
            }
        )
        out.append(
            {
                "apiVersion": f"{rbac}/v1",
                "kind": "RoleBinding",
                "metadata": names.meta(ROLE, "local-k8s", ns),
                "roleRef": {"apiGroup": rbac, "kind": "Role", "name": ROLE},
                "subjects": subject,
            }
        )
    cluster = cluster_role_name(names.namespace)
    out.append(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": names.meta(cluster, "local-k8s", None),
            "rules": cluster_rules(),
        }
    )
    out.append(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": names.meta(cluster, "local-k8s", None),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": cluster},
            "subjects": subject,
        }
    )
    return out


def _service(
    names: _Names, options: ManifestOptions, name: str, port_name: str, port: int, target: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.meta(name, "controlplane"),
        "spec": {
            "type": options.service_type,
            "selector": names.selector,
            "ports": [{"name": port_name, "port": port, "targetPort": target, "protocol": "TCP"}],
        },
    }


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _probe(path: str, scheme: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http", "scheme": scheme},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _cpu(millicores: int) -> str:
    """A CPU quantity: whole cores as a number of cores, else millicores."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def _memory(mib: int) -> str:
    """A memory quantity: whole GiB as ``Gi``, else ``Mi``."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _deployment(names: _Names, options: ManifestOptions, pod: pc.PodConfig, api_access: bool) -> dict[str, Any]:
    scheme = "HTTPS" if pod.tls else "HTTP"
    mounts = [
        {"name": "config", "mountPath": pc.CONFIG_DIR, "readOnly": True},
        {"name": "data", "mountPath": pc.DATA_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "template", "configMap": {"name": CONFIG_MAP}},
        {"name": "config", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "data", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if options.tls_secret is not None:
        mounts.append({"name": "tls", "mountPath": pc.TLS_DIR, "readOnly": True})
        # group-readable: the files belong to root and the pod's group (fsGroup); the server warns about that mode
        volumes.append({"name": "tls", "secret": {"secretName": options.tls_secret, "defaultMode": 0o440}})
    resources: dict[str, Any] = {
        "requests": {"cpu": _cpu(options.cpu_request), "memory": _memory(options.memory_request)}
    }
    limits = {}
    if options.cpu_limit is not None:
        limits["cpu"] = _cpu(options.cpu_limit)
    if options.memory_limit is not None:
        limits["memory"] = _memory(options.memory_limit)
    if limits:
        resources["limits"] = limits
    server = {
        "name": "server",
        "image": options.image,
        "command": ["levers9", "server"],
        "env": [
            {"name": "LEVERS9_CONFIG", "value": pc.CONFIG_FILE},
            {"name": "LEVERS9_HOME", "value": pc.DATA_MOUNT},
            _secret_env("LEVERS9_SECRET_KEY", options.secret_key_secret, pc.SECRET_KEY_KEY),
        ],
        "ports": [
            {"name": "grpc", "containerPort": pod.grpc_port, "protocol": "TCP"},
            {"name": "http", "containerPort": pod.http_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": pod.metrics_port, "protocol": "TCP"},
        ],
        "startupProbe": _probe(LIVENESS_PATH, scheme, 5, 60),  # migrations run before the listeners open
        "livenessProbe": _probe(LIVENESS_PATH, scheme, 20, 3),
        "readinessProbe": _probe(READINESS_PATH, scheme, 10, 3),
        "resources": resources,
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": mounts,
    }
    write_config = {
        "name": "write-config",
        "image": options.image,
        "command": [
            "levers9",
            "kubernetes",
            "write-config",
            "--template",
            pc.TEMPLATE_FILE,
            "--output",
            pc.CONFIG_FILE,
        ],
        "env": [
            _secret_env(pc.DATABASE_URL_ENV, options.database_secret, pc.URL_KEY),
            _secret_env(pc.REDIS_URL_ENV, options.redis_secret, pc.URL_KEY),
        ],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "template", "mountPath": pc.TEMPLATE_DIR, "readOnly": True},
            {"name": "config", "mountPath": pc.CONFIG_DIR},
        ],
    }
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": when,
            "nodeTaintsPolicy": "Honor",
            "labelSelector": {"matchLabels": names.selector},
        }
        for key, when in (
            ("kubernetes.io/hostname", "DoNotSchedule"),
            ("topology.kubernetes.io/zone", "ScheduleAnyway"),
        )
    ]
    spec: dict[str, Any] = {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": api_access,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": GRACE_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "topologySpreadConstraints": spread,
        "initContainers": [write_config],
        "containers": [server],
        "volumes": volumes,
    }
    if options.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in options.image_pull_secrets]
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(pod.metrics_port),
        "prometheus.io/path": METRICS_PATH,
        "prometheus.io/scheme": scheme.lower(),
        "levers9/config-sha256": pod.digest(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.meta(NAME, "controlplane"),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": names.selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": names.labels("controlplane"), "annotations": annotations},
                "spec": spec,
            },
        },
    }


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors (a shared selector is written out each time) and with multi-line strings as
    literal blocks, so the ConfigMap's file reads as the file it is."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML file, with a comment saying what made it."""
    header = f"# levers9 {__version__} on Kubernetes, written by `levers9 kubernetes manifests`.\n"
    body = yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, explicit_start=True)
    return header + body
