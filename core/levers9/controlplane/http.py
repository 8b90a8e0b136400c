"""The REST API under ``/api/v1``: what dashboards, scripts and operators use besides the SDK's gRPC.

Who may see what:

* every call but ``/health`` needs a *user* token; worker, agent and machine
  tokens are refused with 403, because their holders run other people's code
  and must not reach the API that manages it;
* a user token bound to a workspace sees only that workspace: its tokens, its
  tasks, the shared pools and its own attached cluster. Another workspace's
  task answers 404 exactly like a missing one, so ids cannot be probed;
* a user token bound to no workspace is an operator's: it manages workspaces,
  sees machines and every pool, but has no tasks of its own.

Secrets are write-only: their values go in and reach the functions that name
them, but no answer of this API ever carries one.

Errors are always ``{"error": {"type": ..., "message": ...}}``; which exception
becomes which status is decided in one table, :data:`ERRORS`. Every number a
request carries (path, query or body) is bounded, and one out of its bounds is
a 422 naming the field and, from :data:`ACCEPTED`, the range it takes: never a
500 from deeper down (an overflowing date, an integer the database cannot hold).
A method a path does not take is a 405 whose ``Allow`` names every method of
every route on that path. Each route's OpenAPI ``responses`` list every status
it can answer (see :mod:`levers9.controlplane.rest_routes`).
Every route calls one function of :mod:`levers9.services` (the same one
the gRPC call of that operation uses): this package only translates. The wire
models are in :mod:`levers9.controlplane.rest_schemas`, the routes in
:mod:`levers9.controlplane.rest_routes`; this module builds the app and answers
errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from levers9.__about__ import __version__
from levers9.controlplane.rest_auth import router as auth_api_router
from levers9.controlplane.rest_members import router as members_router
from levers9.controlplane.rest_routes import router
from levers9.controlplane.rest_sandboxes import MAX_MILLICORES, MAX_PROCESS, MAX_SECONDS, snapshots_router
from levers9.controlplane.rest_sandboxes import router as sandbox_router
from levers9.controlplane.rest_schemas import MAX_TASKS_LISTED, MAX_VERSION, ErrorDetail
from levers9.controlplane.rest_usage import router as usage_router
from levers9.controlplane.wheels import OwnWheels
from levers9.dashboard.auth_routes import router as auth_router
from levers9.dashboard.pages import SecuredPaths
from levers9.dashboard.routes import router as dashboard_router
from levers9.services.agent_pools.clusters import MAX_CPUS, MAX_GPUS, MAX_IDLE_S, MAX_MEMORY_MIB, MAX_WORKERS
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.errors import ERRORS, error_answer
from levers9.services.metrics import Metrics
from levers9.services.sandboxes import SandboxProblem, SandboxService
from levers9.services.volume_access import DAV_PREFIX, DavAccess
from levers9.services.workspaces import MAX_TOKEN_TTL_S
from levers9.volumes.webdav import WebDav

__all__ = ["ACCEPTED", "create_http_app"]

#: what each numeric field of a request accepts, by the location a validation error gives it; every numeric
#: field has an entry (a test reads the OpenAPI document to hold this), and an error on it names the range
ACCEPTED: dict[str, str] = {
    "body.ttl_s": f"a number of seconds above 0 and at most {MAX_TOKEN_TTL_S} (ten years); "
    "omit it for a token that never expires",
    "path.version": f"a whole number from 1 to {MAX_VERSION}",
    "body.gpu_count": f"a whole number up to {MAX_GPUS} (a cluster's pool: at least 1; omit it for 1 with a GPU)",
    "body.cpu": f"a number of CPU cores above 0 and at most {MAX_CPUS}",
    "body.memory": f"a whole number of MiB from 1 to {MAX_MEMORY_MIB}, or a size like 16GiB",
    "body.min_workers": f"a whole number from 0 to {MAX_WORKERS}",
    "body.max_workers": f"a whole number from 0 to {MAX_WORKERS}",
    "body.idle_timeout_s": f"a number of seconds from 0 to {MAX_IDLE_S:.0f} (30 days)",
    "query.limit": f"a whole number from 1 to {MAX_TASKS_LISTED}",
    # sandboxes
    "body.cpu_millicores": f"a whole number of millicores from 1 to {MAX_MILLICORES}",
    "body.memory_mib": f"a whole number of MiB from 16 to {MAX_MEMORY_MIB}",
    "body.timeout_s": f"a number of seconds from 0 (no deadline) to {MAX_SECONDS}",
    "body.seconds": f"a number of seconds from 0 (no deadline) to {MAX_SECONDS}",
    "body.signal": "a signal's number, from 1 to 64",
    "path.process": f"a process's number in its sandbox, from 1 to {MAX_PROCESS}",
    "path.port": "a port, from 1 to 65535",
}


# --------------------------------------------------------------------------- errors


def _error(
    status: int, kind: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    detail = ErrorDetail(type=kind, message=message, **extra)
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse({"error": detail.model_dump(exclude_none=True)}, status_code=status, headers=headers)


async def _domain_error(request: Request, exc: Exception) -> Response:
    answer = error_answer(exc)
    if answer is None:
        raise exc
    status, kind = answer
    return _error(status, kind, str(exc))


def _location(loc: tuple[int | str, ...] | list[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "request"


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    fields = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid":
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            reason = (err.get("ctx") or {}).get("error", "")
            fields.append({"field": "body", "message": f"not valid JSON{where}: {reason}".rstrip(": ")})
        else:
            where = _location(loc)
            message = str(err.get("msg", "invalid"))
            if err.get("type") == "value_error":  # our own validators' messages, without pydantic's prefix
                message = str((err.get("ctx") or {}).get("error", message))
            field = {"field": where, "message": message}
            accepted = ACCEPTED.get(where)
            if accepted is not None:
                field["message"] = f"{message} (accepted: {accepted})"
                field["accepted"] = accepted
            fields.append(field)
    message = "; ".join(f"{f['field']}: {f['message']}" for f in fields) or "the request is not valid"
    return _error(422, "validation_error", message, fields=fields)


_HTTP_TYPES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


def _routes(routes: Iterable[Any]) -> Iterator[Any]:
    """Every route, those of included routers too: FastAPI 0.165 keeps an included router as one entry
    whose routes are its ``effective_route_contexts`` (each with ``matches`` and ``methods``, as a route has)."""
    for route in routes:
        nested = getattr(route, "effective_route_contexts", None)
        if nested is not None:
            yield from nested()
        else:
            yield route


def _allowed(request: Request) -> str:
    """Every method the request's path takes, over all the routes of that path (the router's own 405 names
    only the first route's, so a path with a GET and a POST route answered a PUT with ``Allow: GET``)."""
    methods: set[str] = set()
    for route in _routes(request.app.router.routes):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's "error parsing the body": JSON nested too deeply
        message = "body: not valid JSON: its arrays and objects nest too deeply (a few hundred levels at most)"
        return _error(422, "validation_error", message, fields=[{"field": "body", "message": message[6:]}])
    if exc.status_code == 405:
        allow = _allowed(request)
        message = f"{request.method} is not allowed on {request.url.path}; it takes {allow}"
        return _error(405, "method_not_allowed", message, headers={"Allow": allow})
    message = str(exc.detail)
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):  # a body FastAPI cannot decode
        message = f"body: not valid JSON: not UTF-8 text ({exc.__cause__})"
    response = _error(exc.status_code, _HTTP_TYPES.get(exc.status_code, "http_error"), message)
    response.headers.update(exc.headers or {})
    return response


