"""Kubernetes mode's credential: the Secret ``levers9-agent-credential`` in the agent's namespace, and that namespace.

An agent in a pod has no state directory that outlives the pod. What
``levers9 agent join --kubernetes`` got for its join token is kept instead in
the Secret :data:`SECRET_NAME`, data key :data:`SECRET_KEY` (``agent.json``),
the very JSON :func:`levers9.agent.credentials.to_json` writes. Invariants:

* **Read first, join only without it.** :meth:`CredentialSecret.load` is asked
  before a join token is spent; a pod that restarts finds the Secret and runs
  with it, so only the first start needs a token.
* **Created once, never changed.** The Secret is created (``immutable``), never
  updated, patched or deleted here. One that exists already when the agent
  would create it (another pod joined meanwhile) is :class:`CredentialError`.
* **A malformed Secret is refused**, never overwritten: no data key
  ``agent.json``, not base64, not UTF-8, or not what a join wrote is
  :class:`~levers9.agent.credentials.CredentialError` naming
  ``Secret <namespace>/levers9-agent-credential`` and what is wrong.
* :class:`~levers9.agent.credentials.NotJoined`: the API answered 404, there
  is no such Secret (the agent never joined in this namespace).
* :class:`SecretUnavailable`: the API refused or did not answer (its
  :func:`~levers9.agent.k8s_api.refusal` message); ``transient`` when trying
  again may help (no answer, 429, 5xx), else RBAC or the service-account token
  is wrong and the operator must act. :func:`read_credential` and
  :func:`keep_credential` try transient failures again with back-off until the
  stop event.
* The credential's value is never logged nor put in an error; only the Secret's
  name and the agent's id are.

:func:`own_namespace` is the pod's namespace from its service-account mount
(``/var/run/secrets/kubernetes.io/serviceaccount/namespace``), None outside a
pod. Calls block except the two ``async`` helpers, which run them in threads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from levers9.agent.credentials import AgentCredential, CredentialError, NotJoined, from_json, to_json
from levers9.agent.docker_workers import OrderRefused
from levers9.agent.k8s_api import K8sApi, open_api, refusal
from levers9.backoff import delay_s
from levers9.kube import api_status, as_object

__all__ = [
    "SECRET_KEY",
    "SECRET_NAME",
    "SERVICE_ACCOUNT_NAMESPACE",
    "CredentialSecret",
    "SecretUnavailable",
    "keep_credential",
    "own_namespace",
    "read_credential",
]

log = logging.getLogger(__name__)

SECRET_NAME = "levers9-agent-credential"
SECRET_KEY = "agent.json"
#: where a pod's service-account mount says which namespace the pod runs in
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_LABELS = {"app.kubernetes.io/part-of": "levers9", "app.kubernetes.io/component": "agent-credential"}
_RETRY_INITIAL_S = 1.0
_RETRY_CAP_S = 30.0


class SecretUnavailable(Exception):
    """The API refused or did not answer a call on the credential Secret; ``transient``: trying again may help."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def own_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace of the pod this process runs in; None outside a pod (no service-account mount)."""
    try:
        namespace = path.read_text().strip()
    except OSError:
        return None
    return namespace or None


