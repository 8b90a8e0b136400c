"""Machines the controlplane asked its providers for: the operators' view of what runs and what it costs."""

from __future__ import annotations

from collections.abc import Sequence

from levers9.services.access import require_operator
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.records import MachineRecord

__all__ = ["list_machines"]


async def list_machines(
    services: Services, principal: Principal, *, pool: str | None = None, states: Sequence[str] | None = None
) -> list[MachineRecord]:
    """Machines, oldest first, of ``pool`` and in ``states`` when given; operators only."""
    require_operator(principal, "list machines")
    return await services.machines.list(pool, None if states is None else list(states))
