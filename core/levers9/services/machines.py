"""Machines the controlplane asked its providers for: the operators' view of what runs and what it costs.

Every record is listed (REST's ``GET /api/v1/machines``), or, for ``levers9
machines``, only those levers9 rented or started itself
(:func:`started_machines`): the worker containers on boxes and clusters their
owners joined are left to the joined machines' listing, where each box names
its workers. Only operators may list machines (a workspace user gets
``PermissionDenied``).
"""

from __future__ import annotations

from collections.abc import Sequence

from levers9.hooks.agent_providers import AGENT_PROVIDERS
from levers9.services.access import require_operator
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.records import MachineRecord, MachineState

__all__ = ["LIVE_STATES", "list_machines", "started_machines"]

#: states of a machine that has not ended: what `levers9 machines` shows unless told otherwise
LIVE_STATES = tuple(s.value for s in MachineState if s not in (MachineState.TERMINATED, MachineState.FAILED))


async def list_machines(
    services: Services, principal: Principal, *, pool: str | None = None, states: Sequence[str] | None = None
) -> list[MachineRecord]:
    """Machines, oldest first, of ``pool`` and in ``states`` when given; operators only."""
    require_operator(principal, "list machines")
    return await services.machines.list(pool, None if states is None else list(states))


async def started_machines(
    services: Services, principal: Principal, *, pool: str | None = None, states: Sequence[str] | None = None
) -> list[MachineRecord]:
    """:func:`list_machines` without the joined providers' (see the module docstring); ``states`` defaults to
    :data:`LIVE_STATES`. Raises ValueError naming the field for a state that is not one."""
    wanted = list(states) if states else list(LIVE_STATES)
    known = {s.value for s in MachineState}
    bad = sorted(set(wanted) - known)
    if bad:
        raise ValueError(f"states: {', '.join(bad)} is not a machine state (one of {', '.join(sorted(known))})")
    found = await list_machines(services, principal, pool=pool, states=wanted)
    return [m for m in found if m.provider not in AGENT_PROVIDERS]
