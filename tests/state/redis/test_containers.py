"""Container state and addresses, as workers report them."""

from __future__ import annotations

from levers9.state.redis.containers import ContainerRecord, Containers
from tests.fixtures.redis import RedisFactory


async def test_containers_are_tracked_per_worker_and_forgotten_on_delete(redis_factory: RedisFactory) -> None:
    containers = Containers(redis_factory(), "t:")
    await containers.put(ContainerRecord("c1", "w1", "running", "task_1", "10.0.0.5:8000", 5))
    await containers.put(ContainerRecord("c2", "w1", "created"))
    assert await containers.get("c1") == ContainerRecord("c1", "w1", "running", "task_1", "10.0.0.5:8000", 5)
    assert await containers.get("c2") == ContainerRecord("c2", "w1", "created", None, None, 0)
    assert await containers.on_worker("w1") == {"c1", "c2"}
    await containers.put(ContainerRecord("c1", "w1", "exited", "task_1", None, 9))
    record = await containers.get("c1")
    assert record is not None
    assert (record.status, record.address) == ("exited", None)
    await containers.delete("c1")
    await containers.delete("c1")  # idempotent
    assert await containers.get("c1") is None
    assert await containers.on_worker("w1") == {"c2"}
