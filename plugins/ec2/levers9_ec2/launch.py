"""One RunInstances call for one levers9 machine: its parameters, and the idempotent retry after no answer.

:func:`run_instances_params` builds the request from the pool's settings and
the offer (pure, so it is tested without a cloud):

* ``MinCount=MaxCount=1`` and ``ClientToken`` = the levers9 machine id: EC2
  returns the instance already started for a token instead of starting a
  second (for about a day), which makes every retry of a provision safe;
* the offer's ``InstanceType``; its zone picks the subnet (one of
  ``subnet_ids`` in that zone, the same one for the same machine id), or, with
  no subnets configured, ``Placement.AvailabilityZone`` in the default VPC;
* ``ImageId`` = ``ami``, or ``resolve:ssm:<ami_ssm_parameter>`` (EC2 resolves
  the parameter at launch);
* network: ``SubnetId`` and ``SecurityGroupIds``; when ``public_ip`` is set,
  EC2 wants them inside ``NetworkInterfaces[0]`` instead (an interface and
  an instance-level subnet or groups may not be given together), with
  ``AssociatePublicIpAddress``;
* root volume: a ``BlockDeviceMappings`` entry for the image's root device
  (size, type, ``DeleteOnTermination``). The device name is the AMI's own
  ``RootDeviceName`` when ``ami`` is given (one cached DescribeImages); for an
  SSM parameter it is ``/dev/sda1``, the root device of the Deep Learning AMIs
  (Ubuntu) the parameter normally names: with another name EC2 would attach a
  second volume instead of growing the root one;
* ``MetadataOptions``: IMDSv2 only (``HttpTokens=required``), and a response
  hop limit of 1, so only the machine itself reaches the metadata service: a
  call's container, in a network namespace of its own, is one hop further and
  can read neither the user data (the join token) nor the instance role's keys
  (some AMIs raise the limit to 2 for Docker; levers9 sets it back);
* spot: ``InstanceMarketOptions`` one-time, terminate on interruption,
  ``MaxPrice`` from ``max_spot_price`` (left out: up to the on-demand price);
* ``TagSpecifications`` on the instance and its volumes: ``levers9:machine-id``,
  ``levers9:pool``, ``Name=levers9-<machine id>``, and the pool's extra tags;
* ``UserData`` = :func:`levers9.bootstrap.cloud_init` of the request's
  bootstrap (boto3 base64-encodes it), with ``LEVERS9_MACHINE_IDENTITY=ec2``
  added to its environment unless the pool's ``instance_identity`` is
  ``off``: the worker then shows the instance's signed identity document when
  it joins (:mod:`levers9_ec2.identity`).

:func:`launch` sends it with the launch client (botocore's retries off, see
:mod:`levers9_ec2.session`). An answer that never came (read timeout,
connection closed or reset after sending) is asked again with the same
``ClientToken``, at most :data:`LAUNCH_ATTEMPTS` times and never past the
deadline: EC2 answers the repeat with the instance the first request started.
An EC2 error is raised at once, whatever it is (a capacity error must reach
the scheduler in one call).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from levers9.bootstrap import cloud_init
from levers9.hooks.types import ProvisionRequest, WorkerBootstrap
from levers9_ec2.identity import IDENTITY_PLUGIN
from levers9_ec2.settings import Ec2Settings

__all__ = [
    "DEFAULT_ROOT_DEVICE",
    "LAUNCH_ATTEMPTS",
    "MACHINE_ID_TAG",
    "POOL_TAG",
    "choose_subnet",
    "launch",
    "run_instances_params",
]

MACHINE_ID_TAG = "levers9:machine-id"
POOL_TAG = "levers9:pool"
#: the root device of the images an SSM parameter usually names (Deep Learning AMIs on Ubuntu)
DEFAULT_ROOT_DEVICE = "/dev/sda1"
#: how many times one provision sends RunInstances when no answer comes back
LAUNCH_ATTEMPTS = 3
#: botocore's names for "sent, but no answer": only these are asked again
_NO_ANSWER = frozenset({"ReadTimeoutError", "ConnectionClosedError", "EndpointConnectionError", "ConnectTimeoutError"})


def choose_subnet(subnet_zones: dict[str, str], zone: str | None, machine_id: str) -> str | None:
    """One of the subnets in ``zone`` (any zone when None), always the same one for the same machine id."""
    candidates = sorted(s for s, z in subnet_zones.items() if zone is None or z == zone)
    if not candidates:
        return None
    digest = int(hashlib.sha256(machine_id.encode()).hexdigest(), 16)
    return candidates[digest % len(candidates)]


def _tags(request: ProvisionRequest, settings: Ec2Settings) -> list[dict[str, str]]:
    tags = {**settings.tags, "Name": f"levers9-{request.machine_id}"}
    tags[MACHINE_ID_TAG] = request.machine_id
    tags[POOL_TAG] = request.pool.name
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _bootstrap(request: ProvisionRequest, settings: Ec2Settings) -> WorkerBootstrap:
    """The request's bootstrap, with the worker told to show its instance identity where the pool requires it."""
    bootstrap = request.bootstrap
    if settings.instance_identity != "required":
        return bootstrap
    environment = {**bootstrap.environment, "LEVERS9_MACHINE_IDENTITY": IDENTITY_PLUGIN}
    return bootstrap.model_copy(update={"environment": environment})


