"""One account of a worker's GPUs, shared by its warm pool (calls) and its sandboxes.

A worker's GPUs go to two kinds of container: the warm pool's (a function's
call, kept warm after it) and the sandboxes'. Each takes its devices from the
one :class:`GpuLedger` and gives them back when its container is gone, so a
device is never in two containers at once, whichever kind asked first.

Invariants:

* every device is either free or held by exactly one taker; :meth:`take` hands
  out the lowest free indexes and never more than are free (None, taking
  nothing, when there are too few); :meth:`give` takes back only devices of
  this ledger that are held, and raises :class:`ValueError` otherwise (a
  double free is a bug in the caller, never silently absorbed);
* devices given back go first to the claims waiting for them, in the order
  they came, and then every listener (:meth:`on_freed`) is told, so a warm pool
  with a call waiting for GPUs decides again when a sandbox ends; while a claim
  waits, :meth:`take` hands nothing to anyone else (it would starve the claim);
* a taker that needs more than is free may claim them (:meth:`claim`): the warm
  pool, registered as the reclaimer, stops idle GPU containers (never a busy
  one, and none at all when stopping them would still not free enough) and the
  claim is served as their devices come back. Sandboxes claim; a sandbox is
  never stopped to make room for a call (it is someone's live session).

Nothing here blocks: the ledger is used from the worker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from levers9.hooks.types import GpuDevice

__all__ = ["GpuLedger"]

log = logging.getLogger(__name__)


class GpuLedger:
    """The worker's GPU devices, each free or held by one container."""

    def __init__(self, devices: Iterable[GpuDevice] = ()) -> None:
        self.devices: tuple[GpuDevice, ...] = tuple(sorted(devices, key=lambda g: g.index))
        if len({g.index for g in self.devices}) != len(self.devices):
            raise ValueError(f"GPU indexes repeat in {[g.index for g in self.devices]}")
        self._free: list[GpuDevice] = list(self.devices)
        self._listeners: list[Callable[[], None]] = []
        self._reclaimer: Callable[[int], int] | None = None
        #: claims waiting for devices on their way back, first come first served: (count, future)
        self._claims: list[tuple[int, asyncio.Future[list[GpuDevice]]]] = []

    @property
    def total(self) -> int:
        return len(self.devices)

    @property
    def free(self) -> int:
        return len(self._free)

    def can_take(self, count: int) -> bool:
        """Whether :meth:`take` of ``count`` would succeed now."""
        return count == 0 or (not self._claims and count <= len(self._free))

    def take(self, count: int) -> list[GpuDevice] | None:
        """``count`` free devices (lowest indexes first), now held; None, holding nothing, when fewer are free
        or a claim is waiting for devices (claims are served first)."""
        if count < 0:
            raise ValueError(f"cannot take {count} GPUs")
        if not self.can_take(count):
            return None
        taken, self._free = self._free[:count], self._free[count:]
        return taken

    def give(self, devices: Iterable[GpuDevice]) -> None:
        """Devices back from a container that is gone: waiting claims are served first, then listeners told."""
        given = list(devices)
        if not given:
            return
        free = {g.index for g in self._free}
        own = {g.index for g in self.devices}
        for device in given:
            if device.index not in own or device.index in free:
                raise ValueError(f"GPU {device.index} is not held from this ledger (free: {sorted(free)})")
            free.add(device.index)
        self._free = sorted([*self._free, *given], key=lambda g: g.index)
        while self._claims and self._claims[0][0] <= len(self._free):
            count, future = self._claims.pop(0)
            if not future.done():
                taken, self._free = self._free[:count], self._free[count:]
                future.set_result(taken)
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # one listener's bug must not keep the devices from the others
                log.exception("a listener of freed GPUs failed")

    def on_freed(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments, on the event loop) whenever devices come back."""
        self._listeners.append(listener)

    def reclaim_with(self, reclaimer: Callable[[int], int]) -> None:
        """Who stops idle GPU containers for a claim: ``reclaimer(needed)`` asks idle containers holding GPUs
        to stop, but only when that brings ``needed`` more devices back, and returns how many are on their way
        back (from containers already stopping and those it stopped). The warm pool registers itself."""
        self._reclaimer = reclaimer

    async def claim(self, count: int, *, timeout_s: float) -> list[GpuDevice] | None:
        """``count`` devices, stopping idle containers that hold some when too few are free; None when that
        many cannot be had (not enough on the machine, held by busy containers, or not back in ``timeout_s``)."""
        taken = self.take(count)
        if taken is not None:
            return taken
        if count > self.total or self._reclaimer is None:
            return None
        future: asyncio.Future[list[GpuDevice]] = asyncio.get_running_loop().create_future()
        entry = (count, future)
        self._claims.append(entry)
        handed = False
        try:
            coming = self._reclaimer(count - len(self._free))
            if not future.done() and len(self._free) + coming < count:
                return None
            try:
                taken = await asyncio.wait_for(asyncio.shield(future), timeout_s)
            except TimeoutError:
                return None
            handed = True
            return taken
        finally:
            if entry in self._claims:
                self._claims.remove(entry)
            if future.done() and not handed:
                self.give(future.result())
            elif not future.done():
                future.cancel()
