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
variables), never values. ``boto3`` is never imported here. In this version the
plugin declares its settings only; the provisioning hooks come later.
"""

from __future__ import annotations

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9_ec2.settings import Ec2Settings

__all__ = ["Ec2Settings", "levers9_provider_settings"]


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    """Declare ``ec2`` a provider whose pools are validated with :class:`Ec2Settings`."""
    return Ec2Settings
