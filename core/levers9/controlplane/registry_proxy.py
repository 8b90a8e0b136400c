"""The controlplane as a registry: the OCI distribution API under ``/v2/``, relayed to its backend registry.

Images built from blueprints are named ``<controlplane HTTP host:port>/<prefix>/<workspace id>/...``,
so workers behind NAT, agents' workers, attached clusters, ``docker pull`` and ``skopeo`` reach them
through the controlplane they already reach, with a levers9 token. :class:`RegistryProxy` answers
``/v2/`` itself and relays every other request it admits to the registry of
:attr:`Services.registry <levers9.services.core.Services.registry>` with the controlplane's own
credential for it; who may do what is :mod:`levers9.services.registry_access`'s to decide.
:class:`WithRegistry` puts it in front of the HTTP listener's app.

What a request meets, in order:

1. no token, or a bad one: ``401`` with ``WWW-Authenticate: Basic realm="levers9"`` (so ``docker`` and
   ``skopeo`` send their credentials) and the distribution error body ``{"errors": [{"code":
   "UNAUTHORIZED", ...}]}``;
2. ``GET /v2/``: ``200``; ``/v2/_catalog``: ``403 DENIED`` (it would list every workspace); a path
   that is no endpoint of the API: ``404 UNSUPPORTED``; a method an endpoint does not take (deletes
   among them: nothing is deleted through the controlplane): ``405 UNSUPPORTED``;
3. a repository outside ``<prefix>/<workspace id>/``: ``404 NAME_UNKNOWN``; a right the token lacks:
   ``403 DENIED`` naming it. A cross-repository mount (``POST .../blobs/uploads/?mount=D&from=R``)
   needs the right to pull ``R`` as well;
4. no backend (the binary missing, a supervisor that gave up): ``503 UNAVAILABLE`` saying why; a
   backend that cannot be reached, or refuses the controlplane's own credential: ``502``.

Invariants of the relay: bodies stream both ways, in the pieces they arrive in; nothing holds a
whole blob (a big layer crosses with the memory of a few pieces). Forwarded to the backend: the
method, path and query, ``Accept``, ``Content-Type``, ``Content-Length``, ``Content-Range``,
``Range``, ``If-None-Match``; never the caller's ``Authorization``. Forwarded back: the status, the
body untouched (never decompressed) and the distribution headers (``Docker-Content-Digest``,
``Docker-Upload-UUID``, ``Range``, ``Content-Range``, ``Link``, ...), with an upload session's
``Location`` rewritten to a path on the controlplane (relative, so it holds behind a proxy or load
balancer that terminates TLS); a redirect of a blob read (a backend serving blobs from object
storage) is followed by the relay, so callers need reach nothing but the controlplane. A caller that
goes away mid-download stops the relay's read of the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from levers9.services import registry_access
from levers9.services.auth import PermissionDenied, Unauthenticated
from levers9.services.dataplane import DataPlane
from levers9.services.registry_access import PULL, PUSH, Action, NameUnknown
from levers9.services.registry_backend import RegistryUnavailable

__all__ = ["API_VERSION", "RegistryProxy", "WithRegistry"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Any, Any, Any], Awaitable[None]]

#: what every answer says it speaks (docker checks it on /v2/)
API_VERSION = (b"docker-distribution-api-version", b"registry/2.0")
_CHALLENGE = (b"www-authenticate", b'Basic realm="levers9"')
_FORWARD_UP = frozenset({b"content-type", b"content-length", b"content-range", b"range", b"if-none-match"})
_FORWARD_DOWN = frozenset(
    {
        "content-type",
        "content-length",
        "content-range",
        "range",
        "accept-ranges",
        "docker-content-digest",
        "docker-upload-uuid",
        "docker-distribution-api-version",
        "etag",
        "link",
        "last-modified",
        "cache-control",
        "oci-subject",
        "oci-filters-applied",
    }
)
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True)
class _Route:
    """An endpoint of the API: what the metrics label it (``path``), and what each method needs."""

    path: str
    pattern: re.Pattern[str]
    methods: dict[str, Action]


_NAME = r"(?P<name>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
_ROUTES = (
    _Route("/v2/{name}/blobs/uploads/", re.compile(rf"/v2/{_NAME}/blobs/uploads/?"), {"POST": PUSH}),
    _Route(
        "/v2/{name}/blobs/uploads/{uuid}",
        re.compile(rf"/v2/{_NAME}/blobs/uploads/[A-Za-z0-9_.=-]+"),
        {"GET": PUSH, "PATCH": PUSH, "PUT": PUSH, "DELETE": PUSH},
    ),
    _Route(
        "/v2/{name}/blobs/{digest}",
        re.compile(rf"/v2/{_NAME}/blobs/[A-Za-z0-9_+.-]+:[A-Fa-f0-9]+"),
        {"GET": PULL, "HEAD": PULL},
    ),
    _Route(
        "/v2/{name}/manifests/{reference}",
        re.compile(rf"/v2/{_NAME}/manifests/[A-Za-z0-9_+.:-]+"),
        {"GET": PULL, "HEAD": PULL, "PUT": PUSH},
    ),
    _Route("/v2/{name}/tags/list", re.compile(rf"/v2/{_NAME}/tags/list"), {"GET": PULL}),
    _Route(
        "/v2/{name}/referrers/{digest}",
        re.compile(rf"/v2/{_NAME}/referrers/[A-Za-z0-9_+.-]+:[A-Fa-f0-9]+"),
        {"GET": PULL},
    ),
)
_BASE = _Route("/v2/", re.compile(r"/v2/?"), {"GET": PULL, "HEAD": PULL})
_CATALOG = _Route("/v2/_catalog", re.compile(r"/v2/_catalog"), {})
_UNKNOWN = _Route("/v2/{unknown}", re.compile(r""), {})


class _Answer(Exception):
    """A distribution error answer: status, the spec's error code, a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class _CallerGone(Exception):
    """The caller went away while its request body was being relayed."""


