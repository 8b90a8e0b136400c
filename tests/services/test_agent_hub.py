"""The agent hub on real stores: join tokens spent once, orders and acknowledgements, inventories, workspaces, replicas.

Every test runs on SQLite and on PostgreSQL, with the Redis the controlplane
would use (a private redis-server). The "agent" here drives the hub's session
API exactly as the gRPC transport does (tests/controlplane/test_agent_service.py
runs the same over a real gRPC server).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from levers9.hooks.context import AgentAck, AgentOrder
from levers9.hooks.errors import (
    BillingRefused,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.services import agent_join
from levers9.services import agents as agents_module
from levers9.services.agents import (
    ANY_WORKSPACE,
    AgentHub,
    AgentSession,
    Command,
    InventoryReport,
    OrderCommand,
    Welcome,
)
from levers9.services.auth import Principal, Unauthenticated
from levers9.services.core import Services
from levers9.state.sql.records import TokenKind
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services

CONFIG = ONE_POOL_CONFIG


@pytest.fixture
async def services(tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    async with opened_services(tmp_path, CONFIG, database_url) as opened:
        yield opened


class Clock:
    """Wall-clock seconds the test moves by hand: heartbeats lapse without waiting for them."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def clock() -> Clock:
    return Clock()


@pytest.fixture
async def hub(services: Services, clock: Clock) -> AsyncIterator[AgentHub]:
    started = AgentHub(services.redis, name="replica-a", heartbeat_s=5.0, clock=clock)
    await started.start()
    try:
        yield started
    finally:
        await started.close()


async def operator(services: Services) -> Principal:
    record, _ = await services.tokens.issue("user", subject="root")
    return Principal(record.id, TokenKind.USER, None, "root")


async def workspace_user(services: Services, name: str) -> Principal:
    workspace = await services.workspaces.get_or_create(name)
    record, _ = await services.tokens.issue("user", workspace_id=workspace.id, subject=f"someone@{name}")
    return Principal(record.id, TokenKind.USER, workspace.id, f"someone@{name}")


class Agent:
    """One agent's stream, driven through :class:`AgentSession` as the gRPC transport drives it."""

    def __init__(self, hub: AgentHub, identity: agent_join.AgentIdentity) -> None:
        self.hub = hub
        self.identity = identity
        self.received: asyncio.Queue[Command] = asyncio.Queue()
        self.session: AgentSession | None = None
        self._hang_up: asyncio.Future[None] | None = None
        self._pump: asyncio.Task[None] | None = None

    async def connect(self, provider: str = "agent_machine", version: str = "test") -> Welcome:
        async def recheck() -> None:
            return None

        self.session = self.hub.attach(self.identity, recheck)
        self._hang_up = asyncio.get_running_loop().create_future()
        self._pump = asyncio.create_task(self._read(self.session, self._hang_up))
        await self.session.hello(version=version, provider=provider, labels={"rack": "r1"}, hostname="box")
        welcome = await self.next()
        assert isinstance(welcome, Welcome), welcome
        return welcome

    async def _read(self, session: AgentSession, hang_up: asyncio.Future[None]) -> None:
        async for command in session.commands(hang_up):
            self.received.put_nowait(command)

    async def next(self) -> Command:
        return await asyncio.wait_for(self.received.get(), 10)

    async def order(self) -> OrderCommand:
        command = await self.next()
        assert isinstance(command, OrderCommand), command
        return command

    async def ack(self, order: OrderCommand, **fields: Any) -> None:
        assert self.session is not None
        await self.session.ack(AgentAck(order_id=order.order_id, **({"ok": True} | fields)))

    async def hang_up(self) -> None:
        if self._hang_up is not None and not self._hang_up.done():
            self._hang_up.set_result(None)
        if self._pump is not None:
            await self._pump


