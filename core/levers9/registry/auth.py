"""Logging in to a registry: HTTP basic, and the bearer-token flow real registries use.

A registry that wants credentials answers ``401`` with a ``WWW-Authenticate``
challenge. ``Basic realm=...`` (distribution with ``auth.htpasswd``, ECR-style
registries) is answered with the username and password on every later request.
``Bearer realm=...,service=...,scope=...`` (ghcr.io, distribution with
``auth.token``, Harbor, GitLab) is answered by asking the realm for a token
(``GET realm?service=...&scope=...``, with the credentials as HTTP basic when
there are any, anonymously otherwise) and sending ``Authorization: Bearer
<token>``. :class:`Authenticator` keeps the tokens per scope (``repository:
<name>:<actions>``) until a little before they expire, so a pull asks the
token service once, not once per blob.

Invariants: a password is never in a repr, a log line or an error message; a
challenge is answered at most once per request (a second ``401`` is the
registry's refusal, reported with its own error code); an unknown scheme, a
realm that is not an http(s) URL, or a token service that refuses or answers
without a token raises :class:`~levers9.registry.errors.RegistryError`.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field

import httpx

from levers9.registry.errors import RegistryError

__all__ = ["Authenticator", "Challenge", "RegistryAuth", "parse_challenge"]

#: tokens are dropped this many seconds before the token service says they expire
_EXPIRY_MARGIN_S = 10.0
#: what a token lives when the token service does not say (the token spec's default)
_DEFAULT_TOKEN_S = 60.0
_PARAM = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')


@dataclass(frozen=True)
class RegistryAuth:
    """A username and password (or token) for one registry; the password never shows in a repr."""

    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        """The ``Authorization`` header value for HTTP basic."""
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: its scheme, lowercased, and its parameters."""

    scheme: str
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """The challenge in a ``WWW-Authenticate`` header, or None when it has no scheme at all."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params: dict[str, str] = {}
    for match in _PARAM.finditer(rest):
        quoted, bare = match.group(2), match.group(3)
        params[match.group(1).lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
    return Challenge(scheme=scheme.lower(), params=params)


class Authenticator:
    """What to send as ``Authorization`` to one registry, learned from its challenges (see the module docstring)."""

    def __init__(self, registry: str, auth: RegistryAuth | None, http: httpx.Client) -> None:
        self.registry = registry
        self.auth = auth
        self._http = http
        self._basic = False  # the registry asked for basic: send it with every request
        self._tokens: dict[str, tuple[str, float]] = {}  # scope -> (token, monotonic expiry)
        #: tokens fetched from token services (for tests and logs: reuse shows as no growth)
        self.tokens_fetched = 0

    def header(self, scope: str | None) -> str | None:
        """The ``Authorization`` value to send before any challenge, from what earlier ones taught."""
        if self._basic and self.auth is not None:
            return self.auth.basic()
        cached = self._tokens.get(scope or "")
        if cached is not None:
            token, expires = cached
            if time.monotonic() < expires:
                return f"Bearer {token}"
            del self._tokens[scope or ""]
        return None

    def answer(self, header: str, scope: str | None, *, operation: str, repository: str | None) -> bool:
        """Learn from a ``401``'s challenge; True when the request is worth sending again."""
        challenge = parse_challenge(header)
        if challenge is None:
            return False
        if challenge.scheme == "basic":
            if self.auth is None or self._basic:
                return False  # no credentials to offer, or these were just refused
            self._basic = True
            return True
        if challenge.scheme == "bearer":
            self._tokens.pop(scope or "", None)  # one just sent was refused (expired early): fetch a new one
            self._fetch_token(challenge, scope, operation=operation, repository=repository)
            return True
        raise RegistryError(
            f"it asks for {challenge.scheme!r} authentication; accepted: Basic and Bearer",
            registry=self.registry,
            operation=operation,
            repository=repository,
            status=401,
        )

    def _fetch_token(self, challenge: Challenge, scope: str | None, *, operation: str, repository: str | None) -> None:
        def fail(message: str, status: int | None = None, code: str | None = None) -> RegistryError:
            return RegistryError(
                message, registry=self.registry, operation=operation, repository=repository, status=status, code=code
            )

        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise fail(f"its bearer challenge names no http(s) token realm (realm={realm!r})", 401)
        params = {key: challenge.params[key] for key in ("service", "scope") if challenge.params.get(key)}
        if scope and "scope" not in params:
            params["scope"] = scope
        headers = {"Authorization": self.auth.basic()} if self.auth is not None else {}
        try:
            response = self._http.get(realm, params=params, headers=headers)
        except httpx.HTTPError as e:
            raise fail(f"cannot reach its token service {realm}: {e}") from e
        if response.status_code in (401, 403):
            who = f"user {self.auth.username!r}" if self.auth is not None else "an anonymous request"
            raise fail(f"its token service {realm} refused {who}", response.status_code, "UNAUTHORIZED")
        if response.status_code != 200:
            raise fail(f"its token service {realm} answered HTTP {response.status_code}", response.status_code)
        try:
            doc = response.json()
        except ValueError:
            doc = None
        token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise fail(f"its token service {realm} answered without a token")
        lifetime = doc.get("expires_in") if isinstance(doc, dict) else None
        seconds = float(lifetime) if isinstance(lifetime, int | float) and lifetime > 0 else _DEFAULT_TOKEN_S
        self._tokens[scope or ""] = (token, time.monotonic() + max(seconds - _EXPIRY_MARGIN_S, 1.0))
        self.tokens_fetched += 1