class RegistryProxy:
    """The ``/v2/`` API over the services' registry backend (see the module docstring)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").partition("?")[0]
        route = _route(path)
        scope["route"] = route  # the metrics' bounded label
        try:
            await self._serve(route, path, scope, receive, send)
        except _Answer as answer:
            await _error(send, answer)

    async def _serve(self, route: _Route, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        method: str = scope["method"]
        try:
            caller = await registry_access.identify(
                self.dp, _header(headers, b"authorization"), _header(headers, b"x-levers9-worker")
            )
        except Unauthenticated as exc:
            raise _Answer(401, "UNAUTHORIZED", str(exc)) from None
        except PermissionDenied as exc:
            raise _Answer(403, "DENIED", str(exc)) from None
        if route is _UNKNOWN:
            raise _Answer(404, "UNSUPPORTED", f"{path} is not an endpoint of the OCI distribution API")
        if route is _CATALOG:
            raise _Answer(403, "DENIED", "the catalog is not served: it would list every workspace's repositories")
        action = route.methods.get(method)
        if action is None:
            raise _Answer(
                405,
                "UNSUPPORTED",
                f"{method} is not served on {route.path}; it takes {', '.join(sorted(route.methods))}",
            )
        if route is _BASE:
            await _send(send, 200, [(b"content-type", b"application/json")], b"{}")
            return
        match = route.pattern.fullmatch(path)
        assert match is not None
        repository = match.group("name")
        query = scope.get("query_string", b"").decode("latin-1")
        try:
            await registry_access.authorize(self.dp, caller, repository, action)
            source = _mounted_from(query) if route.path.endswith("/uploads/") else None
            if source is not None:
                await registry_access.authorize(self.dp, caller, source, PULL)
        except NameUnknown as exc:
            raise _Answer(404, "NAME_UNKNOWN", str(exc)) from None
        except PermissionDenied as exc:
            raise _Answer(403, "DENIED", str(exc)) from None
        await self._relay(method, path, query, repository, action, headers, receive, send)

    async def _relay(
        self,
        method: str,
        path: str,
        query: str,
        repository: str,
        action: Action,
        headers: list[tuple[bytes, bytes]],
        receive: Receive,
        send: Send,
    ) -> None:
        backend = self.dp.services.registry
        try:
            base = await backend.ready()
            authorization = await backend.authorization(
                f"repository:{repository}:{'pull' if action == PULL else 'pull,push'}"
            )
        except RegistryUnavailable as exc:
            raise _Answer(503, "UNAVAILABLE", str(exc)) from None
        up = [(name, value) for name, value in headers if name in _FORWARD_UP]
        accepts = [value for name, value in headers if name == b"accept"]
        if accepts:
            up.append((b"accept", b", ".join(accepts)))
        if authorization is not None:
            up.append((b"authorization", authorization.encode()))
        url = f"{base}{path}" + (f"?{query}" if query else "")
        http = backend.http
        body = _body(receive) if method in _WITH_BODY else None
        request = http.build_request(method, url, headers=up, content=body)
        try:
            response = await http.send(request, stream=True, follow_redirects=method in ("GET", "HEAD"))
        except _CallerGone:
            return  # nothing to answer: the caller is not there
        except httpx.HTTPError as exc:
            log.warning("relaying %s %s to the image registry failed: %r", method, path, exc)
            raise _Answer(
                502,
                "UNAVAILABLE",
                f"the image registry behind the controlplane cannot be reached: {str(exc) or type(exc).__name__}",
            ) from None
        try:
            if response.status_code == 401:
                log.error(
                    "the image registry at %s refused the controlplane's credential for %s %s", base, method, path
                )
                raise _Answer(
                    502,
                    "UNAVAILABLE",
                    "the image registry behind the controlplane refused its credential (see the controlplane's log)",
                )
            down: list[tuple[bytes, bytes]] = [API_VERSION]
            for name, value in response.headers.multi_items():
                lowered = name.lower()
                if lowered == "location":
                    down.append((b"location", _relative(value, response.url).encode("latin-1")))
                elif lowered in _FORWARD_DOWN and lowered != API_VERSION[0].decode():
                    down.append((lowered.encode(), value.encode("latin-1")))
            await send({"type": "http.response.start", "status": response.status_code, "headers": down})
            if method == "HEAD":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await _stream(response, receive, send, f"{method} {path}")
        finally:
            await response.aclose()


class WithRegistry:
    """``/v2`` and everything under it to ``proxy``; every other request to ``app`` (the gateway and REST)."""

    def __init__(self, app: App, proxy: RegistryProxy) -> None:
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path == "/v2" or path.startswith("/v2/"):
                await self.proxy(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _route(path: str) -> _Route:
    for route in (_BASE, _CATALOG, *_ROUTES):
        if route.pattern.fullmatch(path):
            return route
    return _UNKNOWN


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _mounted_from(query: str) -> str | None:
    """The ``from`` repository of a cross-repository mount, when the upload asks for one."""
    params = dict(httpx.QueryParams(query))
    return params.get("from") if params.get("mount") else None


def _relative(location: str, answered: httpx.URL) -> str:
    """An upload's ``Location`` as a path on the controlplane; one on another host is left as it is."""
    target = answered.join(location)
    if (target.scheme, target.host, target.port) != (answered.scheme, answered.host, answered.port):
        return location
    return target.raw_path.decode("ascii")


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The request's body as it arrives; :class:`_CallerGone` when the caller goes away first."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _CallerGone
        piece: bytes = message.get("body", b"")
        if piece:
            yield piece
        if not message.get("more_body", False):
            return


async def _stream(response: httpx.Response, receive: Receive, send: Send, what: str) -> None:
    """Send the backend's body on as it comes; stop reading it when the caller goes away."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    try:
        async for piece in response.aiter_raw():
            if gone.is_set():
                return
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.HTTPError as exc:  # the answer has begun: all that is left is to end the connection
        log.warning("the image registry's answer to %s broke off: %s", what, exc)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    head = [API_VERSION, *headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _error(send: Send, answer: _Answer) -> None:
    body = json.dumps({"errors": [{"code": answer.code, "message": answer.message}]}).encode()
    headers = [(b"content-type", b"application/json; charset=utf-8")]
    if answer.status == 401:
        headers.append(_CHALLENGE)
    await _send(send, answer.status, headers, body)