async def joined_agent(
    services: Services, hub: AgentHub, principal: Principal, *, provider: str = "agent_machine"
) -> Agent:
    issued = await agent_join.issue_join_token(services, principal, provider, {"pool": "gpu-box"})
    joined = await agent_join.join(services, issued.token, version="test", hostname="box")
    identity = await agent_join.authenticate_agent(services, joined.token)
    return Agent(hub, identity)


# ---------------------------------------------------------------------------------------------- joining


async def test_a_join_token_is_spent_once_for_the_agents_own_credential(services: Services) -> None:
    user = await workspace_user(services, "team")
    issued = await agent_join.issue_join_token(services, user, "agent_machine", {"pool": "gpu-box"}, ttl_s=600)
    joined = await agent_join.join(services, issued.token, version="0.1", hostname="box-1")
    assert joined.agent_id == issued.agent_id
    assert (joined.provider, joined.workspace, joined.labels) == (
        "agent_machine",
        user.workspace_id,
        {"pool": "gpu-box"},
    )
    assert joined.token != issued.token
    identity = await agent_join.authenticate_agent(services, joined.token)
    assert (identity.agent_id, identity.workspace) == (issued.agent_id, user.workspace_id)
    # stored hashed like every token: the credential itself is nowhere in the table
    record = await services.tokens.get(identity.token_id)
    assert record is not None
    assert record.kind is TokenKind.AGENT
    assert record.expires_at is None

    with pytest.raises(Unauthenticated, match="already used"):
        await agent_join.join(services, issued.token)


async def test_two_joins_racing_with_one_token_one_wins(services: Services) -> None:
    issued = await agent_join.issue_join_token(services, await operator(services), "agent_machine")
    outcomes = await asyncio.gather(
        *(agent_join.join(services, issued.token) for _ in range(4)), return_exceptions=True
    )
    won = [o for o in outcomes if isinstance(o, agent_join.JoinedAgent)]
    lost = [o for o in outcomes if isinstance(o, Unauthenticated)]
    assert (len(won), len(lost)) == (1, 3), outcomes
    assert won[0].workspace is None  # an operator's agent serves shared pools


async def test_an_expired_unknown_or_wrong_token_is_refused_saying_which(services: Services) -> None:
    root = await operator(services)
    issued = await agent_join.issue_join_token(services, root, "agent_machine", ttl_s=0.5)
    await asyncio.sleep(1.0)
    with pytest.raises(Unauthenticated, match="expired at"):
        await agent_join.join(services, issued.token)
    with pytest.raises(Unauthenticated, match="unknown: check it was copied whole"):
        await agent_join.join(services, "l9_agent_notatoken")
    with pytest.raises(Unauthenticated, match="no join token"):
        await agent_join.join(services, "")
    _, user_token = await services.tokens.issue("user", subject="someone")
    with pytest.raises(Unauthenticated, match="not a join token"):
        await agent_join.join(services, user_token)
    # and a join token is no credential: it cannot open a stream
    fresh = await agent_join.issue_join_token(services, root, "agent_machine")
    with pytest.raises(Unauthenticated, match="call Join with it first"):
        await agent_join.authenticate_agent(services, fresh.token)


async def test_issuing_checks_the_provider_labels_and_lifetime(services: Services) -> None:
    root = await operator(services)
    with pytest.raises(ValueError, match=r"provider 'nope' is not loaded; agents can join one of: .*agent_machine"):
        await agent_join.issue_join_token(services, root, "nope")
    with pytest.raises(ValueError, match="label 'Bad Key'"):
        await agent_join.issue_join_token(services, root, "agent_machine", {"Bad Key": "x"})
    with pytest.raises(ValueError, match="ttl_s must be above 0"):
        await agent_join.issue_join_token(services, root, "agent_machine", ttl_s=0)


# ---------------------------------------------------------------------------------------------- orders


