"""levers9.volumes.webdav.WebDav under a real uvicorn on 127.0.0.1, mounted in FastAPI where the controlplane
mounts it, with a resolver that wants one bearer token and maps volume names to directories."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from starlette.requests import Request

from levers9.volumes.paths import VolumeRoot
from levers9.volumes.webdav import DavRefused, WebDav

PREFIX = "/api/v1/volumes/dav"


@dataclass
class DavServer:
    #: http://127.0.0.1:<port>
    origin: str
    token: str
    #: (method, path) of every request the resolver saw, in order
    seen: list[tuple[str, str]]

    def url(self, volume: str, path: str = "") -> str:
        return f"{self.origin}{PREFIX}/{volume}/{path}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@contextlib.contextmanager
def serve_dav(
    volumes: dict[str, Path], token: str = "s3cr3t-volume-token", tls: tuple[Path, Path] | None = None
) -> Iterator[DavServer]:
    """The server, over TLS with ``tls`` (certificate file, key file)."""
    seen: list[tuple[str, str]] = []

    async def resolve(request: Request, volume: str) -> VolumeRoot:
        seen.append((request.method, request.url.path))
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            raise DavRefused(401, "a bearer token is needed")
        if header.removeprefix("Bearer ") != token:
            raise DavRefused(401, "the bearer token is not valid")
        if volume not in volumes:
            raise DavRefused(404, f"no volume {volume!r}")
        return VolumeRoot(volumes[volume])

    app = FastAPI()
    app.mount(PREFIX, WebDav(resolve))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    cert, key = (str(tls[0]), str(tls[1])) if tls else (None, None)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", ssl_certfile=cert, ssl_keyfile=key)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dav-server", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn ended before it started")
            threading.Event().wait(0.01)
        yield DavServer(f"{'https' if tls else 'http'}://127.0.0.1:{sock.getsockname()[1]}", token, seen)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
