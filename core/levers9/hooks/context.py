"""What the core lends a plugin: the context ``levers9_startup`` and ``levers9_shutdown`` receive.

A provider plugin runs in the controlplane's process but owns none of its
parts. This context is the whole of what it may use, so a plugin never imports
the controlplane, the scheduler or the state stores (the layering test holds
plugins to that):

* ``name``: the plugin's entry-point name;
* ``log``: a logger named ``levers9.plugin.<name>``;
* ``metrics``: counters and gauges labelled with the plugin's name;
* ``state``: a dict the plugin may keep anything in for its lifetime on this replica;
* ``agents``: the agent hub, for providers whose machines are agents (joined
  machines, attached clusters): send an order down an agent's stream and await
  its acknowledgement, read the agents' inventories. ``None`` where the process
  has no hub (the contract kit's bare facade, ``levers9 check`` without a server);
* ``gpu_devices()``: this host's GPUs as every discovery plugin reports them,
  asked through the facade (each discovery plugin on its own threads, with its
  deadline and its answer checked), for a provider whose machines are this
  host's (``local``); a plugin never calls another plugin's hook itself.

The agent hub is a protocol here so hooks stay below services: the
controlplane's hub (``levers9.services.agents``) implements it, and so may a
test's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from levers9.hooks.types import GpuDevice, _Frozen

__all__ = ["AgentAck", "AgentHub", "AgentInventory", "AgentOrder", "PluginContext", "PluginMetrics"]


class AgentOrder(_Frozen):
    """One order for an agent: what to do (``provision``, ``terminate``, ``list``...) and its arguments."""

    #: the agent's id (``levers9 machine create`` prints it; an attached cluster's id)
    agent_id: str
    #: a verb the agent knows: ``provision``, ``terminate``, ``list``
    kind: str
    #: the order's arguments as JSON-able data (a provision order carries the bootstrap)
    payload: dict[str, Any] = {}
    #: the idempotency key the agent dedupes by; None: the hub makes one (set it to retry the same order)
    order_id: str | None = None


class AgentAck(_Frozen):
    """An agent's answer to one order."""

    order_id: str
    ok: bool
    #: the agent's result (a provision order's machine), JSON-able
    result: dict[str, Any] = {}
    #: why not, when ``ok`` is False, in the agent's words
    error: str | None = None
    #: the error's kind, as the provider errors name them (``insufficient_capacity``, ``invalid_request``...)
    error_kind: str | None = None


class AgentInventory(_Frozen):
    """What an agent last reported it has: its machine's or cluster's capacity, and what runs there."""

    agent_id: str
    #: the provider the agent serves (``agent_machine``, ``attached_cluster``)
    provider: str
    #: the workspace that owns the agent; None for the operator's agents
    workspace: str | None = None
    connected: bool
    #: epoch seconds of the agent's last heartbeat
    last_seen: float
    labels: dict[str, str] = {}
    #: free and total capacity, for example ``{"cpu_millicores": 8000, "memory_mib": 32768, "gpus": {"H100": 2}}``
    capacity: dict[str, Any] = {}
    #: levers9 machine ids of the workers this agent runs now
    machines: list[str] = []


class AgentHub(Protocol):
    """The core's agent hub, as a plugin sees it."""

    async def send(self, order: AgentOrder, *, timeout: float) -> AgentAck:
        """Send ``order`` down the agent's stream and wait for its acknowledgement.

        Raises :class:`~levers9.hooks.errors.InsufficientCapacity` when the agent is not connected (another
        agent may serve), and ``TimeoutError`` when no acknowledgement arrives within ``timeout``.
        """
        ...

    def inventories(self, provider: str | None = None, *, workspace: Any = ...) -> list[AgentInventory]:
        """Every known agent's last inventory: of ``provider``'s agents only, when given, and of ``workspace``'s
        only when given (a workspace id, or None for the operator's own agents; left out: every workspace's).
        A provider serving a pool passes ``pool.workspace``, so one workspace's agents never serve another's.
        """
        ...


class PluginMetrics(Protocol):
    """Counters exported as ``levers9_plugin_<name>_total`` and gauges as ``levers9_plugin_<name>``, labelled with
    the caller's labels and levers9's ``replica`` and ``plugin`` (see :mod:`levers9.services.plugin_metrics`)."""

    def count(self, name: str, value: float = 1.0, **labels: str) -> None: ...

    def gauge(self, name: str, value: float, **labels: str) -> None: ...


class _NoMetrics:
    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        return None

    def gauge(self, name: str, value: float, **labels: str) -> None:
        return None


@dataclass
class PluginContext:
    """One plugin's handle on the core (see the module docstring)."""

    name: str
    log: logging.Logger
    metrics: PluginMetrics = field(default_factory=_NoMetrics)
    agents: AgentHub | None = None
    state: dict[str, Any] = field(default_factory=dict)
    #: the controlplane's event loop, where the agent hub lives; set by ``Hooks.startup``
    loop: asyncio.AbstractEventLoop | None = None
    #: the facade's GPU discovery for a hook's thread (deadline in seconds -> devices); set by the facade
    discover_gpus: Callable[[float], list[GpuDevice]] | None = None

    def gpu_devices(self, *, timeout: float = 20.0) -> list[GpuDevice]:
        """This host's GPUs, from every loaded ``levers9_gpu_devices`` implementation, merged by uuid.

        Call it from a hook (a plugin's own thread), never from the event loop.
        Raises ``RuntimeError`` where no facade made this context, and when
        discovery failed and found nothing (the failures' words in its message).
        """
        if self.discover_gpus is None:
            raise RuntimeError(f"plugin {self.name!r}: no plugin manager to ask for this host's GPUs")
        return self.discover_gpus(timeout)

    def send_order(self, order: AgentOrder, *, timeout: float) -> AgentAck:
        """:meth:`AgentHub.send` for a hook: hooks run on the plugin's own threads, the hub on the event loop.

        Blocks the calling hook thread (never the loop) until the agent acknowledges, and raises what
        ``send`` raises. Must not be called from the event loop's own thread.
        """
        if self.agents is None or self.loop is None:
            raise RuntimeError(f"plugin {self.name!r}: no agent hub in this process (only a controlplane has one)")
        future = asyncio.run_coroutine_threadsafe(self.agents.send(order, timeout=timeout), self.loop)
        # the hub's own timeout ends the call; the margin only covers the hop back to this thread
        return future.result(timeout + 5.0)

    @classmethod
    def bare(cls, name: str) -> PluginContext:
        """A context with a logger and nothing else: tools and the contract kit, where no server runs."""
        return cls(name=name, log=logging.getLogger(f"levers9.plugin.{name}"))
