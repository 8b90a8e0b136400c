"""What `levers9 up` does with its pools' machines when it stops (Ctrl-C, SIGTERM).

`levers9 up` is one person's controlplane: nobody else reconciles its pools
while it is down, so a machine it leaves running keeps costing money (a rented
cloud machine) or holding this host (a local worker, a local_k8s Job) with no
one to stop it. On a clean stop it therefore terminates the machines of its own
pools, and says so on the terminal, machine by machine, unless it was started
with ``--keep-machines``, which leaves every machine running so that the next
`levers9 up` finds them again (their workers register anew, their calls go on).

Which pools, by one rule: every pool except those whose machines their owners
joined, the providers of :data:`~levers9.hooks.agent_providers.AGENT_PROVIDERS` (``agent_machine``: boxes
joined with ``levers9 machine create``; ``attached_cluster``: a team's cluster
joined with ``levers9 cluster join``). levers9 started nothing there: the
owner's agent keeps running and reconnects when `up` starts again, with its
workers (docs/agents.md). The core knows these two providers by name already
(they are its own services); any other provider, a third-party plugin included,
is taken to start machines of its own and has them stopped, the safe side for
a bill. `levers9 server` never stops machines at shutdown: its replicas share
them (docs/deploy.md).

Order and failures: the scheduler is stopped first (a launch in flight gets its
grace and is recorded), then each pool's recorded machines are terminated, then
whatever the provider itself still lists for the pool (a machine whose launch
answered too late to be recorded). A terminate that fails is printed with the
provider's error: that machine may still run, and the message says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from levers9.hooks.agent_providers import AGENT_PROVIDERS
from levers9.hooks.types import ENDED_STATES, Machine, MachineState
from levers9.scheduler.pools import PoolSpec
from levers9.services.core import Services
from levers9.state.sql.records import MachineRecord

__all__ = ["Stopping", "stop_or_keep_machines"]

log = logging.getLogger(__name__)

#: what every terminate gets, at most, before it is reported as not confirmed
TERMINATE_TIMEOUT_S = 120.0

REASON = "levers9 up is stopping"


@dataclass(frozen=True)
class Stopping:
    """One machine `up` stops or keeps: its pool and provider, and the name the terminal shows."""

    pool: PoolSpec
    target: MachineRecord | Machine

    @property
    def name(self) -> str:
        if isinstance(self.target, Machine):
            return self.target.provider_id
        return self.target.provider_id or self.target.id

    @property
    def shown(self) -> str:
        return f"{self.name} (pool {self.pool.name}, {self.pool.pool.provider})"


async def stop_or_keep_machines(services: Services, *, keep: bool, say: Callable[[str], None]) -> None:
    """Terminate the machines of ``services``' pools that `up` started, or, with ``keep``, only say they run on.

    ``say`` prints one line on the terminal. Never raises for a machine: a failure is said and logged.
    """
    await services.scheduler.stop()
    # `up` is its pools' only controlplane: these terminations are its own shutdown's, made after its scheduler
    # stopped and gave the planner lease up, so the lease's fence (which refuses a former holder's acts) is off
    services.scheduler.provisioner.fence = None
    joined = [spec for spec in services.pools.values() if spec.pool.provider in AGENT_PROVIDERS]
    owned = [spec for spec in services.pools.values() if spec.pool.provider not in AGENT_PROVIDERS]
    if keep:
        kept = [m for spec in owned for m in await _recorded(services, spec)]
        if kept:
            say(
                f"--keep-machines: leaving {len(kept)} machine(s) running: {', '.join(m.shown for m in kept)}; "
                "the next levers9 up finds them again (a cloud machine is billed meanwhile)"
            )
    else:
        recorded = [m for spec in owned for m in await _recorded(services, spec)]
        if recorded:
            say(
                f"terminating {len(recorded)} machine(s) of levers9 up's pools: "
                f"{', '.join(m.shown for m in recorded)} (levers9 up --keep-machines keeps them running)"
            )
        await _terminate(services, recorded, say)
        # what the providers still list: machines whose launch answered too late to be recorded
        done = {m.name for m in recorded}
        listed = [m for spec in owned for m in await _listed(services, spec) if m.name not in done]
        if listed:
            say(
                f"terminating {len(listed)} more machine(s) the providers still list: "
                f"{', '.join(m.shown for m in listed)}"
            )
        await _terminate(services, listed, say)
    running = [m for spec in joined for m in await _recorded(services, spec)]
    if running:
        say(
            f"leaving {len(running)} worker(s) on joined machines running: {', '.join(m.shown for m in running)}; "
            "they reconnect when levers9 up starts again"
        )


async def _recorded(services: Services, spec: PoolSpec) -> list[Stopping]:
    try:
        records = await services.machines.list(pool=spec.name)
    except Exception as exc:
        log.warning("pool %s: its machine records could not be read: %s", spec.name, exc)
        return []
    return [Stopping(spec, r) for r in records if r.state.value != "terminated"]


async def _listed(services: Services, spec: PoolSpec) -> list[Stopping]:
    try:
        machines = await services.hooks.list_machines(spec.pool)
    except Exception as exc:
        log.warning("pool %s: the %s provider could not list its machines: %s", spec.name, spec.pool.provider, exc)
        return []
    # one already stopping (the terminate just sent, say) needs no second; an ended one holds nothing
    return [Stopping(spec, m) for m in machines if m.state not in ENDED_STATES and m.state != MachineState.STOPPING]


async def _terminate(services: Services, machines: list[Stopping], say: Callable[[str], None]) -> None:
    provisioner = services.scheduler.provisioner

    async def one(machine: Stopping) -> None:
        try:
            done = await asyncio.wait_for(
                provisioner.terminate(machine.pool, machine.target, REASON), TERMINATE_TIMEOUT_S
            )
        except Exception as exc:  # a timeout included: the provider never answered
            done, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = "the provider refused (see the log above)"
        if done:
            say(f"terminated {machine.shown}")
        else:
            say(
                f"could not terminate {machine.shown}: {why}; it may still be running: stop it with the "
                "provider's own tools, or start levers9 up again, whose reconciler retries"
            )

    await asyncio.gather(*(one(m) for m in machines))
