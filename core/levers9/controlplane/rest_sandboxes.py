"""The REST API's sandbox routes under ``/api/v1/sandboxes``: each parses its request and relays it through
:class:`~levers9.services.sandboxes.SandboxService`, which decides; answers come back as they come.

Bodies are JSON but a file's (``PUT .../files``: the file's bytes, streamed both ways); a process's output is
NDJSON, streamed as the process writes. Errors are the API's error body with the types
:data:`levers9.services.sandboxes.ERROR_TYPES` lists (``sandbox_not_found``, ``sandbox_gone``...), from the
app's handler for :class:`~levers9.services.sandboxes.SandboxProblem`. The REST app served alone (no
workers' tunnels) answers what it can from the records, and a sandbox's worker as unreachable.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as FastPath
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from levers9.controlplane.rest_routes import ALWAYS, USER_ERRORS, Member, Responses, Viewer
from levers9.controlplane.rest_schemas import ErrorBody
from levers9.services.agent_pools.clusters import MAX_GPUS, MAX_IDLE_S, MAX_MEMORY_MIB
from levers9.services.sandboxes import Relayed, SandboxService

__all__ = ["router", "snapshots_router"]

router = APIRouter(prefix="/api/v1/sandboxes", tags=["sandboxes"], responses={**ALWAYS, **USER_ERRORS})


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


_SANDBOX_ERRORS: Responses = {
    404: _error("No sandbox of that id in this workspace (`sandbox_not_found`), process or file"),
    409: _error("The sandbox ended (`sandbox_ended`) or its container or worker died (`sandbox_gone`)"),
    502: _error("Its worker cannot be reached (`worker_unreachable`) or its container did not start"),
    503: _error("No worker of a pool with sandboxes took it (`no_sandbox_worker`)"),
}


#: the bounds of the numbers the sandbox routes take (the worker's own limits, or above them)
MAX_MILLICORES = 1_000_000
MAX_SECONDS = 10_000_000
MAX_PROCESS = 2**31 - 1


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BucketIn(_In):
    read_only: bool = False
    force_path_style: bool = False
    access_key: str = Field("", description="The name of the workspace secret holding the access key id")
    secret_key: str = Field("", description="The name of the workspace secret holding the secret access key")
    endpoint: str = Field("", description="An S3-compatible store's http(s)://HOST[:PORT]; empty: AWS S3")
    region: str = Field("", max_length=64)


class VolumeIn(_In):
    name: str = Field(
        min_length=1, description="One of the workspace's volumes (made when new, as a function's), or a bucket's name"
    )
    mount_path: str = Field(description="Where the sandbox sees it: an absolute path other than /")
    read_only: bool = False
    bucket: BucketIn | None = Field(None, description="Set for a cloud bucket (S3 or compatible) named by name")


class SandboxCreate(_In):
    image: str | None = Field(None, description="An image reference (a built blueprint's); default: the worker's own")
    python_version: str | None = Field(None, description="The image's Python, such as 3.11")
    cpu_millicores: int | None = Field(None, ge=1, le=MAX_MILLICORES, description="Default 1000")
    memory_mib: int | None = Field(None, ge=16, le=MAX_MEMORY_MIB, description="Default 1024")
    gpu: list[str] | str | None = Field(
        None,
        description="GPU types in order of preference (the first with a free GPU), 'any', or a list ending in "
        "'cpu' to run without a GPU when none can be had; as a function's gpu",
    )
    gpu_count: int | None = Field(None, ge=0, le=MAX_GPUS, description="GPUs it takes; 1 when gpu is given alone")
    env: dict[str, str] | None = None
    secrets: list[str] | None = Field(None, description="Names of the workspace's secrets, set as variables")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = Field(
        None, description="Ports a server in the sandbox listens on"
    )
    block_network: bool | None = None
    allow_list: list[str] | None = None
    timeout_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS, description="Seconds it lives; 0: until terminated. Default 300"
    )
    idle_timeout_s: float | None = Field(
        None, ge=0, le=MAX_IDLE_S, description="Seconds unused before it ends; 0: never"
    )
    workdir: str | None = None
    name: str | None = None
    pool: str | None = Field(None, description="Default: every pool with sandboxes, by priority")
    snapshots: bool | None = Field(None, description="Boot it so that it can be snapshotted (snapshot_memory)")
    volumes: list[VolumeIn] | None = Field(None, description="The workspace's volumes it mounts")
    snapshot: str | None = Field(None, description="A snapshot's id: the sandbox resumes from it, processes running")


class TtlIn(_In):
    seconds: float = Field(ge=0, le=MAX_SECONDS, description="It ends this many seconds from now; 0: no deadline")


class ExecIn(_In):
    argv: list[str] | None = Field(None, min_length=1, description="The program and its arguments")
    code: str | None = Field(None, description="Python source, run with the sandbox's python")
    cwd: str | None = None
    env: dict[str, str] | None = None


class KillIn(_In):
    signal: int = Field(9, ge=1, le=64)


async def _service(request: Request) -> SandboxService:  # async: FastAPI runs a plain def in a thread
    service: SandboxService = request.app.state.sandboxes
    return service


Service = Annotated[SandboxService, Depends(_service)]
#: a process's number in its sandbox (1, 2, ...)
ProcessId = Annotated[int, FastPath(ge=1, le=MAX_PROCESS)]
PathQuery = Annotated[str, Query(description="An absolute path inside the sandbox")]


def _json(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_none=True).encode()


async def _answer(relayed: Relayed) -> Response:
    body = b""
    async for piece in relayed.body:
        body += piece
    return Response(body, status_code=relayed.status, media_type=relayed.content_type or "application/json")


@router.post("", status_code=201, responses=_SANDBOX_ERRORS)
async def create_sandbox(service: Service, principal: Member, body: SandboxCreate) -> JSONResponse:
    """Start a sandbox on a worker of a pool with sandboxes; its info."""
    info = await service.create(principal, body.model_dump(exclude_none=True))
    return JSONResponse(info, status_code=201)


@router.get("", responses=_SANDBOX_ERRORS)
async def list_sandboxes(
    service: Service, principal: Viewer, all: Annotated[bool, Query(description="Ended ones too")] = False
) -> JSONResponse:
    """The workspace's sandboxes, oldest first."""
    return JSONResponse({"sandboxes": await service.list(principal, include_ended=all)})


