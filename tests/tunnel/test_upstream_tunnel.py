"""The gateway's upstream through a worker's tunnel: the registry, the worker's relay and a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from levers9.gateway.upstream import Upstream, UpstreamError
from levers9.runner.serving import HttpServer
from levers9.services.tunnels import TunnelRegistry, parse_address
from levers9.tunnel.mux import WINDOW, Mux
from levers9.worker.tunnel import connect_locally
from tests.fixtures.http_wire import request_body
from tests.fixtures.ports import free_port
from tests.tunnel.pair import Channel

STREAMED = 16 * 1024 * 1024


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = await request_body(receive)
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        piece = b"s" * 65536
        for _ in range(STREAMED // len(piece)):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    seen = {
        "path": scope["path"],
        "body": body.decode(),
        "client_port": scope["client"][1],
        "host": dict(scope["headers"]).get(b"host", b"").decode(),
    }
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": json.dumps(seen).encode()})


class Worker:
    """A worker's end of a tunnel to the registry, in memory, connecting to this host's loopback."""

    def __init__(self, registry: TunnelRegistry, worker_id: str) -> None:
        self.down = Channel()  # controlplane -> worker
        self.up = Channel()
        self.mux = Mux(self.up.send, name="worker", initiator=False, on_open=connect_locally)
        self.tasks = [
            asyncio.create_task(registry.serve(worker_id, self.up.frames(), self.down.send)),
            asyncio.create_task(self.mux.run(self.down.frames())),
        ]

    async def stop(self) -> None:
        self.up.end()
        self.mux.close()
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
async def server() -> AsyncIterator[int]:
    port = free_port()
    http = HttpServer(app, "127.0.0.1", port)
    http.start()
    yield port
    http.stop()


class Collected:
    def __init__(self, *, hold_after: int | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.hold_after = hold_after
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if self.hold_after is not None and len(self.messages) == self.hold_after:
            self.held.set()
            await self.release.wait()  # a client that stopped reading

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


def _scope(path: str = "/") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "query_string": b"", "headers": [], "client": None}


async def test_requests_go_through_the_tunnel_on_one_kept_alive_stream(server: int) -> None:
    registry = TunnelRegistry()
    worker = Worker(registry, "wkr_a")
    upstream = Upstream(tunnel=registry.connect_address)
    address = f"tunnel://wkr_a/127.0.0.1:{server}"
    try:
        ports = []
        for i in range(3):
            out = Collected()
            status = await upstream.forward(address, _scope("/x"), f"body {i}".encode(), out.send, path="/x")
            assert status == 200
            seen = json.loads(out.body)
            assert (seen["path"], seen["body"], seen["host"]) == ("/x", f"body {i}", f"127.0.0.1:{server}")
            ports.append(seen["client_port"])
        assert len(set(ports)) == 1  # the same stream, kept alive, carried all three
        assert worker.mux.streams() == 1
    finally:
        await upstream.close()
        await worker.stop()


async def test_a_client_that_stops_reading_stops_the_worker_after_one_window(server: int) -> None:
    registry = TunnelRegistry()
    worker = Worker(registry, "wkr_b")
    upstream = Upstream(tunnel=registry.connect_address)
    out = Collected(hold_after=3)  # the start and two pieces, then the client stalls
    forward = asyncio.create_task(
        upstream.forward(f"tunnel://wkr_b/127.0.0.1:{server}", _scope("/stream"), b"", out.send, path="/stream")
    )
    try:
        await asyncio.wait_for(out.held.wait(), 30)
        near = registry._tunnels["wkr_b"]
        (stream,) = near._streams.values()
        for _ in range(1000):  # the window fills while nobody reads
            if len(stream._inbox) >= WINDOW * 3 // 4:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        # at most a window waits unread (less what was read and is not yet granted back: under a quarter)
        assert WINDOW * 3 // 4 <= len(stream._inbox) <= WINDOW
        crossed = worker.up.data_bytes
        await asyncio.sleep(0.5)
        assert worker.up.data_bytes == crossed  # no credit, no more data: nothing piles up anywhere
        assert crossed < STREAMED // 2
        out.release.set()
        assert await asyncio.wait_for(forward, 60) == 200
        assert len(out.body) == STREAMED
    finally:
        out.release.set()
        forward.cancel()
        with contextlib.suppress(asyncio.CancelledError, UpstreamError):
            await forward
        await upstream.close()
        await worker.stop()


async def test_a_port_nothing_listens_on_is_refused_and_no_tunnel_is_a_clear_502() -> None:
    registry = TunnelRegistry()
    worker = Worker(registry, "wkr_c")
    upstream = Upstream(tunnel=registry.connect_address, connect_timeout_s=0.5)
    closed = free_port()
    try:
        with pytest.raises(UpstreamError) as refused:
            await upstream.forward(f"tunnel://wkr_c/127.0.0.1:{closed}", _scope(), b"", Collected().send, path="/")
        assert refused.value.refused  # nothing reached a container: another may take the request
        assert f"127.0.0.1:{closed}" in str(refused.value)
        with pytest.raises(UpstreamError) as missing:
            await upstream.forward("tunnel://wkr_other/127.0.0.1:80", _scope(), b"", Collected().send, path="/")
        assert not missing.value.refused
        assert missing.value.elsewhere
        assert not refused.value.elsewhere
        assert "holds none to this controlplane replica" in str(missing.value)
        with pytest.raises(UpstreamError, match="has no tunnels"):
            await Upstream().forward(f"tunnel://wkr_c/127.0.0.1:{closed}", _scope(), b"", Collected().send, path="/")
    finally:
        await upstream.close()
        await worker.stop()


async def test_a_worker_that_goes_away_fails_its_streams_and_leaves_the_registry(server: int) -> None:
    registry = TunnelRegistry()
    worker = Worker(registry, "wkr_d")
    upstream = Upstream(tunnel=registry.connect_address)
    out = Collected(hold_after=2)
    forward = asyncio.create_task(
        upstream.forward(f"tunnel://wkr_d/127.0.0.1:{server}", _scope("/stream"), b"", out.send, path="/stream")
    )
    await asyncio.wait_for(out.held.wait(), 30)
    await worker.stop()  # the worker's connection is gone mid-response
    out.release.set()
    with pytest.raises(UpstreamError) as broke:
        await asyncio.wait_for(forward, 30)
    assert broke.value.sent  # the caller had the start of the response
    for _ in range(100):
        if not registry.has("wkr_d"):
            break
        await asyncio.sleep(0.01)
    assert not registry.has("wkr_d")
    await upstream.close()


def test_tunnel_addresses() -> None:
    assert parse_address("tunnel://wkr_1/127.0.0.1:8000") == ("wkr_1", "127.0.0.1", 8000)
    assert parse_address("tunnel://wkr_1/[::1]:80") == ("wkr_1", "::1", 80)
    assert parse_address("10.0.0.2:8000") is None
    with pytest.raises(ValueError, match="tunnel://WORKER_ID/HOST:PORT"):
        parse_address("tunnel://wkr_1/nohost")
