"""The ``agent_machine`` provider: a pool of machines joined to levers9, running workers in Docker.

Some GPUs are not rented through an API at all: a rack in the office, a box at a
colo, a VM from a provider levers9 has no plugin for. ``levers9 machine create``
joins such a machine over SSH by installing ``levers9 agent``; from then on the
agent dials the controlplane, reports the machine's GPUs, and starts or stops
worker containers with Docker when told to. "Provisioning" here means choosing a
joined machine with free GPUs and ordering its agent to start a worker.

The settings therefore cover the worker container (image, network, GPU runtime,
how many per machine), how quickly a silent agent is given up on, and the SSH
bootstrap (user, port, key path, bastion, sudo). Only paths to keys appear, never
keys. Neither docker nor paramiko is imported here.

The hooks (:mod:`levers9_agent_machine.provider` says what each does) keep the
plugin context ``levers9_startup`` gives them: its agent hub is how they read
the joined machines' inventories and send their agents orders.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuOffer, Machine, Pool, ProviderCheck, ProvisionRequest
from levers9_agent_machine.provider import AgentMachineProvider
from levers9_agent_machine.settings import AgentMachineSettings, JumpHost, SshBootstrap

__all__ = [
    "AgentMachineProvider",
    "AgentMachineSettings",
    "JumpHost",
    "SshBootstrap",
    "levers9_check",
    "levers9_gpu_offers",
    "levers9_list_machines",
    "levers9_provider_settings",
    "levers9_provision",
    "levers9_startup",
    "levers9_terminate",
    "plugin",
]

#: the hooks' state: the context (with its agent hub) from levers9_startup; the agents' records are the rest
_provider = AgentMachineProvider()


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``agent_machine`` a provider whose pools are validated with :class:`AgentMachineSettings`."""
    return AgentMachineSettings


@hookimpl
def levers9_startup(ctx: PluginContext) -> None:
    _provider.startup(ctx)


@hookimpl
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    return _provider.gpu_offers(pool)


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    return _provider.provision(request)


@hookimpl
def levers9_terminate(pool: Pool, machine: Machine) -> None:
    _provider.terminate(pool, machine)


@hookimpl
def levers9_check(pool: Pool) -> ProviderCheck:
    return _provider.check(pool)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    return _provider.list_machines(pool)


#: the plugin as one object (the entry point names it): its methods are the hooks
plugin = _provider
