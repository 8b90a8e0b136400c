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

The plugin is one object, :data:`plugin`, an :class:`Ec2Provider`: its
``levers9_*`` methods are the hooks (the entry point names it), and
:mod:`levers9_ec2.provider` says what each does. Its boto3 clients, made by
:mod:`levers9_ec2.session`, live from ``levers9_startup`` to
``levers9_shutdown``. ``boto3`` is imported only inside the functions that
make a client, never when this package is imported.
"""

from __future__ import annotations

from levers9_ec2.provider import Ec2Provider
from levers9_ec2.settings import Ec2Settings

__all__ = ["Ec2Provider", "Ec2Settings", "plugin"]

#: the plugin the entry point names: its hooks, clients per credentials and region, and the describe cache
plugin = Ec2Provider()
