"""What the reconciler does with a machine its provider lists ``stopping`` (docs/plugins.md §3, ``MachineState``).

With a live record, nothing: the machine is on its way out and its worker's end is judged as any worker's. With no
live record (levers9 never knew it, or closed its record), it is terminated again on each pass, like any machine
levers9 does not want: terminate is idempotent, and a machine that is only being stopped (EC2's ``stopping``) or
whose worker left processes behind (local's ``stopping``) would otherwise stay, billed or running.
"""

from __future__ import annotations

import json
from typing import Any

from levers9.state.sql.machines import MachineStore
from tests.scheduler.conftest import Harness, MakeHarness


def _list_as(h: Harness, machine: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """Make the provider list ``machine`` with ``changes``; return what it lists."""
    listed = machine | changes
    (h.cloud / "machines" / f"{listed['id']}.json").write_text(json.dumps(listed))
    return listed


async def test_a_stopping_machine_with_a_live_record_is_left_alone(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    s = h.scheduler()
    await s.upkeep_once()
    await h.settle(s)
    [machine] = h.machines()
    before = await MachineStore(h.db).get(machine["machine_id"])
    assert before is not None

    _list_as(h, machine, state="stopping")
    report = await s.reconcile_once()

    assert (report.ended, report.vanished, report.orphans) == ([], [], [])
    assert h.terminates() == []
    after = await MachineStore(h.db).get(machine["machine_id"])
    assert after is not None
    assert after.state == before.state


async def test_a_stopping_machine_without_a_live_record_is_terminated_again(make_harness: MakeHarness) -> None:
    h = await make_harness([("cpu", None, 1, {"min_workers": 1})])
    s = h.scheduler()
    await s.upkeep_once()
    await h.settle(s)
    [machine] = h.machines()
    # one levers9 never knew, and one whose record levers9 closed while the provider still lists it
    stranger = _list_as(h, machine, id="i-stranger", machine_id="m-stranger", state="stopping")
    await MachineStore(h.db).set_state(machine["machine_id"], "terminated", "released")
    _list_as(h, machine, state="stopping")

    report = await s.reconcile_once()

    assert sorted(report.orphans) == sorted([machine["id"], stranger["id"]])
    assert sorted(t["provider_id"] for t in h.terminates()) == sorted([machine["id"], stranger["id"]])
