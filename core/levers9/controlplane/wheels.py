"""The wheels this controlplane serves: levers9's own, which boxes install the agent and workers from.

``GET /api/v1/wheels`` lists them (file name, sha256, size, URL) and
``GET /api/v1/wheels/<file name>`` answers one; both take no token. The
wheel is not secret (it is this installation's own code, what the worker
image carries too), and a box fetches it before it holds any credential. The
routes are no proxy and read no path they are given: a name is looked up
among the wheels this process built (:mod:`levers9.images.wheel`), and any
other name is a 404 listing the ones served.

:class:`OwnWheels` builds the wheel once, on first use, in a thread (about a
second), and keeps its bytes in memory (about 1 MiB); a build that fails is
not cached, so the next request tries again and the error names what is
missing. ``http_url`` is the HTTP listener's advertised URL
(``listen.advertise_http`` or derived from ``listen.advertise``): the join
command and the boot script fetch from there. Without it (a controlplane
composed without its HTTP listener, as some tests do) :meth:`OwnWheels.ref`
answers None and commands say that levers9 must already be on the box.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from levers9.images.wheel import Wheel, build

__all__ = ["WHEELS_PATH", "OwnWheels", "WheelRef"]

log = logging.getLogger(__name__)

#: where the wheels are served on the HTTP listener
WHEELS_PATH = "/api/v1/wheels"


@dataclass(frozen=True)
class WheelRef:
    """Where a box fetches the wheel and the sha256 it must have."""

    url: str
    sha256: str
    filename: str


class OwnWheels:
    """levers9's own wheel(s), built once and served from memory (see the module docstring)."""

    def __init__(self, http_url: str = "") -> None:
        self.http_url = http_url.rstrip("/")
        self._built: list[Wheel] | None = None
        self._lock = asyncio.Lock()

    async def wheels(self) -> list[Wheel]:
        """The wheels served, built on first use (:class:`~levers9.images.rootfs.ImageError` when they cannot be)."""
        async with self._lock:
            if self._built is None:
                self._built = [await asyncio.to_thread(build)]
            return self._built

    async def find(self, filename: str) -> Wheel | None:
        return next((w for w in await self.wheels() if w.filename == filename), None)

    def url(self, wheel: Wheel, base: str = "") -> str:
        """The wheel's URL under ``base`` (default: the advertised HTTP URL)."""
        return f"{(base or self.http_url).rstrip('/')}{WHEELS_PATH}/{wheel.filename}"

    async def url_and_hash(self) -> tuple[str, str] | None:
        """(URL, sha256) for a booted machine's script (the scheduler's ``ctx.wheel``); None as :meth:`ref`."""
        ref = await self.ref()
        return (ref.url, ref.sha256) if ref is not None else None

    async def ref(self, base: str = "") -> WheelRef | None:
        """The levers9 wheel's URL and hash for a command to fetch; None without an HTTP URL to give, or when the
        wheel cannot be built here (logged: the command then says levers9 must be on the box already, and the
        controlplane serves on)."""
        if not (base or self.http_url):
            return None
        try:
            wheel = (await self.wheels())[0]
        except Exception as exc:  # ImageError, an unreadable file
            log.warning("levers9's wheel cannot be built, so join commands and booted machines get none: %s", exc)
            return None
        return WheelRef(self.url(wheel, base), wheel.sha256, wheel.filename)
