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
keys. Neither docker nor paramiko is imported here. In this version the plugin
declares its settings only; the provisioning hooks come later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_agent_machine.settings import AgentMachineSettings, JumpHost, SshBootstrap

__all__ = ["AgentMachineSettings", "JumpHost", "SshBootstrap", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``agent_machine`` a provider whose pools are validated with :class:`AgentMachineSettings`."""
    return AgentMachineSettings
