"""The dashboard's pages: server-rendered HTML over the same service functions the REST API calls.

URLs: ``/`` goes to ``/dashboard/``, which goes to the session's environment, ``/dashboard/e/ENV/deployments``;
every page of an environment is under ``/dashboard/e/ENV/`` so it can be bookmarked. Static files are under
``/dashboard/static/`` (:func:`static_file`: the files of ``static/`` only).

Invariants, and what each failure means:

* a page is a session's: no cookie, or one that does not verify (unknown, revoked, expired; its person removed),
  redirects a ``GET`` to ``/auth/sign-in?next=PATH`` and answers any other method 401;
* each page calls the service function its REST route calls, with the session's principal acting in the URL's
  environment (:func:`levers9.services.access.authenticate_user`), and names the role that route names
  (:data:`levers9.state.sql.records.Role`): roles, environments and workspace isolation are the API's. Another
  workspace's task, a missing volume, an unknown environment: a 404 page, like a missing object;
* every state-changing request (POST, PUT) checks the session's CSRF token (:func:`levers9.dashboard.session.check_csrf`)
  after the session and before anything else, role included: without it, 403 and nothing changes. A viewer's
  forged stop is 403 with or without the token;
* a form's bad value is a 400 page naming the field; a domain error is the page of its status
  (:data:`levers9.services.errors.ERRORS`), never the REST API's JSON; anything else is logged and a 500 page;
* live regions (:mod:`levers9.dashboard.live`) and task logs are server-sent events held on the session's token:
  revoking it ends them.
"""

from __future__ import annotations

import functools
import logging
import mimetypes
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from levers9.dashboard import live
from levers9.dashboard.pages import STATIC, Chrome, message_page, render, secure
from levers9.dashboard.session import CsrfRefused, check_csrf, csrf_token, read_form, session_token
from levers9.services import deployments, secrets, tasks, workspaces
from levers9.services import usage as usage_service
from levers9.services import volumes as volume_service
from levers9.services.access import authenticate_user, require_role
from levers9.services.auth import Principal, Unauthenticated
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.errors import error_answer
from levers9.state.sql.records import MAIN_ENVIRONMENT, Role, TaskStatus

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

P = ParamSpec("P")

#: the longest file name a volume upload takes (its path below the folder shown)
MAX_UPLOAD_NAME = 255


class SignIn(Exception):
    """No valid session: the person signs in (again)."""


class FormError(ValueError):
    """A form's bad value: the message names the field."""


@dataclass(frozen=True)
class Session:
    """A signed-in request: the session's token (never shown), its principal in the URL's environment, the header."""

    token: str
    principal: Principal
    chrome: Chrome

    @property
    def role(self) -> Role:
        return self.principal.role


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _dataplane(request: Request) -> DataPlane:
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


def _sign_in_url(request: Request) -> str:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return "/auth/sign-in?" + urllib.parse.urlencode({"next": target})


async def _session(request: Request, env: str | None, section: str) -> Session:
    """The request's session acting in ``env`` (None: the token's own), with its page header."""
    token = session_token(request)
    if not token:
        raise SignIn
    services = _services(request)
    try:
        principal = await authenticate_user(services, token, Role.VIEWER, environment=env)
    except Unauthenticated:
        raise SignIn from None
    caller = await workspaces.whoami(services, principal)
    if principal.environment_bound:  # a token of one environment acts in no other: offer none
        names = [principal.environment]
    else:
        names = [e.environment for e in await workspaces.list_environments(services, principal)]
    chrome = Chrome(
        workspace=caller.workspace_name,
        environment=principal.environment,
        email=caller.email,
        role=principal.role.value,
        csrf=csrf_token(token),
        section=section,
        environments=names,
    )
    session = Session(token, principal, chrome)
    request.state.chrome = chrome
    return session


async def _acting(request: Request, env: str, section: str, needed: Role, action: str) -> Session:
    """A state-changing request's session: its CSRF token checked first, then the role ``action`` needs."""
    session = await _session(request, env, section)
    await check_csrf(request, session.token)
    require_role(session.principal, needed, action)
    return session


