"""The Agent gRPC service: Join, and the stream each agent holds open.

This module only translates between agent.proto and :mod:`levers9.services.agents`,
which decides everything: who an agent is, what its Hello may say, where its
orders and acknowledgements go. Status codes: a refused join token or agent
credential is UNAUTHENTICATED, a Hello naming another provider than the one
joined for is PERMISSION_DENIED, a message out of order INVALID_ARGUMENT, and
a stream that fell silent for three heartbeat periods ends with UNAVAILABLE
(the agent dials again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from levers9.controlplane.grpc_errors import status_of, unary
from levers9.hooks.context import AgentAck
from levers9.proto.v1 import agent_pb2, agent_pb2_grpc
from levers9.services import agent_join, agents
from levers9.services.auth import bearer
from levers9.services.core import Services

__all__ = ["AgentService"]

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


def _command(command: agents.Command) -> agent_pb2.AgentCommand:
    if isinstance(command, agents.Welcome):
        return agent_pb2.AgentCommand(
            welcome=agent_pb2.Welcome(agent_id=command.agent_id, heartbeat_s=command.heartbeat_s)
        )
    if isinstance(command, agents.OrderCommand):
        return agent_pb2.AgentCommand(
            order=agent_pb2.Order(
                order_id=command.order_id, kind=command.kind, payload_json=json.dumps(command.payload)
            )
        )
    return agent_pb2.AgentCommand(ping=agent_pb2.Ping())


def _inventory(message: agent_pb2.Inventory) -> agents.InventoryReport:
    return agents.InventoryReport(
        cpu_millicores=message.cpu_millicores,
        memory_mib=message.memory_mib,
        free_cpu_millicores=message.free_cpu_millicores,
        free_memory_mib=message.free_memory_mib,
        gpus=tuple((g.gpu, g.count, g.free) for g in message.gpus),
        machines=tuple(message.machines),
        details=agents.json_object(message.details_json, "Inventory.details_json") or None,
    )


def _ack(message: agent_pb2.Ack) -> AgentAck:
    return AgentAck(
        order_id=message.order_id,
        ok=message.ok,
        result=agents.json_object(message.result_json, "Ack.result_json"),
        error=message.error or None,
        error_kind=message.error_kind or None,
    )


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(self, services: Services, hub: agents.AgentHub) -> None:
        self.services = services
        self.hub = hub

    @unary
    async def Join(self, request: agent_pb2.JoinRequest, context: Context) -> agent_pb2.JoinResponse:
        joined = await agent_join.join(
            self.services, request.join_token, version=request.version, hostname=request.hostname
        )
        return agent_pb2.JoinResponse(
            agent_id=joined.agent_id,
            agent_token=joined.token,
            provider=joined.provider,
            workspace_id=joined.workspace or "",
            labels=joined.labels,
        )

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: Context
    ) -> AsyncIterator[agent_pb2.AgentCommand]:
        try:
            session = await agents.open_session(self.services, self.hub, bearer(context.invocation_metadata()))
        except Exception as exc:
            await context.abort(status_of(exc) or grpc.StatusCode.INTERNAL, str(exc))
            return
        reader = asyncio.create_task(self._read(request_iterator, session), name=f"agent {session.identity.agent_id}")
        failure: BaseException | None = None
        try:
            async with contextlib.aclosing(session.commands(reader)) as commands:
                async for command in commands:
                    yield _command(command)
            if reader.done() and not reader.cancelled():
                failure = reader.exception()
        except agents.AgentCut as exc:  # removed or revoked: final, the agent must not dial again
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except agents.AgentLapsed as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        if failure is not None:
            code = status_of(failure)
            if code is None:
                log.error("agent %s's stream failed", session.identity.agent_id, exc_info=failure)
                await context.abort(grpc.StatusCode.INTERNAL, "internal error; the controlplane log has details")
            await context.abort(code or grpc.StatusCode.INTERNAL, str(failure))

    @staticmethod
    async def _read(incoming: AsyncIterator[agent_pb2.AgentMessage], session: agents.AgentSession) -> None:
        async for message in incoming:
            which = message.WhichOneof("body")
            if which == "hello":
                hello = message.hello
                await session.hello(
                    version=hello.version, provider=hello.provider, labels=dict(hello.labels), hostname=hello.hostname
                )
            elif which == "inventory":
                await session.inventory(_inventory(message.inventory))
            elif which == "heartbeat":
                await session.heartbeat()
            elif which == "ack":
                await session.ack(_ack(message.ack))
            # anything else is a message of a newer agent this controlplane does not know: skipped
