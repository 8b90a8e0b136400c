"""What a joined machine has and runs, as the agent's Inventory message reports it.

- CPU and memory are the machine's (the CPUs this process may run on, the
  kernel's MemTotal); the free figures subtract what every levers9 container
  on the machine's Docker reserves (its CPU and memory limits), whatever its
  state, because a container holds its share until it is removed.
- GPUs come from the GPU-discovery hook of the installed plugins
  (``levers9_gpu_devices``, through :class:`levers9.hooks.facade.Hooks`; the
  built-in one runs ``nvidia-smi``), counted by canonical type; a GPU is free
  when no levers9 container's ``levers9.gpus`` label names it. A GPU whose
  model is not in the catalog is left out of ``gpus`` (the controlplane could
  not place work on it) and listed under ``details.unsupported_gpus``.
- ``machines`` are the machine ids of this agent's running containers;
  ``details_json`` is the object docs and the ``agent_machine`` provider read:
  ``{"docker": {"version", "runtimes", "nvidia"}, "arch", "disk_free_gib",
  "containers": [ContainerInfo...]}``.

Building a report never fails on its own; discovery failures are the callers'
(a failing plugin is logged and left out by the facade).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from levers9.agent.docker_workers import DockerFacts, WorkerContainer
from levers9.hooks.types import GpuDevice
from levers9.proto.v1 import agent_pb2

__all__ = ["GpuSource", "PluginGpus", "build_inventory", "change_key", "machine_resources"]

#: the GPUs of this machine, asked again now and then
GpuSource = Callable[[], Awaitable[list[GpuDevice]]]


def machine_resources() -> tuple[int, int]:
    """(CPU millicores, memory MiB) of this machine."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    memory_mib = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory_mib = int(line.split()[1]) // 1024
                    break
    except OSError:
        pass
    return cpus * 1000, memory_mib


class PluginGpus:
    """The installed plugins' ``levers9_gpu_devices`` answers, merged (what a worker discovers, too)."""

    def __init__(self) -> None:
        from levers9.hooks.facade import Hooks
        from levers9.hooks.manager import PluginPolicy, PluginSet

        plugins = PluginSet(PluginPolicy.from_env())
        plugins.load_entry_points()
        self._hooks = Hooks(plugins)

    async def __call__(self) -> list[GpuDevice]:
        return list((await self._hooks.gpu_devices()).devices)

    def close(self) -> None:
        self._hooks.close()


def _disk_free_gib(root_dir: str) -> float:
    for path in (root_dir, "/"):
        try:
            return round(shutil.disk_usage(path).free / 2**30, 1)
        except OSError:
            continue
    return 0.0


def build_inventory(
    agent_id: str,
    resources: tuple[int, int],
    gpus: Sequence[GpuDevice],
    facts: DockerFacts,
    containers: Sequence[WorkerContainer],
) -> agent_pb2.Inventory:
    """The Inventory message: ``containers`` are every levers9 container on the Docker (any agent's)."""
    cpu, memory = resources
    held = {uuid for container in containers for uuid in container.gpus}
    counts: dict[str, list[int]] = {}
    unsupported: list[str] = []
    for device in gpus:
        if device.gpu is None:
            unsupported.append(device.model)
            continue
        entry = counts.setdefault(device.gpu, [0, 0])
        entry[0] += 1
        entry[1] += device.uuid not in held
    mine = [c for c in containers if c.agent_id == agent_id]
    details: dict[str, Any] = {
        "docker": {"version": facts.version, "runtimes": list(facts.runtimes), "nvidia": facts.nvidia},
        "arch": platform.machine(),
        "disk_free_gib": _disk_free_gib(facts.root_dir),
        "containers": [c.info() for c in mine],
    }
    if unsupported:
        details["unsupported_gpus"] = unsupported
    return agent_pb2.Inventory(
        cpu_millicores=cpu,
        memory_mib=memory,
        free_cpu_millicores=max(0, cpu - sum(c.cpu_millicores for c in containers)),
        free_memory_mib=max(0, memory - sum(c.memory_mib for c in containers)),
        gpus=[agent_pb2.GpuCapacity(gpu=name, count=n, free=free) for name, (n, free) in sorted(counts.items())],
        machines=[c.machine_id for c in mine if c.state == "running"],
        details_json=json.dumps(details, sort_keys=True),
    )


def change_key(inventory: agent_pb2.Inventory) -> str:
    """What counts as a change worth a new Inventory message (everything but the disk's free space)."""
    details = json.loads(inventory.details_json or "{}")
    details.pop("disk_free_gib", None)
    copy = agent_pb2.Inventory()
    copy.CopyFrom(inventory)
    copy.details_json = json.dumps(details, sort_keys=True)
    return copy.SerializeToString(deterministic=True).hex()
