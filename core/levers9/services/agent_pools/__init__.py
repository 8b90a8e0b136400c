"""Agent-backed pools: joined machines and attached clusters, the pools a levers9 agent serves by dialling out.

Both kinds are created the same way (a record in SQL and a single-use join token
for the agent, labelled with the pool it serves), listed the same way (the record
with its agent's last inventory), removed the same way (the pool's workers on it
stopped through the provisioner, every token of its agents revoked, their streams
cut) and survive Redis losing its contents the same way (the agent's registration
written again from SQL). What is the same is written once, in
:mod:`~levers9.services.agent_pools.common`; what differs per kind (which record,
which labels, which machines are the agent's) is in each kind's module,
:mod:`~levers9.services.agent_pools.joined_machines` and
:mod:`~levers9.services.agent_pools.clusters`, each with a small strategy object
(:data:`~levers9.services.agent_pools.joined_machines.JOINED_MACHINES`,
:data:`~levers9.services.agent_pools.clusters.ATTACHED_CLUSTERS`).

Token checking (:mod:`levers9.services.agent_join`) sits below this package and
never imports it: the registrations it restores come through the
:class:`~levers9.services.agent_pools.registry.AgentPools` registry that
:func:`levers9.services.core.open_services` builds from the two strategies and
keeps as :attr:`Services.agent_pools <levers9.services.core.Services.agent_pools>`.

Who calls what decides where it lives: this package is the controlplane's; what
runs in the agent daemon on the box or in the cluster (its Docker and Kubernetes
backends) stays in :mod:`levers9.agent`; the ``machine create --ssh`` installer
runs on the operator's machine (:mod:`levers9.cli.machine_install`); the
providers' hooks are the plugins' (``levers9_agent_machine``,
``levers9_attached_cluster``), which share only the providers' names with this
package (:mod:`levers9.hooks.agent_providers`).
"""
