"""The agent itself: orders carried out once and acknowledged, inventories sent, GPUs rediscovered.

:class:`Agent` is the :class:`~levers9.agent.connection.SessionHandler` the
connection loop drives. Invariants:

* **An order is carried out once per agent process.** Orders are keyed by
  id: one seen again while it runs is not started twice (its acknowledgement
  goes out when it is done, on whatever stream is up then); one seen again
  after it was done is answered with the same acknowledgement. Across
  restarts Docker is the memory: a provision order for a machine whose
  container exists answers with it (:mod:`levers9.agent.docker_workers`).
* **Inventory** goes out right after every Welcome, whenever it changes
  (checked every ``poll_s`` and at once after each order) and every
  ``inventory_every_s`` (5 min) regardless: a thousand agents re-sending an
  unchanged inventory would cost the controlplane more than their heartbeats. While Docker cannot be reached,
  none is sent (an empty container list would read as "every worker is
  gone"); the failure is logged once until it changes.
* **Heartbeats** every ``Welcome.heartbeat_s``.
* **Nothing is stopped on start-up**: the agent reports its containers and
  the controlplane decides.
* **A removed machine leaves nothing running**: when the controlplane refuses
  the credential because the machine was removed ("this machine was
  removed"), the agent stops and removes its own ``l9w-*`` containers (those
  its terminate orders did not reach) before it exits with code 3. Any other
  refusal (a revoked token, say) leaves them: the operator decides.

Docker's blocking calls run in threads. :func:`run_agent` is what the CLI
runs: it returns the process's exit code (0 on a stop signal, 3 when the
controlplane refused the credential).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from levers9.agent.connection import CredentialRefused, Send, connect_forever
from levers9.agent.credentials import AgentCredential
from levers9.agent.docker_workers import DockerWorkers, OrderRefused
from levers9.agent.inventory import GpuSource, build_inventory, change_key, machine_resources
from levers9.hooks.types import GpuDevice
from levers9.proto.v1 import agent_pb2

__all__ = ["EXIT_REFUSED", "REMOVED", "Agent", "run_agent"]

log = logging.getLogger(__name__)

#: the exit code of an agent whose credential (or join token) the controlplane refused
EXIT_REFUSED = 3
#: the words of the controlplane's refusal of a removed machine's agent (services.agent_join.removed_message)
REMOVED = "this machine was removed"
#: acknowledgements remembered for orders seen again
_DONE_KEPT = 1000


class Agent:
    """One agent process's state across its streams (see the module docstring)."""

    def __init__(
        self, workers: DockerWorkers, gpus: GpuSource, *, poll_s: float = 2.0, inventory_every_s: float = 300.0
    ) -> None:
        self.workers = workers
        self._gpu_source = gpus
        self._gpus: list[GpuDevice] = []
        self._gpus_at = -float("inf")
        self.poll_s = poll_s
        self.inventory_every_s = inventory_every_s
        self._send: Send | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._done: OrderedDict[str, agent_pb2.Ack] = OrderedDict()
        self._changed = asyncio.Event()
        self._docker_error: str | None = None
        workers.gpu_devices = lambda: list(self._gpus)

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
            action = self._actions().get(order.kind)
            if action is None:
                raise OrderRefused(
                    f"this agent does not know the order {order.kind!r}; it knows {', '.join(sorted(self._actions()))}",
                    "invalid_request",
                )
            if order.kind == "provision" and int(payload.get("gpu_count") or 0) > 0:
                await self._refresh_gpus(force=not self._gpus)
            result = await asyncio.to_thread(action, payload)
        except OrderRefused as exc:
            log.warning("refused the %s order %s: %s", order.kind, order.order_id, exc)
            return agent_pb2.Ack(order_id=order.order_id, ok=False, error=str(exc), error_kind=exc.kind)
        except ValueError as exc:
            return agent_pb2.Ack(order_id=order.order_id, ok=False, error=f"bad {order.kind} order: {exc}",
                                 error_kind="invalid_request")  # fmt: skip
        except Exception as exc:
            log.exception("the %s order %s failed", order.kind, order.order_id)
            return agent_pb2.Ack(order_id=order.order_id, ok=False, error=f"{type(exc).__name__}: {exc}")
        return agent_pb2.Ack(order_id=order.order_id, ok=True, result_json=json.dumps(result))

    def _actions(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            "provision": self.workers.provision,
            "terminate": self.workers.terminate,
            "list": lambda _payload: self.workers.list_containers(),
        }

    # -------------------------------------------------------------------------- inventory and heartbeats

    @staticmethod
    async def _heartbeats(send: Send, heartbeat_s: float) -> None:
        while True:
            await asyncio.sleep(max(0.1, heartbeat_s))
            send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))

    async def _refresh_gpus(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._gpus_at < self.inventory_every_s:
            return
        self._gpus_at = time.monotonic()
        try:
            self._gpus = await self._gpu_source()
        except Exception as exc:  # the facade logs a failing plugin; anything else: keep what was known
            log.warning("GPU discovery failed: %s", exc)

    async def inventory(self) -> agent_pb2.Inventory | None:
        """This machine's inventory now; None when Docker cannot be reached."""
        await self._refresh_gpus()
        try:
            facts, containers = await asyncio.to_thread(lambda: (self.workers.facts(), self.workers.containers()))
        except OrderRefused as exc:
            if str(exc) != self._docker_error:
                log.warning("no inventory sent: %s", exc)
                self._docker_error = str(exc)
            return None
        if self._docker_error is not None:
            log.info("Docker at %s answers again", self.workers.docker_host)
            self._docker_error = None
        return build_inventory(self.workers.agent_id, self.workers.resources, self._gpus, facts, containers)

    async def _inventories(self, send: Send) -> None:
        sent_key: str | None = None
        sent_at = -float("inf")
        while True:
            self._changed.clear()
            inventory = await self.inventory()
            if inventory is not None:
                key = change_key(inventory)
                if key != sent_key or time.monotonic() - sent_at >= self.inventory_every_s:
                    send(agent_pb2.AgentMessage(inventory=inventory))
                    sent_key, sent_at = key, time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.poll_s)

    async def wait_orders(self) -> None:
        """Let the orders being carried out finish (a stop signal does not cut a container start in half)."""
        if self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)