async def test_an_order_reaches_the_agent_and_its_ack_comes_back(services: Services, hub: AgentHub) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    welcome = await agent.connect()
    assert welcome.heartbeat_s == 5.0
    agent_id = agent.identity.agent_id
    sending = asyncio.create_task(
        hub.send(AgentOrder(agent_id=agent_id, kind="provision", payload={"machine_id": "m-1"}), timeout=10)
    )
    order = await agent.order()
    assert (order.kind, order.payload) == ("provision", {"machine_id": "m-1"})
    await agent.ack(order, result={"provider_id": "c-1"})
    ack = await sending
    assert (ack.order_id, ack.ok, ack.result) == (order.order_id, True, {"provider_id": "c-1"})
    await agent.hang_up()


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("insufficient_capacity", InsufficientCapacity),
        ("invalid_request", InvalidRequest),
        ("permission_denied", PermissionDenied),
        ("quota_exceeded", QuotaExceeded),
        ("billing_refused", BillingRefused),
        ("throttled", Throttled),
        ("", ProviderError),
        ("something_new", ProviderError),
    ],
)
async def test_a_refusing_ack_is_the_typed_provider_error(
    services: Services, hub: AgentHub, kind: str, error: type[ProviderError]
) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    await agent.connect()
    sending = asyncio.create_task(hub.send(AgentOrder(agent_id=agent.identity.agent_id, kind="provision"), timeout=10))
    order = await agent.order()
    await agent.ack(order, ok=False, error="no GPU free on box", error_kind=kind or None)
    with pytest.raises(error) as raised:
        await sending
    assert type(raised.value) is error
    assert f"agent {agent.identity.agent_id} refused the provision order: no GPU free on box" in str(raised.value)
    await agent.hang_up()


async def test_an_agent_connected_nowhere_is_insufficient_capacity(services: Services, hub: AgentHub) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    agent_id = agent.identity.agent_id
    await hub.refresh()
    with pytest.raises(InsufficientCapacity, match=f"agent {agent_id} is not connected \\(it never connected\\)"):
        await hub.send(AgentOrder(agent_id=agent_id, kind="provision"), timeout=5)
    await agent.connect()
    await agent.hang_up()  # it was connected, and is no longer
    with pytest.raises(InsufficientCapacity, match=f"agent {agent_id} is not connected \\(last heard from"):
        await hub.send(AgentOrder(agent_id=agent_id, kind="provision"), timeout=5)
    with pytest.raises(InsufficientCapacity, match="agt_unknown is not known"):
        await hub.send(AgentOrder(agent_id="agt_unknown", kind="provision"), timeout=5)


async def test_no_ack_is_a_timeout_naming_the_agent_and_order(services: Services, hub: AgentHub) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    await agent.connect()
    with pytest.raises(TimeoutError, match=f"agent {agent.identity.agent_id} did not acknowledge the terminate order"):
        await hub.send(AgentOrder(agent_id=agent.identity.agent_id, kind="terminate"), timeout=0.3)
    assert (await agent.order()).kind == "terminate"  # it was sent; the agent never answered
    await agent.hang_up()


async def test_an_order_is_sent_again_when_its_agent_reconnects(services: Services, hub: AgentHub) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    await agent.connect()
    sending = asyncio.create_task(hub.send(AgentOrder(agent_id=agent.identity.agent_id, kind="provision"), timeout=30))
    first = await agent.order()
    await agent.hang_up()  # lost before it acknowledged
    again = Agent(hub, agent.identity)
    await again.connect()
    second = await again.order()
    assert second.order_id == first.order_id  # the same order: the agent acknowledges, and does not redo it
    await again.ack(second)
    assert (await sending).order_id == first.order_id
    await again.hang_up()


