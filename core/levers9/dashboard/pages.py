"""Rendering the dashboard's HTML: one Jinja2 environment, the base layout, and the headers every page carries.

Everything under ``/dashboard/`` and ``/auth/`` answers through :func:`render` (or :func:`secure`), so:

* every response carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that allows scripts, styles and
  connections from this origin only (no inline script or style, so an injected ``<script>`` or ``style=``
  does nothing), no framing, ``nosniff``, ``Referrer-Policy: same-origin`` and ``Cache-Control: no-store``
  (a page shows a workspace's data: no shared cache or back button keeps it);
* every value reaches the page through Jinja2 with autoescape on (``.html`` templates), so a task's output, a
  secret's name or an email is text, never markup;
* the layout (``templates/base.html``) links only files served from ``/dashboard/static/`` (no CDN): a
  machine without internet serves the whole dashboard.

A template extends ``base.html`` and fills ``{% block main %}``; :func:`render` passes ``title`` and, for a
signed-in page, ``chrome`` (the header's workspace, environments, person and CSRF token: see
:mod:`levers9.dashboard.routes`). The sign-in pages (:mod:`levers9.dashboard.auth_routes`) render with no
chrome: the header then shows the name alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "NAV",
    "SECURITY_HEADERS",
    "STATIC",
    "STATIC_PREFIX",
    "TEMPLATES",
    "Chrome",
    "message_page",
    "render",
    "render_fragment",
    "secure",
]

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

#: the headers of every dashboard and sign-in response (see the module docstring)
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

#: where the layout's stylesheet, script and icon are served
STATIC_PREFIX = "/dashboard/static"
#: the folder they are read from (every file in it is served, nothing else)
STATIC = Path(__file__).parent / "static"

TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default_for_string=True, default=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.globals["static"] = STATIC_PREFIX


def _timestamp(epoch_s: float) -> str:
    """An epoch time as UTC text; an absolute time, so a region re-rendered each second stays the same."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _heartbeat(epoch_s: float) -> str:
    return _timestamp(epoch_s) if epoch_s else "never"


TEMPLATES.globals["timestamp"] = _timestamp
TEMPLATES.globals["heartbeat"] = _heartbeat


#: the sections of a signed-in page, in the order the navigation lists them: (path under the environment, label)
NAV: tuple[tuple[str, str], ...] = (
    ("deployments", "Deployments"),
    ("tasks", "Tasks"),
    ("pools", "Pools"),
    ("machines", "Machines"),
    ("volumes", "Volumes"),
    ("secrets", "Secrets"),
    ("tokens", "Tokens"),
    ("members", "Members"),
    ("environments", "Environments"),
    ("usage", "Usage"),
)


@dataclass(frozen=True)
class Chrome:
    """What the header of a signed-in page shows; the session token itself is never part of it."""

    workspace: str
    environment: str
    email: str
    role: str
    #: the CSRF token every form of the page carries (see :mod:`levers9.dashboard.session`)
    csrf: str
    #: the section shown (one of :data:`NAV`'s paths)
    section: str
    #: the workspace's environments, for the switcher
    environments: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        """The URL prefix of this environment's pages."""
        return f"/dashboard/e/{self.environment}"

    @property
    def nav(self) -> tuple[tuple[str, str], ...]:
        return NAV


#: the paths whose every answer carries :data:`SECURITY_HEADERS`, whatever answers it (a route, a 405, a 404)
SECURED_PREFIXES = ("/dashboard", "/auth")


class SecuredPaths:
    """ASGI middleware: every response under :data:`SECURED_PREFIXES` (and ``/``) gets the headers a route did not
    set, so the framework's own answers there (HEAD, OPTIONS, a 405, a 404) are as locked down as the pages."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == "/" or path.startswith(SECURED_PREFIXES)):
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in self._headers if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, sending)


def secure(response: Response) -> Response:
    """``response`` with :data:`SECURITY_HEADERS` (those it already has are kept: a static file's caching)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def render(
    request: Request,
    template: str,
    *,
    title: str,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """The page ``template`` (which extends ``base.html``) with ``context``, and :data:`SECURITY_HEADERS`.

    ``chrome`` (the signed-in header) defaults to None: the layout then shows the name alone, as on the
    sign-in pages."""
    context.setdefault("chrome", None)
    html = TEMPLATES.get_template(template).render(request=request, title=title, **context)
    response = HTMLResponse(html, status_code=status, headers=dict(headers or {}))
    secure(response)
    return response


def render_fragment(template: str, **context: Any) -> str:
    """A template rendered on its own (a page region the live updates replace), escaped like a page."""
    return TEMPLATES.get_template(template).render(**context)


def message_page(
    request: Request, title: str, message: str, *, status: int, chrome: Any = None, link: tuple[str, str] | None = None
) -> HTMLResponse:
    """A page saying ``message`` (an error, a refusal), with an optional ``(href, text)`` link onward."""
    return render(request, "message.html", title=title, status=status, message=message, chrome=chrome, link=link)
