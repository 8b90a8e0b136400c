"""Machines levers9 provisioned or was joined by, from the request to the provider until termination.

The record is written before the provider is asked for anything, so a
controlplane that crashes mid-provisioning still knows the machine may exist
and the reconciler can find it by id (providers tag machines with it) and
terminate it.

It also keeps what the provider needs to find the machine again: the region
actually used, the zone, the instance type and the provider's own
``provider_data`` (small JSON, checked by the hooks facade), set from the
provision answer or, when that lacked them, from the provider's listing
(:meth:`MachineStore.set_placement`); and the offer it was started from
(``offer_key``, ``price_per_hour``). Records written by a release before
these columns have them empty, and every reader copes with that.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from levers9.state.errors import InvalidTransition
from levers9.state.sql._common import require
from levers9.state.sql.database import Database
from levers9.state.sql.models import Machine, new_id, utcnow
from levers9.state.sql.records import MachineRecord, MachineState, parse_enum

S = MachineState
#: the states each state may move to; staying in the same state is always allowed (a repeated report)
TRANSITIONS: dict[MachineState, frozenset[MachineState]] = {
    S.REQUESTED: frozenset({S.STARTING, S.RUNNING, S.FAILED, S.TERMINATING, S.TERMINATED}),
    S.STARTING: frozenset({S.RUNNING, S.FAILED, S.TERMINATING, S.TERMINATED}),
    S.RUNNING: frozenset({S.DRAINING, S.FAILED, S.TERMINATING, S.TERMINATED}),
    S.DRAINING: frozenset({S.RUNNING, S.FAILED, S.TERMINATING, S.TERMINATED}),
    S.TERMINATING: frozenset({S.FAILED, S.TERMINATED}),
    S.FAILED: frozenset({S.TERMINATING, S.TERMINATED}),
    S.TERMINATED: frozenset(),
}


def _machine(row: Machine) -> MachineRecord:
    return MachineRecord(
        id=row.id,
        pool=row.pool,
        provider=row.provider,
        provider_id=row.provider_id,
        state=MachineState(row.state),
        gpu=row.gpu,
        gpu_count=row.gpu_count,
        region=row.region,
        worker_id=row.worker_id,
        token_id=row.token_id,
        register_by=row.register_by,
        created_at=row.created_at,
        registered_at=row.registered_at,
        terminated_at=row.terminated_at,
        last_error=row.last_error,
        zone=row.zone,
        instance_type=row.instance_type,
        provider_data=row.provider_data,
        offer_key=row.offer_key,
        price_per_hour=row.price_per_hour,
    )


class MachineStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self,
        pool: str,
        provider: str,
        *,
        gpu: str | None = None,
        gpu_count: int = 0,
        region: str | None = None,
        register_by: datetime | None = None,
        token_id: str | None = None,
        machine_id: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        offer_key: str | None = None,
        price_per_hour: float | None = None,
    ) -> MachineRecord:
        """A machine about to be requested from ``provider``; ``machine_id`` is made here when None.

        ``zone``, ``instance_type``, ``offer_key`` and ``price_per_hour`` describe the offer it is
        requested from, when there is one.
        """
        if gpu_count < 0:
            raise ValueError(f"gpu_count must be 0 or more, got {gpu_count}")
        async with self._db.transaction() as session:
            row = Machine(
                id=machine_id or new_id("mach"),
                pool=pool,
                provider=provider,
                provider_id=None,
                state=MachineState.REQUESTED.value,
                gpu=gpu,
                gpu_count=gpu_count,
                region=region,
                worker_id=None,
                token_id=token_id,
                register_by=register_by,
                created_at=utcnow(),
                registered_at=None,
                terminated_at=None,
                last_error=None,
                zone=zone,
                instance_type=instance_type,
                provider_data=None,
                offer_key=offer_key,
                price_per_hour=price_per_hour,
            )
            session.add(row)
            await session.flush()
            return _machine(row)

    async def get(self, machine_id: str) -> MachineRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Machine, machine_id)
            return None if row is None else _machine(row)

    async def set_provider_id(self, machine_id: str, provider_id: str) -> MachineRecord:
        """The provider's own id for the machine (an instance id), once the provider has answered."""
        async with self._db.transaction() as session:
            row = await require(session, Machine, machine_id, "machine", lock=True)
            row.provider_id = provider_id
            return _machine(row)

    async def set_placement(
        self,
        machine_id: str,
        *,
        provider_id: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        provider_data: dict[str, Any] | None = None,
    ) -> MachineRecord:
        """What the provider said about the machine (its provision answer, or its listing); None keeps a field.

        ``provider_data`` must be JSON (the hooks facade checks its size before it gets here).
        """
        async with self._db.transaction() as session:
            row = await require(session, Machine, machine_id, "machine", lock=True)
            if provider_id is not None:
                row.provider_id = provider_id
            if region is not None:
                row.region = region
            if zone is not None:
                row.zone = zone
            if instance_type is not None:
                row.instance_type = instance_type
            if provider_data is not None:
                row.provider_data = dict(provider_data)
            return _machine(row)

    async def set_token(self, machine_id: str, token_id: str | None) -> MachineRecord:
        """The token the machine's worker dials in with; issued after the machine so it can name it as subject."""
        async with self._db.transaction() as session:
            row = await require(session, Machine, machine_id, "machine", lock=True)
            row.token_id = token_id
            return _machine(row)

    async def set_state(self, machine_id: str, state: str, error: str | None = None) -> MachineRecord:
        """Move the machine to ``state`` (see :data:`TRANSITIONS`); ``error`` is kept as its last error."""
        target = parse_enum(MachineState, state, "machine state")
        now = utcnow()
        async with self._db.transaction() as session:
            row = await require(session, Machine, machine_id, "machine", lock=True)
            current = MachineState(row.state)
            if target != current and target not in TRANSITIONS[current]:
                allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing, it is final"
                raise InvalidTransition(
                    f"machine {machine_id} is {current}; it cannot become {target} (from {current}: {allowed})"
                )
            row.state = target.value
            if error is not None:
                row.last_error = error
            if target == MachineState.TERMINATED and row.terminated_at is None:
                row.terminated_at = now
            return _machine(row)

    async def mark_registered(self, machine_id: str, worker_id: str) -> MachineRecord:
        """The machine's worker dialled in: the machine is running and known by ``worker_id``."""
        async with self._db.transaction() as session:
            row = await require(session, Machine, machine_id, "machine", lock=True)
            current = MachineState(row.state)
            if current == MachineState.RUNNING and row.worker_id == worker_id:
                return _machine(row)
            if current not in (MachineState.REQUESTED, MachineState.STARTING):
                raise InvalidTransition(
                    f"machine {machine_id} is {current}"
                    + (f" as worker {row.worker_id}" if row.worker_id else "")
                    + "; only a requested or starting machine can register"
                )
            row.state = MachineState.RUNNING.value
            row.worker_id = worker_id
            row.registered_at = utcnow()
            return _machine(row)

    async def overdue(self, now: datetime | None = None) -> builtins.list[MachineRecord]:
        """Machines whose worker has not registered by their ``register_by``: to terminate and forget."""
        waiting = (MachineState.REQUESTED.value, MachineState.STARTING.value)
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Machine)
                .where(Machine.state.in_(waiting), Machine.register_by < (now or utcnow()))
                .order_by(Machine.register_by)
            )
            return [_machine(row) for row in rows]

    async def delete(self, machine_id: str) -> bool:
        """Forget the machine; False if there was no such record."""
        async with self._db.transaction() as session:
            result = await session.execute(delete(Machine).where(Machine.id == machine_id))
            deleted: int = result.rowcount  # type: ignore[attr-defined]
            return deleted > 0

    async def list(self, pool: str | None = None, states: Sequence[str] | None = None) -> builtins.list[MachineRecord]:
        """Machines, oldest first, optionally of one pool and in some states."""
        query = select(Machine)
        if pool is not None:
            query = query.where(Machine.pool == pool)
        if states is not None:
            query = query.where(Machine.state.in_([parse_enum(MachineState, s, "machine state").value for s in states]))
        async with self._db.transaction() as session:
            rows = await session.scalars(query.order_by(Machine.created_at, Machine.id))
            return [_machine(row) for row in rows]


__all__ = ["TRANSITIONS", "MachineStore"]
