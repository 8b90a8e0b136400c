"""A person's dashboard session: a cookie holding a user token, and the CSRF token that goes with it.

Invariants:

* the session cookie holds a user token issued for one person in one workspace
  (:func:`start_session`), so a session is authenticated, revoked, expired and
  bounded by the person's role exactly like any API token: removing someone
  from a workspace ends their sessions there;
* the cookie is HttpOnly (no script reads it), SameSite=Lax (another site's
  form posts do not carry it), Secure when the controlplane speaks TLS, and
  scoped to ``/``; the token is never put in a URL, a page or local storage;
* every state-changing request carries the CSRF token (:data:`CSRF_HEADER` or
  the form field :data:`CSRF_FIELD`), an HMAC of the session token, which a page
  of another origin cannot read or compute; :func:`check_csrf` refuses a request
  without the right one (403), before anything is changed.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request
from starlette.responses import Response

from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.records import Role, TokenKind

__all__ = [
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "SESSION_TTL_S",
    "CsrfRefused",
    "check_csrf",
    "clear_session_cookie",
    "csrf_token",
    "session_token",
    "set_session_cookie",
    "start_session",
]

SESSION_COOKIE = "levers9_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
#: how long a session lasts before its person signs in again
SESSION_TTL_S = 12 * 3600
#: what a session token's subject starts with, so listings tell sessions from other tokens
SESSION_SUBJECT = "dashboard session"


class CsrfRefused(Exception):
    """A state-changing request without the session's CSRF token."""


async def start_session(
    services: Services, user_id: str, workspace_id: str, *, how: str, ttl_s: float = SESSION_TTL_S
) -> str:
    """A new session token for the person ``user_id`` in ``workspace_id`` (a workspace, not an environment: the
    session picks its environment per request). ``how`` says how they signed in (shown in token listings).
    The caller checks membership first; a session of someone who is not a member verifies to nothing anyway."""
    _, token = await services.tokens.issue(
        TokenKind.USER.value,
        workspace_id=workspace_id,
        subject=f"{SESSION_SUBJECT} ({how})",
        ttl_s=ttl_s,
        user_id=user_id,
        role=Role.OWNER,  # capped by the person's role in the workspace when it is used
    )
    return token


def session_token(request: Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE) or None


def set_session_cookie(response: Response, token: str, *, secure: bool, ttl_s: float = SESSION_TTL_S) -> None:
    response.set_cookie(
        SESSION_COOKIE, token, max_age=int(ttl_s), path="/", secure=secure, httponly=True, samesite="lax"
    )


def clear_session_cookie(response: Response, *, secure: bool) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", secure=secure, httponly=True, samesite="lax")


def csrf_token(session: str) -> str:
    """The CSRF token of a session: an HMAC keyed by the session token, so only its holder can make it."""
    return hmac.new(session.encode(), b"levers9 csrf", hashlib.sha256).hexdigest()


async def check_csrf(request: Request, session: str) -> None:
    """Raise CsrfRefused unless the request carries the session's CSRF token (header, or form field)."""
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form()
        value = form.get(CSRF_FIELD)
        given = value if isinstance(value, str) else None
    if not given or not hmac.compare_digest(given, csrf_token(session)):
        raise CsrfRefused("this request lacks the page's CSRF token: reload the page and try again")


def principal_label(principal: Principal) -> str:
    return f"{principal.role.value} in {principal.environment}"
