"""The Agent gRPC service on a real gRPC server: Join, the stream, orders and acks, heartbeats, refusals.

The agent is a plain gRPC client written here, speaking agent.proto as the
agents of the agent-machine and attached-cluster issues will. The stores are
real (SQLite and PostgreSQL, the controlplane's Redis); the last test starts
a whole controlplane ``Server`` and checks the service is served there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from levers9.config.load import load_config
from levers9.controlplane.grpc_agent import AgentService
from levers9.controlplane.server import Listeners, Server
from levers9.hooks.context import AgentOrder
from levers9.hooks.errors import InsufficientCapacity
from levers9.proto.v1 import agent_pb2, agent_pb2_grpc
from levers9.services import agent_join
from levers9.services.agents import AgentHub
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.workspaces import revoke_token
from levers9.state.sql.records import TokenKind
from tests.fixtures.levers9_up import free_port
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services

CONFIG = ONE_POOL_CONFIG

#: short, so a silent agent is cut off within a second; the stream's own pace, not an assertion on time
HEARTBEAT_S = 0.5


@pytest.fixture
async def services(tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    async with opened_services(tmp_path, CONFIG, database_url) as opened:
        yield opened


@dataclass
class Wire:
    services: Services
    hub: AgentHub
    stub: Any
    operator: Principal

    async def join_token(self, provider: str = "agent_machine") -> str:
        return (await agent_join.issue_join_token(self.services, self.operator, provider, {"pool": "box"})).token

    async def agent(self, provider: str = "agent_machine") -> tuple[str, str]:
        """A joined agent: (its id, its credential)."""
        joined = await self.stub.Join(agent_pb2.JoinRequest(join_token=await self.join_token(provider)))
        return joined.agent_id, joined.agent_token


@pytest.fixture
async def wire(services: Services) -> AsyncIterator[Wire]:
    hub = AgentHub(services.redis, name="replica-a", heartbeat_s=HEARTBEAT_S)
    await hub.start()
    server = grpc.aio.server()
    add: Any = agent_pb2_grpc.add_AgentServicer_to_server  # generated, unannotated
    add(AgentService(services, hub), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    record, _ = await services.tokens.issue("user", subject="root")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]
            yield Wire(services, hub, stub, Principal(record.id, TokenKind.USER, None, "root"))
    finally:
        await server.stop(None)
        await hub.close()


class Stream:
    """One agent's Connect stream, as a test writes and reads it."""

    def __init__(self, stub: Any, token: str) -> None:
        self.call = stub.Connect(metadata=(("authorization", f"Bearer {token}"),))

    async def send(self, **body: Any) -> None:
        await self.call.write(agent_pb2.AgentMessage(**body))

    async def hello(self, provider: str = "agent_machine") -> agent_pb2.Welcome:
        await self.send(hello=agent_pb2.Hello(version="test", provider=provider, hostname="box"))
        command = await self.read()
        assert command.WhichOneof("body") == "welcome", command
        welcome: agent_pb2.Welcome = command.welcome
        return welcome

    async def read(self) -> agent_pb2.AgentCommand:
        command = await asyncio.wait_for(self.call.read(), 10)
        assert command is not grpc.aio.EOF, "the stream ended"
        result: agent_pb2.AgentCommand = command
        return result

    async def refused(self) -> grpc.aio.AioRpcError:
        """The status the stream ended with (it must end with an error)."""
        try:
            while await asyncio.wait_for(self.call.read(), 10) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc
        raise AssertionError("the stream ended without an error")


