"""Machines: from requested to terminated, with the transitions that make sense in between."""

from __future__ import annotations

from datetime import timedelta

import pytest

from levers9.state.errors import InvalidTransition, NotFound
from levers9.state.sql.database import Database
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.models import utcnow
from levers9.state.sql.records import MachineState
from levers9.state.sql.workspaces import TokenStore


async def test_a_machine_from_request_to_termination(db: Database) -> None:
    machines = MachineStore(db)
    register_by = utcnow() + timedelta(minutes=10)
    machine = await machines.create(
        "h100s", "ec2", gpu="H100", gpu_count=8, region="us-east-1", register_by=register_by
    )
    assert machine.id.startswith("mach_")
    assert machine.state is MachineState.REQUESTED
    assert (machine.gpu, machine.gpu_count, machine.region) == ("H100", 8, "us-east-1")
    assert machine.register_by == register_by
    record, _ = await TokenStore(db).issue("machine", subject=machine.id)
    assert (await machines.set_token(machine.id, record.id)).token_id == record.id
    assert (await machines.set_provider_id(machine.id, "i-0abc")).provider_id == "i-0abc"
    assert (await machines.set_state(machine.id, "starting")).state is MachineState.STARTING
    registered = await machines.mark_registered(machine.id, "wrk_1")
    assert (registered.state, registered.worker_id) == (MachineState.RUNNING, "wrk_1")
    assert registered.registered_at is not None
    assert await machines.mark_registered(machine.id, "wrk_1") == registered  # a repeated registration
    with pytest.raises(InvalidTransition, match="is running as worker wrk_1; only a requested or starting"):
        await machines.mark_registered(machine.id, "wrk_2")
    draining = await machines.set_state(machine.id, "draining")
    assert draining.state is MachineState.DRAINING
    terminated = await machines.set_state(machine.id, "terminated", error="idle")
    assert terminated.terminated_at is not None
    assert terminated.last_error == "idle"
    assert await machines.set_state(machine.id, "terminated") == terminated
    with pytest.raises(InvalidTransition, match=r"is terminated; it cannot become running .*nothing, it is final"):
        await machines.set_state(machine.id, "running")
    assert await machines.get(machine.id) == terminated


async def test_bad_states_and_missing_machines(db: Database) -> None:
    machines = MachineStore(db)
    machine = await machines.create("cpu", "local")
    with pytest.raises(ValueError, match="machine state 'up' is not one of: requested, starting"):
        await machines.set_state(machine.id, "up")
    with pytest.raises(InvalidTransition, match="requested; it cannot become draining"):
        await machines.set_state(machine.id, "draining")
    with pytest.raises(NotFound, match="machine 'mach_missing'"):
        await machines.set_state("mach_missing", "failed")
    with pytest.raises(ValueError, match="gpu_count"):
        await machines.create("cpu", "local", gpu_count=-1)
    failed = await machines.set_state(machine.id, "failed", error="quota exceeded")
    assert (failed.state, failed.last_error) == (MachineState.FAILED, "quota exceeded")
    with pytest.raises(InvalidTransition, match="only a requested or starting machine can register"):
        await machines.mark_registered(machine.id, "wrk_1")


async def test_list_filters_overdue_and_delete(db: Database) -> None:
    machines = MachineStore(db)
    now = utcnow()
    a = await machines.create("h100s", "ec2", register_by=now - timedelta(seconds=1), machine_id="mach_a")
    b = await machines.create("h100s", "ec2", register_by=now + timedelta(minutes=5))
    c = await machines.create("cpu", "local", register_by=now - timedelta(minutes=1))
    await machines.mark_registered(c.id, "wrk_c")
    assert a.id == "mach_a"
    assert [m.id for m in await machines.list()] == [a.id, b.id, c.id]
    assert [m.id for m in await machines.list(pool="h100s")] == [a.id, b.id]
    assert [m.id for m in await machines.list(states=["running"])] == [c.id]
    assert await machines.list(pool="cpu", states=["requested", "starting"]) == []
    assert [m.id for m in await machines.overdue(now)] == [a.id]
    assert [m.id for m in await machines.overdue(now + timedelta(minutes=6))] == [a.id, b.id]
    assert await machines.delete(a.id) is True
    assert await machines.delete(a.id) is False
    assert await machines.get(a.id) is None
