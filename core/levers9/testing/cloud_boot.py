"""Boot what a fake cloud runs: every instance it reports running gets an emulated first boot of its user data.

A fake cloud API (a moto server, a fake OCI or Lambda API) holds instances
but runs nothing. :class:`CloudBooter` plays the cloud's hypervisor for a
test: a thread asks each source (a callable listing the cloud's instances)
every ``interval`` seconds, and

* an instance reported running that has not been booted gets
  :func:`levers9.testing.boot.emulated_boot` of its user data, under a root
  of its own, reaching only ``ports`` on the host's loopback (the
  controlplane's), with the GPUs ``hardware`` says its instance type has,
  and the environment ``platform`` says the cloud gives its processes (the
  address of a fake metadata service for that instance, whose port is then
  among ``ports``);
* an instance reported gone (terminated, or no longer listed) has its boot
  stopped: everything it started is signalled and its root removed, as a
  terminated VM takes its processes with it (SIGTERM, then SIGKILL after
  ``grace`` seconds).

An instance is booted at most once: a boot that ends by itself (the worker
exited) is not started again, as a real machine's first boot runs once. An
instance without user data boots nothing (its image would just start) and is
listed in :attr:`CloudBooter.bare`. User data a boot cannot run is recorded in
:attr:`CloudBooter.refused` with the reason, and the instance is left alone.

GPUs: ``hardware`` gives an instance's ``nvidia-smi --query-gpu`` lines;
by default an instance that has ``gpu`` and ``gpu_count`` attributes (as
:class:`levers9.testing.fake_cloud.FakeInstance` has) gets
:func:`levers9.testing.recorded_gpus.nvidia_smi` of them, every other one none.

Failing fast: a boot whose user data's command ends with a status other than
0 while its instance still runs is recorded in :attr:`CloudBooter.failed`
with why and what it printed, naming the renderer the user data came from
(:meth:`levers9.testing.boot.EmulatedBoot.failure`); :meth:`CloudBooter.wait_for`
raises :class:`BootFailed` with that at once, instead of waiting out its
timeout for a worker that will never come.

Invariants: :meth:`CloudBooter.stop` stops the thread and every boot it
started, whatever state the sources are in; a source that raises is logged
and asked again next round (a fake restarting must not end the harness).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from levers9.testing.boot import BootError, EmulatedBoot, emulated_boot
from levers9.testing.recorded_gpus import nvidia_smi

__all__ = ["BootFailed", "BootTarget", "CloudBooter", "recorded_hardware"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class BootTarget(Protocol):
    """What the booter needs of an instance (:class:`levers9.testing.fake_cloud.FakeInstance` has it)."""

    @property
    def id(self) -> str: ...

    @property
    def running(self) -> bool: ...

    @property
    def gone(self) -> bool: ...

    @property
    def user_data(self) -> str: ...

    @property
    def instance_type(self) -> str | None: ...


class BootFailed(RuntimeError):
    """A booted instance's user data failed: the message names the instance, the renderer, why, and its output."""


def recorded_hardware(instance: BootTarget) -> str | None:
    """The default ``hardware``: the recorded nvidia-smi lines of the instance's ``gpu`` and ``gpu_count``
    attributes (its id seeding the UUIDs); None (no GPUs) for an instance without them."""
    gpu: str | None = getattr(instance, "gpu", None)
    count: int = getattr(instance, "gpu_count", 0) or 0
    if not gpu or count < 1:
        return None
    return nvidia_smi(gpu, count, machine=instance.id)


