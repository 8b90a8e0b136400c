"""Signing people in: the pages and redirects under ``/auth/``.

* ``GET /auth/sign-in?next=PATH``: the sign-in page (a button per configured identity provider; how to get a
  one-time link);
* ``GET /auth/link/CODE`` shows a button, and its ``POST`` spends the link and starts the session: a link
  fetched by a mail scanner or a chat's preview (a GET) is not spent;
* ``GET /auth/oidc/start?next=PATH`` -> the issuer; ``GET /auth/oidc/callback`` <- the issuer (see
  :mod:`levers9.dashboard.auth_oidc`);
* ``GET /auth/workspaces`` and ``POST /auth/switch``: the person's workspaces, and moving the session to another;
* ``POST /auth/sign-out``: the session's token revoked, the cookie cleared;
* ``GET /auth/cli/start``, ``POST /auth/cli/allow`` and ``POST /auth/cli/exchange``: ``levers9 login`` (RFC 8252's
  loopback redirect with RFC 7636's PKCE; see :mod:`levers9.cli.login_cmd`).

Invariants, and what each failure means:

* a session starts only for a person who is a member of the workspace it is for (see
  :func:`levers9.dashboard.auth_signin.workspace_for`); a sign-in that names nobody who may enter ends on a page
  that says so (for OpenID Connect: "ask an owner to invite EMAIL"), with no cookie set;
* where a person goes afterwards (``next``) is only ever a path of this site
  (:func:`levers9.dashboard.auth_codes.local_path`): no open redirect;
* every state-changing request made from a session (sign-out, switch, allowing the CLI) carries the session's
  CSRF token; the link's POST and the CLI exchange have no session yet, and the one-time code itself is the
  secret. So that nobody signs someone else's browser in as themselves (login CSRF): a link's POST from
  another site's page (its ``Origin``) is refused, and an OpenID Connect state is bound to the browser that
  started it by a cookie (:data:`STATE_COOKIE`, a hash of the state) that its callback must bring back;
* a failure (a spent or expired link, a denied or forged OpenID Connect callback, an issuer that cannot be
  reached) is a page saying what happened and where to start again, never a traceback; the CLI exchange answers
  JSON errors (``{"error": {"type", "message"}}``);
* the token the CLI gets travels only in the exchange's answer: never in a URL, a page or a log. The exchange is
  refused over plain HTTP unless it came to a loopback address;
* every response carries the dashboard's security headers (:func:`levers9.dashboard.pages.secure`); the CLI's
  confirmation page's Content-Security-Policy also allows its form to go on to the CLI's loopback port.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from levers9.addresses import is_loopback
from levers9.config.model import OidcConfig
from levers9.dashboard import auth_oidc
from levers9.dashboard.auth_codes import check_challenge, check_verifier, local_path, s256
from levers9.dashboard.auth_signin import (
    CLI,
    LINK,
    OIDC_STATE,
    OIDC_STATE_TTL_S,
    base_url,
    cli_code,
    codes,
    workspace_for,
)
from levers9.dashboard.pages import CONTENT_SECURITY_POLICY, message_page, render, secure
from levers9.dashboard.session import (
    CsrfRefused,
    check_csrf,
    clear_session_cookie,
    csrf_token,
    read_form,
    session_token,
    set_session_cookie,
    start_session,
)
from levers9.services import workspaces as workspace_service
from levers9.services.auth import Principal, Unauthenticated
from levers9.services.core import Services
from levers9.state.sql.records import MAIN_ENVIRONMENT, Role, TokenKind

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

SIGN_IN = "/auth/sign-in"
#: the cookie that binds an OpenID Connect sign-in's state to the browser that started it
STATE_COOKIE = "levers9_oidc_state"
#: an OAuth state or a CLI's state: URL-safe characters, as RFC 3986 leaves unreserved
_STATE = re.compile(r"^[A-Za-z0-9\-._~]{8,256}$")


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _secure_cookie(request: Request, services: Services) -> bool:
    """Cookies are Secure when the request came over TLS, or the configured public address is https (a proxy)."""
    public = services.config.auth.public_url or ""
    return request.url.scheme == "https" or public.startswith("https://")


async def _session(request: Request, services: Services) -> tuple[str, Principal] | None:
    """The request's session and whom it acts for; None without a cookie, or with one that does not verify."""
    token = session_token(request)
    if token is None:
        return None
    try:
        principal = await services.auth.verify(token)
    except Unauthenticated:
        return None
    if principal.kind is not TokenKind.USER or principal.workspace_root is None:
        return None
    return token, principal