async def test_join_over_grpc_once_then_refused(wire: Wire) -> None:
    token = await wire.join_token()
    joined = await wire.stub.Join(agent_pb2.JoinRequest(join_token=token, version="0.1", hostname="box-1"))
    assert joined.agent_id.startswith("agt_")
    assert joined.agent_token.startswith("l9_agent_")
    assert (joined.provider, joined.workspace_id, dict(joined.labels)) == ("agent_machine", "", {"pool": "box"})
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await wire.stub.Join(agent_pb2.JoinRequest(join_token=token))
    assert again.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "this join token was already used" in (again.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await wire.stub.Join(agent_pb2.JoinRequest(join_token="l9_agent_made_up"))
    assert bad.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "this join token is unknown" in (bad.value.details() or "")


async def test_an_agent_answers_orders_on_its_stream(wire: Wire) -> None:
    agent_id, token = await wire.agent()
    stream = Stream(wire.stub, token)
    welcome = await stream.hello()
    assert (welcome.agent_id, welcome.heartbeat_s) == (agent_id, HEARTBEAT_S)
    await stream.send(
        inventory=agent_pb2.Inventory(
            cpu_millicores=8000,
            memory_mib=32768,
            free_cpu_millicores=8000,
            free_memory_mib=32768,
            gpus=[agent_pb2.GpuCapacity(gpu="L4", count=2, free=2)],
            machines=["m-0"],
        )
    )

    sending = asyncio.create_task(
        wire.hub.send(AgentOrder(agent_id=agent_id, kind="provision", payload={"machine_id": "m-1"}), timeout=10)
    )
    command = await stream.read()
    assert command.WhichOneof("body") == "order"
    assert (command.order.kind, json.loads(command.order.payload_json)) == ("provision", {"machine_id": "m-1"})
    await stream.send(ack=agent_pb2.Ack(order_id=command.order.order_id, ok=True, result_json='{"id": "c-1"}'))
    assert (await sending).result == {"id": "c-1"}

    sending = asyncio.create_task(wire.hub.send(AgentOrder(agent_id=agent_id, kind="provision"), timeout=10))
    command = await stream.read()
    await stream.send(
        ack=agent_pb2.Ack(
            order_id=command.order.order_id, ok=False, error="both GPUs are taken", error_kind="insufficient_capacity"
        )
    )
    with pytest.raises(InsufficientCapacity, match="both GPUs are taken"):
        await sending

    (listed,) = wire.hub.inventories("agent_machine")
    assert listed.connected
    assert listed.machines == ["m-0"]
    assert listed.capacity["gpus"] == {"L4": 2}
    await stream.call.done_writing()


async def test_the_stream_takes_only_an_agents_credential(wire: Wire) -> None:
    join_token = await wire.join_token()
    refused = await Stream(wire.stub, join_token).refused()
    assert refused.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "call Join with it first" in (refused.details() or "")
    _, user_token = await wire.services.tokens.issue("user", subject="someone")
    refused = await Stream(wire.stub, user_token).refused()
    assert refused.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "needs a agent token, not a user token" in (refused.details() or "")


async def test_hello_first_and_for_the_provider_joined_for(wire: Wire) -> None:
    _, token = await wire.agent()
    early = Stream(wire.stub, token)
    await early.send(heartbeat=agent_pb2.Heartbeat())
    refused = await early.refused()
    assert refused.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "must be Hello, not Heartbeat" in (refused.details() or "")

    other = Stream(wire.stub, token)
    await other.send(hello=agent_pb2.Hello(provider="attached_cluster"))
    refused = await other.refused()
    assert refused.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "joined for provider 'agent_machine'" in (refused.details() or "")


async def test_a_silent_agent_is_pinged_then_disconnected(wire: Wire) -> None:
    agent_id, token = await wire.agent()
    stream = Stream(wire.stub, token)
    await stream.hello()
    assert (await stream.read()).WhichOneof("body") == "ping"  # silent for two heartbeats
    refused = await stream.refused()  # and for a third: cut off
    assert refused.code() is grpc.StatusCode.UNAVAILABLE
    assert f"agent {agent_id} sent nothing" in (refused.details() or "")
    assert [i.connected for i in wire.hub.inventories()] == [False]
    with pytest.raises(InsufficientCapacity, match="is not connected"):
        await wire.hub.send(AgentOrder(agent_id=agent_id, kind="provision"), timeout=5)


async def test_an_agent_answering_pings_stays_connected(wire: Wire) -> None:
    agent_id, token = await wire.agent()
    stream = Stream(wire.stub, token)
    await stream.hello()
    for _ in range(3):  # nine heartbeat periods, alive only through its answers to pings
        command = await stream.read()
        assert command.WhichOneof("body") == "ping"
        await stream.send(heartbeat=agent_pb2.Heartbeat())
    sending = asyncio.create_task(wire.hub.send(AgentOrder(agent_id=agent_id, kind="list"), timeout=10))
    while (command := await stream.read()).WhichOneof("body") != "order":
        await stream.send(heartbeat=agent_pb2.Heartbeat())
    await stream.send(ack=agent_pb2.Ack(order_id=command.order.order_id, ok=True))
    assert (await sending).ok
    await stream.call.done_writing()


async def test_a_revoked_agent_is_cut_off(wire: Wire) -> None:
    _, token = await wire.agent()
    stream = Stream(wire.stub, token)
    await stream.hello()
    record = await wire.services.tokens.find(token)
    assert record is not None
    operator = Principal(token_id="tok_test_operator", kind=TokenKind.USER, workspace_id=None, subject="op")
    await revoke_token(wire.services, operator, record.id)  # as `DELETE /tokens/{id}` does
    refused = await stream.refused()  # at once: the agent need not send anything first
    assert refused.code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_controlplane_serves_the_agent_service(tmp_path: Path, database_url: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(CONFIG.format(data_dir=tmp_path / "server-data", database_url=database_url))
    loaded = load_config(path)
    server = Server(loaded, Listeners("127.0.0.1", free_port(), free_port(), free_port()))
    try:
        await server.start()
        assert server.services is not None
        assert server.agents is not None
        root, _ = await server.services.tokens.issue("user", subject="root")
        issued = await agent_join.issue_join_token(
            server.services, Principal(root.id, TokenKind.USER, None, "root"), "agent_machine"
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.listeners.grpc_port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]
            joined = await stub.Join(agent_pb2.JoinRequest(join_token=issued.token))
            stream = Stream(stub, joined.agent_token)
            welcome = await stream.hello()
            assert welcome.agent_id == issued.agent_id
            assert welcome.heartbeat_s > 0
            await stream.call.done_writing()
    finally:
        await server.stop(grace_s=1)
        loaded.hooks.close()