async def _sandbox_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandboxProblem)
    return _error(exc.status, exc.kind, str(exc))


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette logs the exception after this answer; the client learns nothing about the server's insides.
    return _error(500, "internal", "internal error; the controlplane's log has the details")


async def _no_tunnels(worker_id: str, host: str, port: int, timeout_s: float) -> tuple[Any, Any]:
    raise ConnectionError(
        f"worker {worker_id} is reached through a controlplane replica's tunnel, not this REST server"
    )


def create_http_app(
    services: Services,
    *,
    metrics: Metrics | None = None,
    dataplane: DataPlane | None = None,
    wheels: OwnWheels | None = None,
    sandboxes: SandboxService | None = None,
) -> FastAPI:
    """The REST app over ``services``, acting on calls through ``dataplane`` (the one gRPC uses).

    Without a ``dataplane`` (the REST API served on its own) one is made over ``services``, counting into
    ``metrics``: like any replica's, it reaches workers through Redis.
    """
    app = FastAPI(
        title="levers9",
        version=__version__,
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
    )
    app.state.services = services
    if dataplane is None:
        dataplane = DataPlane.standalone(services, metrics)
    app.state.dataplane = dataplane
    # levers9's own wheel under /api/v1/wheels (without an advertised HTTP URL, links use the request's)
    app.state.wheels = wheels if wheels is not None else OwnWheels()
    app.include_router(router)
    app.include_router(members_router)
    app.include_router(auth_api_router)
    app.include_router(usage_router)
    # the dashboard's pages and signing people in (HTML, outside the API's document)
    app.include_router(dashboard_router)
    app.include_router(auth_router)
    # sandboxes, relayed to their workers through the workers' tunnels; served alone (no tunnels), a sandbox's
    # worker is answered unreachable
    app.state.sandboxes = sandboxes if sandboxes is not None else SandboxService(services, _no_tunnels)
    app.include_router(sandbox_router)
    app.include_router(snapshots_router)
    # volumes over WebDAV, for workers that do not mount the volumes' file system themselves
    app.mount(DAV_PREFIX, WebDav(DavAccess(services).resolve))
    for kind, _, _ in ERRORS:
        app.add_exception_handler(kind, _domain_error)
    app.add_exception_handler(SandboxProblem, _sandbox_problem)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    # the dashboard's and sign-in's security headers on every answer there, the framework's own (405, 404) too
    app.add_middleware(SecuredPaths)
    return app