def _same_origin(request: Request, services: Services) -> bool:
    """Whether a POST came from a page of this site: a browser names the page's origin in ``Origin``; another
    site's form posting someone's own link code (signing a visitor in as the attacker) names its own. No Origin
    (not a browser, or an old one) is let through: the code is the secret."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    allowed = {base_url(services, request).rstrip("/")}
    allowed.add(str(request.base_url).rstrip("/"))
    return any(origin == urllib.parse.urlunsplit((*urllib.parse.urlsplit(a)[:2], "", "", "")) for a in allowed)


def _to_sign_in(next_path: str) -> Response:
    return secure(RedirectResponse(f"{SIGN_IN}?{urllib.parse.urlencode({'next': next_path})}", status_code=303))


def _this_path(request: Request) -> str:
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def _page_error(request: Request, title: str, message: str, status: int, *, again: bool = True) -> Response:
    link = (SIGN_IN, "Sign in again") if again else None
    return message_page(request, title, message, status=status, link=link)


async def _enter(
    request: Request, services: Services, user_id: str, workspace_id: str, how: str, next_path: str
) -> Response:
    """Start a session for the person in the workspace and send the browser on to ``next_path``."""
    token = await start_session(services, user_id, workspace_id, how=how)
    response = RedirectResponse(local_path(next_path), status_code=303)
    set_session_cookie(response, token, secure=_secure_cookie(request, services))
    return secure(response)


# --------------------------------------------------------------------------- the sign-in page


@router.get(SIGN_IN)
async def sign_in_page(request: Request, next: str | None = None) -> Response:
    services = _services(request)
    oidc = services.config.auth.oidc
    session = await _session(request, services)
    signed_in = None
    if session is not None and session[1].user_id is not None and session[1].workspace_root is not None:
        person = await services.users.get(session[1].user_id)
        workspace = await services.workspaces.get(session[1].workspace_root)
        if person is not None and workspace is not None:
            signed_in = (person.email, workspace.name)
    return render(
        request,
        "auth_sign_in.html",
        title="Sign in",
        provider=oidc.display_name if oidc is not None else None,
        next=local_path(next),
        signed_in=signed_in,
        error=None,
    )


# --------------------------------------------------------------------------- one-time links


@router.get("/auth/link/{code}")
async def link_page(request: Request, code: str) -> Response:
    """The link's page: a button that spends it (a GET never does)."""
    services = _services(request)
    if not await codes(services).waiting(LINK, code):
        return _spent_link(request)
    return render(request, "auth_link.html", title="Sign in to levers9", code=code, workspace=None)


def _spent_link(request: Request) -> Response:
    return _page_error(
        request,
        "This sign-in link does not work",
        "This link was used already or has expired: each link signs in once, for a short while. Get a new one "
        "with `levers9 dashboard` (or restart `levers9 up`, which prints one).",
        404,
    )


@router.post("/auth/link/{code}")
async def use_link(request: Request, code: str) -> Response:
    services = _services(request)
    if not _same_origin(request, services):
        return _page_error(
            request, "Refused", "This sign-in was sent from another site; open the link itself to sign in.", 403
        )
    payload = await codes(services).take(LINK, code)
    if payload is None:
        return _spent_link(request)
    user_id, workspace_id = str(payload["user"]), str(payload["workspace"])
    if await services.members.role_of(workspace_id, user_id) is None:
        return _page_error(
            request, "Not a member", "The person this link was made for is no longer a member of its workspace.", 403
        )
    return await _enter(request, services, user_id, workspace_id, "one-time link", "/dashboard/")


# --------------------------------------------------------------------------- OpenID Connect


def _redirect_uri(request: Request, services: Services) -> str:
    return f"{base_url(services, request)}/auth/oidc/callback"


