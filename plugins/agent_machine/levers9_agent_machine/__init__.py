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

The hooks are the methods of one object, :data:`plugin` (:mod:`levers9_agent_machine.provider`
says what each does); they keep the plugin context ``levers9_startup`` gives them: its agent hub is how they read
the joined machines' inventories and send their agents orders.
"""

from __future__ import annotations

from levers9_agent_machine.provider import AgentMachineProvider
from levers9_agent_machine.settings import AgentMachineSettings, JumpHost, SshBootstrap

__all__ = ["AgentMachineProvider", "AgentMachineSettings", "JumpHost", "SshBootstrap", "plugin"]

#: the plugin as one object (the entry point names it): its ``levers9_*`` methods are the hooks, and it keeps the
#: context (with its agent hub) that ``levers9_startup`` gives it
plugin = AgentMachineProvider()
