"""The agent itself: orders carried out once and acknowledged, inventories sent, workers on Docker or Kubernetes.

:class:`Agent` is the :class:`~levers9.agent.connection.SessionHandler` the
connection loop drives; what it drives is a :class:`~levers9.agent.backends.Backend`:
a joined machine's Docker (:class:`~levers9.agent.backends.DockerBackend`) or,
in Kubernetes mode (:class:`KubernetesMode`), worker Jobs in the agent's
namespace of an attached cluster (:class:`~levers9.agent.backends.K8sBackend`).
Invariants:

* **An order is carried out once per agent process.** Orders are keyed by
  id: one seen again while it runs is not started twice (its acknowledgement
  goes out when it is done, on whatever stream is up then); one seen again
  after it was done is answered with the same acknowledgement. Across
  restarts the workers' side is the memory: a provision order for a machine
  whose container (Docker) or Job (Kubernetes) exists answers with it.
* **Inventory** goes out right after every Welcome, whenever it changes
  (checked every ``poll_s``, :data:`DOCKER_POLL_S` or :data:`K8S_POLL_S`, and at
  once after each order) and every ``inventory_every_s`` (5 min) regardless: a
  thousand agents re-sending an unchanged inventory would cost the
  controlplane more than their heartbeats. What counts as a change is the
  backend's ``change_key``. While Docker or the Kubernetes API cannot be read,
  none is sent (an empty worker list would read as "every worker is gone");
  the failure is logged once until it changes.
* **Heartbeats** every ``Welcome.heartbeat_s``.
* **Nothing is stopped on start-up**: the agent reports its workers and the
  controlplane decides.
* **A removed agent leaves nothing running**: when the controlplane refuses
  the credential because the agent was removed (:data:`REMOVED`), the agent
  removes its own workers (its ``l9w-*`` containers; in Kubernetes mode the
  worker Jobs and Secrets of its namespace labelled with its owner, never
  another levers9 pool's), those its terminate orders did not
  reach, before it exits with code 3. Any other refusal (a revoked token, say)
  leaves them: the operator decides.
* **A namespace is not shared unless told.** In Kubernetes mode the agent,
  before it connects, looks for worker Jobs of another owner in its
  namespace (a ``local_k8s`` pool's, another cluster's agent's): there are
  some, and the agent was not started with ``--share-namespace``
  (:attr:`KubernetesMode.share_namespace`), so it logs who they belong to and
  which flag allows sharing, and exits with :data:`EXIT_SHARED_NAMESPACE` (2:
  its command is refused, not restarted by a supervisor). Whatever is shared,
  each side acts on its own Jobs only (the ``levers9/owner`` label).

Blocking calls run in threads. :func:`run_agent` is what the CLI runs: it
returns the process's exit code (0 on a stop signal, 3 when the controlplane
refused the credential, 2 when a Kubernetes agent's namespace is another
pool's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from levers9.agent.backends import Backend, DockerBackend, K8sBackend
from levers9.agent.connection import CredentialRefused, Send, connect_forever
from levers9.agent.credentials import AgentCredential
from levers9.agent.docker_workers import DockerWorkers, OrderRefused
from levers9.agent.inventory import GpuSource, machine_resources
from levers9.agent.k8s_workers import K8sWorkers
from levers9.proto.v1 import agent_pb2

__all__ = ["DOCKER_POLL_S", "EXIT_REFUSED", "K8S_POLL_S", "REMOVED", "Agent", "KubernetesMode", "run_agent"]

log = logging.getLogger(__name__)

#: the exit code of an agent whose credential (or join token) the controlplane refused
EXIT_REFUSED = 3
#: the exit code of a Kubernetes agent whose namespace holds another levers9 pool's workers (no --share-namespace)
EXIT_SHARED_NAMESPACE = 2
#: the words of the controlplane's refusal of a removed machine's agent (services.agent_join.removed_message)
REMOVED = "this machine was removed"
#: acknowledgements remembered for orders seen again
_DONE_KEPT = 1000
#: how often a joined machine's agent looks for a changed inventory (Docker answers locally, in milliseconds)
DOCKER_POLL_S = 2.0
#: how often an attached cluster's agent does (each look lists the cluster's nodes and pods on its API server)
K8S_POLL_S = 10.0


@dataclass(frozen=True)
class KubernetesMode:
    """Run the workers as Jobs in ``namespace`` of the cluster ``api_client_factory`` reaches (None: in-cluster).

    ``allow_privileged``: the Jobs may run privileged containers (the runc and gvisor runtimes need it).
    ``share_namespace``: start even when the namespace holds another levers9 pool's worker Jobs.
    """

    namespace: str
    api_client_factory: Callable[[], Any] | None = None
    allow_privileged: bool = False
    share_namespace: bool = False


class Agent:
    """One agent process's state across its streams (see the module docstring)."""

    def __init__(self, backend: Backend, *, poll_s: float = DOCKER_POLL_S, inventory_every_s: float = 300.0) -> None:
        self.backend = backend
        self.poll_s = poll_s
        self.inventory_every_s = inventory_every_s
        self._send: Send | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._done: OrderedDict[str, agent_pb2.Ack] = OrderedDict()
        self._changed = asyncio.Event()
        self._unreadable: str | None = None

    # -------------------------------------------------------------------------- the stream's side

    async def session(self, send: Send, heartbeat_s: float) -> None:
        self._send = send
        try:
            heartbeats = asyncio.create_task(self._heartbeats(send, heartbeat_s), name="agent heartbeats")
            try:
                await self._inventories(send)
            finally:
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats
        finally:
            if self._send is send:
                self._send = None

    def order(self, order: agent_pb2.Order, send: Send) -> None:
        done = self._done.get(order.order_id)
        if done is not None:
            send(agent_pb2.AgentMessage(ack=done))
            return
        if order.order_id in self._running:
            return
        task = asyncio.create_task(self._carry_out(order), name=f"order {order.order_id}")
        self._running[order.order_id] = task

    # -------------------------------------------------------------------------- orders

    async def _carry_out(self, order: agent_pb2.Order) -> None:
        try:
            ack = await self._ack(order)
            self._done[order.order_id] = ack
            while len(self._done) > _DONE_KEPT:
                self._done.popitem(last=False)
        finally:
            self._running.pop(order.order_id, None)
        self._changed.set()
        if self._send is not None:
            self._send(agent_pb2.AgentMessage(ack=ack))

    async def _ack(self, order: agent_pb2.Order) -> agent_pb2.Ack:
        try:
            payload = json.loads(order.payload_json or "{}")
            if not isinstance(payload, dict):
                raise OrderRefused(f"the {order.kind} order's payload must be a JSON object", "invalid_request")
            actions = self.backend.actions()
            action = actions.get(order.kind)
            if action is None:
                raise OrderRefused(
                    f"this agent does not know the order {order.kind!r}; it knows {', '.join(sorted(actions))}",
                    "invalid_request",
                )
            await self.backend.before_order(order.kind, payload)
            result = await asyncio.to_thread(action, payload)
        except OrderRefused as exc:
            log.warning("refused the %s order %s: %s", order.kind, order.order_id, exc)
            return agent_pb2.Ack(order_id=order.order_id, ok=False, error=str(exc), error_kind=exc.kind)
        except ValueError as exc:
            return agent_pb2.Ack(
                order_id=order.order_id, ok=False, error=f"bad {order.kind} order: {exc}", error_kind="invalid_request"
            )
        except Exception as exc:
            log.exception("the %s order %s failed", order.kind, order.order_id)
            return agent_pb2.Ack(order_id=order.order_id, ok=False, error=f"{type(exc).__name__}: {exc}")
        return agent_pb2.Ack(order_id=order.order_id, ok=True, result_json=json.dumps(result))

    # -------------------------------------------------------------------------- inventory and heartbeats

    @staticmethod
    async def _heartbeats(send: Send, heartbeat_s: float) -> None:
        while True:
            await asyncio.sleep(max(0.1, heartbeat_s))
            send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))

    async def inventory(self) -> agent_pb2.Inventory | None:
        """The inventory now; None when Docker or the Kubernetes API cannot be read (logged once per failure)."""
        try:
            inventory = await self.backend.inventory()
        except OrderRefused as exc:
            if str(exc) != self._unreadable:
                log.warning("no inventory sent: %s", exc)
                self._unreadable = str(exc)
            return None
        if self._unreadable is not None:
            log.info("%s answers again", self.backend.where)
            self._unreadable = None
        return inventory

    async def _inventories(self, send: Send) -> None:
        sent_key: str | None = None
        sent_at = -float("inf")
        while True:
            self._changed.clear()
            inventory = await self.inventory()
            if inventory is not None:
                key = self.backend.change_key(inventory)
                if key != sent_key or time.monotonic() - sent_at >= self.inventory_every_s:
                    send(agent_pb2.AgentMessage(inventory=inventory))
                    sent_key, sent_at = key, time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.poll_s)

    async def wait_orders(self) -> None:
        """Let the orders being carried out finish (a stop signal does not cut a container start in half)."""
        if self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)