def page(handler: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """Answer ``handler``'s failures as pages (see the module docstring), with the security headers."""

    @functools.wraps(handler)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> Response:
        request = kwargs.get("request")
        assert isinstance(request, Request), "a page handler takes request as a keyword"
        try:
            return secure(await handler(*args, **kwargs))
        except SignIn:
            if request.method in ("GET", "HEAD"):
                return secure(RedirectResponse(_sign_in_url(request), status_code=303))
            return message_page(
                request,
                "Signed out",
                "Your session has ended: sign in again.",
                status=401,
                link=(_sign_in_url(request), "Sign in"),
            )
        except CsrfRefused as exc:
            return _error_page(request, 403, "Refused", str(exc))
        except Exception as exc:
            answer = error_answer(exc)
            if answer is None:
                log.exception("dashboard page %s %s failed", request.method, request.url.path)
                return _error_page(request, 500, "Something went wrong", "The controlplane's log has the details.")
            status, _ = answer
            titles = {404: "Not found", 403: "Not allowed", 409: "Conflict", 400: "Not valid", 401: "Signed out"}
            return _error_page(request, status, titles.get(status, "Refused"), str(exc))

    return wrapped


def _error_page(request: Request, status: int, title: str, message: str) -> Response:
    chrome = getattr(request.state, "chrome", None)
    link = (f"{chrome.base}/{chrome.section}", "Back") if chrome is not None else ("/dashboard/", "The dashboard")
    return message_page(request, title, message, status=status, chrome=chrome, link=link)


def _back(session: Session, path: str) -> RedirectResponse:
    return RedirectResponse(f"{session.chrome.base}/{path}", status_code=303)


# --------------------------------------------------------------------------- entry points and static files


@router.get("/")
async def root() -> Response:
    return secure(RedirectResponse("/dashboard/", status_code=307))


@router.get("/dashboard")
@router.get("/dashboard/")
@page
async def dashboard_home(request: Request) -> Response:
    session = await _session(request, None, "deployments")
    return RedirectResponse(f"/dashboard/e/{urllib.parse.quote(session.principal.environment)}/deployments", 303)


@router.get("/dashboard/e/{env}")
@router.get("/dashboard/e/{env}/")
async def environment_home(env: str) -> Response:
    return secure(RedirectResponse(f"/dashboard/e/{urllib.parse.quote(env)}/deployments", status_code=303))


_STATIC_FILES = {path.name: path for path in STATIC.iterdir() if path.is_file()}


@router.get("/dashboard/static/{name}")
async def static_file(name: str) -> Response:
    """One of ``static/``'s files, by name (nothing else is ever read)."""
    path = _STATIC_FILES.get(name)
    if path is None:
        return secure(Response("no such file", status_code=404, media_type="text/plain"))
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if name.endswith(".js"):
        kind = "text/javascript"
    response = Response(path.read_bytes(), media_type=kind, headers={"Cache-Control": "no-cache"})
    return secure(response)


# --------------------------------------------------------------------------- deployments


@router.get("/dashboard/e/{env}/deployments")
@page
async def deployments_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "deployments")
    region = await live.render_region(request, session.principal, "deployments", {}, csrf=session.chrome.csrf)
    return render(request, "deployments.html", title="Deployments", chrome=session.chrome, region=region)


@router.post("/dashboard/e/{env}/deployments/{name}/versions/{version}/stop")
@page
async def stop_version(request: Request, env: str, name: str, version: str) -> Response:
    session = await _acting(request, env, "deployments", Role.MEMBER, "stop deployments")
    number = _whole(version, "version", 1, deployments.MAX_VERSION)
    await deployments.stop_version(_dataplane(request), session.principal, name, number)
    return _back(session, "deployments")


# --------------------------------------------------------------------------- tasks


def _statuses(request: Request) -> list[str]:
    wanted = request.query_params.getlist("status")
    known = {s.value for s in TaskStatus}
    bad = [s for s in wanted if s not in known]
    if bad:
        raise FormError(f"status: {bad[0]!r} is not a task status (one of {', '.join(sorted(known))})")
    return wanted


@router.get("/dashboard/e/{env}/tasks")
@page
async def tasks_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "tasks")
    wanted = _statuses(request)
    params = {"status": wanted}
    region = await live.render_region(request, session.principal, "tasks", params, csrf=session.chrome.csrf)
    return render(
        request,
        "tasks.html",
        title="Tasks",
        chrome=session.chrome,
        region=region,
        statuses=[s.value for s in TaskStatus],
        wanted=wanted,
        live_query=urllib.parse.urlencode([("status", s) for s in wanted]),
    )


@router.get("/dashboard/e/{env}/tasks/{task_id}")
@page
async def task_page(request: Request, env: str, task_id: str) -> Response:
    session = await _session(request, env, "tasks")
    # NotFound here (a missing task, another workspace's) is the 404 page
    task = await tasks.get_task(_dataplane(request), session.principal, task_id)
    region = await live.render_region(request, session.principal, "task", {"id": [task.id]}, csrf=session.chrome.csrf)
    return render(
        request,
        "task.html",
        title=f"Task {task.id}",
        chrome=session.chrome,
        task=task,
        region=region,
        live_query=urllib.parse.urlencode({"id": task.id}),
    )


