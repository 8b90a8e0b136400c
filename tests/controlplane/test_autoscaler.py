"""The gateway's containers on real Services (SQLite and PostgreSQL, embedded Redis), with workers' reports.

No worker runs here: a serving container's task is queued through the real scheduler, and the test reports
it ready, or ended, exactly as the controlplane's worker session would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from levers9.gateway.autoscaler import NoContainer, Overloaded, ServedStub, ServingAutoscaler
from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.reports import ServingReport, TaskOutcome
from levers9.state.sql.records import TokenKind

from .conftest import Api


@dataclass
class World:
    api: Api
    dp: DataPlane
    plane: ServingAutoscaler
    workspace_id: str

    async def endpoint(self, name: str, **settings: Any) -> ServedStub:
        """An endpoint stub, deployed as version 1 of ``name``."""
        me = Principal(token_id="t", kind=TokenKind.USER, workspace_id=self.workspace_id, subject="someone")
        stub_id, _ = await self.dp.get_or_create_stub(me, {"name": name, "kind": "endpoint", **settings}, b"code")
        record, stub_settings = await self.dp.stub(stub_id)
        await self.api.services.deployments.create_version(self.workspace_id, record.app_id, name, stub_id)
        return ServedStub(stub_id, self.workspace_id, stub_settings)

    async def serving_tasks(self, stub: ServedStub, status: str = "pending") -> list[str]:
        tasks = await self.api.services.tasks.for_workspace(self.workspace_id, statuses=[status], limit=100)
        return [t.id for t in tasks if t.stub_id == stub.stub_id]

    async def started(self, stub: ServedStub, count: int = 1) -> list[str]:
        """The ids of ``count`` serving tasks the plane asked for, once it has."""
        for _ in range(200):
            found = await self.serving_tasks(stub)
            if len(found) >= count:
                return found
            await asyncio.sleep(0.02)
        raise AssertionError(f"the plane did not start {count} containers of {stub.stub_id}")

    def ready(self, stub: ServedStub, task_id: str, address: str = "127.0.0.1:9") -> None:
        self.plane.serving(stub.stub_id, "w1", ServingReport(task_id, address))


@pytest.fixture
async def world(api: Api) -> AsyncIterator[World]:
    hub = Hub(api.services.redis, name="test")
    dp = DataPlane(api.services, hub)
    plane = ServingAutoscaler(dp, name="replica-main", orphan_after_s=0.2)
    await plane.start()
    workspace, _ = await api.user("team-a")
    try:
        yield World(api, dp, plane, workspace.id)
    finally:
        await plane.close(grace_s=5)
        await dp.close()


async def test_a_cold_request_waits_for_the_container_it_started_and_gets_it_once_ready(world: World) -> None:
    stub = await world.endpoint("cold", start_timeout_s=10)
    waiting = asyncio.create_task(world.plane.acquire(stub))
    [task_id] = await world.started(stub)
    await asyncio.sleep(0.1)
    assert not waiting.done()  # never sent to a container that has not said it is ready
    world.ready(stub, task_id, "10.0.0.5:8080")
    container = await asyncio.wait_for(waiting, 5)
    assert (container.task_id, container.address, container.in_flight) == (task_id, "10.0.0.5:8080", 1)
    world.plane.release(container)
    assert container.in_flight == 0


async def test_requests_beyond_the_slots_wait_in_order_and_beyond_max_pending_are_refused(world: World) -> None:
    stub = await world.endpoint("busy", tasks_per_container=1, max_containers=1, max_pending=2, start_timeout_s=10)
    first = asyncio.create_task(world.plane.acquire(stub))
    [task_id] = await world.started(stub)
    world.ready(stub, task_id)
    holder = await first
    second = asyncio.create_task(world.plane.acquire(stub))
    third = asyncio.create_task(world.plane.acquire(stub))
    await asyncio.sleep(0.05)
    with pytest.raises(Overloaded, match="max_pending=2"):
        await world.plane.acquire(stub)
    assert world.plane.stats(stub.stub_id)["waiting"] == 2
    world.plane.release(holder)
    got = await asyncio.wait_for(second, 5)  # the first in line gets the freed slot
    assert not third.done()
    world.plane.release(got)
    world.plane.release(await asyncio.wait_for(third, 5))
    assert await world.serving_tasks(stub) == [task_id]  # max_containers=1: no second container


async def test_demand_starts_more_containers_up_to_max_containers(world: World) -> None:
    stub = await world.endpoint("wide", tasks_per_container=2, max_containers=3, max_pending=100, start_timeout_s=10)
    waiting = [asyncio.create_task(world.plane.acquire(stub)) for _ in range(9)]
    started = await world.started(stub, 3)
    await asyncio.sleep(0.2)
    assert len(await world.serving_tasks(stub)) == 3  # 9 requests / 2 slots each, capped at 3 containers
    for task_id in started:
        world.ready(stub, task_id)
    granted = [await asyncio.wait_for(w, 5) for w in waiting[:6]]
    assert sorted(c.in_flight for c in {id(c): c for c in granted}.values()) == [2, 2, 2]
    for w in waiting[6:]:
        w.cancel()
    for container in granted:
        world.plane.release(container)


async def test_a_start_that_fails_ends_the_wait_with_504_saying_why(world: World) -> None:
    stub = await world.endpoint("broken", start_timeout_s=1)
    waiting = asyncio.create_task(world.plane.acquire(stub))
    [task_id] = await world.started(stub)
    world.plane.ended([TaskOutcome(task_id, "error", error="image /nope not found")])
    with pytest.raises(NoContainer, match=r"within 1 s; the last start failed: image /nope not found"):
        await waiting


async def test_an_idle_container_is_stopped_after_keep_warm_and_the_next_request_starts_one(world: World) -> None:
    stub = await world.endpoint("idle", keep_warm_s=0, start_timeout_s=10)
    first = asyncio.create_task(world.plane.acquire(stub))
    [task_id] = await world.started(stub)
    world.ready(stub, task_id)
    world.plane.release(await first)
    for _ in range(200):  # the scaler's next pass stops it: its task is cancelled
        task = await world.api.services.tasks.get(task_id)
        if task is not None and task.status.value == "cancelled":
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the idle container was not stopped")
    # no worker reports the end of a task the plane cancelled: the plane forgets the container itself
    for _ in range(200):
        if world.plane.stats(stub.stub_id)["draining"] == 0:
            break
        await asyncio.sleep(0.02)
    assert world.plane.stats(stub.stub_id)["ready"] == world.plane.stats(stub.stub_id)["draining"] == 0
    again = asyncio.create_task(world.plane.acquire(stub))
    fresh = [t for t in await world.started(stub) if t != task_id]
    assert fresh
    world.ready(stub, fresh[0])
    world.plane.release(await asyncio.wait_for(again, 5))


async def test_a_caller_that_goes_away_after_being_handed_a_slot_gives_it_back(world: World) -> None:
    stub = await world.endpoint("leave", tasks_per_container=1, start_timeout_s=10)
    waiting = asyncio.create_task(world.plane.acquire(stub))
    [task_id] = await world.started(stub)
    world.ready(stub, task_id)  # hands the slot to the waiter...
    waiting.cancel()  # ...which is cancelled before it runs again
    try:
        handed = await waiting
    except asyncio.CancelledError:
        pass  # the plane took the slot back
    else:
        world.plane.release(handed)  # asyncio let the wait finish first: the caller has it, and gives it back
    assert world.plane.stats(stub.stub_id)["in_flight"] == 0
    world.plane.release(await asyncio.wait_for(world.plane.acquire(stub), 5))


class _QuickWorkerPlane(DataPlane):
    """A worker so quick that the container reports ready before ``start_serving`` has returned."""

    plane: ServingAutoscaler

    async def start_serving(self, workspace: str, stub_id: str, task_id: str) -> None:
        await super().start_serving(workspace, stub_id, task_id)
        self.plane.serving(stub_id, "w1", ServingReport(task_id, "127.0.0.1:9"))


async def test_a_container_ready_before_its_start_returned_is_not_lost(world: World) -> None:
    """The task is visible to workers once queued, so its first report can come before the scaler hears back."""
    hub = Hub(world.api.services.redis, name="quick")
    quick = _QuickWorkerPlane(world.api.services, hub)
    quick.plane = plane = ServingAutoscaler(quick, name="replica-quick")
    await plane.start()
    try:
        stub = await world.endpoint("quick", start_timeout_s=10)
        container = await asyncio.wait_for(plane.acquire(stub), 5)
        assert container.address == "127.0.0.1:9"
        plane.release(container)
        assert plane.stats(stub.stub_id) == {"ready": 1, "draining": 0, "starting": 0, "waiting": 0, "in_flight": 0}
    finally:
        await plane.close(grace_s=5)
        await quick.close()


async def test_a_retired_version_fails_its_waiters_and_stops_its_containers(world: World) -> None:
    stub = await world.endpoint("old", tasks_per_container=1, max_containers=1, start_timeout_s=10)
    first = asyncio.create_task(world.plane.acquire(stub))
    [task_id] = await world.started(stub)
    world.ready(stub, task_id)
    holder = await first
    waiting = asyncio.create_task(world.plane.acquire(stub))
    await asyncio.sleep(0.05)
    world.plane.retire(stub.stub_id)
    with pytest.raises(NoContainer, match="stopped"):
        await waiting
    world.plane.release(holder)  # its last request ends: now it goes
    for _ in range(200):
        task = await world.api.services.tasks.get(task_id)
        if task is not None and task.status.value == "cancelled":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the retired version's container was not stopped")


async def test_a_container_reported_to_another_replica_reaches_the_one_that_asked_for_it(world: World) -> None:
    """The worker's session may be on another controlplane replica: its reports travel over Redis."""
    services = world.api.services
    hubs = [Hub(services.redis, name="replica-a"), Hub(services.redis, name="replica-b")]
    planes = [
        ServingAutoscaler(DataPlane(services, hub), name=hub_name) for hub, hub_name in zip(hubs, "ab", strict=True)
    ]
    for hub in hubs:
        await hub.start()
    await planes[0].start()
    try:
        stub = await world.endpoint("shared", start_timeout_s=10)
        waiting = asyncio.create_task(planes[0].acquire(stub))
        [task_id] = await world.started(stub)
        await asyncio.sleep(0.3)  # both replicas subscribed
        planes[1].serving(stub.stub_id, "w1", ServingReport(task_id, "10.0.0.9:8080"))
        container = await asyncio.wait_for(waiting, 5)
        assert container.address == "10.0.0.9:8080"
        assert planes[1].stats(stub.stub_id)["ready"] == 0  # replica b only passed it on
        planes[0].release(container)
        planes[1].ended([TaskOutcome(task_id, "error", error="the container exited")])
        for _ in range(100):
            if planes[0].stats(stub.stub_id)["ready"] == 0:
                break
            await asyncio.sleep(0.05)
        assert planes[0].stats(stub.stub_id)["ready"] == 0
    finally:
        for plane in planes:
            await plane.close(grace_s=5)
            await plane.dataplane.close()
        for hub in hubs:
            await hub.close()


async def test_containers_of_a_replica_that_died_are_stopped_by_another(world: World) -> None:
    """A controlplane that crashed or restarted forgets its containers; whoever is alive stops them."""
    services = world.api.services
    gone = ServingAutoscaler(DataPlane(services, Hub(services.redis, name="gone")), name="gone")
    await gone.start()
    stub = await world.endpoint("forgotten", start_timeout_s=10)
    waiting = asyncio.create_task(gone.acquire(stub))
    [task_id] = await world.started(stub)
    assert await services.redis.hget("l9:serving:owner", task_id) in (b"gone", "gone")
    # it dies: its loop stops with nothing cleaned up, and its alive mark runs out
    assert gone._loop_task is not None
    gone._loop_task.cancel()
    waiting.cancel()
    await services.redis.delete("l9:serving:alive:gone")
    for _ in range(300):
        task = await services.tasks.get(task_id)
        if task is not None and task.status.value == "cancelled":
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the orphaned container was not stopped")
    assert await services.redis.hget("l9:serving:owner", task_id) is None
    await gone.dataplane.close()