async def _remove_workers(backend: Backend) -> None:
    """The agent was removed: its workers go with it (logged; a failure is logged, not raised)."""
    try:
        removed = await asyncio.to_thread(backend.remove_mine)
    except OrderRefused as exc:
        log.error("this agent was removed but its workers could not be removed: %s", exc)
        return
    if removed:
        log.warning("%s", backend.describe_removed(removed))


async def _namespace_taken(workers: K8sWorkers) -> str | None:
    """Why the agent may not work in its namespace (another owner's worker Jobs are there); None: it may.

    A namespace that cannot be read now is no refusal: the agent starts, and says so once the API answers."""
    try:
        others = await asyncio.to_thread(workers.others)
    except OrderRefused as exc:
        log.warning("could not look for other levers9 pools' worker Jobs in namespace %s: %s", workers.namespace, exc)
        return None
    if not others:
        return None
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return (
        f"namespace {workers.namespace} is used by another levers9 pool already ({shown}), and this agent's "
        f"workers belong to pool {workers.owner!r}; join the cluster into a namespace of its own (levers9 cluster join "
        "--namespace NAME), or, to share this one (each side acts on its own Jobs only), start the agent with "
        "--share-namespace (levers9 cluster join --share-namespace writes it into the manifest)"
    )


async def run_agent(
    credential: AgentCredential,
    stop: asyncio.Event,
    *,
    docker_host: str | None = None,
    gpus: GpuSource | None = None,
    stop_grace_s: float = 10.0,
    poll_s: float | None = None,
    kubernetes: KubernetesMode | None = None,
    on_ready: Callable[[Agent], Awaitable[None]] | None = None,
) -> int:
    """Run the agent of ``credential`` until ``stop`` is set: 0, or :data:`EXIT_REFUSED` (3) when refused, or
    :data:`EXIT_SHARED_NAMESPACE` (2) before connecting when its namespace holds another pool's worker Jobs.

    Its workers are containers on Docker (``docker_host``; ``gpus`` is where GPUs are discovered, default the
    installed plugins' ``levers9_gpu_devices``), or, with ``kubernetes``, Jobs in that namespace. ``poll_s``:
    how often a changed inventory is looked for (None: :data:`DOCKER_POLL_S`, or :data:`K8S_POLL_S`).
    """
    from levers9.agent.inventory import PluginGpus

    plugin_gpus = None
    backend: Backend
    if kubernetes is not None:
        k8s_workers = K8sWorkers(
            kubernetes.namespace,
            agent_id=credential.agent_id,
            api_client_factory=kubernetes.api_client_factory,
            allow_privileged=kubernetes.allow_privileged,
            insecure=credential.insecure,
            owner=credential.labels.get("pool"),
        )
        if not kubernetes.share_namespace:
            refused = await _namespace_taken(k8s_workers)
            if refused is not None:
                k8s_workers.close()
                log.error("%s", refused)
                return EXIT_SHARED_NAMESPACE
        backend = K8sBackend(k8s_workers)
        default_poll_s = K8S_POLL_S
    else:
        if gpus is None:
            plugin_gpus = PluginGpus()
            gpus = plugin_gpus
        workers = DockerWorkers(
            credential.agent_id,
            docker_host=docker_host,
            resources=machine_resources(),
            stop_grace_s=stop_grace_s,
            insecure=credential.insecure,
        )
        backend = DockerBackend(workers, gpus)
        default_poll_s = DOCKER_POLL_S
    agent = Agent(backend, poll_s=default_poll_s if poll_s is None else poll_s)
    try:
        if on_ready is not None:
            await on_ready(agent)
        log.info("agent %s for provider %s, workers on %s", credential.agent_id, credential.provider, backend.where)
        try:
            await connect_forever(credential, agent, stop)
        except CredentialRefused as exc:
            await agent.wait_orders()
            if REMOVED in str(exc):
                await _remove_workers(backend)
            log.error("%s; this agent stops (%s)", exc, backend.forget)
            return EXIT_REFUSED
        finally:
            await agent.wait_orders()
        return 0
    finally:
        backend.close()
        if plugin_gpus is not None:
            plugin_gpus.close()
