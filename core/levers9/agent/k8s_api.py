"""The agent's calls on its own cluster's API, answering plain JSON, and what each failure means to the controlplane.

:class:`K8sApi` wraps one ``kubernetes.client.ApiClient`` with the few calls the
agent's Kubernetes backend (:mod:`levers9.agent.k8s_workers`) makes. Every call
has a deadline (:data:`REQUEST_TIMEOUT`: connect, read), lists are read page
by page, and answers are the API's JSON as plain dicts
(``_preload_content=False``), never the client's model classes. A Job is
deleted with ``propagationPolicy: Background`` (the API's default for a Job
orphans its pod). ``kubernetes`` is imported only when a client is made
(:func:`open_api`; the default is the pod's in-cluster service account,
:func:`in_cluster_client`; outside a cluster, a kubeconfig's context,
:func:`kubeconfig_client`).

:func:`refusal` turns what the client raised into the
:class:`~levers9.agent.docker_workers.OrderRefused` the agent answers, with the
provider error kind the controlplane maps to a typed error
(``levers9.hooks.errors.ERROR_KINDS``; docs/architecture.md §5.2):

================================================  =========================
what the API answered                             kind
================================================  =========================
401 (the service-account token was rejected)      ``authentication_failed``
403 whose message says ``exceeded quota``         ``quota_exceeded``
any other 403 (RBAC)                              ``permission_denied``
400, 404, 409, 422                                ``invalid_request``
429, 5xx, no answer (connection, timeout)         ``throttled``
anything else the API answered                    ``""`` (a plain error)
================================================  =========================

The message is the API's own (its ``Status`` message), after where it
happened. An exception that is neither an API answer nor a failed connection
is not translated: it propagates, and the daemon reports it as a plain error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from levers9.agent.docker_workers import OrderRefused
from levers9.kube import api_status, status_reason

__all__ = [
    "REQUEST_TIMEOUT",
    "K8sApi",
    "in_cluster_client",
    "kubeconfig_client",
    "open_api",
    "raise_refusal",
    "refusal",
    "typed",
]

#: seconds to connect, and to wait for an answer, on every API call
REQUEST_TIMEOUT = (5.0, 30.0)
#: list pages: a big cluster is read in several answers, not one huge one
PAGE = 500
_INVALID = "invalid_request"
_QUOTA = "quota_exceeded"
_PERMISSION = "permission_denied"
_AUTH = "authentication_failed"
_THROTTLED = "throttled"
_NO_ANSWER = frozenset(
    {
        "MaxRetryError",
        "NewConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ProtocolError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "TimeoutError",
    }
)
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- failures


def _status_message(exc: BaseException) -> str:
    reason, message = status_reason(exc)
    return message or reason


def refusal(exc: BaseException, where: str) -> OrderRefused | None:
    """The refusal ``exc`` (raised while ``where``) stands for, with its kind (module docstring); None: not an
    API answer nor a failed connection."""
    status = api_status(exc)
    if status is None:
        if type(exc).__name__ in _NO_ANSWER or isinstance(exc, ConnectionError | TimeoutError):
            return OrderRefused(f"{where}: the Kubernetes API did not answer ({type(exc).__name__}: {exc})", _THROTTLED)
        return None
    said = f"{where}: {_status_message(exc) or f'HTTP {status}'}"
    if status == 401:
        return OrderRefused(said + " (the agent's service-account token was rejected)", _AUTH)
    if status == 403:
        return OrderRefused(said, _QUOTA if "exceeded quota" in said else _PERMISSION)
    if status == 429 or status >= 500:
        return OrderRefused(said, _THROTTLED)
    if status in (400, 404, 409, 422):
        return OrderRefused(said, _INVALID)
    return OrderRefused(said)


def raise_refusal(exc: Exception, where: str) -> NoReturn:
    """Raise the refusal of ``exc``, or ``exc`` itself when it is not one."""
    refused = refusal(exc, where)
    if refused is None:
        raise exc
    raise refused from None


def typed(where: str, call: Callable[[], T]) -> T:
    """``call()``, its API failures raised as refusals naming ``where``."""
    try:
        return call()
    except OrderRefused:
        raise
    except Exception as exc:
        raise_refusal(exc, where)


# ---------------------------------------------------------------------------------------------- the API


class K8sApi:
    """The calls the agent makes on its cluster, answering API JSON (``_preload_content=False``)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        data = answer.data
        parsed: dict[str, Any] = json.loads(data) if data else {}
        return parsed

    def _items(self, method: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item of a list, page by page (``limit``/``continue``), so a big cluster is not one huge answer."""
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            paging: dict[str, Any] = {"limit": PAGE, **({"_continue": token} if token else {})}
            answer = self._call(method, *args, **kwargs, **paging)
            found.extend(answer.get("items") or [])
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return found

    def nodes(self) -> list[dict[str, Any]]:
        return self._items(self.core.list_node)

    def live_pods(self) -> list[dict[str, Any]]:
        """Every pod of the cluster that has not ended (the ones that hold room on their node)."""
        return self._items(
            self.core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
        )

    def namespace_live_pods(self, namespace: str) -> list[dict[str, Any]]:
        """Every pod of ``namespace`` that has not ended (what :meth:`live_pods` gives without the right to it)."""
        return self._items(
            self.core.list_namespaced_pod, namespace, field_selector="status.phase!=Succeeded,status.phase!=Failed"
        )

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._items(self.core.list_namespaced_pod, namespace, label_selector=label_selector)

    def jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._items(self.batch.list_namespaced_job, namespace, label_selector=label_selector)

    def quotas(self, namespace: str) -> list[dict[str, Any]]:
        return self._items(self.core.list_namespaced_resource_quota, namespace)

    def events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        return self._items(self.core.list_namespaced_event, namespace, field_selector=field_selector)

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.batch.read_namespaced_job, name, namespace)

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.batch.create_namespaced_job, namespace, body)

    def delete_job(self, namespace: str, name: str) -> None:
        # the API's default for a Job orphans its pod: Background deletes the pod (and the owned Secret) after it
        self._call(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")

    def secret(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.core.read_namespaced_secret, name, namespace)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.core.create_namespaced_secret, namespace, body)

    def delete_secret(self, namespace: str, name: str) -> None:
        self._call(self.core.delete_namespaced_secret, name, namespace)


def in_cluster_client() -> Any:
    """An ApiClient with the pod's service-account token and CA (``kubernetes.config.load_incluster_config``)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def kubeconfig_client(path: str, context: str | None = None) -> Any:
    """An ApiClient for ``context`` (None: the current one) of the kubeconfig at ``path``; the file is only read
    (a refreshed token is not written back)."""
    from kubernetes import config

    load: Any = config.new_client_from_config  # unannotated
    return load(config_file=path, context=context, persist_config=False)


def open_api(factory: Callable[[], Any]) -> K8sApi:
    """A :class:`K8sApi` on the client ``factory`` makes; :class:`OrderRefused` (plain) saying why there is none."""
    try:
        import kubernetes  # noqa: F401
    except ImportError as exc:
        raise OrderRefused(
            f"the kubernetes client is not installed where this agent runs ({exc}): pip install 'kubernetes>=29'"
        ) from None
    try:
        return K8sApi(factory())
    except Exception as exc:  # no in-cluster configuration here, a kubeconfig unreadable
        raise OrderRefused(
            f"cannot make a Kubernetes API client ({type(exc).__name__}: {exc}); the agent's Kubernetes mode runs "
            "in a pod with a service account, or outside the cluster with --kubeconfig FILE (or $KUBECONFIG)"
        ) from None