@router.get("/dashboard/e/{env}/tasks/{task_id}/logs")
@page
async def task_logs_stream(request: Request, env: str, task_id: str) -> Response:
    """The task's output as server-sent events (``log``, then ``end`` once it finished), from its start."""
    try:
        session = await _session(request, env, "tasks")
    except SignIn:
        return live.signed_out_stream()
    await tasks.get_task(_dataplane(request), session.principal, task_id)
    return live.log_stream(request, session.principal, task_id)


@router.get("/dashboard/e/{env}/tasks/{task_id}/logs.txt")
@page
async def task_logs_text(request: Request, env: str, task_id: str) -> Response:
    """The output so far, as plain text (a page without scripts, a download)."""
    session = await _session(request, env, "tasks")
    dataplane = _dataplane(request)
    chunks = [c async for c in tasks.task_logs(dataplane, session.principal, task_id, follow=False)]
    return Response(b"".join(chunks), media_type="text/plain; charset=utf-8")


# --------------------------------------------------------------------------- pools, machines


@router.get("/dashboard/e/{env}/pools")
@page
async def pools_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "pools")
    region = await live.render_region(request, session.principal, "pools", {}, csrf=session.chrome.csrf)
    return render(request, "pools.html", title="Pools", chrome=session.chrome, region=region)


@router.get("/dashboard/e/{env}/machines")
@page
async def machines_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "machines")
    region = await live.render_region(request, session.principal, "machines", {}, csrf=session.chrome.csrf)
    return render(request, "machines.html", title="Machines", chrome=session.chrome, region=region)


@router.get("/dashboard/e/{env}/live/{region}")
@page
async def live_region(request: Request, env: str, region: str) -> Response:
    """A region's server-sent events: its HTML whenever it changed (see :mod:`levers9.dashboard.live`)."""
    try:
        session = await _session(request, env, region if region in live.REGIONS else "deployments")
    except SignIn:
        return live.signed_out_stream()
    params = {name: request.query_params.getlist(name) for name in request.query_params}
    if region == "tasks":
        params["status"] = _statuses(request)
    return await live.region_stream(request, session.principal, region, params, csrf=session.chrome.csrf)


# --------------------------------------------------------------------------- volumes


@router.get("/dashboard/e/{env}/volumes")
@page
async def volumes_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "volumes")
    services = _services(request)
    found = await volume_service.list_volumes(services.volumes, session.principal)
    return render(request, "volumes.html", title="Volumes", chrome=session.chrome, volumes=found)


def _crumbs(volume: str, path: str) -> list[tuple[str, str]]:
    """(name, path) of each folder from the volume's root down to ``path``."""
    out = [(volume, "")]
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        out.append((part, "/".join(parts[: i + 1])))
    return out


@router.get("/dashboard/e/{env}/volumes/{name}/files")
@router.get("/dashboard/e/{env}/volumes/{name}/files/{path:path}")
@page
async def volume_files(request: Request, env: str, name: str, path: str = "") -> Response:
    """A folder of the volume (its entries), or a file (its bytes, as a download)."""
    session = await _session(request, env, "volumes")
    services = _services(request)
    path = path.strip("/")
    parent = path.rpartition("/")[0]
    if path:
        listing = await volume_service.list_path(
            services.volumes, services.volume_files, session.principal, name, parent
        )
        entry = next((e for e in listing if e.path == path), None)
        if entry is not None and not entry.is_dir:
            size, pieces = await volume_service.read_file(
                services.volumes, services.volume_files, session.principal, name, path
            )
            filename = urllib.parse.quote(entry.name)
            return StreamingResponse(
                pieces,
                media_type="application/octet-stream",
                headers={
                    "Content-Length": str(size),
                    "Content-Disposition": f"attachment; filename*=UTF-8''{filename}",
                },
            )
    entries = await volume_service.list_path(services.volumes, services.volume_files, session.principal, name, path)
    entries = sorted(entries, key=lambda e: (not e.is_dir, e.name))
    return render(
        request,
        "volume.html",
        title=f"Volume {name}",
        chrome=session.chrome,
        volume=name,
        path=path,
        crumbs=_crumbs(name, path),
        entries=entries,
        can_write=session.role.allows(Role.MEMBER),
        quote=urllib.parse.quote,
    )


