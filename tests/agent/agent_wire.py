"""The controlplane side the agent's tests dial: the real Agent gRPC service on real stores, over TLS or not.

:class:`AgentServer` runs :class:`~levers9.controlplane.grpc_agent.AgentService`
with a real :class:`~levers9.services.agents.AgentHub` (the controlplane's
Redis, SQLite) on a fixed port, so a test can stop it and start it again on
the same port. The hub records what each agent's stream said (Hello,
Inventory) by wrapping the real session, so a test can see that a
reconnected agent said Hello and sent its inventory again.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from levers9.agent.credentials import AgentCredential
from levers9.controlplane.grpc_agent import AgentService
from levers9.hooks.context import AgentAck, AgentInventory, AgentOrder
from levers9.proto.v1 import agent_pb2_grpc
from levers9.services import agent_join
from levers9.services.agents import AgentHub, AgentSession, InventoryReport
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.records import TokenKind
from tests.fixtures.ports import free_port
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services
from tests.fixtures.tls import TestCA

__all__ = ["HEARTBEAT_S", "AgentServer", "Said", "eventually", "opened_server", "provision_payload"]

CONFIG = ONE_POOL_CONFIG

#: short, so the tests' streams beat fast; the agent follows what Welcome says
HEARTBEAT_S = 0.5
#: how long the hub may take to close before its tasks are cancelled a second time
_HUB_CLOSE_S = 5.0


@dataclass
class Said:
    """What agents said on their streams, in order: ("hello", agent_id, None) and ("inventory", agent_id, report)."""

    events: list[tuple[str, str, InventoryReport | None]] = field(default_factory=list)

    def hellos(self, agent_id: str) -> int:
        return sum(1 for kind, who, _ in self.events if kind == "hello" and who == agent_id)

    def inventories(self, agent_id: str) -> list[InventoryReport]:
        return [r for kind, who, r in self.events if kind == "inventory" and who == agent_id and r is not None]


class _RecordingSession(AgentSession):
    said: Said

    async def hello(self, *, version: str, provider: str, labels: Mapping[str, str], hostname: str) -> None:
        await super().hello(version=version, provider=provider, labels=labels, hostname=hostname)
        self.said.events.append(("hello", self.identity.agent_id, None))

    async def inventory(self, report: InventoryReport) -> None:
        await super().inventory(report)
        self.said.events.append(("inventory", self.identity.agent_id, report))


class _RecordingHub(AgentHub):
    said: Said

    def attach(self, identity: Any, recheck: Callable[[], Awaitable[object]]) -> AgentSession:
        session = _RecordingSession(self, identity, recheck)
        session.said = self.said
        return session


async def _bounded(step: str, awaitable: Awaitable[Any], timeout: float = _HUB_CLOSE_S) -> None:
    """Await a stop step for at most ``timeout`` s, as the controlplane's own stop bounds each of its steps; a step
    still running then has every task's stack written to stderr (the test's captured output), a warning, and is
    cancelled, so one stuck stop names itself instead of hanging the run until the suite's timeout."""
    running = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({running}, timeout=timeout)
    if done:
        running.result()
        return
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()} still running while {step} waits:", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    warnings.warn(f"{step} did not end within {timeout:g} s; cancelled (stacks on stderr)", stacklevel=2)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


