"""This host's GPUs, as the local provider hands them out.

The local provider owns no cloud catalogue: what it can offer is what the
driver reports on this machine, asked of the GPU discovery plugins (the core's
``nvidia_smi``) through the plugin manager's facade, with its deadline and its
answer checked, so the controlplane and the workers it starts agree on what a
GPU index means. ``nvidia-smi`` can take seconds while the driver wakes the
GPUs, and the scheduler asks for offers often, so answers are kept for a
minute; GPUs do not come and go faster than that on a running host. Each start
of the plugin (each facade) begins with an empty memory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

from levers9.gpu.catalog import CATALOG
from levers9.hooks.types import Availability, GpuDevice, GpuOffer

__all__ = ["CACHE_S", "CachedDiscovery", "Discover", "eligible", "not_started", "offer"]

#: a function returning this host's GPUs; raises when the host's GPU tool is present but fails
Discover = Callable[[], list[GpuDevice]]

#: how long a discovery answer is reused
CACHE_S = 60.0


def not_started() -> list[GpuDevice]:
    """Discovery of a provider that was neither started nor given ``discover``: there is no facade to ask."""
    raise RuntimeError("the local provider was not started: GPU discovery goes through the plugin manager")


class CachedDiscovery:
    """A discovery function (the facade's, ``PluginContext.gpu_devices``) with a short memory.

    Failures are not remembered: a driver that was loading a moment ago may
    answer now.
    """

    def __init__(self, ask: Discover, cache_s: float = CACHE_S) -> None:
        self._ask = ask
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._answer: tuple[float, list[GpuDevice]] | None = None

    def __call__(self) -> list[GpuDevice]:
        with self._lock:
            cached = self._answer
            if cached is not None and time.monotonic() - cached[0] < self._cache_s:
                return list(cached[1])
        devices = self._ask()
        with self._lock:
            self._answer = (time.monotonic(), list(devices))
        return list(devices)


def eligible(devices: Iterable[GpuDevice], visible: list[int] | None, gpu: str | None) -> list[GpuDevice]:
    """The GPUs workers may be given: those in ``visible`` (all when None) and of type ``gpu`` (any when None).

    An index in ``visible_gpus`` that discovery does not find is not handed
    out: a worker given a GPU that is not there would fail every job it takes.
    """
    chosen = [
        device
        for device in devices
        if (visible is None or device.index in visible) and (gpu is None or device.gpu == gpu)
    ]
    return sorted(chosen, key=lambda device: device.index)


def _host_memory_mib() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def offer(gpu: str, per_worker: int, devices: list[GpuDevice], free: int, region: str | None) -> GpuOffer | None:
    """The one offer this host makes for ``per_worker`` GPUs of type ``gpu``, or None if it never could.

    ``devices`` are the eligible GPUs of that type and ``free`` how many of them
    no live worker holds. CPU and memory are the host's: local workers share it.
    """
    if len(devices) < per_worker:
        return None
    # The driver reports slightly less than the nominal size; the smallest GPU is what a job can count on.
    memory = min(device.memory_mib for device in devices)
    if not memory:  # the driver does not report it: the catalog's nominal size is the best guess
        known = CATALOG.get(gpu)
        if known is None:
            return None
        memory = known.memory_mib
    cpus = os.cpu_count()
    return GpuOffer(
        gpu=gpu,
        gpu_count=per_worker,
        gpu_memory_mib=memory,
        region=region,
        instance_type="local",
        cpu_millicores=cpus * 1000 if cpus else None,
        memory_mib=_host_memory_mib(),
        availability=Availability.AVAILABLE if free >= per_worker else Availability.UNAVAILABLE,
    )