@router.put("/dashboard/e/{env}/volumes/{name}/upload/{path:path}")
@page
async def volume_upload(request: Request, env: str, name: str, path: str) -> Response:
    """The request's body written to ``path`` of the volume, whole or not at all (the page's script sends it)."""
    session = await _acting(request, env, "volumes", Role.MEMBER, "write to volumes")
    services = _services(request)
    clean = path.strip("/")
    if not clean or len(clean.rpartition("/")[2]) > MAX_UPLOAD_NAME:
        raise FormError(f"path: a file name of 1 to {MAX_UPLOAD_NAME} characters is needed, got {path!r}")
    written = await volume_service.write_file(
        services.volumes, services.volume_files, session.principal, name, clean, request.stream()
    )
    return Response(f"wrote {written} bytes to {name}:{clean}\n", media_type="text/plain")


# --------------------------------------------------------------------------- secrets


@router.get("/dashboard/e/{env}/secrets")
@page
async def secrets_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "secrets")
    return await _secrets(request, session)


async def _secrets(
    request: Request, session: Session, *, status: int = 200, notes: list[Any] | None = None
) -> Response:
    found = await secrets.list_secrets(_services(request), session.principal)
    return render(
        request,
        "secrets.html",
        title="Secrets",
        status=status,
        chrome=session.chrome,
        secrets=found,
        can_manage=session.role.allows(Role.OWNER),
        notes=notes or [],
    )


def _field(form: dict[str, str], name: str, *, limit: int = 4096, required: bool = True) -> str:
    value = form.get(name, "")
    if required and not value.strip():
        raise FormError(f"{name}: a value is needed")
    if len(value) > limit:
        raise FormError(f"{name}: at most {limit} characters are accepted, got {len(value)}")
    return value


def _whole(value: str, name: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise FormError(f"{name}: a whole number from {low} to {high} is needed, got {value!r}") from None
    if not low <= number <= high:
        raise FormError(f"{name}: a whole number from {low} to {high} is needed, got {number}")
    return number


@router.post("/dashboard/e/{env}/secrets")
@page
async def create_secret(request: Request, env: str) -> Response:
    session = await _acting(request, env, "secrets", Role.OWNER, "create secrets")
    form = await read_form(request)
    name = _field(form, "name", limit=secrets.MAX_NAME).strip()
    value = _field(form, "value", limit=64 * 1024)
    secrets.check_secret_name(name)
    secrets.check_secret_value(value)
    _, created = await secrets.put_secret(_services(request), session.principal, name, value)
    said = "created" if created else "replaced (running containers keep the value they started with)"
    return await _secrets(request, session, notes=[{"kind": "ok", "text": f"Secret {name} {said}."}])


@router.post("/dashboard/e/{env}/secrets/{name}/delete")
@page
async def delete_secret(request: Request, env: str, name: str) -> Response:
    session = await _acting(request, env, "secrets", Role.OWNER, "delete secrets")
    await secrets.delete_secret(_services(request), session.principal, name)
    return _back(session, "secrets")


# --------------------------------------------------------------------------- tokens


@router.get("/dashboard/e/{env}/tokens")
@page
async def tokens_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "tokens")
    return await _tokens(request, session)


async def _tokens(
    request: Request, session: Session, *, issued: str | None = None, notes: list[Any] | None = None
) -> Response:
    can_manage = session.role.allows(Role.OWNER)
    found = await workspaces.list_tokens(_services(request), session.principal, None) if can_manage else []
    return render(
        request,
        "tokens.html",
        title="Tokens",
        chrome=session.chrome,
        tokens=found,
        can_manage=can_manage,
        issued=issued,
        roles=[r.value for r in Role if session.role.allows(r)],
        notes=notes or [],
    )


@router.post("/dashboard/e/{env}/tokens")
@page
async def create_token(request: Request, env: str) -> Response:
    """A new token of this environment's workspace, shown on this answer's page only (never in a URL)."""
    session = await _acting(request, env, "tokens", Role.OWNER, "issue tokens")
    form = await read_form(request)
    subject = _field(form, "subject", limit=128).strip()
    role = form.get("role") or session.role.value
    if role not in {r.value for r in Role}:
        raise FormError(f"role: one of viewer, member or owner is needed, got {role!r}")
    days = form.get("ttl_days", "").strip()
    ttl_s = None if not days else _whole(days, "ttl_days", 1, 3650) * 86400.0
    record, token = await workspaces.issue_token(
        _services(request), session.principal, None, subject=subject, ttl_s=ttl_s, role=role
    )
    note = {"kind": "secret", "text": f"Token {record.id} issued: copy it now, it is not shown again."}
    return await _tokens(request, session, issued=token, notes=[note])