async def _remove_workers(workers: DockerWorkers) -> None:
    """The machine was removed: its worker containers go with it (logged; a failure is logged, not raised)."""
    try:
        removed = await asyncio.to_thread(workers.remove_mine)
    except OrderRefused as exc:
        log.error("this machine was removed but its worker containers could not be removed: %s", exc)
        return
    if removed:
        log.warning("this machine was removed: stopped and removed its worker containers %s",
                    ", ".join(f"l9w-{m}" for m in removed))  # fmt: skip


async def run_agent(
    credential: AgentCredential,
    stop: asyncio.Event,
    *,
    docker_host: str | None = None,
    gpus: GpuSource | None = None,
    stop_grace_s: float = 10.0,
    poll_s: float = 2.0,
    on_ready: Callable[[Agent], Awaitable[None]] | None = None,
) -> int:
    """Run the agent of ``credential`` until ``stop`` is set: 0, or :data:`EXIT_REFUSED` (3) when refused.

    ``gpus`` is where GPUs are discovered (default: the installed plugins' ``levers9_gpu_devices``).
    """
    from levers9.agent.inventory import PluginGpus

    plugin_gpus = None
    if gpus is None:
        plugin_gpus = PluginGpus()
        gpus = plugin_gpus
    workers = DockerWorkers(credential.agent_id, docker_host=docker_host, resources=machine_resources(),
                            stop_grace_s=stop_grace_s, insecure=credential.insecure)  # fmt: skip
    agent = Agent(workers, gpus, poll_s=poll_s)
    try:
        if on_ready is not None:
            await on_ready(agent)
        log.info("agent %s for provider %s, Docker at %s", credential.agent_id, credential.provider,
                 workers.docker_host)  # fmt: skip
        try:
            await connect_forever(credential, agent, stop)
        except CredentialRefused as exc:
            await agent.wait_orders()
            if REMOVED in str(exc):
                await _remove_workers(workers)
            log.error("%s; this agent stops (remove its state directory and join again with a new token)", exc)
            return EXIT_REFUSED
        finally:
            await agent.wait_orders()
        return 0
    finally:
        workers.close()
        if plugin_gpus is not None:
            plugin_gpus.close()
