"""Live pages: regions re-rendered on the server and sent as server-sent events when they change, and task logs.

A page region (``deployments``, ``tasks``, ``task``, ``pools``, ``machines``) is one template fed by one
builder that calls the service layer with the session's principal; the page renders it once, inline, and its
script (``static/dashboard.js``) subscribes to ``/dashboard/e/ENV/live/REGION``, whose stream renders the
region again every :data:`EVERY_S` and sends it (event ``region``) only when its HTML changed. So a
deployment made from the CLI appears, a task's status changes and a stopped version goes, without a reload.

Invariants:

* a stream is held on the session's token (``services.auth.streams``): revoking the token ends it with a
  ``signed-out`` event (the script reloads the page, which leads to signing in; a stream asked for without a
  valid session gets that one event too), the replica stopping with an ``end`` event; the script does not
  reconnect after either;
* one session holds at most :data:`MAX_STREAMS_PER_SESSION` streams on this replica; one more is a 429;
* a stream stops when the client goes (checked every :data:`EVERY_S`) or when a builder raises (the object
  went: its ``end`` event says why);
* log streams send the task's output from its start as ``log`` events (text, never markup: the script inserts
  it as text) and ``end`` once the task finished; between pieces a comment every :data:`EVERY_S` notices a
  client that went.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from levers9.dashboard.pages import SECURITY_HEADERS, message_page, render_fragment
from levers9.services import deployments, health, machines, pools, tasks
from levers9.services.agent_pools import clusters, joined_machines
from levers9.services.auth import PermissionDenied, Principal
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.errors import error_answer
from levers9.services.revocation import ReplicaStopping, TokenRevoked
from levers9.state.sql.records import Role

__all__ = [
    "EVERY_S",
    "MAX_STREAMS_PER_SESSION",
    "REGIONS",
    "SIGNED_OUT",
    "log_stream",
    "region_stream",
    "render_region",
    "signed_out_stream",
]

#: how often a live region is rendered again
EVERY_S = 1.0
#: the most live streams (regions and logs) one session holds on one replica
MAX_STREAMS_PER_SESSION = 8
#: the most tasks the tasks region lists
TASKS_SHOWN = 200

Params = Mapping[str, list[str]]
Builder = Callable[[Services, DataPlane, Principal, Params], Awaitable[dict[str, Any]]]

#: open streams by session token id (this replica)
_open: Counter[str] = Counter()


async def _deployments(services: Services, dp: DataPlane, principal: Principal, params: Params) -> dict[str, Any]:
    found = await deployments.list_deployments(dp, principal)
    apps = {}
    for app_id in {view.deployment.app_id for view in found}:
        # the app of one of the caller's own deployments: nothing another workspace could learn from
        record = await services.apps.get(app_id)
        apps[app_id] = record.name if record is not None else ""
    return {"deployments": found, "apps": apps, "can_stop": principal.role.allows(Role.MEMBER)}


async def _tasks(services: Services, dp: DataPlane, principal: Principal, params: Params) -> dict[str, Any]:
    wanted = params.get("status") or None
    found = await tasks.list_tasks(dp, principal, statuses=wanted, limit=TASKS_SHOWN)
    return {"tasks": found, "names": await tasks.function_names(dp, found), "shown": TASKS_SHOWN}


async def _task(services: Services, dp: DataPlane, principal: Principal, params: Params) -> dict[str, Any]:
    task_id = (params.get("id") or [""])[0]
    task = await tasks.get_task(dp, principal, task_id)
    history = await tasks.task_history(dp, principal, task_id)
    names = await tasks.function_names(dp, [task])
    return {"task": task, "history": history, "function": names.get(task.stub_id or "", "")}


async def _pools(services: Services, dp: DataPlane, principal: Principal, params: Params) -> dict[str, Any]:
    found = await pools.list_pools(services, principal)
    workers = await pools.list_workers(services, principal)
    offers = {p.name: services.scheduler.offers.get(p.name) for p in found}
    report = await health.health(services)
    # each provider plugin as the controlplane's hooks see it (levers9 check's provider question, without asking
    # the provider's own check hook every second): unhealthy after timeouts or a failed start, with the reason
    plugins = services.hooks.health()
    providers = {p.provider: plugins.get(p.provider) for p in found}
    return {"pools": found, "workers": workers, "offers": offers, "health": report, "providers": providers}


async def _machines(services: Services, dp: DataPlane, principal: Principal, params: Params) -> dict[str, Any]:
    try:
        started: list[Any] | None = await machines.list_machines(services, principal)
    except PermissionDenied:
        started = None  # operators only: the page says so
    joined = await joined_machines.list_machines(services, principal)
    attached = await clusters.list_clusters(services, principal)
    return {"machines": started, "joined": joined, "clusters": attached}


#: region name: (template, builder)
REGIONS: dict[str, tuple[str, Builder]] = {
    "deployments": ("regions/deployments.html", _deployments),
    "tasks": ("regions/tasks.html", _tasks),
    "task": ("regions/task.html", _task),
    "pools": ("regions/pools.html", _pools),
    "machines": ("regions/machines.html", _machines),
}


def _dataplane(request: Request) -> DataPlane:
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


async def render_region(request: Request, principal: Principal, region: str, params: Params, *, csrf: str) -> str:
    """The region's HTML now, its forms carrying ``csrf`` (raises the builder's domain errors: the page answers
    them)."""
    template, build = REGIONS[region]
    services: Services = request.app.state.services
    context = await build(services, _dataplane(request), principal, params)
    base = f"/dashboard/e/{principal.environment}"
    return render_fragment(template, base=base, principal=principal, csrf=csrf, **context)


def event(name: str, data: str) -> bytes:
    """One server-sent event; each line of ``data`` a ``data:`` line (the client joins them with newlines)."""
    text = data.replace("\r\n", "\n").replace("\r", "\n")
    lines = "".join(f"data: {line}\n" for line in text.split("\n"))
    return f"event: {name}\n{lines}\n".encode()


_STREAM_HEADERS = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}


def _too_many(request: Request, principal: Principal) -> Response | None:
    if _open[principal.token_id] >= MAX_STREAMS_PER_SESSION:
        return message_page(
            request,
            "Too many live views",
            f"This session already has {MAX_STREAMS_PER_SESSION} live views open: close some tabs.",
            status=429,
        )
    return None


@contextlib.contextmanager
def _counted(token_id: str) -> Any:
    _open[token_id] += 1
    try:
        yield
    finally:
        _open[token_id] -= 1
        if _open[token_id] <= 0:
            del _open[token_id]


#: the event that tells a page its session ended (the script reloads it, which leads to signing in)
SIGNED_OUT = "signed-out"
SIGNED_OUT_TEXT = "Your session ended: sign in again."


def _ended(exc: BaseException) -> bytes:
    """The last event of a stream that ``exc`` ended."""
    if isinstance(exc, TokenRevoked):
        return event(SIGNED_OUT, SIGNED_OUT_TEXT)
    if isinstance(exc, ReplicaStopping):
        return event("end", "The controlplane is restarting: reload the page.")
    return event("end", str(exc))


def signed_out_stream() -> Response:
    """The whole stream of a request whose session is gone: one :data:`SIGNED_OUT` event (a redirect to the
    sign-in page would be no event stream, and the page's script could not tell what happened)."""

    async def events() -> AsyncIterator[bytes]:
        yield event(SIGNED_OUT, SIGNED_OUT_TEXT)

    return StreamingResponse(events(), media_type="text/event-stream", headers=_STREAM_HEADERS)


async def region_stream(request: Request, principal: Principal, region: str, params: Params, *, csrf: str) -> Response:
    """The region's server-sent events (see the module docstring); 404 for a region there is none of."""
    if region not in REGIONS:
        return message_page(request, "Not found", f"no live region {region!r}", status=404)
    refused = _too_many(request, principal)
    if refused is not None:
        return refused
    services: Services = request.app.state.services

    async def events() -> AsyncIterator[bytes]:
        with _counted(principal.token_id), services.auth.streams.open(principal.token_id) as guard:
            if _open[principal.token_id] > MAX_STREAMS_PER_SESSION:
                yield event("end", "Too many live views in this session.")
                return
            last = None
            try:
                while not await request.is_disconnected():
                    html = await guard.wait(render_region(request, principal, region, params, csrf=csrf))
                    if html != last:
                        yield event("region", html)
                        last = html
                    await guard.wait(asyncio.sleep(EVERY_S))
            except (TokenRevoked, ReplicaStopping) as exc:
                yield _ended(exc)
            except Exception as exc:
                if error_answer(exc) is None:
                    raise
                yield _ended(exc)

    return StreamingResponse(events(), media_type="text/event-stream", headers=_STREAM_HEADERS)


def log_stream(request: Request, principal: Principal, task_id: str) -> Response:
    """The task's output as ``log`` events, then ``end`` (see the module docstring)."""
    refused = _too_many(request, principal)
    if refused is not None:
        return refused
    services: Services = request.app.state.services
    dataplane = _dataplane(request)

    async def events() -> AsyncIterator[bytes]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        queue: asyncio.Queue[bytes | Exception | None] = asyncio.Queue(maxsize=64)

        async def pump() -> None:
            try:
                async for piece in tasks.task_logs(dataplane, principal, task_id, follow=True):
                    await queue.put(piece)
            except Exception as exc:  # the task went (its workspace deleted...): the stream says so and ends
                await queue.put(exc)
                return
            await queue.put(None)

        with _counted(principal.token_id), services.auth.streams.open(principal.token_id) as guard:
            if _open[principal.token_id] > MAX_STREAMS_PER_SESSION:
                yield event("end", "Too many live views in this session.")
                return
            reader = asyncio.create_task(pump(), name=f"dashboard logs of {task_id}")
            try:
                while True:
                    try:
                        piece = await guard.wait(asyncio.wait_for(queue.get(), EVERY_S))
                    except TimeoutError:
                        if await request.is_disconnected():
                            return
                        yield b": still following\n\n"
                        continue
                    if isinstance(piece, Exception):
                        yield event("end", f"The output stopped: {piece}")
                        return
                    if piece is None:
                        rest = decoder.decode(b"", final=True)
                        if rest:
                            yield event("log", rest)
                        yield event("end", "The task finished: this is all its output.")
                        return
                    text = decoder.decode(piece)
                    if text:
                        yield event("log", text)
            except (TokenRevoked, ReplicaStopping) as exc:
                yield _ended(exc)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader

    return StreamingResponse(events(), media_type="text/event-stream", headers=_STREAM_HEADERS)
