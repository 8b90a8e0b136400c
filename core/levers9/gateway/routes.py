"""The gateway's URLs on the HTTP listener, in front of the REST API.

::

    /endpoint/NAME[/vN][/PATH]        call an endpoint (PATH goes to an ASGI endpoint's app)
    /queue/NAME[/vN]                  POST: enqueue one item (JSON body), answer its task id
    /queue/NAME[/vN]/tasks/ID         GET: the item's status and result
    /job/NAME[/vN]                    POST: start a run (JSON body as arguments), answer its task id
    /job/NAME[/vN]/tasks/ID           GET: the run's status and result
    /box/NAME[/vN]/PORT[/PATH]        proxied to the box's port PORT
    /sandbox/ID/PORT[/PATH]           proxied to a sandbox's exposed port PORT (its workspace's token)
    /function, /taskqueue, /pod       the older names of /job, /queue and /box

Without ``vN`` the newest version still serving answers. The segment after
NAME is a version when it is ``v`` followed by digits, with or without a sign
(``v1``, ``v0``, ``v-1``, ``v01``, ``v+2``): a version is ``v`` and a positive
whole number without leading zeros, at most ``v2147483647``, and any other
segment of that form answers 404 saying the deployment has no such version,
never the newest one. Any other segment (``vfoo``, ``V1``, ``v1.5``) is not a
version: it is the start of the PATH an ASGI endpoint gets. So an ASGI app's
own paths cannot begin with a segment of the form ``vDIGITS``.

Errors are JSON, ``{"error": {"type": ..., "message": ...}}``, of the types
listed in :mod:`levers9.runner.http_errors`; so is a fault in the gateway itself
(500 ``internal``).

A request to an endpoint or box whose container refuses the connection (its
server is gone, nothing of the request reached it) is sent to another ready
container, or waits for one, within the stub's ``start_timeout``; that
container gets no more requests and the scaler replaces it. A request the
container already had when it failed is answered 502 and never sent again, so
a call runs at most once. A deployment is
looked up in the workspace of the bearer token (in the environment its
``X-Levers9-Environment`` header names, for a token of a whole workspace);
``/endpoint/@WORKSPACE/NAME`` names the workspace instead (``@WORKSPACE:ENV``
one of its environments), which is how a public endpoint is called with no
token. Calling a deployment that is not public needs the member role (403 for a
viewer). Another workspace's deployment is answered 404, exactly as one that
does not exist, and so is a non-public one asked for without a token (401).

This is a plain ASGI app rather than FastAPI routes: every request to an
endpoint crosses it, and its cost is measured against a direct call (see
``bench/gateway.py``). Anything else goes on to the REST app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from levers9.gateway.autoscaler import NoContainer, Overloaded, ServedStub, ServingAutoscaler
from levers9.gateway.upstream import RequestTooLarge, Upstream, UpstreamError, UpstreamTimeout
from levers9.payloads import JSON_CALL
from levers9.runner import http_errors as errors
from levers9.services import access, deployments, tasks, workspaces
from levers9.services.auth import PermissionDenied, Principal, Unauthenticated
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.deployments import MAX_VERSION
from levers9.services.errors import error_answer
from levers9.services.metrics import Metrics
from levers9.services.sandboxes import SandboxProblem, SandboxService
from levers9.services.stubs import InvalidStub
from levers9.state.errors import NotFound
from levers9.state.sql.records import Role, TokenKind

__all__ = ["MAX_VERSION", "AtHand", "GatewayApp"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: the REST app behind the gateway (FastAPI's own signature is wider than this module's)
App = Callable[[Any, Any, Any], Awaitable[None]]

#: seconds a deployment's name and version are remembered: a stopped version answers 404 within this
#: on other replicas (at once on the one that stopped it)
RESOLVE_CACHE_S = 1.0
#: counted for a request whose caller went away before it was answered (nginx's convention)
CLIENT_GONE = 499
#: a segment of this form after NAME is a version, valid or not (see the module's docstring)
#: the environment a request acts in, for a token issued for its whole workspace (as the REST API's)
_ENVIRONMENT_HEADER = b"x-levers9-environment"
_VERSION_ATTEMPT = re.compile(r"v[+-]?\d+")
#: a valid version: v and a positive decimal number without leading zeros (and at most MAX_VERSION)
_VERSION = re.compile(r"v([1-9][0-9]*)", re.ASCII)
#: the first path segment -> the kind of stub it serves
_ROUTES = {
    "endpoint": ("endpoint",),
    "queue": ("queue",),
    "taskqueue": ("queue",),
    "job": ("job", "function"),
    "function": ("job", "function"),
    "box": ("box",),
    "pod": ("box",),
}


class _Answer(Exception):
    """An error answer: ``kind`` is one of :data:`levers9.runner.http_errors.ERROR_TYPES`, answered with its status."""

    def __init__(self, kind: str, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status = errors.ERROR_TYPES[kind]
        self.kind = kind
        self.headers = headers or []


@dataclass
class _Resolved:
    expires: float
    stub_id: str | None
    refreshing: asyncio.Future[str | None] | None = None


class AtHand(NamedTuple):
    """An endpoint or box request the short path may serve: its kind, stub, the container's path and box port."""

    kind: str
    stub: ServedStub
    path: str
    port: int | None