async def test_an_order_sent_on_one_replica_reaches_an_agent_on_another(
    services: Services, hub: AgentHub, clock: Clock
) -> None:
    other = AgentHub(services.redis, name="replica-b", heartbeat_s=5.0, clock=clock)
    await other.start()
    try:
        agent = await joined_agent(services, hub, await operator(services))  # connected to replica-a
        await agent.connect()
        sending = asyncio.create_task(
            other.send(AgentOrder(agent_id=agent.identity.agent_id, kind="provision", payload={"n": 1}), timeout=10)
        )
        order = await agent.order()
        await agent.ack(order, result={"done": True})
        assert (await sending).result == {"done": True}
        # replica-b lists it too, once it heard (an inventory is announced to every replica)
        assert agent.session is not None
        await agent.session.inventory(InventoryReport(cpu_millicores=4000, memory_mib=8192))
        for _ in range(100):
            listed = other.inventories("agent_machine")
            if listed and listed[0].capacity.get("cpu_millicores") == 4000:
                break
            await asyncio.sleep(0.05)
        assert [(i.agent_id, i.connected) for i in other.inventories("agent_machine")] == [
            (agent.identity.agent_id, True)
        ]
        await agent.hang_up()
    finally:
        await other.close()


# ---------------------------------------------------------------------------------------------- inventories


async def test_the_inventory_reported_is_listed_until_heartbeats_lapse(
    services: Services, hub: AgentHub, clock: Clock
) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    await agent.connect()
    assert agent.session is not None
    await agent.session.inventory(
        InventoryReport(
            cpu_millicores=16000,
            memory_mib=65536,
            free_cpu_millicores=12000,
            free_memory_mib=60000,
            gpus=(("NVIDIA H100 80GB HBM3", 2, 1), ("L4", 1, 1)),
            machines=("m-1",),
            details={"runtimes": ["runc", "nvidia"]},
        )
    )
    (listed,) = hub.inventories("agent_machine")
    assert listed.agent_id == agent.identity.agent_id
    assert listed.connected
    assert listed.labels == {"pool": "gpu-box", "rack": "r1"}
    assert listed.machines == ["m-1"]
    assert listed.capacity == {
        "cpu_millicores": 16000,
        "memory_mib": 65536,
        "gpus": {"H100": 2, "L4": 1},
        "free": {"cpu_millicores": 12000, "memory_mib": 60000, "gpus": {"H100": 1, "L4": 1}},
        "details": {"runtimes": ["runc", "nvidia"]},
    }
    assert hub.inventories("attached_cluster") == []
    # persisted: a replica starting now sees the same
    fresh = AgentHub(services.redis, name="replica-c", heartbeat_s=5.0, clock=clock)
    await fresh.refresh()
    assert fresh.inventories() == hub.inventories()

    clock.now += 14.0  # under three heartbeats: still connected
    assert hub.inventories()[0].connected
    await agent.session.heartbeat()
    clock.now += 15.5  # three heartbeats and a half of silence
    assert not hub.inventories()[0].connected
    await agent.hang_up()


