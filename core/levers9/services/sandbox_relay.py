"""HTTP to a worker's sandbox server, through the worker's tunnel: the only way the controlplane reaches it.

A worker serves its sandboxes on ``127.0.0.1:<port>`` of its own machine
(:mod:`levers9.worker.sandbox_api`); the controlplane opens a stream through
the worker's tunnel to that address (:meth:`TunnelRegistry.connect
<levers9.services.tunnels.TunnelRegistry.connect>`: held here, or relayed to
the replica that holds it) and speaks HTTP/1.1 on it with httpcore, whose
connection pool keeps a few streams per worker open between requests.

A request carries the worker's bearer secret (never logged) and the
workspace it acts for (``Levers9-Workspace``), so a worker answers a sandbox
of another workspace as not found, whatever the controlplane asked.

:meth:`WorkerLink.request` answers a :class:`WorkerAnswer`: the status, the
content type, and the body as it comes (an output stream is relayed piece by
piece, never gathered). Failures: :class:`WorkerUnreachable` when no stream
could be opened to the worker (no tunnel within the connect timeout, the
worker refused the secret, or the connection broke before an answer began);
a connection that breaks after the answer began ends the body iterator with
:class:`BodyBroken`, which the caller turns into its own last word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpcore

__all__ = ["BodyBroken", "Connect", "WorkerAnswer", "WorkerLink", "WorkerUnreachable"]

log = logging.getLogger(__name__)

#: opens a connection to host:port on the worker's machine: (worker id, host, port, timeout) -> (reader, writer)
Connect = Callable[[str, str, int, float], Awaitable[tuple[Any, Any]]]

WORKSPACE_HEADER = "Levers9-Workspace"
CONNECT_TIMEOUT_S = 10.0
#: a request's answer must begin within this (a create boots a container: up to the worker's start timeout)
ANSWER_TIMEOUT_S = 180.0
#: an idle connection is dropped after this: before the worker's server closes it (uvicorn's 5 s), so a request
#: is never sent on a connection the worker is closing
KEEPALIVE_S = 3.0
#: the most bytes of an error answer read (its JSON body)
MAX_ERROR_BYTES = 64 * 1024


class WorkerUnreachable(ConnectionError):
    """No answer could be had from the worker's sandbox server; the message names the worker and why."""


class BodyBroken(ConnectionError):
    """The connection to the worker broke while its answer's body was being relayed."""


@dataclass
class WorkerAnswer:
    status: int
    content_type: str
    body: AsyncIterator[bytes]
    _close: Callable[[], Awaitable[None]]

    async def close(self) -> None:
        await self._close()

    async def read(self, limit: int = MAX_ERROR_BYTES) -> bytes:
        """The whole body (at most ``limit`` bytes), then closed."""
        data = b""
        try:
            async for piece in self.body:
                data += piece
                if len(data) > limit:
                    break
        finally:
            await self.close()
        return data[:limit]

    async def json(self) -> Any:
        raw = await self.read()
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"error": {"code": "BadAnswer", "message": raw[:300].decode(errors="replace")}}


class _TunnelStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: Any, writer: Any) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                data: bytes = await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout(f"no byte from the worker in {timeout} s") from None
        except (ConnectionError, OSError, EOFError) as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            drain = getattr(self._writer, "drain", None)
            if drain is not None:
                async with asyncio.timeout(timeout):
                    await drain()
        except TimeoutError:
            raise httpcore.WriteTimeout(f"the worker took no byte in {timeout} s") from None
        except (ConnectionError, OSError) as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # httpcore asks before reusing an idle connection: the worker closed it
            at_eof = getattr(self._reader, "at_eof", None)
            return bool(at_eof()) if at_eof is not None else False
        return None


class _TunnelBackend(httpcore.AsyncNetworkBackend):
    """Opens ``http://<worker_id>:<port>`` as ``127.0.0.1:<port>`` through that worker's tunnel."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            reader, writer = await self._connect(host, "127.0.0.1", port, timeout or CONNECT_TIMEOUT_S)
        except Exception as exc:
            raise httpcore.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return _TunnelStream(reader, writer)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a worker's sandbox server is reached over its tunnel only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class WorkerLink:
    """HTTP/1.1 to the workers' sandbox servers through their tunnels (one pool of connections for all)."""

    def __init__(self, connect: Connect) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            network_backend=_TunnelBackend(connect), max_connections=256, keepalive_expiry=KEEPALIVE_S
        )

    async def close(self) -> None:
        await self._pool.aclose()

    async def request(
        self,
        worker_id: str,
        port: int,
        secret: str,
        workspace_id: str,
        method: str,
        path: str,
        *,
        body: bytes | AsyncIterator[bytes] = b"",
        content_type: str = "application/json",
        streamed: bool = False,
    ) -> WorkerAnswer:
        """``method path`` on the worker; ``streamed`` answers (process output) have no read timeout once
        their head came (within :data:`ANSWER_TIMEOUT_S`, as every answer's)."""
        headers = [
            (b"Authorization", f"Bearer {secret}".encode()),
            (WORKSPACE_HEADER.encode(), workspace_id.encode()),
            (b"Content-Type", content_type.encode()),
        ]
        if isinstance(body, bytes):
            headers.append((b"Content-Length", str(len(body)).encode()))
        else:
            headers.append((b"Transfer-Encoding", b"chunked"))
        timeouts = {
            "connect": CONNECT_TIMEOUT_S,
            "pool": CONNECT_TIMEOUT_S,
            "write": 60.0,
            "read": None if streamed else ANSWER_TIMEOUT_S,
        }
        url = f"http://{worker_id}:{port}{path}"
        stream = self._pool.stream(method, url, headers=headers, content=body, extensions={"timeout": timeouts})
        # a streamed answer's head is bounded all the same (an exec that waits answers once its process
        # started); an upload's is not, its body goes first and may take long
        head_s = ANSWER_TIMEOUT_S if streamed and isinstance(body, bytes) else None
        try:
            async with asyncio.timeout(head_s):
                response = await stream.__aenter__()
        except (httpcore.TimeoutException, TimeoutError) as exc:
            await stream.__aexit__(None, None, None)
            why = str(exc) or f"no answer within {ANSWER_TIMEOUT_S:g} s"
            raise WorkerUnreachable(f"worker {worker_id} did not answer in time ({why})") from None
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            await stream.__aexit__(None, None, None)
            raise WorkerUnreachable(f"worker {worker_id}'s sandbox server cannot be reached: {exc}") from None
        if response.status == 401:
            await stream.__aexit__(None, None, None)
            raise WorkerUnreachable(
                f"worker {worker_id} refused the controlplane's secret for its sandbox server (it restarted and "
                "has not announced its new one yet)"
            )
        content = dict((k.lower(), v) for k, v in response.headers).get(b"content-type", b"").decode()

        async def pieces() -> AsyncIterator[bytes]:
            iterator: Any = response.aiter_stream()
            try:
                async for piece in iterator:
                    yield piece
            except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.TimeoutException) as exc:
                raise BodyBroken(f"the connection to worker {worker_id} broke: {exc}") from None

        async def close() -> None:
            with contextlib.suppress(Exception):
                await stream.__aexit__(None, None, None)

        return WorkerAnswer(response.status, content, pieces(), close)