@dataclass(frozen=True)
class _Target:
    workspace_id: str
    name: str
    version: int | None
    #: the path after NAME[/vN]
    rest: list[str]
    principal: Principal | None


class GatewayApp:
    def __init__(
        self,
        services: Services,
        dataplane: DataPlane,
        plane: ServingAutoscaler,
        upstream: Upstream,
        rest: App,
        *,
        metrics: Metrics | None = None,
        sandboxes: SandboxService | None = None,
    ) -> None:
        self.services = services
        self.metrics = metrics
        self.dataplane = dataplane
        self.plane = plane
        self.upstream = upstream
        self.rest = rest
        #: sandboxes' exposed ports, at /sandbox/ID/PORT (None: that path goes on to the REST app's 404)
        self.sandboxes = sandboxes
        self._resolved: dict[tuple[str, str, int | None], _Resolved] = {}
        self._workspaces: dict[str, tuple[float, str | None]] = {}
        plane.on_gone.append(upstream.forget)

    def stopped(self, workspace_id: str, name: str, stub_id: str) -> None:
        """A version of ``name`` was stopped on this replica: 404 from now on, and its containers go."""
        for key in [k for k in self._resolved if k[0] == workspace_id and k[1] == name]:
            del self._resolved[key]
        self.plane.retire(stub_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            first, _, rest = path[1:].partition("/")
            if first == "sandbox" and self.sandboxes is not None:
                await self._counted("sandbox", self._sandbox(rest.split("/"), scope, receive, send), scope, send)
                return
            kinds = _ROUTES.get(first)
            if kinds is not None:
                parts = rest.split("/") if rest else []
                await self._counted(kinds[0], self._route(first, kinds, parts, scope, receive, send), scope, send)
                return
        await self.rest(scope, receive, send)

    async def _counted(self, route: str, answering: Awaitable[int], scope: Scope, send: Send) -> None:
        """Answer with ``answering`` (its status), errors as JSON, counted under ``route``."""
        started = time.monotonic()
        status = 500
        try:
            status = await answering
        except _Answer as answer:
            status = answer.status
            await _error(send, answer)
        except Exception:
            log.exception("the gateway failed %s %s", scope["method"], scope["path"])
            with contextlib.suppress(Exception):
                await _error(send, _Answer(errors.INTERNAL, "internal error; the controlplane's log has the details"))
        finally:
            if self.metrics is not None:
                self.metrics.gateway_answered(route, status, time.monotonic() - started)

    async def _sandbox(self, parts: list[str], scope: Scope, receive: Receive, send: Send) -> int:
        """``/sandbox/ID/PORT/PATH``: to the sandbox's exposed port, through its worker's tunnel."""
        assert self.sandboxes is not None
        principal = await self._principal(scope)
        if principal is None:
            raise _unauthenticated("no token: a sandbox's port takes its workspace's: 'authorization: Bearer <token>'")
        if not principal.role.allows(Role.MEMBER):
            raise _Answer(
                errors.PERMISSION_DENIED,
                f"a sandbox's ports need the member role; this token acts as a {principal.role.value}",
            )
        if len(parts) < 2 or not parts[0] or not parts[1].isdigit():
            raise _Answer(errors.NOT_FOUND, "name a sandbox and one of its exposed ports: /sandbox/ID/PORT/...")
        sandbox_id, port = parts[0], int(parts[1])
        try:
            address = await self.sandboxes.exposed_address(principal, sandbox_id, port)
        except SandboxProblem as exc:
            kind = errors.NOT_FOUND if exc.status == 404 else errors.CONFLICT
            raise _Answer(kind, str(exc)) from None
        body = await self._body(receive)
        if body is None:
            return CLIENT_GONE
        try:
            return await self.upstream.forward(address, scope, body, send, path="/" + "/".join(parts[2:]))
        except UpstreamTimeout as exc:
            raise _Answer(errors.TIMEOUT, str(exc)) from None
        except UpstreamError as exc:
            self.upstream.forget(address)
            if not exc.sent:
                why = "nothing listens on it now" if exc.refused else str(exc)
                raise _Answer(errors.BAD_GATEWAY, f"port {port} of sandbox {sandbox_id}: {why}") from None
            return 502

    async def _route(
        self, route: str, kinds: tuple[str, ...], parts: list[str], scope: Scope, receive: Receive, send: Send
    ) -> int:
        """Answer one gateway request; the status it was answered with."""
        target = await self._target(parts, scope)
        stub = await self._stub(target, kinds, route)
        reading = kinds[0] not in ("endpoint", "box") and scope["method"] in ("GET", "HEAD")
        if not stub.settings.public and not reading:
            _require_member(target)  # an endpoint's call, a box's request or an enqueue runs code; a viewer reads
        if kinds[0] == "endpoint":
            return await self._endpoint(stub, target, scope, receive, send)
        if kinds[0] == "box":
            return await self._box(stub, target, scope, receive, send)
        return await self._call(stub, target, scope, receive, send)

    # ------------------------------------------------------------------ the short path's lookup

    def at_hand(self, path: str, headers: list[tuple[bytes, bytes]]) -> AtHand | None:
        """What an endpoint or box request goes to, when everything needed is cached and it may be served.

        For the short path (:mod:`levers9.gateway.shortpath`): None whenever anything is not at hand (a token
        not verified lately, a deployment not resolved within :data:`RESOLVE_CACHE_S`, a stub not read yet)
        or the request would be refused; the ASGI path then answers it, errors included, and fills the
        caches. It decides exactly as :meth:`_target`, :meth:`_resolve` and :meth:`_stub` do on a hit.
        """
        first, _, rest = path[1:].partition("/")
        kinds = _ROUTES.get(first)
        if kinds is None or kinds[0] not in ("endpoint", "box") or not rest:
            return None
        token = _bearer(headers)
        principal = None
        if token is not None:
            principal = self.services.auth.cached(token, TokenKind.USER)
            if principal is None or not principal.role.allows(Role.MEMBER) or _header(headers, _ENVIRONMENT_HEADER):
                return None  # the ASGI path picks the environment, or refuses the role
        parts = rest.split("/")
        now = time.monotonic()
        if parts[0].startswith("@"):
            hit = self._workspaces.get(parts[0][1:])
            if hit is None or hit[0] <= now or hit[1] is None:
                return None
            workspace_id: str = hit[1]
            parts = parts[1:]
        elif principal is None or principal.workspace_id is None:
            return None
        else:
            workspace_id = principal.workspace_id
        if not parts or not parts[0]:
            return None
        name, parts = parts[0], parts[1:]
        version = None
        if parts and _VERSION_ATTEMPT.fullmatch(parts[0]):
            version = _version(parts[0])
            if version is None:
                return None
            parts = parts[1:]
        entry = self._resolved.get((workspace_id, name, version))
        if entry is None or entry.stub_id is None or entry.expires <= now:
            return None
        cached = self.dataplane.stubs_read.get(entry.stub_id)
        if cached is None:
            return None
        record, settings = cached
        if record.kind not in kinds or not access.may_call_served(principal, workspace_id, public=settings.public):
            return None
        stub = ServedStub(entry.stub_id, record.workspace_id, settings)
        if kinds[0] == "endpoint":
            return AtHand("endpoint", stub, "/" + "/".join(parts) if settings.interface == "asgi" else "/", None)
        if not parts or not parts[0].isdigit() or int(parts[0]) not in settings.ports:
            return None
        return AtHand("box", stub, "/" + "/".join(parts[1:]), int(parts[0]))

    # ------------------------------------------------------------------ finding the deployment

    async def _target(self, parts: list[str], scope: Scope) -> _Target:
        principal = await self._principal(scope)
        if not parts or not parts[0]:
            raise _Answer(errors.NOT_FOUND, "name a deployment: /KIND/NAME[/vN]")
        named_workspace: str | None = None
        if parts[0].startswith("@"):
            named_workspace = parts.pop(0)[1:]
            if not parts or not parts[0]:
                raise _Answer(errors.NOT_FOUND, "name a deployment: /KIND/@WORKSPACE/NAME[/vN]")
        name = parts.pop(0)
        version = None
        bad_version = None
        if parts and _VERSION_ATTEMPT.fullmatch(parts[0]):
            segment = parts.pop(0)
            version = _version(segment)
            if version is None:
                bad_version = segment
        if named_workspace is not None:
            workspace_id = await self._workspace(named_workspace)
            if workspace_id is None:
                raise _Answer(errors.NOT_FOUND, f"deployment {name!r} not found")
        elif principal is None:
            raise _unauthenticated(
                "no token: send 'authorization: Bearer <token>', or call a public endpoint as /endpoint/@WORKSPACE/NAME"
            )
        elif principal.workspace_id is None:
            raise _Answer(
                errors.NOT_FOUND,
                f"deployment {name!r} not found: an operator token has no workspace; name one as /KIND/@WORKSPACE/NAME",
            )
        else:
            workspace_id = principal.workspace_id
        if bad_version is not None:
            raise _Answer(
                errors.NOT_FOUND,
                f"deployment {name!r} has no version {bad_version!r}: a version is v "
                "and a positive whole number without leading zeros (v1, v2, ...), "
                f"at most v{MAX_VERSION}",
            )
        return _Target(workspace_id, name, version, parts, principal)

    async def _principal(self, scope: Scope) -> Principal | None:
        token = _bearer(scope["headers"])
        if token is None:
            return None
        try:
            principal = await self.services.auth.verify(token, TokenKind.USER)
            principal = await access.in_environment(
                self.services, principal, _header(scope["headers"], _ENVIRONMENT_HEADER)
            )
        except Unauthenticated as exc:
            raise _unauthenticated(str(exc)) from None
        except (PermissionDenied, NotFound) as exc:
            raise _Answer(
                errors.PERMISSION_DENIED if isinstance(exc, PermissionDenied) else errors.NOT_FOUND, str(exc)
            ) from None
        return principal

    async def _workspace(self, name: str) -> str | None:
        now = time.monotonic()
        hit = self._workspaces.get(name)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await workspaces.workspace_id_named(self.services, name)
        if found is None and ":" in name:  # @WORKSPACE:ENVIRONMENT names an environment (stored as WORKSPACE/ENV)
            workspace, _, environment = name.rpartition(":")
            found = await workspaces.workspace_id_named(self.services, f"{workspace}/{environment.lower()}")
        if len(self._workspaces) > 10_000:
            self._workspaces.clear()
        self._workspaces[name] = (now + 10.0, found)
        return found

    async def _stub(self, target: _Target, kinds: tuple[str, ...], route: str) -> ServedStub:
        stub_id = await self._resolve(target)
        record, settings = await self.dataplane.stub(stub_id)
        if not access.may_call_served(target.principal, target.workspace_id, public=settings.public):
            raise self._not_found(target)
        if record.kind not in kinds:
            raise _Answer(
                errors.NOT_FOUND,
                f"deployment {target.name!r} is a {record.kind}, not served at /{route}; "
                f"use /{_route_of(record.kind)}/{target.name}",
            )
        return ServedStub(stub_id, record.workspace_id, settings)

    async def _resolve(self, target: _Target) -> str:
        """The stub serving the target's deployment version; read once per RESOLVE_CACHE_S however many ask.

        Only the request that finds the entry expired waits for the database; the others use the entry
        meanwhile, so a busy endpoint does not send one query per request the moment it expires.
        """
        key = (target.workspace_id, target.name, target.version)
        entry = self._resolved.get(key)
        now = time.monotonic()
        if entry is not None and (entry.expires > now or entry.refreshing is not None):
            if entry.stub_id is None:  # the first lookup is still on its way
                assert entry.refreshing is not None
                stub_id = await asyncio.shield(entry.refreshing)
                if stub_id is None:
                    raise self._not_found(target)
                return stub_id
            return entry.stub_id
        if entry is None:
            entry = self._resolved[key] = _Resolved(0.0, None)
            if len(self._resolved) > 100_000:
                self._resolved.clear()
                self._resolved[key] = entry
        refreshing = entry.refreshing = asyncio.ensure_future(self._lookup(target))
        try:
            stub_id = await asyncio.shield(refreshing)
        finally:
            entry.refreshing = None
        if stub_id is None:
            self._resolved.pop(key, None)
            raise self._not_found(target)
        entry.stub_id, entry.expires = stub_id, time.monotonic() + RESOLVE_CACHE_S
        return stub_id

    async def _lookup(self, target: _Target) -> str | None:
        return await deployments.serving_stub(self.dataplane, target.workspace_id, target.name, target.version)

    def _not_found(self, target: _Target) -> _Answer:
        if target.principal is None:
            return _unauthenticated("no token, and no public endpoint by that name")
        what = f"{target.name} v{target.version}" if target.version else target.name
        return _Answer(errors.NOT_FOUND, f"deployment {what!r} not found (or no version of it is serving)")

    # ------------------------------------------------------------------ endpoints and boxes

    async def _endpoint(self, stub: ServedStub, target: _Target, scope: Scope, receive: Receive, send: Send) -> int:
        path = "/" + "/".join(target.rest) if stub.settings.interface == "asgi" else "/"
        return await self._proxy(stub, scope, receive, send, path, port=None)

    async def _box(self, stub: ServedStub, target: _Target, scope: Scope, receive: Receive, send: Send) -> int:
        ports = stub.settings.ports
        if not target.rest or not target.rest[0].isdigit() or int(target.rest[0]) not in ports:
            listed = ", ".join(str(p) for p in ports)
            raise _Answer(
                errors.NOT_FOUND,
                f"name one of the box's ports in the URL: /box/{target.name}/PORT/..., PORT one of {listed}",
            )
        port = int(target.rest[0])
        return await self._proxy(stub, scope, receive, send, "/" + "/".join(target.rest[1:]), port=port)

    async def _proxy(
        self, stub: ServedStub, scope: Scope, receive: Receive, send: Send, path: str, port: int | None
    ) -> int:
        body = await self._body(receive)
        if body is None:
            return CLIENT_GONE
        settings = stub.settings
        deadline = time.monotonic() + settings.start_timeout_s
        refused: list[str] = []
        while True:  # once per container that refuses the connection, until one answers or the wait runs out
            try:
                container = await self.plane.acquire(stub, timeout_s=max(0.0, deadline - time.monotonic()))
            except Overloaded as exc:
                raise _Answer(errors.OVERLOADED, str(exc), [(b"retry-after", b"1")]) from None
            except NoContainer as exc:
                why = f"; {len(refused)} refused the connection, the last: {refused[-1]}" if refused else ""
                raise _Answer(errors.NO_CONTAINER, f"{exc}{why}") from None
            broken = False
            address = container.address if port is None else container.ports.get(port, "")
            try:
                return await self.upstream.forward(address, scope, body, send, path=path, timeout_s=settings.timeout_s)
            except UpstreamTimeout as exc:
                raise _Answer(errors.TIMEOUT, f"{exc} (the {settings.kind}'s timeout)") from None
            except UpstreamError as exc:
                # it gets no more requests, and the scaler replaces it; but a container behind a tunnel no
                # replica holds this moment (its worker is dialling again) is fine, only not reachable now
                broken = not exc.elsewhere
                if exc.refused:  # nothing of the request reached it: another container may have it
                    self.upstream.forget(address)
                    refused.append(str(exc))
                    continue
                if not exc.sent:
                    raise _Answer(errors.BAD_GATEWAY, str(exc)) from None
                return 502  # cut short after the status went out: counted as the container's failure
            finally:
                self.plane.release(container, broken=broken)

    async def _body(self, receive: Receive) -> bytes | None:
        """The request's body; None when the caller went away; 413 past the limit."""
        try:
            return await self.upstream.read_body(receive)
        except RequestTooLarge as exc:
            raise _Answer(errors.TOO_LARGE, str(exc)) from None
        except ConnectionError:
            return None

    # ------------------------------------------------------------------ queues and jobs

    async def _call(self, stub: ServedStub, target: _Target, scope: Scope, receive: Receive, send: Send) -> int:
        principal = target.principal
        assert principal is not None  # queues and jobs are never public
        if len(target.rest) == 2 and target.rest[0] == "tasks":
            if scope["method"] not in ("GET", "HEAD"):
                raise _Answer(errors.METHOD_NOT_ALLOWED, "a task is read with GET", [(b"allow", b"GET, HEAD")])
            return await self._task(stub, target.rest[1], send)
        if target.rest:
            raise _Answer(errors.NOT_FOUND, "the path goes on after the deployment; did you mean .../tasks/ID?")
        if scope["method"] != "POST":
            raise _Answer(
                errors.METHOD_NOT_ALLOWED, "POST a JSON body (the arguments) to enqueue a call", [(b"allow", b"POST")]
            )
        raw = await self._body(receive)
        if raw is None:
            return CLIENT_GONE
        payload = JSON_CALL + _arguments(raw)
        try:
            (task_id,) = await self.dataplane.submit(principal, stub.stub_id, [payload])
        except InvalidStub as exc:
            raise _Answer(errors.INVALID_REQUEST, str(exc)) from None
        except Exception as exc:
            answer = error_answer(exc)
            if answer is None:
                raise
            raise _Answer(answer[1], str(exc)) from None
        await _json(send, 202, {"task_id": task_id, "status": "pending"})
        return 202

    async def _task(self, stub: ServedStub, task_id: str, send: Send) -> int:
        task = await tasks.deployment_task(self.dataplane, stub.workspace_id, stub.stub_id, task_id)
        if task is None:
            raise _Answer(errors.NOT_FOUND, f"task {task_id!r} not found in this deployment")
        out: dict[str, Any] = {"task_id": task_id, "status": task.status, "attempts": task.attempts}
        if task.has_result:
            out["result"] = task.result
        if task.error is not None:
            out["error"] = {"type": task.error_type, "message": task.error}
        await _json(send, 200, out)
        return 200


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The bearer token of the first ``authorization`` header; None without one."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            return given.strip() if scheme.lower() == "bearer" and given.strip() else None
    return None


def _require_member(target: _Target) -> None:
    principal = target.principal
    if principal is not None and not principal.role.allows(Role.MEMBER):
        raise _Answer(
            errors.PERMISSION_DENIED,
            f"deployment {target.name!r} runs code: calling it needs the member role, and this token acts as a "
            f"{principal.role.value}",
        )


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1").strip() or None
    return None


def _route_of(kind: str) -> str:
    return {"function": "job"}.get(kind, kind)


def _version(segment: str) -> int | None:
    """The version a segment of the form ``v[+-]DIGITS`` names; None when it names none (``v0``, ``v01``, ``v-1``)."""
    match = _VERSION.fullmatch(segment)
    if match is None or len(match.group(1)) > len(str(MAX_VERSION)):
        return None
    version = int(match.group(1))
    return version if version <= MAX_VERSION else None


def _arguments(raw: bytes) -> bytes:
    """A queue or job call's JSON body as the call's ``{"args": [...], "kwargs": {...}}``; 400 if it is not JSON."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    try:
        if raw.strip():
            value = json.loads(raw)
            if isinstance(value, dict):
                kwargs = value
            elif isinstance(value, list):
                args = value
            else:
                args = [value]
        return json.dumps({"args": args, "kwargs": kwargs}).encode()
    except RecursionError:
        raise _Answer(errors.INVALID_JSON, errors.TOO_DEEP_MESSAGE) from None
    except ValueError as exc:
        raise _Answer(errors.INVALID_JSON, f"the body is not JSON: {exc}") from None


def _unauthenticated(message: str) -> _Answer:
    return _Answer(errors.UNAUTHENTICATED, message, [(b"www-authenticate", b"Bearer")])


async def _error(send: Send, answer: _Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [(b"content-type", b"application/json"), *answer.headers],
        }
    )
    await send({"type": "http.response.body", "body": errors.error_body(answer.kind, str(answer))})


async def _json(send: Send, status: int, value: Any) -> None:
    body = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