@router.get("/{sandbox_id}", responses=_SANDBOX_ERRORS)
async def get_sandbox(service: Service, principal: Viewer, sandbox_id: str) -> JSONResponse:
    """Its info: ``state`` (starting, running, ended, gone) and why it ended."""
    return JSONResponse(await service.get(principal, sandbox_id))


@router.delete("/{sandbox_id}", responses=_SANDBOX_ERRORS)
async def terminate_sandbox(service: Service, principal: Member, sandbox_id: str) -> JSONResponse:
    """End it now: its processes, its container and its files go."""
    return JSONResponse(await service.terminate(principal, sandbox_id))


@router.post("/{sandbox_id}/ttl", responses=_SANDBOX_ERRORS)
async def update_ttl(service: Service, principal: Member, sandbox_id: str, body: TtlIn) -> Response:
    """A new deadline, counted from now."""
    return await _answer(await service.relay(principal, sandbox_id, "POST", "/ttl", body=_json(body)))


@router.post(
    "/{sandbox_id}/processes",
    status_code=201,
    responses={
        **_SANDBOX_ERRORS,
        201: {
            "content": {"application/json": {}, "application/x-ndjson": {}},
            "description": "Started: ``{process, pid, argv}``; with ``wait``, that object as the first NDJSON line, "
            "then its output as the output route gives it, to its exit line",
        },
    },
)
async def exec_process(
    service: Service,
    principal: Member,
    sandbox_id: str,
    body: ExecIn,
    wait: Annotated[
        bool, Query(description="Answer NDJSON: the process, then its output as it comes, to its exit")
    ] = False,
) -> Response:
    """Start a process (``argv``) or Python code (``code``); its id in the sandbox. With ``wait`` one request
    does what exec then the output route do: its output is this answer's (another reader is refused)."""
    if not wait:
        return await _answer(await service.relay(principal, sandbox_id, "POST", "/processes", body=_json(body)))
    relayed = await service.relay(
        principal, sandbox_id, "POST", "/processes?wait=true", body=_json(body), streamed=True
    )
    return StreamingResponse(relayed.body, status_code=201, media_type="application/x-ndjson")


