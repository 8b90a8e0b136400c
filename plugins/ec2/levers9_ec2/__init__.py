"""The ``ec2`` provider: each worker is an Amazon EC2 instance that boots straight into ``levers9 worker``.

GPU capacity on EC2 is bought one instance at a time with RunInstances, found
with DescribeInstanceTypes (GpuInfo) and DescribeInstanceTypeOfferings (per
availability zone), and comes and goes at the provider's whim: the plugin's job
is to turn that into offers for the scheduler and to report
InsufficientInstanceCapacity quickly so the scheduler can fail over.

The settings are what an operator must decide for an AWS account: zones, the
image, the network (subnets, security groups), the instance role, spot or
on-demand, and how the plugin authenticates. The region is the pool's own
``region`` (or ``regions``), never a setting: one source for every provider.
Credentials are always references (a profile, or the names of environment
variables), never values.

The hooks below are thin: :mod:`levers9_ec2.provider` says what each does,
and holds the one provider object they share (its boto3 clients, made by
:mod:`levers9_ec2.session`, live from ``levers9_startup`` to
``levers9_shutdown``). ``boto3`` is imported only inside the functions that
make a client, never when this package is imported.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from levers9.hooks.context import PluginContext
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuOffer, Machine, MachineIdentity, Pool, ProviderCheck, ProvisionRequest
from levers9_ec2.identity import fetch_identity
from levers9_ec2.provider import Ec2Provider
from levers9_ec2.settings import Ec2Settings

__all__ = [
    "Ec2Provider",
    "Ec2Settings",
    "levers9_check",
    "levers9_gpu_offers",
    "levers9_list_machines",
    "levers9_machine_identity",
    "levers9_provider_settings",
    "levers9_provision",
    "levers9_shutdown",
    "levers9_startup",
    "levers9_terminate",
    "levers9_verify_identity",
]

#: the hooks' shared state: clients per credentials and region, and the describe cache
_provider = Ec2Provider()


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``ec2`` a provider whose pools are validated with :class:`Ec2Settings`."""
    return Ec2Settings


@hookimpl
def levers9_startup(ctx: PluginContext) -> None:
    _provider.startup(ctx)


@hookimpl
def levers9_shutdown(ctx: PluginContext) -> None:
    _provider.shutdown()


@hookimpl
def levers9_check(pool: Pool) -> ProviderCheck:
    return _provider.check(pool)


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
def levers9_list_machines(pool: Pool) -> list[Machine]:
    return _provider.list_machines(pool)


@hookimpl
def levers9_verify_identity(pool: Pool, machine: Machine, identity: MachineIdentity | None) -> None:
    _provider.verify_identity(pool, machine, identity)


@hookimpl
def levers9_machine_identity() -> MachineIdentity:
    """On a worker of an EC2 instance: the instance's signed identity document, from IMDSv2."""
    return fetch_identity()


#: the plugin object the entry point names; for now this module itself (its functions are the hooks)
plugin = sys.modules[__name__]