@router.get("/auth/oidc/start")
async def oidc_start(request: Request, next: str | None = None) -> Response:
    services = _services(request)
    oidc = services.config.auth.oidc
    if oidc is None:
        return _page_error(
            request, "No identity provider", "This levers9 has no identity provider configured (auth.oidc).", 404
        )
    verifier = secrets.token_urlsafe(48)
    nonce = secrets.token_urlsafe(24)
    state = await codes(services).put(
        OIDC_STATE, {"nonce": nonce, "verifier": verifier, "next": local_path(next)}, OIDC_STATE_TTL_S
    )
    try:
        url = await auth_oidc.authorization_url(
            oidc, _redirect_uri(request, services), state=state, nonce=nonce, challenge=s256(verifier)
        )
    except auth_oidc.SignInFailed as exc:
        await codes(services).take(OIDC_STATE, state)
        return _page_error(request, "Sign-in failed", str(exc), exc.status)
    response = RedirectResponse(url, status_code=303)
    # the state is bound to this browser too: a callback with someone else's state and code (signing this
    # browser in as them) finds no cookie of its own
    response.set_cookie(
        STATE_COOKIE,
        hashlib.sha256(state.encode()).hexdigest(),
        max_age=int(OIDC_STATE_TTL_S),
        path="/auth/oidc/",
        secure=_secure_cookie(request, services),
        httponly=True,
        samesite="lax",
    )
    return secure(response)


@router.get("/auth/oidc/callback")
async def oidc_callback(
    request: Request,
    code: str | None = None,
    state: str | None = None,
    error: str | None = None,
    error_description: str | None = None,
) -> Response:
    services = _services(request)
    oidc = services.config.auth.oidc
    if oidc is None:
        return _page_error(
            request, "No identity provider", "This levers9 has no identity provider configured (auth.oidc).", 404
        )
    bound = request.cookies.get(STATE_COOKIE)
    saved = await codes(services).take(OIDC_STATE, state) if state else None
    response = await _oidc_callback(request, services, oidc, code, state, saved, bound, error, error_description)
    response.delete_cookie(STATE_COOKIE, path="/auth/oidc/", httponly=True, samesite="lax")
    return response


async def _oidc_callback(
    request: Request,
    services: Services,
    oidc: OidcConfig,
    code: str | None,
    state: str | None,
    saved: dict[str, Any] | None,
    bound: str | None,
    error: str | None,
    error_description: str | None,
) -> Response:
    if error:
        said = f"{error}: {error_description}" if error_description else error
        return _page_error(
            request, "Sign-in refused", f"The identity provider {oidc.display_name} did not sign you in ({said}).", 403
        )
    if not state:
        return _page_error(
            request,
            "Sign-in failed",
            "The identity provider's answer has no state, so it cannot be matched to a sign-in started here.",
            400,
        )
    if saved is None:
        return _page_error(
            request,
            "Sign-in failed",
            "This sign-in was not started here, was finished already or took too long. Start again.",
            400,
        )
    assert state is not None
    if bound is None or not hmac.compare_digest(bound, hashlib.sha256(state.encode()).hexdigest()):
        return _page_error(
            request,
            "Sign-in failed",
            "This sign-in was started in another browser (or its cookie was refused): start again here.",
            400,
        )
    if not code:
        return _page_error(request, "Sign-in failed", "The identity provider's answer has no code.", 400)
    try:
        who = await auth_oidc.finish(
            oidc,
            _redirect_uri(request, services),
            code=code,
            nonce=str(saved["nonce"]),
            verifier=str(saved["verifier"]),
        )
    except auth_oidc.SignInFailed as exc:
        return _page_error(request, "Sign-in failed", str(exc), exc.status)
    try:
        person = await services.users.signed_in(who.issuer, who.subject, who.email, who.name)
    except ValueError as exc:  # an email the address check refuses
        return _page_error(request, "Sign-in failed", str(exc), 403)
    entry = await workspace_for(services, person)
    if entry is None:
        return _page_error(
            request,
            "Not a member yet",
            f"You are signed in at {oidc.display_name} as {person.email}, but you are a member of no levers9 "
            f"workspace here. Ask an owner to invite {person.email}.",
            403,
            again=False,
        )
    workspace, _ = entry
    return await _enter(
        request, services, person.id, workspace.id, f"OpenID Connect, {oidc.display_name}", str(saved["next"])
    )


# --------------------------------------------------------------------------- workspaces and signing out


@router.get("/auth/workspaces")
async def workspaces_page(request: Request) -> Response:
    services = _services(request)
    session = await _session(request, services)
    if session is None or session[1].user_id is None:
        return _to_sign_in(_this_path(request))
    token, principal = session
    assert principal.user_id is not None
    mine = await services.members.workspaces_of(principal.user_id)
    rows = [(w.name, role.value, w.id == principal.workspace_root) for w, role in mine]
    return render(request, "auth_workspaces.html", title="Your workspaces", workspaces=rows, csrf=csrf_token(token))