@router.get("/{sandbox_id}/processes", responses=_SANDBOX_ERRORS)
async def list_processes(service: Service, principal: Viewer, sandbox_id: str) -> Response:
    """The processes started in it, running or ended."""
    return await _answer(await service.relay(principal, sandbox_id, "GET", "/processes"))


@router.get("/{sandbox_id}/processes/{process}", responses=_SANDBOX_ERRORS)
async def process_status(service: Service, principal: Viewer, sandbox_id: str, process: ProcessId) -> Response:
    """Whether it runs, and its exit code once it ended."""
    return await _answer(await service.relay(principal, sandbox_id, "GET", f"/processes/{process}"))


@router.post("/{sandbox_id}/processes/{process}/kill", responses=_SANDBOX_ERRORS)
async def kill_process(
    service: Service, principal: Member, sandbox_id: str, process: ProcessId, body: KillIn
) -> Response:
    """Send it a signal (default SIGKILL)."""
    path = f"/processes/{process}/kill"
    return await _answer(await service.relay(principal, sandbox_id, "POST", path, body=_json(body)))


@router.get(
    "/{sandbox_id}/processes/{process}/output",
    response_class=StreamingResponse,
    responses={**_SANDBOX_ERRORS, 200: {"content": {"application/x-ndjson": {}}, "description": "Its output"}},
)
async def process_output(service: Service, principal: Viewer, sandbox_id: str, process: ProcessId) -> StreamingResponse:
    """Its output as it comes, a JSON line per piece (``stream``, ``data``, ``encoding``, ``partial``), then
    ``{"exit": code}``, or ``{"error": {...}}`` when the sandbox went first."""
    path = f"/processes/{process}/output"
    relayed = await service.relay(principal, sandbox_id, "GET", path, streamed=True)
    return StreamingResponse(relayed.body, media_type="application/x-ndjson")


@router.post("/{sandbox_id}/ports/{port}", responses=_SANDBOX_ERRORS)
async def expose_port(
    service: Service,
    principal: Member,
    sandbox_id: str,
    port: Annotated[int, FastPath(ge=1, le=65535)],
    request: Request,
) -> JSONResponse:
    """Serve one of the ports declared at create through the gateway; ``url`` takes the workspace's token
    (``Authorization: Bearer``), which is not passed on to the sandbox. 409 ``port_not_listening`` when
    nothing in the sandbox accepts connections on it yet."""
    exposed = await service.expose(principal, sandbox_id, port)
    wheels = getattr(request.app.state, "wheels", None)
    base = (getattr(wheels, "http_url", "") or str(request.base_url)).rstrip("/")
    return JSONResponse({"port": port, "url": base + exposed["path"]})


@router.post("/{sandbox_id}/image", status_code=201, responses=_SANDBOX_ERRORS)
async def make_image(service: Service, principal: Member, sandbox_id: str) -> JSONResponse:
    """Its filesystem as it is now made an image in the workspace's repository of the controlplane's registry
    (it runs on): ``image`` (pinned by digest) is what a later sandbox's or function's ``image`` takes. 409
    ``image_unavailable`` for a sandbox of the worker's own filesystem (image ``host``)."""
    return JSONResponse(await service.make_image(principal, sandbox_id), status_code=201)


