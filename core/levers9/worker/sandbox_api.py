"""The worker's sandboxes over HTTP on its loopback, for the controlplane to reach through the worker's tunnel.

:class:`SandboxAPI` serves :class:`~levers9.worker.sandboxes.Sandboxes` on ``127.0.0.1`` at an
ephemeral port, with uvicorn in the worker's own event loop (no thread, no signal handlers of its own).
The controlplane reaches it the way the gateway reaches a box's port: through the worker's tunnel
(:mod:`levers9.worker.tunnel`) to an address on the worker's loopback.

The switch: a worker serves it only when its pool's ``sandboxes`` is a positive count (the most sandboxes
at once; the controlplane sends it at registration as ``max_sandboxes``) or ``LEVERS9_SANDBOXES`` on the
worker says so (it wins). :class:`levers9.worker.session.WorkerProcess` opens it with its pool and closes it,
ending every sandbox, before the pool. Unset, the default, nothing is served and nothing changes for
existing pools. Every session the worker opens starts by announcing the port and the secret
(``WorkerMessage.sandbox_api``), and the controlplane keeps them for the replicas that relay to it
(:mod:`levers9.services.sandbox_hosts`).

Every request carries ``Authorization: Bearer <secret>``, the per-worker secret made when the API
starts (:attr:`SandboxAPI.secret`; never logged, compared in constant time); anything else is 401
before any route runs. A request may name its workspace in the ``Levers9-Workspace`` header: a
sandbox of another workspace is then not found (404), as if it did not exist.

Routes (JSON in and out; ``{id}`` a sandbox, ``{process}`` the sandbox's own process id):

=======================================  ===============================================================
``POST /sandboxes``                      create: the fields of :class:`~levers9.worker.sandboxes.SandboxSpec`
                                         (``secrets`` for ``secret_env``); 201 and the sandbox's info
``GET /sandboxes``                       ``{"sandboxes": [info...]}``, the running ones
``GET /sandboxes/{id}``                  its info, ended ones too (``state``, ``reason``)
``DELETE /sandboxes/{id}``               terminate; its info
``POST /sandboxes/{id}/ttl``             ``{"seconds": s}``: it ends ``s`` from now (0: no deadline)
``POST /sandboxes/{id}/processes``       ``{"argv": [...]}`` or ``{"code": "..."}``, ``cwd``, ``env``;
                                         201 ``{"process", "pid", "argv"}``; with ``?wait=true`` 201 NDJSON:
                                         that object as the first line, then the process's output as
                                         ``.../output`` gives it, to its exit line (its output is this
                                         answer's: another reader is 409 ``OutputBusy``)
``GET /sandboxes/{id}/processes``        ``{"processes": [status...]}``
``GET .../processes/{process}``          its status (:class:`~levers9.runner.sandbox_wire.ProcessInfo`)
``POST .../processes/{process}/kill``    ``{"signal": n}`` (default SIGKILL); ``{"running": bool}``
``GET .../processes/{process}/output``   NDJSON, a line per piece of output as it comes:
                                         ``{"stream", "data", "encoding": "utf-8"|"base64", "partial"}``,
                                         then ``{"exit": code}`` (or ``{"error": {...}}`` if the sandbox
                                         went first)
``PUT /sandboxes/{id}/files?path=``      the body, streamed into the file (created or replaced); ``{"size"}``
``GET /sandboxes/{id}/files?path=``      the file, streamed (``application/octet-stream``)
``DELETE /sandboxes/{id}/files?path=``   ``&recursive=true`` for a directory and all it holds
``GET .../files/stat?path=``             ``{"entry": {...}}`` (:class:`~levers9.runner.sandbox_wire.FileEntry`)
``GET .../files/list?path=``             ``{"entries": [...]}``
``POST .../files/mkdir?path=``           ``&parents=false`` to need the parent
``POST /sandboxes/{id}/image``           ``{"repository": "<prefix>/<workspace>/<name>"}``: its filesystem
                                         made an image there (it runs on; :mod:`~levers9.worker.sandbox_images`):
                                         201 ``{"image": ref@digest, "size_bytes": n, "layers": n}``
``POST /sandboxes/{id}/snapshots``       snapshot it (memory and files; it runs on): 201 ``{"snapshot": {...}}``
                                         (:class:`~levers9.worker.sandbox_snapshots.SnapshotInfo`); a create
                                         whose body has ``"snapshot": {...}`` (that object) restores it, one
                                         with ``"snapshots": true`` can be snapshotted
``DELETE /snapshots?key=``               remove a stored snapshot (its ``key``); ``{}``
=======================================  ===============================================================

A process's output is handed out once: one reader at a time (another is 409 ``OutputBusy``), and a
piece sent to a reader that then hung up is not sent again. Files go through in chunks of
``sandbox_wire.FILE_CHUNK_BYTES`` both ways: no file is held whole in the worker's memory.

Errors are ``{"error": {"code", "message", "path"}}``: 401 ``Unauthorized``; 404 ``SandboxNotFound``,
``ENOENT``, ``NoSuchProcess``; 409 ``SandboxEnded`` (terminated, timed out, idle; the message says which),
``SandboxGone`` (its container died), ``OutputBusy``, ``EEXIST``; 400 ``BadPath`` (not absolute, NUL, or a
``..`` that would leave the sandbox's root), ``BadRequest`` (a field; named), other errno names; 403
``EACCES``/``EPERM``; 429 ``TooManyProcesses``; 503 ``SandboxesFull``; 502 ``StartFailed``. Snapshots: 409
``SandboxBusy`` (a snapshot is being taken), ``SnapshotUnavailable`` (not created for snapshots, no
checkpoint storage, or a runtime that cannot checkpoint here); 404 ``SnapshotMissing`` (not in the
storage); 502 ``SnapshotFailed``; a snapshot of another runtime is 400 ``BadRequest`` naming both.
Images: 400 ``BadRequest`` naming ``repository`` (missing, not a valid name, or not the workspace's);
409 ``CommitUnavailable`` (the ``host`` image, a tag, a path that is no OCI layout, naming ``image``; a
worker with no registry; another image of it being made); 502 ``CommitFailed`` (the runtime or the
registry failed; its cause quoted).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import secrets
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from levers9.runner import sandbox_wire as wire
from levers9.worker.sandbox_images import CommitFailed, CommitUnavailable
from levers9.worker.sandbox_snapshots import SnapshotFailed, SnapshotInfo, SnapshotUnavailable
from levers9.worker.sandboxes import (
    Sandbox,
    SandboxBusy,
    SandboxEnded,
    Sandboxes,
    SandboxesFull,
    SandboxNotFound,
    SandboxRefused,
    SandboxSpec,
    StartFailed,
)
from levers9.worker.volumes import VolumeSpec
from levers9.worker.warm.sandbox_client import SandboxError, SandboxGone, SandboxProcess, SandboxSession

__all__ = ["WORKSPACE_HEADER", "SandboxAPI"]

log = logging.getLogger(__name__)

WORKSPACE_HEADER = "levers9-workspace"
#: the largest JSON body a request other than a file upload may have
MAX_JSON_BYTES = 1024 * 1024

_STATUS = {
    "SandboxNotFound": 404,
    "ENOENT": 404,
    "NoSuchProcess": 404,
    "SandboxEnded": 409,
    "SandboxGone": 409,
    "OutputBusy": 409,
    "EEXIST": 409,
    "ENOTEMPTY": 409,
    "EACCES": 403,
    "EPERM": 403,
    "TooManyProcesses": 429,
    "SandboxesFull": 503,
    "StartFailed": 502,
    "SandboxBusy": 409,
    "SnapshotUnavailable": 409,
    "SnapshotMissing": 404,
    "SnapshotFailed": 502,
    "CommitUnavailable": 409,
    "CommitFailed": 502,
    "Unauthorized": 401,
}

Handler = Callable[[Request], Awaitable[Response]]


class BadInput(Exception):
    """A request's field is missing or wrong; ``code`` is BadRequest or BadPath."""

    def __init__(self, message: str, code: str = "BadRequest", path: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.path = path


class SandboxAPI:
    """The loopback HTTP API over ``sandboxes``; :meth:`start` it, read :attr:`url` and :attr:`secret`, :meth:`close`."""

    def __init__(self, sandboxes: Sandboxes, *, secret: str | None = None) -> None:
        self.sandboxes = sandboxes
        self.secret = secret or secrets.token_urlsafe(32)
        self.port = 0
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        routes = [
            Route("/sandboxes", self._guard(self.create), methods=["POST"]),
            Route("/sandboxes", self._guard(self.list_sandboxes), methods=["GET"]),
            Route("/sandboxes/{id}", self._guard(self.info), methods=["GET"]),
            Route("/sandboxes/{id}", self._guard(self.terminate), methods=["DELETE"]),
            Route("/sandboxes/{id}/ttl", self._guard(self.ttl), methods=["POST"]),
            Route("/sandboxes/{id}/processes", self._guard(self.exec), methods=["POST"]),
            Route("/sandboxes/{id}/processes", self._guard(self.processes), methods=["GET"]),
            Route("/sandboxes/{id}/processes/{process:int}", self._guard(self.status), methods=["GET"]),
            Route("/sandboxes/{id}/processes/{process:int}/kill", self._guard(self.kill), methods=["POST"]),
            Route("/sandboxes/{id}/processes/{process:int}/output", self._guard(self.output), methods=["GET"]),
            Route("/sandboxes/{id}/files", self._guard(self.put_file), methods=["PUT"]),
            Route("/sandboxes/{id}/files", self._guard(self.get_file), methods=["GET"]),
            Route("/sandboxes/{id}/files", self._guard(self.delete_file), methods=["DELETE"]),
            Route("/sandboxes/{id}/files/stat", self._guard(self.stat), methods=["GET"]),
            Route("/sandboxes/{id}/files/list", self._guard(self.list_files), methods=["GET"]),
            Route("/sandboxes/{id}/files/mkdir", self._guard(self.mkdir), methods=["POST"]),
            Route("/sandboxes/{id}/image", self._guard(self.commit), methods=["POST"]),
            Route("/sandboxes/{id}/snapshots", self._guard(self.snapshot), methods=["POST"]),
            Route("/snapshots", self._guard(self.delete_snapshot), methods=["DELETE"]),
        ]
        self.app: ASGIApp = _Authorized(Starlette(routes=routes), self.secret)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> int:
        """Listen on 127.0.0.1 at an ephemeral port; the port."""
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = _Server(config)
        self._task = asyncio.ensure_future(self._server.serve())
        self._task.set_name("levers9-sandbox-api")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError("the sandbox API stopped before it listened")
            await asyncio.sleep(0.005)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        log.info("the sandbox API listens on %s", self.url)
        return self.port

    async def close(self) -> None:
        """Stop serving (streams in progress end); the sandboxes are :class:`Sandboxes`'s to close."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
            if self._task is not None:
                await self._task

    # ----------------------------------------------------------------- routes: sandboxes

    async def create(self, request: Request) -> Response:
        body = await _json(request)
        spec = _spec(body, request.headers.get(WORKSPACE_HEADER))
        sandbox = await self.sandboxes.create(spec)
        return JSONResponse(sandbox.info(), status_code=201)

    async def list_sandboxes(self, request: Request) -> Response:
        listed = self.sandboxes.running(request.headers.get(WORKSPACE_HEADER))
        return JSONResponse({"sandboxes": [s.info() for s in listed]})

    async def info(self, request: Request) -> Response:
        return JSONResponse(self.sandboxes.get(request.path_params["id"], request.headers.get(WORKSPACE_HEADER)).info())

    async def terminate(self, request: Request) -> Response:
        ended = await self.sandboxes.terminate(request.path_params["id"], request.headers.get(WORKSPACE_HEADER))
        return JSONResponse(ended.info())

    async def ttl(self, request: Request) -> Response:
        seconds = _number(await _json(request), "seconds")
        sandbox = self.sandboxes.update_ttl(request.path_params["id"], seconds, request.headers.get(WORKSPACE_HEADER))
        return JSONResponse(sandbox.info())

    async def snapshot(self, request: Request) -> Response:
        taken = await self.sandboxes.snapshot(request.path_params["id"], request.headers.get(WORKSPACE_HEADER))
        return JSONResponse({"snapshot": taken.fields()}, status_code=201)

    async def delete_snapshot(self, request: Request) -> Response:
        key = request.query_params.get("key")
        if not key:
            raise BadInput("key is missing; give the snapshot's key (?key=sandbox-snapshots/<workspace>/<id>)")
        await self.sandboxes.delete_snapshot(key, request.headers.get(WORKSPACE_HEADER))
        return JSONResponse({})

    async def commit(self, request: Request) -> Response:
        body = await _json(request)
        unknown = sorted(set(body) - {"repository"})
        if unknown:
            raise BadInput(f"unknown fields {unknown}; an image takes ['repository']")
        made = await self.sandboxes.commit(
            request.path_params["id"], request.headers.get(WORKSPACE_HEADER), body.get("repository")
        )
        return JSONResponse(made.fields(), status_code=201)

    # ----------------------------------------------------------------- routes: processes

    async def exec(self, request: Request) -> Response:
        wait = _flag(request, "wait", False)
        sandbox, session = self._use(request)
        body = await _json(request)
        cwd = body.get("cwd") or sandbox.spec.workdir
        if not isinstance(cwd, str):
            raise BadInput(f"cwd is {type(cwd).__name__}; give an absolute path")
        env = _strings(body.get("env") or {}, "env")
        with self.sandboxes.held(sandbox):
            if "code" in body:
                code = body["code"]
                if not isinstance(code, str):
                    raise BadInput(f"code is {type(code).__name__}; give the Python source as a string")
                process = await session.run_code(code, cwd=cwd, env=env)
            else:
                argv = body.get("argv")
                if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                    raise BadInput("give argv, a non-empty list of strings (the program and its arguments), or code")
                process = await session.exec(*argv, cwd=cwd, env=env)
        sandbox.processes[process.id] = process
        started = {"process": process.id, "pid": process.pid, "argv": process.argv}
        if not wait:
            return JSONResponse(started, status_code=201)
        # its output is this answer's from the start: no other reader can take a piece of it first
        sandbox.reading.add(process.id)
        lines = self._lines(sandbox, process.id, process, first=_line(started))
        return StreamingResponse(lines, status_code=201, media_type="application/x-ndjson")

    async def processes(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        with self.sandboxes.held(sandbox):
            listed = await session.list_processes()
        return JSONResponse({"processes": [p.fields() for p in listed]})

    async def status(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        with self.sandboxes.held(sandbox):
            found = await session.status(request.path_params["process"])
        return JSONResponse(found.fields())

    async def kill(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        body = await _json(request)
        sig = body.get("signal", int(signal.SIGKILL))
        if wire.signal_number(sig) is None:
            raise BadInput(f"signal is {sig!r}; give a signal's number (9 for SIGKILL, 15 for SIGTERM)")
        with self.sandboxes.held(sandbox):
            running = await session.kill(request.path_params["process"], sig)
        return JSONResponse({"running": running})

    async def output(self, request: Request) -> Response:
        sandbox, _ = self._use(request)
        number = request.path_params["process"]
        process = sandbox.processes.get(number)
        if process is None:
            raise SandboxError("output", "NoSuchProcess", f"no process {number} was started in {sandbox.id}")
        if number in sandbox.reading:
            raise SandboxError("output", "OutputBusy", f"the output of process {number} is being read already")
        sandbox.reading.add(number)
        return StreamingResponse(self._lines(sandbox, number, process), media_type="application/x-ndjson")

    async def _lines(
        self, sandbox: Sandbox, number: int, process: SandboxProcess, *, first: bytes = b""
    ) -> AsyncIterator[bytes]:
        """The process's output as NDJSON lines to its exit line (``first`` before them); the caller marked
        ``number`` as being read, and it is unmarked here however the stream ends."""
        try:
            if first:
                yield first
            with self.sandboxes.held(sandbox):
                try:
                    async for chunk in process.output():
                        yield _line(_chunk(chunk.stream, chunk.data, chunk.partial))
                    yield _line({"exit": await process.wait()})
                except SandboxGone as exc:
                    yield _line({"error": {"code": "SandboxGone", "message": str(exc), "path": ""}})
        finally:
            sandbox.reading.discard(number)

    # ----------------------------------------------------------------- routes: files

    async def put_file(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        path = _path(request)
        mode = request.query_params.get("mode")
        bits = _mode(mode) if mode is not None else None
        size, first, buffer = 0, True, bytearray()
        with self.sandboxes.held(sandbox):
            async for part in request.stream():
                buffer += part
                while len(buffer) >= wire.FILE_CHUNK_BYTES:
                    chunk = bytes(buffer[: wire.FILE_CHUNK_BYTES])
                    del buffer[: wire.FILE_CHUNK_BYTES]
                    size = await session.write_file(path, chunk, mode=bits, append=not first)
                    first = False
            if buffer or first:
                size = await session.write_file(path, bytes(buffer), mode=bits, append=not first)
        return JSONResponse({"size": size})

    async def get_file(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        path = _path(request)
        chunks = session.read_chunks(path).__aiter__()
        with self.sandboxes.held(sandbox):
            first = await chunks.__anext__()  # a file that cannot be read is an error, not an empty body

        async def body() -> AsyncIterator[bytes]:
            with self.sandboxes.held(sandbox):
                yield first
                async for chunk in chunks:
                    yield chunk

        return StreamingResponse(body(), media_type="application/octet-stream")

    async def delete_file(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        path = _path(request)
        with self.sandboxes.held(sandbox):
            await session.delete_file(path, recursive=_flag(request, "recursive", False))
        return JSONResponse({})

    async def stat(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        path = _path(request)
        with self.sandboxes.held(sandbox):
            entry = await session.stat_file(path)
        return JSONResponse({"entry": entry.fields()})

    async def list_files(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        path = _path(request)
        with self.sandboxes.held(sandbox):
            entries = await session.list_files(path)
        return JSONResponse({"entries": [e.fields() for e in entries]})

    async def mkdir(self, request: Request) -> Response:
        sandbox, session = self._use(request)
        path = _path(request)
        with self.sandboxes.held(sandbox):
            await session.create_directory(path, parents=_flag(request, "parents", True))
        return JSONResponse({})

    # ----------------------------------------------------------------- plumbing

    def _use(self, request: Request) -> tuple[Sandbox, SandboxSession]:
        return self.sandboxes.use(request.path_params["id"], request.headers.get(WORKSPACE_HEADER))

    def _guard(self, handler: Handler) -> Handler:
        """The handler, its errors answered as JSON with a code and a status."""

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except BadInput as exc:
                return _error(exc.code, str(exc), exc.path)
            except SandboxGone as exc:
                return _error("SandboxGone", str(exc))
            except SandboxError as exc:
                return _error(exc.code, str(exc), exc.path)
            except SandboxRefused as exc:
                return _error("BadRequest", str(exc))
            except (CommitUnavailable, CommitFailed) as exc:
                return _error(type(exc).__name__, str(exc))
            except (
                SandboxNotFound,
                SandboxEnded,
                SandboxesFull,
                StartFailed,
                SandboxBusy,
                SnapshotUnavailable,
                SnapshotFailed,
            ) as exc:
                return _error(type(exc).__name__, str(exc))

        return guarded


class _Authorized:
    """Answers 401 to a request without the bearer secret, before any route runs."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self._expected = f"Bearer {secret}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                message = "this API needs the worker's sandbox secret: Authorization: Bearer <secret>"
                await _error("Unauthorized", message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Server(uvicorn.Server):
    """uvicorn without signal handlers of its own: the worker decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _error(code: str, message: str, path: str = "") -> JSONResponse:
    status = _STATUS.get(code, 400)
    return JSONResponse({"error": {"code": code, "message": message, "path": path}}, status_code=status)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _chunk(stream: str, data: bytes, partial: bool) -> dict[str, Any]:
    try:
        return {"stream": stream, "data": data.decode(), "encoding": "utf-8", "partial": partial}
    except UnicodeDecodeError:
        encoded = base64.b64encode(data).decode()
        return {"stream": stream, "data": encoded, "encoding": "base64", "partial": partial}


async def _json(request: Request) -> dict[str, Any]:
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_JSON_BYTES:
            raise BadInput(f"the request's body is over {MAX_JSON_BYTES} bytes")
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadInput(f"the request's body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadInput(f"the request's body is a JSON {type(body).__name__}; send an object")
    return body


def _path(request: Request) -> str:
    """The ``path`` query parameter: absolute, and never leaving the sandbox's root by ``..``."""
    path = request.query_params.get("path")
    if path is None:
        raise BadInput("the query parameter path is missing; give an absolute path inside the sandbox")
    why = wire.bad_path(path)
    if why is None and ".." in path.split("/"):
        why = f"the path {path!r} holds '..', which could lead outside the sandbox's root; give it without"
    if why is not None:
        raise BadInput(why, "BadPath", path)
    return path


def _flag(request: Request, name: str, default: bool) -> bool:
    value = request.query_params.get(name)
    if value is None:
        return default
    if value not in ("true", "false", "1", "0"):
        raise BadInput(f"the query parameter {name} is {value!r}; give true or false")
    return value in ("true", "1")


def _mode(value: str) -> int:
    try:
        bits = int(value, 8)
    except ValueError:
        bits = -1
    if not 0 <= bits <= 0o7777:
        raise BadInput(f"the query parameter mode is {value!r}; give permission bits in octal (644)")
    return bits


def _number(body: dict[str, Any], name: str) -> float:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"{name} is {value!r}; give a number of seconds")
    return float(value)


def _strings(value: object, name: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadInput(f"{name} must be an object of strings to strings")
    return value


_SPEC_FIELDS: dict[str, type | tuple[type, ...]] = {
    "image": str,
    "python_version": str,
    "cpu_millicores": int,
    "memory_mib": int,
    "gpu_count": int,
    "timeout_s": (int, float),
    "idle_timeout_s": (int, float),
    "workdir": str,
    "name": str,
    "block_network": bool,
    "snapshots": bool,
}


_VOLUME_FIELDS: dict[str, type] = {
    "mount_path": str,
    "volume_id": str,
    "volume_name": str,
    "read_only": bool,
    "webdav_url": str,
    "webdav_token": str,
    "bucket": str,
    "endpoint": str,
    "region": str,
    "force_path_style": bool,
    "access_key_id": str,
    "secret_access_key": str,
}


def _volumes(given: object) -> tuple[VolumeSpec, ...]:
    """A create's ``volumes``: each the workspace's volume as the controlplane resolved it (its id, and the WebDAV
    URL and this worker's token for it when the worker does not mount the volumes' file system itself), or a
    cloud bucket with its store and keys (for the worker's mount of it alone)."""
    if not isinstance(given, list) or not all(isinstance(v, dict) for v in given):
        raise BadInput("volumes must be a list of objects, each with mount_path and volume_id")
    out = []
    for volume in given:
        unknown = sorted(set(volume) - set(_VOLUME_FIELDS))
        if unknown:
            raise BadInput(f"volumes: unknown fields {unknown}; a volume takes {sorted(_VOLUME_FIELDS)}")
        for name, kind in _VOLUME_FIELDS.items():
            if name in volume and not isinstance(volume[name], kind):
                raise BadInput(f"volumes: {name} is {volume[name]!r}, of the wrong type")
        out.append(VolumeSpec(**volume))
    return tuple(out)


def _spec(body: dict[str, Any], workspace: str | None) -> SandboxSpec:
    """A :class:`SandboxSpec` from a create request's body, each field checked by name."""
    known = {*_SPEC_FIELDS, "workspace_id", "env", "secrets", "ports", "allow_list", "snapshot", "volumes"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadInput(f"unknown fields {unknown}; a sandbox takes {sorted(known)}")
    workspace_id = body.get("workspace_id", workspace)
    if not isinstance(workspace_id, str) or not workspace_id:
        raise BadInput("workspace_id is missing; give it in the body or the Levers9-Workspace header")
    if workspace is not None and workspace_id != workspace:
        raise BadInput(f"workspace_id {workspace_id!r} is not the request's workspace {workspace!r}")
    fields: dict[str, Any] = {}
    for name, kind in _SPEC_FIELDS.items():
        if name in body:
            value = body[name]
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise BadInput(f"{name} is {value!r}, of the wrong type")
            fields[name] = value
    ports = body.get("ports", [])
    if not isinstance(ports, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports):
        raise BadInput("ports must be a list of port numbers")
    allow = body.get("allow_list", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise BadInput("allow_list must be a list of strings")
    snapshot: SnapshotInfo | None = None
    if body.get("snapshot") is not None:
        try:
            snapshot = SnapshotInfo.of(body["snapshot"])
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    return SandboxSpec(
        workspace_id=workspace_id,
        snapshot=snapshot,
        volumes=_volumes(body.get("volumes", [])),
        env=_strings(body.get("env", {}), "env"),
        secret_env=_strings(body.get("secrets", {}), "secrets"),
        ports=tuple(ports),
        allow_list=tuple(allow),
        **fields,
    )