def run_instances_params(
    request: ProvisionRequest,
    settings: Ec2Settings,
    *,
    instance_type: str,
    zone: str | None,
    subnet_id: str | None,
    root_device: str,
    spot: bool,
) -> dict[str, Any]:
    """The keyword arguments of ``ec2.run_instances`` for ``request`` (see the module docstring)."""
    image = settings.ami if settings.ami is not None else f"resolve:ssm:{settings.ami_ssm_parameter}"
    params: dict[str, Any] = {
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": request.machine_id,
        "InstanceType": instance_type,
        "ImageId": image,
        "UserData": cloud_init(_bootstrap(request, settings)),
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [
            {
                "DeviceName": root_device,
                "Ebs": {
                    "VolumeSize": settings.root_volume_gib,
                    "VolumeType": settings.root_volume_type,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": _tags(request, settings)} for kind in ("instance", "volume")
        ],
    }
    if settings.public_ip is not None:
        interface: dict[str, Any] = {
            "DeviceIndex": 0,
            "AssociatePublicIpAddress": settings.public_ip,
            "DeleteOnTermination": True,
        }
        if subnet_id is not None:
            interface["SubnetId"] = subnet_id
        if settings.security_group_ids:
            interface["Groups"] = list(settings.security_group_ids)
        params["NetworkInterfaces"] = [interface]
    else:
        if subnet_id is not None:
            params["SubnetId"] = subnet_id
        if settings.security_group_ids:
            params["SecurityGroupIds"] = list(settings.security_group_ids)
    if subnet_id is None and zone is not None:
        params["Placement"] = {"AvailabilityZone": zone}
    if settings.iam_instance_profile:
        key = "Arn" if settings.iam_instance_profile.startswith("arn:") else "Name"
        params["IamInstanceProfile"] = {key: settings.iam_instance_profile}
    if settings.key_name:
        params["KeyName"] = settings.key_name
    if spot:
        options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if settings.max_spot_price is not None:
            options["MaxPrice"] = f"{settings.max_spot_price:g}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return params


def _no_answer(exc: BaseException) -> bool:
    return any(cls.__name__ in _NO_ANSWER for cls in type(exc).__mro__)


def launch(client: Any, params: dict[str, Any], deadline: float, attempt_s: float) -> dict[str, Any]:
    """``RunInstances`` with ``params``; asked again with the same ClientToken when no answer came back.

    Returns the launched instance's description. Raises what botocore raised: an EC2 error at once, a
    no-answer error once :data:`LAUNCH_ATTEMPTS` are spent or when less than ``attempt_s`` (the longest one
    attempt takes) is left before ``deadline`` (``time.monotonic()``).
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            response = client.run_instances(**params)
        except Exception as exc:
            left = deadline - time.monotonic()
            if not _no_answer(exc) or attempt >= LAUNCH_ATTEMPTS or left < attempt_s + 1.0:
                raise
            time.sleep(0.5 * attempt)
            continue
        instance: dict[str, Any] = response["Instances"][0]
        return instance