@router.post("/{sandbox_id}/snapshots", status_code=201, responses=_SANDBOX_ERRORS)
async def snapshot_sandbox(service: Service, principal: Member, sandbox_id: str) -> JSONResponse:
    """Snapshot its memory and files (it runs on; created with ``snapshots``); restore it with a create whose
    ``snapshot`` is the answer's ``id``, on any worker of the same pool."""
    return JSONResponse({"snapshot": await service.snapshot(principal, sandbox_id)}, status_code=201)


snapshots_router = APIRouter(
    prefix="/api/v1/sandbox-snapshots", tags=["sandboxes"], responses={**ALWAYS, **USER_ERRORS}
)


@snapshots_router.get("", responses=_SANDBOX_ERRORS)
async def list_snapshots(service: Service, principal: Viewer) -> JSONResponse:
    """The workspace's stored sandbox snapshots, oldest first."""
    return JSONResponse({"snapshots": await service.snapshots(principal)})


@snapshots_router.delete("/{snapshot_id}", responses=_SANDBOX_ERRORS)
async def delete_snapshot(service: Service, principal: Member, snapshot_id: str) -> JSONResponse:
    """Delete a snapshot: its object in the storage, then its record."""
    await service.delete_snapshot(principal, snapshot_id)
    return JSONResponse({})


def _files_path(what: str, path: str, **flags: bool | None) -> str:
    query = {"path": path, **{k: str(v).lower() for k, v in flags.items() if v is not None}}
    return f"/files{what}?{urlencode(query)}"


@router.put("/{sandbox_id}/files", responses=_SANDBOX_ERRORS)
async def put_file(service: Service, principal: Member, sandbox_id: str, path: PathQuery, request: Request) -> Response:
    """The request's body becomes the file (created or replaced), streamed."""
    relayed = await service.relay(
        principal,
        sandbox_id,
        "PUT",
        _files_path("", path),
        body=request.stream(),
        content_type="application/octet-stream",
    )
    return await _answer(relayed)


@router.get(
    "/{sandbox_id}/files",
    response_class=StreamingResponse,
    responses={**_SANDBOX_ERRORS, 200: {"content": {"application/octet-stream": {}}, "description": "The file"}},
)
async def get_file(service: Service, principal: Viewer, sandbox_id: str, path: PathQuery) -> StreamingResponse:
    """The file's bytes, streamed."""
    relayed = await service.relay(principal, sandbox_id, "GET", _files_path("", path), streamed=True)
    return StreamingResponse(relayed.body, media_type="application/octet-stream")


@router.delete("/{sandbox_id}/files", responses=_SANDBOX_ERRORS)
async def delete_file(
    service: Service, principal: Member, sandbox_id: str, path: PathQuery, recursive: bool = False
) -> Response:
    """Remove a file, or a directory with ``recursive``."""
    target = _files_path("", path, recursive=recursive or None)
    return await _answer(await service.relay(principal, sandbox_id, "DELETE", target))


@router.get("/{sandbox_id}/files/stat", responses=_SANDBOX_ERRORS)
async def stat_file(service: Service, principal: Viewer, sandbox_id: str, path: PathQuery) -> Response:
    """A file's or directory's entry: name, size, mode, whether a directory, when changed."""
    return await _answer(await service.relay(principal, sandbox_id, "GET", _files_path("/stat", path)))


@router.get("/{sandbox_id}/files/list", responses=_SANDBOX_ERRORS)
async def list_files(service: Service, principal: Viewer, sandbox_id: str, path: PathQuery) -> Response:
    """A directory's entries."""
    return await _answer(await service.relay(principal, sandbox_id, "GET", _files_path("/list", path)))


@router.post("/{sandbox_id}/files/mkdir", responses=_SANDBOX_ERRORS)
async def make_directory(
    service: Service, principal: Member, sandbox_id: str, path: PathQuery, parents: bool = True
) -> Response:
    """Make a directory (and its parents, unless ``parents=false``)."""
    target = _files_path("/mkdir", path, parents=None if parents else False)
    return await _answer(await service.relay(principal, sandbox_id, "POST", target))
