"""Keeping the embedded ``redis-server`` alive: its death noticed, the child reaped, a new one started, state rebuilt.

:class:`RedisSupervisor` watches the :class:`~levers9.state.redis.connect.ManagedRedis`
child of one controlplane. Invariants:

* A death is noticed at once: the child's pidfd becomes readable the moment
  it exits (Linux 5.3 and later; elsewhere the child is polled every
  :data:`levers9.children.POLL_S`; :func:`levers9.children.wait_exited`). The child is reaped before anything else, so no zombie is
  left however it died.
* The new server listens on the same socket path, so every client of it
  reconnects by itself on its next command. It starts empty (the embedded
  Redis keeps nothing on disk), so ``recover`` runs after every restart: the
  controlplane's own start-up steps that fill Redis from SQL. A ``recover``
  that fails is tried again (with back-off) until it succeeds, unless the
  server died again meanwhile, when the restart comes first.
* Up to :data:`RESTART_TRIES` starts are tried in a row, with back-off
  between them. When none listens, the supervisor gives up: :attr:`failure`
  says why (quoting the server's log) and :attr:`failed` is set; the
  controlplane then stops and its command exits non-zero, since it cannot
  place anything without Redis and a service manager can restart it whole.
* Each death and each restart is logged once, and ``on_restart`` is called
  once per restart (the metric). Commands that reach the server while it is
  down fail as they would against any Redis that is away; their callers
  retry or report (see :mod:`levers9.state.redis.channel` for subscriptions).

The in-process Redis (:class:`~levers9.state.redis.connect.EmbeddedRedis`)
cannot die on its own and has no supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from levers9.backoff import Backoff
from levers9.cancelling import raise_if_cancelling
from levers9.children import how_it_ended, wait_exited
from levers9.state.errors import StateError
from levers9.state.redis.connect import ManagedRedis

__all__ = ["RESTART_TRIES", "RedisSupervisor"]

log = logging.getLogger(__name__)

#: starts of a new server tried in a row before the supervisor gives up
RESTART_TRIES = 5
#: the waits between those tries: doubling from the first, at most the cap
RESTART_BACKOFF_S = (0.2, 2.0)
#: the waits between tries of ``recover`` after a restart
RECOVER_BACKOFF_S = (0.5, 10.0)


class RedisSupervisor:
    """Restarts ``managed`` whenever it dies and runs ``recover`` after each restart (see the module docstring)."""

    def __init__(
        self,
        managed: ManagedRedis,
        recover: Callable[[], Awaitable[None]],
        *,
        on_restart: Callable[[], None] | None = None,
        tries: int = RESTART_TRIES,
    ) -> None:
        if tries < 1:
            raise ValueError(f"tries must be at least 1, got {tries}")
        self.managed = managed
        self.tries = tries
        self._recover = recover
        self._on_restart = on_restart
        #: how many times the server was started again
        self.restarts = 0
        #: why the supervisor gave up (set together with :attr:`failed`); None while it has not
        self.failure: StateError | None = None
        self.failed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin watching, in a task of the running event loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="embedded redis supervisor")

    async def close(self) -> None:
        """Stop watching (before the server is stopped on purpose, which must not be taken for a death)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await self._exited()
            if not await self._restart():
                return
            await self._recovered()

    async def _exited(self) -> None:
        """Return once the child has exited, reaped."""
        process = self.managed.process
        assert process is not None
        await wait_exited(process)

    async def _restart(self) -> bool:
        """Start a new server, up to :attr:`tries` times; False (and :attr:`failure` set) when none listens."""
        managed = self.managed
        log.error(
            "the embedded redis-server (pid %d) %s; starting it again on %s",
            managed.process.pid,
            how_it_ended(managed.process.returncode),
            managed.socket,
        )
        backoff = Backoff(initial_s=RESTART_BACKOFF_S[0], cap_s=RESTART_BACKOFF_S[1])
        last: StateError | None = None
        for attempt in range(1, self.tries + 1):
            try:
                await managed.restart()
            except StateError as exc:
                last = exc
                log.warning(
                    "starting the embedded redis-server again failed (try %d of %d): %s", attempt, self.tries, exc
                )
                if attempt < self.tries:
                    await asyncio.sleep(backoff.next_s())
                continue
            self.restarts += 1
            log.warning(
                "restarted the embedded redis-server (pid %d); rebuilding what it held from SQL", managed.process.pid
            )
            if self._on_restart is not None:
                self._on_restart()
            return True
        self.failure = StateError(
            f"the embedded redis-server died and could not be started again ({self.tries} tries): {last}"
        )
        log.error("%s", self.failure)
        self.failed.set()
        return False

    async def _recovered(self) -> None:
        """Run ``recover`` until it succeeds, or until the server dies again (then the restart comes first)."""
        backoff = Backoff(initial_s=RECOVER_BACKOFF_S[0], cap_s=RECOVER_BACKOFF_S[1])
        while self.managed.process.poll() is None:
            try:
                await self._recover()
            except Exception as exc:
                raise_if_cancelling(exc)
                log.warning("rebuilding the embedded Redis's state failed, trying again: %s", exc)
                await asyncio.sleep(backoff.next_s())
                continue
            return
