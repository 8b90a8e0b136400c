"""Slow and many clients on the HTTP listeners: timeouts, caps, evictions and the burst line, over raw sockets.

A real uvicorn serves on a real :class:`~levers9.controlplane.listener.Listener` with the controlplane's own
protocols (the front, and uvicorn's protocol with deadlines for what the front hands over and for the
metrics listener), configured as the server configures them. Every test reads what a client sees on the
wire, and what the listener counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from levers9.controlplane import listener as listener_module
from levers9.controlplane.http_deadlines import GuardedHttpTools
from levers9.controlplane.http_front import MAX_BODY, FrontProtocol
from levers9.controlplane.listener import Listener, client_of
from levers9.controlplane.server import _listen
from tests.fixtures.http_wire import connect, read_response, request_body

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    port: int
    listener: Listener
    server: uvicorn.Server


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = await request_body(receive)
    answer = b"%s %s %d" % (scope["method"].encode(), scope["path"].encode(), len(body))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": answer})


@contextlib.asynccontextmanager
async def serving(
    *,
    cap: int | None = None,
    per_client: int = 0,
    protocol: type[asyncio.Protocol] = FrontProtocol,
    header_timeout_s: float = 1.0,
    body_timeout_s: float = 1.0,
    keep_alive_s: float = 30.0,
) -> AsyncIterator[Served]:
    """A uvicorn on a listener with these caps and timeouts (set on its config as the server sets them)."""
    sock = _listen("127.0.0.1", 0, cap=cap, per_client=per_client)
    config = uvicorn.Config(_app, http=protocol, lifespan="off", log_level="warning", timeout_keep_alive=keep_alive_s)  # type: ignore[arg-type]
    config.listener = sock  # type: ignore[attr-defined]
    config.header_timeout_s = header_timeout_s  # type: ignore[attr-defined]
    config.body_timeout_s = body_timeout_s  # type: ignore[attr-defined]
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield Served(sock.getsockname()[1], sock, server)
    finally:
        server.should_exit = True
        server.force_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (within 10 s, else the test fails)."""
    return await asyncio.wait_for(reader.read(), 10)


