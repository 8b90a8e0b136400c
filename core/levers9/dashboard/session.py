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
import urllib.parse

from starlette.requests import Request
from starlette.responses import Response

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
    "read_form",
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


#: the most bytes of a form body :func:`read_form` reads (the dashboard's forms are a few short fields)
MAX_FORM_BYTES = 64 * 1024


async def read_form(request: Request) -> dict[str, str]:
    """The fields of an ``application/x-www-form-urlencoded`` body (the last value of a repeated name); {} for a
    body of another type. Parsed here, not by Starlette, whose form parser needs python-multipart, which levers9
    does not depend on. The body is cached on ``request``, so reading it again gives the same fields.
    Raises ValueError (naming the body) for a body over :data:`MAX_FORM_BYTES` or not UTF-8."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_FORM_BYTES:
        raise ValueError(f"body: a form of at most {MAX_FORM_BYTES} bytes is accepted, got {length}")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise ValueError(f"body: a form of at most {MAX_FORM_BYTES} bytes is accepted, got {len(body)}")
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise ValueError("body: the form is not UTF-8 text") from None
    return {name: value for name, value in urllib.parse.parse_qsl(text, keep_blank_values=True)}


async def check_csrf(request: Request, session: str) -> None:
    """Raise CsrfRefused unless the request carries the session's CSRF token (header, or form field of a
    url-encoded form, see :func:`read_form`)."""
    given = request.headers.get(CSRF_HEADER)
    if given is None:
        try:
            given = (await read_form(request)).get(CSRF_FIELD)
        except ValueError:
            given = None
    if not given or not hmac.compare_digest(given, csrf_token(session)):
        raise CsrfRefused("this request lacks the page's CSRF token: reload the page and try again")
