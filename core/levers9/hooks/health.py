"""Which plugins answer, and which the core has stopped waiting for.

A provider whose cloud API hangs costs every caller its full deadline (two
minutes for a provision) before the scheduler may try the next pool. So the
facade keeps a :class:`HealthBook`: a provider whose hooks time out
``unhealthy_after`` times in a row (3 by default) is marked **unhealthy** with
the reason (``"levers9_provision did not answer within 120 s, 3 times in a
row"``), and from then on its provider hooks fail at once with
:class:`ProviderUnhealthy`, a :class:`~levers9.hooks.errors.PluginError`
naming the plugin and the reason. The scheduler treats that like any plugin
failure: the pool is marked unavailable and the next candidate is tried in the
same pass.

Invariants:

* **Only timeouts count.** Any answer (a result, or a typed error such as
  ``InsufficientCapacity``) shows the provider is answering and resets the
  count; a call that never started because the plugin's threads were all busy
  counts as a timeout, since the plugin is not answering.
* **Half-open.** While unhealthy, one call every ``probe_every_s`` seconds (30
  by default) is let through as a probe, never two at once. Its answer, of any
  kind, marks the provider healthy again; a timeout keeps it unhealthy and
  the next probe waits another interval.
* **A failed start is unhealthy too.** A plugin whose ``levers9_startup``
  raised or timed out is unhealthy with that error; its probe reruns
  ``levers9_startup`` first (the facade does that), and only a successful
  start lets the probe's call through.
* Runtime, discovery and checkpoint hooks are never refused: they run on
  workers, where a provider's state means nothing. Their timeouts are counted
  only for the record.

The book is touched only from the event loop's thread, so it holds no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from levers9.hooks.errors import PluginError, PluginTimeout

__all__ = [
    "DEFAULT_PROBE_EVERY_S",
    "DEFAULT_UNHEALTHY_AFTER",
    "HealthBook",
    "PluginHealth",
    "PluginQueueTimeout",
    "ProviderUnhealthy",
]

DEFAULT_UNHEALTHY_AFTER = 3
DEFAULT_PROBE_EVERY_S = 30.0

Cause = Literal["timeouts", "startup"]


class PluginQueueTimeout(PluginTimeout):
    """A call waited its whole deadline for one of the plugin's threads and never ran.

    Distinct from a hook that ran too long: here the plugin's earlier calls hold
    every thread, so the call was withdrawn before the hook was entered.
    """

    def __init__(self, plugin: str, hook: str, timeout: float, threads: int) -> None:
        PluginError.__init__(
            self,
            plugin,
            hook,
            f"never started: all {threads} of the plugin's threads stayed busy with earlier calls for "
            f"{timeout:g} s (the hook was not called)",
        )
        self.timeout = timeout
        self.threads = threads


class ProviderUnhealthy(PluginError):
    """The provider is marked unhealthy, so its hook was not called; ``reason`` says why it was marked."""

    def __init__(self, plugin: str, hook: str, reason: str, probe_in_s: float) -> None:
        super().__init__(
            plugin,
            hook,
            f"not called: the provider is unhealthy ({reason}); it is asked again in {max(probe_in_s, 0):.0f} s",
        )
        self.reason = reason


@dataclass
class PluginHealth:
    """One plugin's state, as ``Hooks.health()`` reports it."""

    plugin: str
    healthy: bool = True
    #: why it is unhealthy; None while healthy
    reason: str | None = None
    cause: Cause | None = None
    #: epoch seconds when it was last marked unhealthy (or healthy again)
    since: float | None = None
    timeouts_in_a_row: int = 0
    #: the plugin's threads: their number, calls running, calls waiting
    threads: int = 0
    running: int = 0
    queued: int = 0
    # half-open bookkeeping (monotonic seconds)
    next_probe: float = 0.0
    probing: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "healthy": self.healthy,
            "reason": self.reason,
            "since": self.since,
            "timeouts_in_a_row": self.timeouts_in_a_row,
            "threads": self.threads,
            "running": self.running,
            "queued": self.queued,
        }


class HealthBook:
    """Per-plugin health for the facade (see the module docstring)."""

    def __init__(
        self,
        *,
        unhealthy_after: int = DEFAULT_UNHEALTHY_AFTER,
        probe_every_s: float = DEFAULT_PROBE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if unhealthy_after < 1:
            raise ValueError(f"unhealthy_after must be at least 1, got {unhealthy_after}")
        if probe_every_s < 0:
            raise ValueError(f"probe_every_s must be 0 or more, got {probe_every_s}")
        self.unhealthy_after = unhealthy_after
        self.probe_every_s = probe_every_s
        self.clock = clock
        self._book: dict[str, PluginHealth] = {}

    def get(self, plugin: str) -> PluginHealth:
        health = self._book.get(plugin)
        if health is None:
            health = self._book[plugin] = PluginHealth(plugin)
        return health

    def admit(self, plugin: str, hook: str) -> bool:
        """May a provider hook of ``plugin`` run now? True when it runs as the half-open probe.

        :raises ProviderUnhealthy: the plugin is unhealthy and no probe is due (or one is in flight).
        """
        health = self.get(plugin)
        if health.healthy:
            return False
        now = self.clock()
        if health.probing or now < health.next_probe:
            wait = self.probe_every_s if health.probing else health.next_probe - now
            raise ProviderUnhealthy(plugin, hook, health.reason or "unknown", wait)
        health.probing = True
        health.next_probe = now + self.probe_every_s
        return True

    def answered(self, plugin: str, *, probe: bool = False) -> None:
        """The plugin answered (a result or a typed error): the count resets, a probe's answer heals."""
        health = self.get(plugin)
        health.timeouts_in_a_row = 0
        if probe:
            health.probing = False
        if not health.healthy and (probe or health.cause == "timeouts"):
            self._heal(health)

    def timed_out(self, plugin: str, hook: str, deadline: float, *, probe: bool = False) -> None:
        health = self.get(plugin)
        health.timeouts_in_a_row += 1
        if probe:
            health.probing = False
        if health.timeouts_in_a_row >= self.unhealthy_after:
            times = health.timeouts_in_a_row
            self._mark(health, "timeouts", f"{hook} did not answer within {deadline:g} s, {times} times in a row")

    def abandoned(self, plugin: str, *, probe: bool) -> None:
        """The caller went away (cancelled) before the answer: a probe slot is freed, nothing is learnt."""
        if probe:
            self.get(plugin).probing = False

    def failed_to_start(self, plugin: str, error: str) -> None:
        self._mark(self.get(plugin), "startup", f"levers9_startup failed: {error}")

    def started(self, plugin: str) -> None:
        health = self.get(plugin)
        if not health.healthy and health.cause == "startup":
            self._heal(health)

    def _mark(self, health: PluginHealth, cause: Cause, reason: str) -> None:
        if health.healthy:
            health.since = time.time()
            health.next_probe = self.clock() + self.probe_every_s
        health.healthy = False
        health.cause = cause
        health.reason = reason

    def _heal(self, health: PluginHealth) -> None:
        health.healthy = True
        health.cause = None
        health.reason = None
        health.since = time.time()
        health.timeouts_in_a_row = 0
