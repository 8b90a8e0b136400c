"""The listening sockets levers9 binds itself and hands to asyncio: their connections go out without Nagle.

asyncio sets ``TCP_NODELAY`` on an accepted connection only when the listening socket was made with
``IPPROTO_TCP`` named; a socket made as ``socket(AF_INET, SOCK_STREAM)`` has protocol 0, and then every
response written in two parts (uvicorn writes the head, then the body) waits out Nagle and the client's
delayed ACK: 40 ms a request on a kept-alive connection. These tests serve each listener exactly as its
user does (``loop.create_server(..., sock=...)``, what uvicorn and ``asyncio.start_server`` do) and read
the option on the connection the server side accepted.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from levers9.controlplane.server import _listen
from levers9.worker.tunnel import _dual_stack_socket

LISTENERS: dict[str, Callable[[], socket.socket]] = {
    "the controlplane's HTTP listener": lambda: _listen("127.0.0.1", 0),
    "the worker's probe listener": _dual_stack_socket,
}


@pytest.mark.parametrize("make", LISTENERS.values(), ids=list(LISTENERS))
async def test_an_accepted_connection_has_nagle_off(make: Callable[[], socket.socket]) -> None:
    listener = make()
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Accept, sock=listener)
    try:
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await asyncio.wait_for(accepted, 10) != 0
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()
