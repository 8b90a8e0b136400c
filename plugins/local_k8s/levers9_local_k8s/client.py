"""The API clients of the pools' clusters, and the few calls the provider makes, answering plain API JSON.

:class:`Clients` keeps one ``kubernetes.client.ApiClient`` per (kubeconfig,
context), made on first use under a lock and closed by ``levers9_shutdown``:

* ``kubeconfig: in-cluster``: the pod's service-account token and CA;
* a path: that file (``~`` expanded), with the pool's ``context`` or the
  file's current one;
* left out: ``$KUBECONFIG`` or ``~/.kube/config`` when there is one, else
  in-cluster, as ``kubectl`` does.

A kubeconfig that cannot be read, or names no such context, is
:class:`~levers9.hooks.errors.InvalidRequest` naming the file and what it
said. The file is read when the client is made; a changed file is read again
only after a restart of the controlplane.

:class:`Cluster` wraps one ApiClient with the calls the provider makes. Every
call has a deadline (:data:`REQUEST_TIMEOUT`: connect, read) and answers the
API's JSON as plain dicts (``_preload_content=False``), the shape the
provider's pure functions and the tests' data files share. The ``kubernetes``
package is imported only when a client is made.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from levers9.hooks.errors import InvalidRequest
from levers9_local_k8s.settings import LocalK8sSettings

__all__ = ["REQUEST_TIMEOUT", "Clients", "Cluster"]

#: seconds to connect, and to wait for an answer, on every call
REQUEST_TIMEOUT = (5.0, 30.0)


class Cluster:
    """The provider's calls on one cluster, answering API JSON."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.auth = client.AuthorizationV1Api(api_client)

    @staticmethod
    def _json(answer: Any) -> dict[str, Any]:
        data = answer.data
        parsed: dict[str, Any] = json.loads(data) if data else {}
        return parsed

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._json(method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs))

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._call(self.core.list_node).get("items") or []
        return items

    def pods(self, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        selector = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            answer = self._call(self.core.list_pod_for_all_namespaces, **selector)
        else:
            answer = self._call(self.core.list_namespaced_pod, namespace, **selector)
        items: list[dict[str, Any]] = answer.get("items") or []
        return items

    def jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (
            self._call(self.batch.list_namespaced_job, namespace, label_selector=label_selector).get("items") or []
        )
        return items

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.batch.read_namespaced_job, name, namespace)

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.batch.create_namespaced_job, namespace, body)

    def delete_job(self, namespace: str, name: str) -> None:
        self._call(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.core.create_namespaced_secret, namespace, body)

    def delete_secret(self, namespace: str, name: str) -> None:
        self._call(self.core.delete_namespaced_secret, name, namespace)

    def quotas(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._call(self.core.list_namespaced_resource_quota, namespace).get("items") or []
        return items

    def events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (
            self._call(self.core.list_namespaced_event, namespace, field_selector=field_selector).get("items") or []
        )
        return items

    def namespace(self, name: str) -> dict[str, Any]:
        return self._call(self.core.read_namespace, name)

    def allowed(self, verb: str, resource: str, namespace: str | None, group: str = "") -> tuple[bool, str]:
        """Whether these credentials may ``verb`` ``resource`` (SelfSubjectAccessReview), and the API's reason."""
        attributes: dict[str, Any] = {"verb": verb, "resource": resource, "group": group}
        if namespace is not None:
            attributes["namespace"] = namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        status = self._call(self.auth.create_self_subject_access_review, body).get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or "")


class Clients:
    """One :class:`Cluster` per (kubeconfig, context), shared by every hook thread (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[tuple[str | None, str | None], Cluster] = {}

    def cluster(self, settings: LocalK8sSettings) -> Cluster:
        key = (settings.kubeconfig, settings.context)
        with self._lock:
            found = self._clusters.get(key)
            if found is None:
                found = self._clusters[key] = Cluster(_api_client(settings))
            return found

    def close(self) -> None:
        with self._lock:
            clusters, self._clusters = list(self._clusters.values()), {}
        for cluster in clusters:
            cluster.api_client.close()


def _api_client(settings: LocalK8sSettings) -> Any:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    where = settings.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        if settings.kubeconfig == "in-cluster":
            return _in_cluster(client, config)
        path = settings.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "~/.kube/config"
        if settings.kubeconfig is None and not Path(path).expanduser().is_file():
            if not os.environ.get("KUBERNETES_SERVICE_HOST"):
                raise InvalidRequest(
                    f"no kubeconfig: {path} does not exist and the controlplane is not in a Kubernetes pod "
                    "(KUBERNETES_SERVICE_HOST is unset); set the pool's kubeconfig to a file or 'in-cluster'",
                    code="Kubeconfig",
                )
            return _in_cluster(client, config)
        made = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(Path(path).expanduser()), context=settings.context
        )
        return made
    except ConfigException as exc:
        raise InvalidRequest(f"kubeconfig {where}: {exc}", code="Kubeconfig") from None
    except OSError as exc:
        raise InvalidRequest(f"kubeconfig {where}: {exc.strerror or exc}", code="Kubeconfig") from None


def _in_cluster(client: Any, config: Any) -> Any:
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)