async def _form(request: Request) -> dict[str, str] | Response:
    try:
        return await read_form(request)
    except ValueError as exc:
        return _page_error(request, "Bad request", str(exc), 400, again=False)


@router.post("/auth/switch")
async def switch(request: Request) -> Response:
    services = _services(request)
    session = await _session(request, services)
    if session is None or session[1].user_id is None:
        return _to_sign_in("/auth/workspaces")
    token, principal = session
    assert principal.user_id is not None
    try:
        await check_csrf(request, token)
    except CsrfRefused as exc:
        return _page_error(request, "Refused", str(exc), 403, again=False)
    form = await _form(request)
    if isinstance(form, Response):
        return form
    name = form.get("workspace", "")
    target = await services.workspaces.by_name(name) if name else None
    if target is None or target.parent_id is not None:
        return _page_error(
            request, "No such workspace", f"workspace: there is no workspace {name!r}.", 404, again=False
        )
    if await services.members.role_of(target.id, principal.user_id) is None:
        return _page_error(request, "Not a member", f"You are not a member of workspace {name!r}.", 403, again=False)
    response = await _enter(request, services, principal.user_id, target.id, "switched workspace", "/dashboard/")
    await workspace_service.revoke_token(services, principal, principal.token_id)
    return response


@router.post("/auth/sign-out")
async def sign_out(request: Request) -> Response:
    services = _services(request)
    session = await _session(request, services)
    if session is not None:
        token, principal = session
        try:
            await check_csrf(request, token)
        except CsrfRefused as exc:
            return _page_error(request, "Refused", str(exc), 403, again=False)
        await workspace_service.revoke_token(services, principal, principal.token_id)
    response = RedirectResponse(SIGN_IN, status_code=303)
    clear_session_cookie(response, secure=_secure_cookie(request, services))
    return secure(response)


# --------------------------------------------------------------------------- levers9 login


def _cli_request(values: dict[str, str]) -> tuple[int, str, str, str] | str:
    """(port, state, challenge, environment) of a ``levers9 login`` request, or what is wrong with it."""
    port = values.get("port", "")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return "port: expected the CLI's loopback port, a whole number from 1 to 65535"
    state = values.get("state", "")
    if not _STATE.fullmatch(state):
        return "state: expected 8 to 256 URL-safe characters"
    method = values.get("code_challenge_method", "S256")
    if method != "S256":
        return f"code_challenge_method: only S256 is accepted, got {method!r}"
    try:
        challenge = check_challenge(values.get("code_challenge", ""))
    except ValueError as exc:
        return str(exc)
    environment = (values.get("env") or MAIN_ENVIRONMENT).lower()
    return int(port), state, challenge, environment


async def _cli_person(
    request: Request, services: Services, principal: Principal, environment: str
) -> tuple[str, str] | Response:
    """(email, workspace name) of the signed-in person, with ``environment`` checked to exist."""
    if principal.user_id is None or principal.workspace_root is None:
        return _page_error(
            request,
            "Sign in as a person",
            "This session acts for no person, so it cannot sign the CLI in. Sign out, then sign in again.",
            403,
        )
    person = await services.users.get(principal.user_id)
    workspace = await services.workspaces.get(principal.workspace_root)
    if person is None or workspace is None:
        return _to_sign_in("/dashboard/")
    if environment != MAIN_ENVIRONMENT and await services.workspaces.environment(workspace.id, environment) is None:
        return _page_error(
            request,
            "No such environment",
            f"env: workspace {workspace.name} has no environment {environment!r} "
            "(`levers9 environment list` shows them).",
            404,
            again=False,
        )
    return person.email, workspace.name