class AgentServer:
    """The Agent service on ``127.0.0.1:port``; :meth:`stop` and :meth:`start` again keep the port and stores."""

    def __init__(self, services: Services, tls: TestCA | None) -> None:
        self.services = services
        self.ca = tls
        self.port = free_port()
        self.said = Said()
        self.hub: AgentHub | None = None
        self._server: grpc.aio.Server | None = None
        self._operator: Principal | None = None

    @property
    def url(self) -> str:
        return f"{'grpcs' if self.ca else 'grpc'}://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> str | None:
        return self.ca.pem.decode() if self.ca else None

    async def start(self) -> None:
        hub = _RecordingHub(self.services.redis, name="replica-a", heartbeat_s=HEARTBEAT_S)
        hub.said = self.said
        await hub.start()
        server = grpc.aio.server()
        add: Any = agent_pb2_grpc.add_AgentServicer_to_server  # generated, unannotated
        add(AgentService(self.services, hub), server)
        address = f"127.0.0.1:{self.port}"
        if self.ca is not None:
            issued = self.ca.issue()
            server.add_secure_port(address, grpc.ssl_server_credentials([(issued.key_pem, issued.cert_pem)]))
        else:
            server.add_insecure_port(address)
        await server.start()
        self.hub, self._server = hub, server

    async def stop(self) -> None:
        if self._server is not None:
            await _bounded("the Agent gRPC server's stop", self._server.stop(None))
            self._server = None
        if self.hub is not None:
            # AgentHub.close() can wait for ever: a cancel that lands inside its refresh loop's Redis read may come
            # back as an ordinary exception, which the loop logs and goes on (reported); cancelling again ends it
            await _bounded("AgentHub.close()", self.hub.close())
            self.hub = None

    async def join_token(self) -> str:
        if self._operator is None:
            record, _ = await self.services.tokens.issue("user", subject="root")
            self._operator = Principal(record.id, TokenKind.USER, None, "root")
        issued = await agent_join.issue_join_token(self.services, self._operator, "agent_machine", {"pool": "box"})
        return issued.token

    async def credential(self) -> AgentCredential:
        """A joined agent's credential, joined through the real Join RPC (by the agent's own code)."""
        from levers9.agent.connection import join

        joined = await join(
            self.url, await self.join_token(), ca_pem=self.ca_pem, insecure=self.ca is None, stop=asyncio.Event()
        )
        assert joined is not None
        return joined

    async def revoke(self, credential: AgentCredential) -> None:
        """Revoke the agent's credential through the service the API's `DELETE /tokens/{id}` calls."""
        from levers9.services.auth import Principal
        from levers9.services.workspaces import revoke_token
        from levers9.state.sql.records import TokenKind

        record = await self.services.tokens.find(credential.token)
        assert record is not None
        operator = Principal(token_id="tok_test_operator", kind=TokenKind.USER, workspace_id=None, subject="op")
        await revoke_token(self.services, operator, record.id)

    def inventory(self, agent_id: str) -> AgentInventory | None:
        assert self.hub is not None
        return next((i for i in self.hub.inventories() if i.agent_id == agent_id), None)

    async def send(
        self, agent_id: str, kind: str, payload: dict[str, Any], *, order_id: str | None = None, timeout: float = 20
    ) -> AgentAck:
        assert self.hub is not None
        return await self.hub.send(
            AgentOrder(agent_id=agent_id, kind=kind, payload=payload, order_id=order_id), timeout=timeout
        )


async def eventually(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(0.1)


def provision_payload(machine_id: str, image: str, **extra: Any) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "pool": "box",
        "workspace": None,
        "image": image,
        "command": ["/bin/sleep", "3600"],
        "env": {"LEVERS9_MACHINE_ID": machine_id},
        "secret_env": {"LEVERS9_TOKEN": "l9_secret_for_the_test"},
        "cpu_millicores": 250,
        "memory_mib": 64,
        "gpu": None,
        "gpu_count": 0,
        "network_mode": "host",
        "gpu_runtime": None,
        **extra,
    }


@contextlib.asynccontextmanager
async def opened_server(tmp_path: Path, *, tls: bool) -> AsyncIterator[AgentServer]:
    """An :class:`AgentServer` on fresh stores (SQLite, the controlplane's Redis), stopped at the end."""
    async with opened_services(tmp_path, CONFIG, f"sqlite:///{tmp_path / 'levers9.db'}") as services:
        server = AgentServer(services, TestCA() if tls else None)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()