async def _get(served: Served, path: str = "/a") -> int:
    async with connect(served.port) as (reader, writer):
        writer.write(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
        return (await read_response(reader))[0]


# ---------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("protocol", [FrontProtocol, GuardedHttpTools], ids=["front", "uvicorn"])
async def test_a_head_that_trickles_is_answered_408_and_closed(protocol: type[asyncio.Protocol]) -> None:
    async with serving(protocol=protocol, header_timeout_s=1.0) as served, connect(served.port) as (reader, writer):
        writer.write(b"GET /slow HTTP/1.1\r\n")
        trickling = asyncio.create_task(_trickle(writer))
        try:
            answer = await _closed(reader)
        finally:
            trickling.cancel()
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"connection: close" in answer
        assert served.listener.counts["header_timeout"] == 1
        assert await _get(served) == 200  # the listener serves on


async def _trickle(writer: asyncio.StreamWriter) -> None:
    """A header line every 0.2 s: the connection is never idle, the head never complete."""
    n = 0
    while True:
        await asyncio.sleep(0.2)
        n += 1
        writer.write(b"x-%d: y\r\n" % n)


async def test_a_head_that_trickles_after_the_front_handed_the_connection_over_is_closed() -> None:
    async with serving(header_timeout_s=1.0) as served, connect(served.port) as (reader, writer):
        # chunked: the front hands the connection to uvicorn's protocol, which answers this one...
        writer.write(b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /c 3")
        assert {type(c) for c in served.server.server_state.connections} == {GuardedHttpTools}
        # ...and keeps the next head's deadline
        writer.write(b"GET /slow HTTP/1.1\r\n")
        trickling = asyncio.create_task(_trickle(writer))
        try:
            answer = await _closed(reader)
        finally:
            trickling.cancel()
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert served.listener.counts["header_timeout"] == 1


@pytest.mark.parametrize("size", [100, MAX_BODY + 1], ids=["front", "uvicorn"])
async def test_a_body_that_never_arrives_is_answered_408_and_closed(size: int) -> None:
    async with serving(body_timeout_s=1.0) as served, connect(served.port) as (reader, writer):
        writer.write(b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\nabc" % size)
        answer = await _closed(reader)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert served.listener.counts["body_timeout"] == 1


async def test_a_silent_connection_to_uvicorns_protocol_is_closed_after_the_header_timeout() -> None:
    """uvicorn's own protocol waits for ever for a first byte; with the deadlines it does not (the metrics port)."""
    async with serving(protocol=GuardedHttpTools, header_timeout_s=1.0) as served, connect(served.port) as (reader, _):
        assert (await _closed(reader)).startswith(b"HTTP/1.1 408 ")


async def test_a_slow_app_is_not_timed_out() -> None:
    """The deadlines are the client's: a request whose app takes longer than both is answered."""
    async with serving(header_timeout_s=0.5, body_timeout_s=0.5) as served:
        served.server.config.loaded_app = _slow_app
        for request in (
            b"POST /s HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc",  # the front's
            b"POST /s HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",  # uvicorn's
        ):
            async with connect(served.port) as (reader, writer):
                writer.write(request)
                status, _, answer = await read_response(reader)
                assert (status, answer) == (200, b"done")


async def _slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await request_body(receive)
    await asyncio.sleep(1.5)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})


async def test_a_body_the_app_has_not_read_yet_is_not_timed_out() -> None:
    """uvicorn stops reading a body the app has not taken (a gateway request waiting for a container): the
    client cannot send then, so that pause is not the client's and the body timeout does not count it."""
    body = b"z" * (MAX_BODY + 512 * 1024)  # uvicorn's protocol, which pauses reading past 64 KiB unread
    async with serving(body_timeout_s=0.5) as served:
        served.server.config.loaded_app = _late_reader
        async with connect(served.port) as (reader, writer):
            writer.write(b"POST /late HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            status, _, answer = await read_response(reader)
        assert (status, answer) == (200, str(len(body)).encode())
        assert served.listener.counts["body_timeout"] == 0


async def _late_reader(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await asyncio.sleep(2.0)  # three body timeouts before the app reads a byte
    body = await request_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


# ---------------------------------------------------------------------- caps


async def test_connections_over_the_per_address_cap_are_refused_while_the_others_work() -> None:
    async with serving(per_client=3, header_timeout_s=30) as served, contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(connect(served.port)) for _ in range(3)]
        # the fourth from 127.0.0.1: 503 and closed
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        answer = await _closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"connection: close" in answer
        # another address is not refused
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port, local_addr=("127.0.0.2", 0))
        writer.write(b"GET /other HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        writer.close()
        # and the three held ones are served
        for r, w in held:
            w.write(b"GET /held HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await read_response(r))[0] == 200
        assert served.listener.counts["per_client"] == 1
    await _until(lambda: served.listener.open == 0)


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        ("127.0.0.5", "127.0.0.5"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:1:2:3", "2001:db8:1:2::/64"),  # the same host's /64: the same client
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("::ffff:10.1.2.3", "10.1.2.3"),  # IPv4 on a dual-stack socket
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_the_per_address_cap_counts_an_ipv6_client_by_its_64(peer: str, client: str) -> None:
    assert client_of(peer) == client


async def test_at_the_total_cap_a_connection_that_sent_no_head_is_evicted_for_a_new_one() -> None:
    async with serving(cap=3, header_timeout_s=30) as served, contextlib.AsyncExitStack() as stack:
        silent = [await stack.enter_async_context(connect(served.port)) for _ in range(3)]
        await _until(lambda: served.listener.open == 3)
        assert await _get(served, "/new") == 200  # room made: the oldest silent connection was closed
        assert await _closed(silent[0][0]) == b""
        assert served.listener.counts["evicted"] >= 1
        for reader, writer in silent[1:]:  # the others are still served
            writer.write(b"GET /still HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await read_response(reader))[0] == 200


async def test_at_the_total_cap_with_every_connection_serving_a_new_one_is_refused() -> None:
    async with serving(cap=3, header_timeout_s=30) as served, contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(connect(served.port)) for _ in range(3)]
        for reader, writer in held:  # each sent a request: none may be evicted
            writer.write(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await read_response(reader))[0] == 200
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        assert (await _closed(reader)).startswith(b"HTTP/1.1 503 ")
        writer.close()
        assert served.listener.counts["cap"] == 1
        assert served.listener.counts["evicted"] == 0
        for reader, writer in held:
            writer.write(b"GET /again HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await read_response(reader))[0] == 200
    await _until(lambda: served.listener.open == 0)
    assert served.listener.by_client == {}
    assert served.listener.waiting == {}


async def test_refusals_are_logged_as_one_line_per_burst(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener_module, "REPORT_EVERY_S", 0.5)
    caplog.set_level(logging.WARNING, logger="levers9.controlplane.listener")
    async with serving(per_client=1, header_timeout_s=30) as served, connect(served.port):
        refused = 0
        for _ in range(2):  # two bursts, a report period apart
            for _ in range(40):
                reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
                assert (await _closed(reader)).startswith(b"HTTP/1.1 503 ")
                writer.close()
                refused += 1
            await asyncio.sleep(1.0)
        lines = [r.getMessage() for r in caplog.records if r.name == "levers9.controlplane.listener"]
    assert len(lines) == 2, lines
    assert all("refused 40 connections (40 over 1 from one address (most: 127.0.0.1, 40))" in line for line in lines)
    assert served.listener.counts["per_client"] == refused


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------- out of descriptors

_STARVED = textwrap.dedent(
    """
    import asyncio, logging, resource, sys
    sys.path[:0] = [{core!r}]
    from levers9.controlplane import listener
    from levers9.controlplane.listener import Listener, quiet_accept_failures

    listener.REPORT_EVERY_S = 1.0

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    async def main():
        sock = Listener(2)  # no cap: what the process has runs out
        sock.bind(("127.0.0.1", 0))
        sock.listen(2048)
        quiet_accept_failures(asyncio.get_running_loop())
        held = []
        class Hold(asyncio.Protocol):
            def connection_made(self, transport):
                held.append(transport)
        await asyncio.get_running_loop().create_server(Hold, sock=sock)
        print(sock.getsockname()[1], flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_running_out_of_descriptors_logs_a_line_per_burst_not_per_connection(tmp_path: Path) -> None:
    """asyncio's accept loop logs each failed accept (with a traceback) and tries the next queued connection at
    once: with 500 queued that was 500 tracebacks a pass, every second. The listener keeps it to its line."""
    script = tmp_path / "starved.py"
    script.write_text(_STARVED.format(core=str(REPO / "core")))
    server = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    clients: list[Any] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        import socket

        for _ in range(500):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            clients.append(client)
        time.sleep(2.5)  # two of asyncio's one-second pauses
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        _, err = server.communicate(timeout=30)
        for client in clients:
            client.close()
    text = err.decode(errors="replace")
    assert "Too many open files" not in text, text[-3000:]
    assert "out of system resource" not in text, text[-3000:]
    counted = [int(n) for n in re.findall(r"found no file descriptor free (\d+) times", text)]
    assert 1 <= len(counted) <= 3, text[-3000:]  # a line a second at most (REPORT_EVERY_S is 1 s here)
    assert sum(counted) <= 4, text[-3000:]  # one failed accept per pause of a second, not one per queued connection