@router.get("/auth/cli/start")
async def cli_start(request: Request) -> Response:
    services = _services(request)
    asked = _cli_request(dict(request.query_params))
    if isinstance(asked, str):
        return _page_error(request, "Bad sign-in request", f"levers9 login sent a bad request: {asked}", 400)
    port, state, challenge, environment = asked
    session = await _session(request, services)
    if session is None:
        return _to_sign_in(_this_path(request))
    token, principal = session
    found = await _cli_person(request, services, principal, environment)
    if isinstance(found, Response):
        return found
    email, workspace = found
    # the form goes on to the CLI's own port, which 'self' does not cover
    policy = CONTENT_SECURITY_POLICY.replace("form-action 'self'", f"form-action 'self' http://127.0.0.1:{port}")
    return render(
        request,
        "auth_cli.html",
        title="Sign in the levers9 CLI",
        headers={"Content-Security-Policy": policy},
        email=email,
        workspace=workspace,
        environment=environment,
        role=principal.role.value,
        csrf=csrf_token(token),
        port=port,
        state=state,
        challenge=challenge,
    )


@router.post("/auth/cli/allow")
async def cli_allow(request: Request) -> Response:
    services = _services(request)
    session = await _session(request, services)
    if session is None:
        return _to_sign_in("/dashboard/")
    token, principal = session
    try:
        await check_csrf(request, token)
    except CsrfRefused as exc:
        return _page_error(request, "Refused", str(exc), 403, again=False)
    form = await _form(request)
    if isinstance(form, Response):
        return form
    asked = _cli_request(form)
    if isinstance(asked, str):
        return _page_error(request, "Bad sign-in request", asked, 400)
    port, state, challenge, environment = asked
    found = await _cli_person(request, services, principal, environment)
    if isinstance(found, Response):
        return found
    assert principal.user_id is not None
    assert principal.workspace_root is not None
    code = await cli_code(services, challenge, principal.user_id, principal.workspace_root, environment)
    query = urllib.parse.urlencode({"code": code, "state": state})
    return secure(RedirectResponse(f"http://127.0.0.1:{port}/callback?{query}", status_code=303))


def _json_error(status: int, kind: str, message: str) -> Response:
    return secure(JSONResponse({"error": {"type": kind, "message": message}}, status_code=status))


@router.post("/auth/cli/exchange")
async def cli_exchange(request: Request, body: Annotated[dict[str, Any], Body()]) -> Response:
    """Trade a ``levers9 login`` code and its PKCE verifier for a token of the person, once."""
    services = _services(request)
    if request.url.scheme != "https" and not is_loopback(request.url.hostname):
        return _json_error(
            403,
            "insecure_transport",
            "the sign-in exchange carries a token, so it is only answered over HTTPS (or on a loopback address)",
        )
    code, verifier, hostname = body.get("code"), body.get("code_verifier"), body.get("hostname", "")
    if not isinstance(code, str) or not code:
        return _json_error(422, "validation_error", "code: expected the one-time code from the callback")
    if not isinstance(verifier, str) or not verifier:
        return _json_error(422, "validation_error", "code_verifier: expected the PKCE verifier")
    if not isinstance(hostname, str) or len(hostname) > 253 or not hostname.isprintable():
        return _json_error(422, "validation_error", "hostname: expected this computer's name, at most 253 characters")
    saved = await codes(services).take(CLI, code)  # spent now, whatever follows: a code is tried once
    if saved is None:
        return _json_error(400, "invalid_grant", "the sign-in code was used already, expired or never issued")
    if not check_verifier(verifier, str(saved["challenge"])):
        return _json_error(400, "invalid_grant", "code_verifier does not match the challenge this sign-in began with")
    user_id, workspace_id, environment = str(saved["user"]), str(saved["workspace"]), str(saved["environment"])
    role = await services.members.role_of(workspace_id, user_id)
    person = await services.users.get(user_id)
    workspace = await services.workspaces.get(workspace_id)
    if role is None or person is None or workspace is None:
        return _json_error(403, "permission_denied", "that person is no longer a member of the workspace")
    _, token = await services.tokens.issue(
        TokenKind.USER.value,
        workspace_id=workspace_id,
        subject=f"levers9 login ({hostname or 'unnamed computer'})",
        user_id=user_id,
        role=Role.OWNER,  # capped by the person's role whenever it is used
    )
    context = services.scheduler.ctx
    tls = context.controlplane_url.startswith(("grpcs://", "https://"))
    answer: dict[str, Any] = {
        "token": token,
        "workspace": workspace.name,
        "environment": environment,
        "email": person.email,
        "role": role.value,
        "grpc": context.controlplane_url,
        "http": base_url(services, request),
    }
    if tls and context.controlplane_ca:
        answer["ca_pem"] = context.controlplane_ca
    return secure(JSONResponse(answer))
