"""An agent hub for the ``attached_cluster`` tests whose agents are the agent's real Kubernetes backend.

:class:`ClusterHub` implements :class:`levers9.hooks.context.AgentHub` (the
protocol the provider sees) without the controlplane's streams: each joined
:class:`ClusterAgent` is a real :class:`levers9.agent.k8s_workers.K8sWorkers`
on a :class:`tests.fakes.k8s_cluster.FakeCluster`, so every order the provider
sends is carried out by the code the agent runs, against the Kubernetes API
at the wire, and every inventory is what that agent would report:
``build_k8s_inventory(agent_id, inventory_details(), gpu_type=from_k8s_labels)``,
stored as ``AgentInventory.capacity`` by :func:`capacity_of` the way the
controlplane's hub stores it.

What the hub mirrors of :class:`levers9.services.agents.AgentHub`: ``send``
raises :class:`InsufficientCapacity` for an agent not connected (or not known),
``TimeoutError`` when the order takes longer than ``timeout``, and for a
refusal the provider error its ``error_kind`` names
(:data:`levers9.services.agent_messages.ERROR_KINDS`); with
``answer_refusals`` it answers the refusing :class:`AgentAck` instead (the
protocol allows either). ``inventories`` filters by provider and workspace as
the real one does. An agent heartbeats (``last_seen`` is now) until the test
makes it fall silent, disconnects or removes it; a silent or disconnected
agent's inventory is the one it last reported.

The payload goes through JSON on the way, as on the wire. Orders are kept
(:attr:`ClusterAgent.orders`) so a test can say which were sent; their
payloads hold join tokens and are never printed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from levers9.agent.docker_workers import OrderRefused
from levers9.agent.k8s_workers import K8sWorkers, build_k8s_inventory
from levers9.gpu import from_k8s_labels
from levers9.gpu.catalog import canonical
from levers9.gpu.normalize import normalize
from levers9.hooks.context import AgentAck, AgentInventory, AgentOrder
from levers9.hooks.errors import InsufficientCapacity, ProviderError
from levers9.proto.v1 import agent_pb2
from levers9.services.agent_messages import ANY_WORKSPACE, ERROR_KINDS, AnyWorkspace, json_object

__all__ = ["ClusterAgent", "ClusterHub", "capacity_of"]

PROVIDER = "attached_cluster"


def capacity_of(message: agent_pb2.Inventory) -> dict[str, Any]:
    """``AgentInventory.capacity`` of an Inventory message, as the controlplane stores it.

    The same steps as ``levers9.controlplane.grpc_agent._inventory`` (the message read, its details as a JSON
    object) and ``AgentSession.inventory`` in ``levers9.services.agents`` (GPU names made canonical, counts
    summed, free no more than the count), which are not functions a test can call on their own.
    """
    gpus: dict[str, int] = {}
    free: dict[str, int] = {}
    for reported in message.gpus:
        gpu = normalize(reported.gpu) or canonical(reported.gpu)
        gpus[gpu] = gpus.get(gpu, 0) + max(0, reported.count)
        free[gpu] = free.get(gpu, 0) + max(0, min(reported.free, reported.count))
    capacity: dict[str, Any] = {
        "cpu_millicores": message.cpu_millicores,
        "memory_mib": message.memory_mib,
        "gpus": gpus,
        "free": {"cpu_millicores": message.free_cpu_millicores, "memory_mib": message.free_memory_mib, "gpus": free},
    }
    details = json_object(message.details_json, "Inventory.details_json")
    if details:
        capacity["details"] = details
    return capacity


@dataclass
class ClusterAgent:
    """One joined agent of an attached cluster, played by a real K8sWorkers."""

    agent_id: str
    workers: K8sWorkers
    workspace: str | None
    labels: dict[str, str]
    connected: bool = True
    #: None while the agent heartbeats (heard from now); else when it was last heard from
    heard_at: float | None = None
    #: the last inventory it reported (capacity, machines), kept once it stops reporting
    frozen: tuple[dict[str, Any], list[str]] | None = None
    #: False: it has not reported an inventory yet
    reports: bool = True
    orders: list[AgentOrder] = field(default_factory=list)

    def kinds(self) -> list[str]:
        """The kinds of the orders it was sent, in order."""
        return [o.kind for o in self.orders]

    def report(self) -> tuple[dict[str, Any], list[str]]:
        """Its inventory now, as the hub stores it: ``capacity`` and ``machines``."""
        if self.frozen is not None:
            return self.frozen
        if not self.reports:
            return {}, []
        message = build_k8s_inventory(self.agent_id, self.workers.inventory_details(), gpu_type=from_k8s_labels)
        return capacity_of(message), list(message.machines)

    def last_seen(self) -> float:
        return time.time() if self.heard_at is None else self.heard_at

    def fall_silent(self, seconds: float, *, connected: bool = False) -> None:
        """Last heard from ``seconds`` ago, its last inventory kept; ``connected`` as the hub would still say."""
        self.frozen = self.report()
        self.heard_at = time.time() - seconds
        self.connected = connected

    def reconnect(self) -> None:
        self.frozen, self.heard_at, self.connected = None, None, True


class ClusterHub:
    """The agent hub the provider is given (see the module docstring)."""

    def __init__(self, *, answer_refusals: bool = False) -> None:
        self.agents: dict[str, ClusterAgent] = {}
        self.answer_refusals = answer_refusals

    def join(
        self, agent_id: str, workers: K8sWorkers, *, workspace: str | None, cluster: str, pool: str
    ) -> ClusterAgent:
        """An agent joined with the labels ``levers9 cluster join`` puts on its token, connected and reporting."""
        agent = ClusterAgent(agent_id, workers, workspace, {"cluster": cluster, "pool": pool, "name": cluster})
        self.agents[agent_id] = agent
        return agent

    def remove(self, agent_id: str) -> None:
        """``levers9 cluster remove``: the agent is no longer known."""
        del self.agents[agent_id]

    # -------------------------------------------------------------------------- the AgentHub protocol

    async def send(self, order: AgentOrder, *, timeout: float) -> AgentAck:
        agent = self.agents.get(order.agent_id)
        if agent is None:
            raise InsufficientCapacity(
                f"agent {order.agent_id} is not known to this controlplane (never joined, or removed)"
            )
        if not agent.connected:
            ago = max(0.0, time.time() - agent.last_seen())
            raise InsufficientCapacity(f"agent {order.agent_id} is not connected (last heard from {ago:.0f} s ago)")
        agent.orders.append(order)
        order_id = order.order_id or f"ord-{len(agent.orders)}"
        payload = json.loads(json.dumps(order.payload))  # what travels is JSON
        try:
            result = await asyncio.wait_for(asyncio.to_thread(_carry_out, agent.workers, order.kind, payload), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"agent {order.agent_id} did not acknowledge the {order.kind} order {order_id} within {timeout:g} s"
            ) from None
        except OrderRefused as exc:
            ack = AgentAck(order_id=order_id, ok=False, error=str(exc), error_kind=exc.kind or None)
        else:
            ack = AgentAck(order_id=order_id, ok=True, result=result)
        if ack.ok or self.answer_refusals:
            return ack
        error = ERROR_KINDS.get(ack.error_kind or "", ProviderError)
        raise error(f"agent {order.agent_id} refused the {order.kind} order: {ack.error or 'no reason given'}")

    def inventories(
        self, provider: str | None = None, *, workspace: str | AnyWorkspace | None = ANY_WORKSPACE
    ) -> list[AgentInventory]:
        found = []
        for agent in sorted(self.agents.values(), key=lambda a: a.agent_id):
            if provider is not None and provider != PROVIDER:
                continue
            if not isinstance(workspace, AnyWorkspace) and agent.workspace != workspace:
                continue
            capacity, machines = agent.report()
            found.append(
                AgentInventory(
                    agent_id=agent.agent_id,
                    provider=PROVIDER,
                    workspace=agent.workspace,
                    connected=agent.connected,
                    last_seen=agent.last_seen(),
                    labels=dict(agent.labels),
                    capacity=capacity,
                    machines=machines,
                )
            )
        return found


def _carry_out(workers: K8sWorkers, kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """An order as the agent's Kubernetes backend carries it out. :raises OrderRefused:."""
    if kind == "provision":
        return workers.provision(payload)
    if kind == "terminate":
        return workers.terminate(payload)
    if kind == "list":
        return workers.list_containers()
    raise OrderRefused(f"unknown order kind {kind!r}; an agent knows provision, terminate and list", "invalid_request")