class CredentialSecret:
    """The credential Secret of the agent in ``namespace``, on the API client ``api_client_factory`` makes."""

    def __init__(self, api_client_factory: Callable[[], Any], namespace: str) -> None:
        self.namespace = namespace
        self._factory = api_client_factory
        self._api: K8sApi | None = None

    @property
    def name(self) -> str:
        """``Secret <namespace>/levers9-agent-credential``, as messages name it."""
        return f"Secret {self.namespace}/{SECRET_NAME}"

    @property
    def again(self) -> str:
        """What the operator does about a credential that cannot be used."""
        return (
            f"delete {self.name} (kubectl -n {self.namespace} delete secret {SECRET_NAME}) and join again with a "
            "new join token"
        )

    def close(self) -> None:
        api, self._api = self._api, None
        if api is not None:
            api.api_client.close()

    def _client(self) -> K8sApi:
        if self._api is None:
            try:
                self._api = open_api(self._factory)
            except OrderRefused as exc:
                raise SecretUnavailable(str(exc), transient=False) from None
        return self._api

    def _unavailable(self, exc: Exception, doing: str) -> SecretUnavailable:
        refused = refusal(exc, f"{doing} {self.name}")
        if refused is None:
            raise exc
        return SecretUnavailable(str(refused), transient=refused.kind == "throttled")

    def load(self) -> AgentCredential:
        """The credential the Secret holds.

        :raises NotJoined: there is no such Secret.
        :raises CredentialError: the Secret is not what a join wrote (named, with what is wrong).
        :raises SecretUnavailable: the API refused or did not answer.
        """
        api = self._client()
        try:
            secret = api.secret(self.namespace, SECRET_NAME)
        except Exception as exc:
            if api_status(exc) == 404:
                raise NotJoined(
                    f"{self.name} does not exist: this agent has not joined in namespace {self.namespace}; run "
                    "`levers9 agent join --kubernetes` with the join token `levers9 cluster join` printed"
                ) from None
            raise self._unavailable(exc, "reading") from None
        encoded = as_object(secret.get("data")).get(SECRET_KEY)
        if not isinstance(encoded, str) or not encoded:
            keys = sorted(as_object(secret.get("data")))
            raise CredentialError(
                f"{self.name} has no data key {SECRET_KEY!r} (it has {', '.join(keys) or 'no data'}); it is not the "
                f"credential a join keeps: {self.again}"
            )
        try:
            text = base64.b64decode(encoded, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialError(
                f"{self.name}: data key {SECRET_KEY!r} is not base64 of UTF-8 text: {self.again}"
            ) from None
        return from_json(text, f"{self.name} (key {SECRET_KEY})", again=self.again)

    def save(self, credential: AgentCredential) -> None:
        """Create the Secret with ``credential``; never replaces one.

        :raises CredentialError: the Secret exists already (another agent pod joined meanwhile).
        :raises SecretUnavailable: the API refused or did not answer.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": self.namespace, "labels": dict(_LABELS)},
            "type": "Opaque",
            "immutable": True,
            "data": {SECRET_KEY: base64.b64encode(to_json(credential).encode()).decode()},
        }
        api = self._client()
        try:
            api.create_secret(self.namespace, body)
        except Exception as exc:
            if api_status(exc) == 409:
                raise CredentialError(
                    f"{self.name} was created by another agent while this one joined (as agent "
                    f"{credential.agent_id}); run one agent per namespace (a Deployment of one replica with the "
                    "Recreate strategy); this one stops and the next start runs with that Secret"
                ) from None
            raise self._unavailable(exc, "creating") from None


async def _retrying(call: Callable[[], Any], what: str, stop: asyncio.Event) -> tuple[bool, Any]:
    """``(True, call())`` once it answers; ``(False, None)`` when ``stop`` is set first; transient failures are
    logged and tried again with back-off; anything else is raised."""
    failures = 0
    while not stop.is_set():
        try:
            return True, await asyncio.to_thread(call)
        except SecretUnavailable as exc:
            if not exc.transient:
                raise
            failures += 1
            wait = random.uniform(0, delay_s(failures, initial_s=_RETRY_INITIAL_S, cap_s=_RETRY_CAP_S))
            log.warning("%s: %s; trying again in %.1f s", what, exc, wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
    return False, None


async def read_credential(secret: CredentialSecret, stop: asyncio.Event) -> AgentCredential | None:
    """:meth:`CredentialSecret.load`, tried again while the API does not answer; None when ``stop`` came first.

    :raises NotJoined, CredentialError: as :meth:`~CredentialSecret.load`.
    :raises SecretUnavailable: a failure that trying again would not mend (RBAC, a rejected token).
    """
    answered, credential = await _retrying(secret.load, "cannot read the agent's credential", stop)
    return credential if answered else None


async def keep_credential(secret: CredentialSecret, credential: AgentCredential, stop: asyncio.Event) -> bool:
    """:meth:`CredentialSecret.save`, tried again while the API does not answer; False when ``stop`` came first.

    :raises CredentialError, SecretUnavailable: as :meth:`~CredentialSecret.save` (not transient).
    """
    answered, _ = await _retrying(lambda: secret.save(credential), "cannot keep the agent's credential", stop)
    return bool(answered)