@router.post("/dashboard/e/{env}/tokens/{token_id}/revoke")
@page
async def revoke_token(request: Request, env: str, token_id: str) -> Response:
    session = await _acting(request, env, "tokens", Role.OWNER, "revoke tokens")
    await workspaces.revoke_token(_services(request), session.principal, token_id)
    if token_id == session.principal.token_id:
        return RedirectResponse("/auth/sign-in", status_code=303)
    return _back(session, "tokens")


# --------------------------------------------------------------------------- members


@router.get("/dashboard/e/{env}/members")
@page
async def members_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "members")
    found = await workspaces.list_members(_services(request), session.principal)
    return render(
        request,
        "members.html",
        title="Members",
        chrome=session.chrome,
        members=found,
        can_manage=session.role.allows(Role.OWNER),
        roles=[r.value for r in Role],
    )


@router.post("/dashboard/e/{env}/members")
@page
async def put_member(request: Request, env: str) -> Response:
    """Invite someone, or change a member's role (the same form: the email names who)."""
    session = await _acting(request, env, "members", Role.OWNER, "invite people or change their roles")
    form = await read_form(request)
    email = _field(form, "email", limit=320).strip()
    role = form.get("role", "")
    if role not in {r.value for r in Role}:
        raise FormError(f"role: one of viewer, member or owner is needed, got {role!r}")
    await workspaces.invite(_services(request), session.principal, email, role)
    return _back(session, "members")


@router.post("/dashboard/e/{env}/members/{email}/remove")
@page
async def remove_member(request: Request, env: str, email: str) -> Response:
    session = await _acting(request, env, "members", Role.OWNER, "remove people")
    await workspaces.remove_member(_services(request), session.principal, email)
    return _back(session, "members")


# --------------------------------------------------------------------------- environments


@router.get("/dashboard/e/{env}/environments")
@page
async def environments_page(request: Request, env: str) -> Response:
    session = await _session(request, env, "environments")
    found = await workspaces.list_environments(_services(request), session.principal)
    return render(
        request,
        "environments.html",
        title="Environments",
        chrome=session.chrome,
        environments=found,
        main=MAIN_ENVIRONMENT,
        can_manage=session.role.allows(Role.OWNER),
    )


@router.post("/dashboard/e/{env}/environments")
@page
async def create_environment(request: Request, env: str) -> Response:
    session = await _acting(request, env, "environments", Role.OWNER, "create environments")
    form = await read_form(request)
    name = _field(form, "name", limit=32).strip()
    await workspaces.create_environment(_services(request), session.principal, name)
    return _back(session, "environments")


@router.post("/dashboard/e/{env}/environments/{name}/delete")
@page
async def delete_environment(request: Request, env: str, name: str) -> Response:
    session = await _acting(request, env, "environments", Role.OWNER, "delete environments")
    await workspaces.delete_environment(_services(request), session.principal, name)
    if name.lower() == session.principal.environment:
        return RedirectResponse(f"/dashboard/e/{MAIN_ENVIRONMENT}/environments", status_code=303)
    return _back(session, "environments")


# --------------------------------------------------------------------------- usage


def _day(value: str, name: str) -> datetime:
    try:
        return datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise FormError(f"{name}: a date like 2026-12-01 is needed, got {value!r}") from None


@router.get("/dashboard/e/{env}/usage")
@page
async def usage_page(request: Request, env: str) -> Response:
    """GPU-hours and CPU-hours of the workspace by environment and pool, from ``since`` to ``until`` (days, UTC,
    ``until`` included; default: the last 30 days)."""
    session = await _session(request, env, "usage")
    today = datetime.now(UTC).date()
    since_text = request.query_params.get("since") or (today - timedelta(days=29)).isoformat()
    until_text = request.query_params.get("until") or today.isoformat()
    since, until = _day(since_text, "since"), _day(until_text, "until") + timedelta(days=1)
    found = await usage_service.usage(_services(request), session.principal, since, until)
    return render(
        request,
        "usage.html",
        title="Usage",
        chrome=session.chrome,
        usage=found,
        since=since_text,
        until=until_text,
        digits=usage_service.DIGITS,
    )


# --------------------------------------------------------------------------- anything else under /dashboard/


@router.api_route("/dashboard/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
async def not_found(request: Request, rest: str) -> Response:
    return message_page(
        request,
        "Not found",
        f"The dashboard has no page {request.url.path}.",
        status=404,
        link=("/dashboard/", "The dashboard"),
    )
