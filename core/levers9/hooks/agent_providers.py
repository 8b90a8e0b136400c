"""The names of the built-in providers whose machines are served by a levers9 agent that dials out.

Two providers are *agent-backed*: ``agent_machine`` (boxes joined with ``levers9
machine create``, workers in Docker) and ``attached_cluster`` (a workspace's own
Kubernetes cluster, workers as Jobs). Their plugins, the controlplane's services
for them (:mod:`levers9.services.agent_pools`), the config checks and the CLI all
name them; this module is the one place those names are written, low enough that
each of them may import it (plugins may import :mod:`levers9.hooks`). A name here
is the plugin's entry-point name: renaming one is a breaking change for configs.

What the two plugin objects share is here too: :class:`AgentBackedProvider` (the agent hub
from the plugin context, a clock) and :class:`AgentOffline`, the retryable error of an
order whose agent is not connected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from levers9.hooks.context import AgentInventory, PluginContext
from levers9.hooks.errors import ProviderError
from levers9.hooks.provider import ProviderPlugin

__all__ = [
    "AGENT_MACHINE",
    "AGENT_PROVIDERS",
    "ATTACHED_CLUSTER",
    "AgentBackedProvider",
    "AgentOffline",
]

#: joined machines: one agent per box, workers as Docker containers
AGENT_MACHINE = "agent_machine"
#: attached clusters: one agent per Kubernetes cluster, workers as Jobs
ATTACHED_CLUSTER = "attached_cluster"
#: every provider whose pools are served by agents
AGENT_PROVIDERS = frozenset({AGENT_MACHINE, ATTACHED_CLUSTER})


class AgentOffline(ProviderError):
    """The agent that must carry out an order (a joined box's, or one of a cluster's) is not connected now.

    Retryable: the same call may succeed once the agent dials in again (the reconciler tries again).
    """

    kind = "agent_offline"
    retryable = True


class AgentBackedProvider(ProviderPlugin):
    """What both agent-backed plugin objects share: the agent hub from the context, a clock, how long an agent is silent.

    Their hooks work only inside a controlplane (``levers9 server``), the one process agents connect to; elsewhere
    (``levers9 offers`` from a config file, tests) :meth:`hub_context` raises a :class:`ProviderError` saying so.
    """

    #: the plugin's entry-point name, as errors name it
    provider_name: ClassVar[str]
    #: whose agents connect to the controlplane, as the "no agent hub" error says
    agents_of: ClassVar[str]

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._clock = clock

    @property
    def has_hub(self) -> bool:
        return self.ctx is not None and self.ctx.agents is not None

    def hub_context(self) -> PluginContext:
        if self.ctx is None or self.ctx.agents is None:
            raise ProviderError(
                f"{self.provider_name} has no agent hub in this process: its pools are served by a running "
                f"controlplane ('levers9 server'), where {self.agents_of} agents connect"
            )
        return self.ctx

    def silent_for(self, agent: AgentInventory) -> float:
        """Seconds since ``agent`` was last heard from; infinite for one never heard from."""
        return max(0.0, self._clock() - agent.last_seen) if agent.last_seen > 0 else float("inf")