@pytest.mark.parametrize("ends_by", ["its peer hanging up", "the agent dialling again"])
async def test_a_stream_its_transport_stopped_reading_is_closed_by_the_watchdog(
    services: Services, clock: Clock, ends_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC abandons a response generator cancelled mid-write (the agent died with an order on the wire): nothing
    iterates :meth:`AgentSession.commands` again, so its own end never runs; the watchdog closes the stream."""
    hub = AgentHub(services.redis, name="replica-w", heartbeat_s=0.3, clock=clock)
    await hub.start()
    try:
        agent = await joined_agent(services, hub, await operator(services))
        session = hub.attach(agent.identity, agent_join_recheck)
        reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        commands = session.commands(reader)
        await session.hello(version="test", provider="agent_machine", labels={}, hostname="box")
        assert isinstance(await commands.__anext__(), Welcome)  # then the transport stops iterating, for good
        if ends_by == "its peer hanging up":
            reader.set_result(None)
        else:
            await Agent(hub, agent.identity).connect()
        caplog.set_level("INFO", logger=agents_module.__name__)
        disconnected = f"agent {agent.identity.agent_id} disconnected from replica-w"
        for _ in range(100):
            if disconnected in caplog.text:
                break
            await asyncio.sleep(0.05)
        assert disconnected in caplog.text, caplog.text
        assert session not in hub._open
        owner = await hub.store.owner(agent.identity.agent_id)
        # connected nowhere now, or (dialled again) still here: the old stream's end released nothing of the new
        assert owner == (None if ends_by == "its peer hanging up" else "replica-w")
        await commands.aclose()  # a second close does nothing
        assert caplog.text.count(disconnected) == 1
    finally:
        await hub.close()


async def test_a_stream_closed_by_a_cancelled_task_still_says_so_and_releases_the_agent(
    services: Services, hub: AgentHub, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC cancels the handler's task when the peer goes; the close that runs then must not be cut short."""
    agent = await joined_agent(services, hub, await operator(services))
    session = hub.attach(agent.identity, agent_join_recheck)
    await session.hello(version="test", provider="agent_machine", labels={}, hostname="box")
    releasing, release = asyncio.Event(), hub.store.release
    released: list[str] = []

    async def slow_release(agent_id: str, *, replica: str) -> None:
        releasing.set()
        await asyncio.sleep(0.2)
        await release(agent_id, replica=replica)
        released.append(agent_id)

    monkeypatch.setattr(hub.store, "release", slow_release)
    caplog.set_level("INFO", logger=agents_module.__name__)
    closing = asyncio.create_task(session.close())
    await releasing.wait()
    closing.cancel()  # a second cancel, mid-release
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    assert f"agent {agent.identity.agent_id} disconnected from replica-a" in caplog.text
    for _ in range(100):
        if released:
            break
        await asyncio.sleep(0.02)
    assert released == [agent.identity.agent_id]  # the release went on, shielded from the cancel
    assert await hub.store.owner(agent.identity.agent_id) is None


async def agent_join_recheck() -> None:
    return None


async def test_a_workspace_sees_only_its_own_agents(services: Services, hub: AgentHub) -> None:
    red = await workspace_user(services, "red")
    blue = await workspace_user(services, "blue")
    agents = {
        "red": await joined_agent(services, hub, red),
        "blue": await joined_agent(services, hub, blue),
        "shared": await joined_agent(services, hub, await operator(services)),
    }
    for agent in agents.values():
        await agent.connect()

    def ids(workspace: Any) -> list[str]:
        return [i.agent_id for i in hub.inventories("agent_machine", workspace=workspace)]

    assert ids(red.workspace_id) == [agents["red"].identity.agent_id]
    assert ids(blue.workspace_id) == [agents["blue"].identity.agent_id]
    assert ids(None) == [agents["shared"].identity.agent_id]
    assert sorted(ids(ANY_WORKSPACE)) == sorted(a.identity.agent_id for a in agents.values())
    assert {i.workspace for i in hub.inventories()} == {red.workspace_id, blue.workspace_id, None}
    for agent in agents.values():
        await agent.hang_up()


async def test_hello_must_name_the_provider_joined_for_and_come_first(services: Services, hub: AgentHub) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    from levers9.services.auth import PermissionDenied as AccessDenied

    with pytest.raises(AccessDenied, match="joined for provider 'agent_machine'; its Hello says 'attached_cluster'"):
        await agent.connect(provider="attached_cluster")
    await agent.hang_up()
    session = hub.attach(agent.identity, lambda: asyncio.sleep(0))
    with pytest.raises(ValueError, match="first message on an agent's stream must be Hello, not Heartbeat"):
        await session.heartbeat()
    with contextlib.suppress(Exception):
        await session.close()


# ---------------------------------------------------------------------------------------------- what a heartbeat costs


async def test_heartbeats_reach_redis_together_and_every_replica_sees_them(
    services: Services, hub: AgentHub, clock: Clock
) -> None:
    agents = [await joined_agent(services, hub, await operator(services)) for _ in range(3)]
    for agent in agents:
        await agent.connect()
    clock.now += 4.0
    for agent in agents:
        assert agent.session is not None
        await agent.session.heartbeat()
    ids = [agent.identity.agent_id for agent in agents]
    # heard here at once; in Redis with the next batch (one pipeline for all three)
    assert all(i.last_seen == clock.now for i in hub.inventories() if i.agent_id in ids)
    assert set(hub._heard) == set(ids)
    await hub._flush_presence()
    assert hub._heard == {}
    assert await hub.store.last_seen(ids) == dict.fromkeys(ids, clock.now)

    other = AgentHub(services.redis, name="replica-b", heartbeat_s=5.0, clock=clock)
    await other.refresh()
    clock.now += 3.0
    for agent in agents:
        assert agent.session is not None
        await agent.session.heartbeat()
    await hub._flush_presence()
    await other.refresh(full=False)  # the light refresh: heartbeats only
    assert {i.agent_id: i.last_seen for i in other.inventories() if i.agent_id in ids} == dict.fromkeys(ids, clock.now)
    assert all(i.connected for i in other.inventories() if i.agent_id in ids)
    for agent in agents:
        await agent.hang_up()


async def test_a_stream_rechecks_its_credential_only_now_and_then(
    services: Services, hub: AgentHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await joined_agent(services, hub, await operator(services))
    checks = 0

    async def recheck() -> None:
        nonlocal checks
        checks += 1

    agent.session = hub.attach(agent.identity, recheck)
    hang_up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    pump = asyncio.create_task(agent._read(agent.session, hang_up))
    await agent.session.hello(version="test", provider="agent_machine", labels={}, hostname="box")
    for _ in range(20):
        await agent.session.heartbeat()
    assert checks == 0, "the credential was checked when the stream opened; heartbeats do not check it again"
    monkeypatch.setattr(agents_module, "CREDENTIAL_RECHECK_S", 0.0)
    await agent.session.heartbeat()
    assert checks == 1
    hang_up.set_result(None)
    await pump


async def test_close_ends_a_loop_whose_redis_call_turned_the_cancellation_into_an_error(
    services: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py can catch the CancelledError of a read and raise a connection error instead: the hub's
    loops must end all the same, or its close (the controlplane's stop) waits for ever."""
    import redis.exceptions

    hub = AgentHub(services.redis, name="replica-a", heartbeat_s=5.0, clock=clock)
    await hub.start()
    inside = asyncio.Event()

    async def seen_many(heard: dict[str, float], *, replica: str, presence_s: float) -> None:
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise redis.exceptions.ConnectionError("Connection closed by server.") from None

    monkeypatch.setattr(hub.store, "seen_many", seen_many)
    tasks = list(hub._tasks)
    await asyncio.wait_for(inside.wait(), 10)  # the presence flush, once a second
    closing = asyncio.ensure_future(hub.close())
    done, _ = await asyncio.wait({closing}, timeout=10)  # a deadline for a hang, not a timing assertion
    if not done:
        for task in tasks:
            task.cancel()
    assert done, "close() still waits on a loop that took its cancellation for a Redis error"
    assert all(task.done() for task in tasks)


async def test_a_hub_started_again_on_an_emptied_redis_has_its_agents_dial_again_and_registers_them_anew(
    services: Services, hub: AgentHub, clock: Clock
) -> None:
    """What the controlplane does when its embedded Redis restarted empty (``Server._redis_restarted``)."""
    agent = await joined_agent(services, hub, await operator(services))
    await agent.connect()
    await services.redis.flushall()  # the new redis-server: nothing of the agent's registration is left
    await hub.close()
    await hub.start()
    assert agent._pump is not None
    await asyncio.wait_for(agent._pump, 10)  # its stream ended (not cut): a real agent dials again at once
    again = Agent(hub, agent.identity)
    await again.connect()
    fresh = AgentHub(services.redis, name="replica-c", heartbeat_s=5.0, clock=clock)
    await fresh.refresh()
    assert [listed.agent_id for listed in fresh.inventories()] == [agent.identity.agent_id]
    await again.hang_up()
