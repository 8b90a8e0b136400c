"""An EC2 instance description (RunInstances, DescribeInstances) as a levers9 :class:`Machine`.

State mapping: ``pending`` -> PENDING, ``running`` -> RUNNING,
``shutting-down`` and ``stopping`` -> STOPPING, ``stopped`` -> FAILED (a
worker's machine is never stopped on purpose: it will not run again, so its
calls are requeued), ``terminated`` -> TERMINATED. A spot instance
(``InstanceLifecycle=spot``) that EC2 took back (``StateReason.Code``
``Server.SpotInstanceTermination`` or ``Server.SpotInstanceShutdown``) is
PREEMPTED whatever its state word. ``reason`` is EC2's ``StateReason`` message
(or ``StateTransitionReason``) for FAILED and PREEMPTED.

``machine_id`` is the ``levers9:machine-id`` tag (None on an untagged
instance); ``provider_data`` holds ``region`` and ``zone``, the keys
provision returns too, so terminate finds the instance from either.
"""

from __future__ import annotations

from typing import Any

from levers9.hooks.types import Machine, MachineState, Pool
from levers9_ec2.launch import MACHINE_ID_TAG

__all__ = ["SPOT_INTERRUPTIONS", "machine_from_instance", "state_of"]

_STATES = {
    "pending": MachineState.PENDING,
    "running": MachineState.RUNNING,
    "shutting-down": MachineState.STOPPING,
    "stopping": MachineState.STOPPING,
    "stopped": MachineState.FAILED,
    "terminated": MachineState.TERMINATED,
}
#: EC2's StateReason codes of a spot interruption
SPOT_INTERRUPTIONS = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})


def state_of(instance: dict[str, Any]) -> tuple[MachineState, str | None]:
    """The levers9 state of an instance description, and EC2's reason when it failed or was preempted."""
    reason_info = instance.get("StateReason") or {}
    reason = reason_info.get("Message") or instance.get("StateTransitionReason") or None
    name = (instance.get("State") or {}).get("Name", "")
    if instance.get("InstanceLifecycle") == "spot" and reason_info.get("Code") in SPOT_INTERRUPTIONS:
        return MachineState.PREEMPTED, reason or "spot instance interrupted by EC2"
    state = _STATES.get(name, MachineState.UNKNOWN)
    if state is MachineState.FAILED:
        return state, f"instance {name}" + (f": {reason}" if reason else "")
    return state, None


def machine_from_instance(pool: Pool, region: str, instance: dict[str, Any]) -> Machine:
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags") or []}
    zone = (instance.get("Placement") or {}).get("AvailabilityZone")
    state, reason = state_of(instance)
    return Machine(
        provider_id=instance["InstanceId"],
        machine_id=tags.get(MACHINE_ID_TAG),
        pool=pool.name,
        state=state,
        gpu=pool.gpu,
        gpu_count=pool.gpu_count,
        region=region,
        zone=zone,
        instance_type=instance.get("InstanceType"),
        address=instance.get("PublicIpAddress") or instance.get("PrivateIpAddress"),
        created_at=instance.get("LaunchTime"),
        provider_data={"region": region, "zone": zone},
        reason=reason,
    )
