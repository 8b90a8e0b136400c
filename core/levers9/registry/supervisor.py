"""Keeping the embedded registry alive: its death noticed, the child reaped, a new one started on the same port.

:class:`RegistrySupervisor` watches one :class:`~levers9.registry.server.EmbeddedRegistry`
(the way :mod:`levers9.state.redis.supervisor` watches the embedded Redis). Invariants:

* A death is noticed at once: the child's pidfd becomes readable the moment it
  exits (Linux 5.3 and later; elsewhere the child is polled every
  :data:`levers9.children.POLL_S`; :func:`levers9.children.wait_exited`). The child is reaped before anything else, so no zombie is
  left however it died.
* The new registry listens on the same address and serves the same storage
  directory, so every image pushed before the death is there after it and refs
  naming the registry stay valid; nothing has to be rebuilt. A push or pull
  under way when it died fails (the client reports a connection error) and is
  the caller's to retry.
* Up to :data:`RESTART_TRIES` starts are tried in a row, with back-off between
  them; starting runs in a thread, so the event loop is never blocked while the
  registry comes up. When none answers, the supervisor gives up: :attr:`failure`
  says why (quoting the registry's log) and :attr:`failed` is set, for the
  controlplane to stop or report.
* Each death and each restart is logged once, and ``on_restart`` is called once
  per restart (the metric).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from levers9.children import how_it_ended, wait_exited
from levers9.registry.errors import RegistryError
from levers9.registry.server import EmbeddedRegistry

__all__ = ["RESTART_TRIES", "RegistrySupervisor"]

log = logging.getLogger(__name__)

#: starts of a new registry tried in a row before the supervisor gives up
RESTART_TRIES = 5
#: the waits between those tries: doubling from the first, at most the cap
RESTART_BACKOFF_S = (0.2, 2.0)


class RegistrySupervisor:
    """Restarts ``registry`` whenever it dies (see the module docstring)."""

    def __init__(
        self,
        registry: EmbeddedRegistry,
        *,
        on_restart: Callable[[], None] | None = None,
        tries: int = RESTART_TRIES,
    ) -> None:
        if tries < 1:
            raise ValueError(f"tries must be at least 1, got {tries}")
        self.registry = registry
        self.tries = tries
        self._on_restart = on_restart
        #: how many times the registry was started again
        self.restarts = 0
        #: why the supervisor gave up (set together with :attr:`failed`); None while it has not
        self.failure: RegistryError | None = None
        self.failed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None  # a start running in a thread

    def start(self) -> None:
        """Begin watching, in a task of the running event loop; the registry must have been started."""
        if self.registry.process is None:
            raise RuntimeError("start the embedded registry before its supervisor")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="embedded registry supervisor")

    async def close(self) -> None:
        """Stop watching (before the registry is stopped on purpose, which must not be taken for a death).

        A start under way in its thread is waited for, so that the caller's ``stop`` that follows finds
        the child it made rather than leaving it running.
        """
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        starting, self._starting = self._starting, None
        if starting is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await starting

    async def _run(self) -> None:
        while True:
            await self._exited()
            if not await self._restart():
                return

    async def _exited(self) -> None:
        """Return once the child has exited, reaped."""
        process = self.registry.process
        assert process is not None
        await wait_exited(process)

    async def _restart(self) -> bool:
        """Start a new registry, up to :attr:`tries` times; False (and :attr:`failure` set) when none answers."""
        registry = self.registry
        process = registry.process
        assert process is not None
        log.error(
            "the embedded registry (pid %d) %s; starting it again on %s",
            process.pid,
            how_it_ended(process.returncode),
            registry.address,
        )
        delay, cap = RESTART_BACKOFF_S
        last: RegistryError | None = None
        for attempt in range(1, self.tries + 1):
            try:
                self._starting = asyncio.ensure_future(asyncio.to_thread(registry.restart))
                await asyncio.shield(self._starting)  # a close() meanwhile waits for it rather than abandon it
                self._starting = None
            except RegistryError as exc:
                last = exc
                log.warning("starting the embedded registry again failed (try %d of %d): %s", attempt, self.tries, exc)
                if attempt < self.tries:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, cap)
                continue
            self.restarts += 1
            log.warning(
                "restarted the embedded registry (pid %d) on %s",
                registry.process.pid if registry.process else -1,
                registry.address,
            )
            if self._on_restart is not None:
                self._on_restart()
            return True
        self.failure = RegistryError(
            f"it died and could not be started again ({self.tries} tries): {last}",
            registry=registry.address,
            operation="keep the embedded registry running",
        )
        log.error("%s", self.failure)
        self.failed.set()
        return False
