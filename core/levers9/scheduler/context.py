"""Everything the scheduler's parts share, in one object so each part's constructor stays short."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from levers9.backoff import delay_s
from levers9.scheduler.events import SchedulerEvent
from levers9.state.errors import InvalidTransition

if TYPE_CHECKING:
    from levers9.config.model import SchedulerConfig
    from levers9.hooks.facade import Hooks
    from levers9.scheduler.availability import Unavailable
    from levers9.scheduler.pools import PoolSpec
    from levers9.state.redis.backlog import Backlog
    from levers9.state.redis.workers import WorkerRegistry
    from levers9.state.sql.machines import MachineStore
    from levers9.state.sql.tasks import TaskStore
    from levers9.state.sql.workspaces import TokenStore


@dataclass
class Context:
    backlog: Backlog
    workers: WorkerRegistry
    unavailable: Unavailable
    hooks: Hooks
    pools: dict[str, PoolSpec]
    settings: SchedulerConfig
    tasks: TaskStore
    machines: MachineStore
    tokens: TokenStore
    #: where provisioned workers dial
    controlplane_url: str
    #: PEM CA bundle the workers verify the controlplane with (``listen.tls.ca_file``); empty: system trust
    controlplane_ca: str = ""
    #: levers9's own wheel for a booted machine that has neither levers9 nor Docker: answers (URL, sha256) on the
    #: controlplane's HTTP listener (built on first use), None when there is none to give; set by the server.
    #: Never levers9 by name from a package index: another project owns the name there
    wheel: Callable[[], Awaitable[tuple[str, str] | None]] | None = None
    clock: Callable[[], float] = time.time
    #: set to make the placement loop run now rather than at its next tick
    placer_wanted: asyncio.Event = field(default_factory=asyncio.Event)
    #: set to make the planner run now (a provider just said no: try the next candidate at once)
    planner_wanted: asyncio.Event = field(default_factory=asyncio.Event)
    #: set when a provider refused an offer or a pool: the planner skips its pacing gap (the pause it leaves
    #: after a long pass) so the next offer or pool is asked at once, not up to a second later
    failover_wanted: asyncio.Event = field(default_factory=asyncio.Event)
    #: told (provider, seconds, outcome) after every provider call that starts a machine; outcomes are
    #: ok, capacity, quota, billing, throttled, timeout, error and cancelled (see :mod:`levers9.scheduler.provisioning`)
    on_provisioned: Callable[[str, float, str], None] | None = None
    #: told of requeues, lost workers, terminated machines and provider calls (see :mod:`levers9.scheduler.events`)
    on_event: Callable[[SchedulerEvent], None] | None = None

    def emit(self, event: SchedulerEvent) -> None:
        """Tell :attr:`on_event`; an observer that fails is logged, never lets the scheduler fail."""
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                logging.getLogger(__name__).exception("the scheduler's event observer failed on %s", event)

    async def requeue_in_sql(self, ids: Sequence[str], reason: str) -> list[str]:
        """Mark requests Redis has just put back on the backlog pending again in SQL; returns those that were.

        One that finished while Redis still counted it on its worker has nothing to run again: it leaves the
        backlog instead.
        """
        requeued: list[str] = []
        for rid in ids:
            try:
                await self.tasks.requeue(rid, reason)
            except InvalidTransition:
                await self.backlog.finish(rid, self.now_ms())
                continue
            requeued.append(rid)
        return requeued

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def backoff_s(self, rounds: int) -> float:
        """Exponential wait between tries, capped: retry_initial_s, doubling, at most retry_max_s."""
        s = self.settings
        return delay_s(rounds + 1, initial_s=s.retry_initial_s, cap_s=s.retry_max_s)