class CloudBooter:
    """Boots the running instances of ``sources`` until :meth:`stop` (see the module docstring)."""

    def __init__(
        self,
        sources: Sequence[Callable[[], Iterable[BootTarget]]],
        *,
        ports: Sequence[int],
        hardware: Callable[[BootTarget], str | None] = recorded_hardware,
        platform: Callable[[BootTarget], Mapping[str, str]] = lambda _: {},
        interval: float = 0.2,
        root: Path | None = None,
        grace: float = 5.0,
    ) -> None:
        self.sources = list(sources)
        self.ports = list(ports)
        self.hardware = hardware
        self.platform = platform
        self.interval = interval
        #: seconds a stopped boot's processes get between SIGTERM and SIGKILL (a VM's shutdown gives its services
        #: time to stop; a worker removes the containers it runs in it)
        self.grace = grace
        # short: a worker's unix sockets live below its boot root
        self._root = Path(tempfile.mkdtemp(prefix="l9cb-", dir=root))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: instance id -> its boot (running or ended)
        self.boots: dict[str, EmulatedBoot] = {}
        #: instance id -> why its user data could not be booted
        self.refused: dict[str, str] = {}
        #: instances that were running without user data: nothing to boot
        self.bare: list[str] = []
        #: instance ids whose boot was stopped because the cloud reported the instance gone
        self.stopped: list[str] = []
        #: instance id -> why its boot failed while the instance ran (see :meth:`wait_for`), with its output
        self.failed: dict[str, str] = {}
        self._thread = threading.Thread(target=self._run, name="cloud-booter", daemon=True)

    def start(self) -> CloudBooter:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval)

    def step(self) -> None:
        """One round: boot the newly running, stop the gone."""
        seen: dict[str, BootTarget] = {}
        complete = True
        for source in self.sources:
            try:
                for instance in source():
                    seen[instance.id] = instance
            except Exception:
                log.exception("a cloud's instance listing failed; asking again next round")
                complete = False
        with self._lock:
            if self._stop.is_set():
                return
            for instance in seen.values():
                known = instance.id in self.boots or instance.id in self.refused or instance.id in self.bare
                if instance.running and not instance.gone and not known:
                    self._boot(instance)
            for instance_id, boot in list(self.boots.items()):
                found = seen.get(instance_id)
                vanished = found is None and complete
                if (vanished or (found is not None and found.gone)) and instance_id not in self.stopped:
                    boot.stop(self.grace)
                    self.stopped.append(instance_id)
                elif instance_id not in self.stopped and instance_id not in self.failed:
                    why = boot.failure()
                    if why is not None:
                        self.failed[instance_id] = (
                            f"instance {instance_id}: {why} while the instance runs ({boot.isolation}); "
                            f"what it printed:\n{boot.output()}"
                        )
                        log.warning("%s", self.failed[instance_id])

    def _boot(self, instance: BootTarget) -> None:
        if not instance.user_data.strip():
            self.bare.append(instance.id)
            return
        root = self._root / f"b{len(self.boots) + len(self.refused)}"
        try:
            self.boots[instance.id] = emulated_boot(
                instance.user_data,
                root,
                ports=self.ports,
                gpus=self.hardware(instance),
                environment=self.platform(instance),
            )
        except (BootError, OSError, ValueError) as exc:
            self.refused[instance.id] = str(exc)
            shutil.rmtree(root, ignore_errors=True)
            log.warning("instance %s: its user data was not booted: %s", instance.id, exc)

    def alive(self) -> list[str]:
        """Instances whose boot still runs something."""
        with self._lock:
            return [i for i, boot in self.boots.items() if i not in self.stopped and boot.alive()]

    def wait_for(self, check: Callable[[], T], what: str, timeout: float, interval: float = 0.2) -> T:
        """Call ``check`` until it returns something true, and return that; meanwhile raise :class:`BootFailed`
        the moment a boot fails (or its user data was refused), and TimeoutError after ``timeout`` seconds,
        naming ``what`` was awaited and what each boot printed."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            with self._lock:
                failures = list(self.failed.values()) + [
                    f"instance {i}: its user data was not booted: {why}" for i, why in self.refused.items()
                ]
            if failures:
                raise BootFailed(f"waiting for {what}: " + "\n".join(failures))
            if time.monotonic() > deadline:
                shown = "\n".join(
                    f"--- instance {i} ({boot.renderer}):\n{boot.output()}" for i, boot in self.boots.items()
                )
                raise TimeoutError(
                    f"{what} did not happen within {timeout:g} s; the boots printed:\n{shown or '(none booted)'}"
                )
            time.sleep(interval)

    def output(self, instance_id: str) -> str:
        boot = self.boots.get(instance_id)
        return boot.output() if boot is not None else self.refused.get(instance_id, "(never booted)")

    def stop(self) -> None:
        """End the thread and every boot; remove every root."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        with self._lock:
            for instance_id, boot in self.boots.items():
                if instance_id not in self.stopped:
                    boot.stop(self.grace)
                    self.stopped.append(instance_id)
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> CloudBooter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
