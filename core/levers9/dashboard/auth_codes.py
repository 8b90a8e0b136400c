"""One-time codes for signing in: sign-in links, OpenID Connect states and ``levers9 login``'s codes.

Invariants:

* a code is 256 random bits (43 URL-safe characters); only its SHA-256 is a Redis key, so someone who reads
  Redis (or a dump of it) cannot use a code that is still waiting;
* a code is spent once, atomically: :meth:`OneTimeCodes.take` is ``GETDEL``, so of two requests racing with the
  same code exactly one gets its payload, and a code that was taken, expired (Redis's TTL) or never made gives
  None, the same None for each, so a caller cannot tell which it was;
* codes of different kinds live under different keys: a link's code is no ``levers9 login`` code;
* :func:`check_verifier` is RFC 7636's S256 check, in constant time; :func:`local_path` lets only a path of this
  site through as a place to go after signing in (no open redirect: ``//host``, ``/\\host``, ``http://...`` and
  control characters all fall back to the dashboard).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "CODE_BYTES",
    "DEFAULT_NEXT",
    "OneTimeCodes",
    "check_challenge",
    "check_verifier",
    "local_path",
    "new_code",
    "s256",
]

#: random bytes in a code: 256 bits
CODE_BYTES = 32
#: where a person goes after signing in when nothing else was asked for
DEFAULT_NEXT = "/dashboard/"
#: RFC 7636 4.1: a verifier is 43 to 128 characters of [A-Z] / [a-z] / [0-9] / "-" / "." / "_" / "~"
_VERIFIER = re.compile(r"^[A-Za-z0-9\-._~]{43,128}$")
#: an S256 challenge is the unpadded base64url of a SHA-256: 43 characters
_CHALLENGE = re.compile(r"^[A-Za-z0-9\-_]{43}$")
#: the longest code a request may carry (a code is 43 characters; anything much longer is not one)
_MAX_CODE = 128


def new_code() -> str:
    return secrets.token_urlsafe(CODE_BYTES)


def s256(verifier: str) -> str:
    """RFC 7636's S256 challenge of ``verifier``: BASE64URL(SHA256(ASCII(verifier))) without padding."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def check_challenge(challenge: str) -> str:
    """``challenge`` if it is an S256 challenge; ValueError naming the field otherwise."""
    if not _CHALLENGE.fullmatch(challenge):
        raise ValueError(
            "code_challenge: expected an S256 challenge, the unpadded base64url of a SHA-256 (43 characters)"
        )
    return challenge


def check_verifier(verifier: str, challenge: str) -> bool:
    """Whether ``verifier`` is well formed (RFC 7636 4.1) and its S256 is ``challenge``."""
    if not _VERIFIER.fullmatch(verifier):
        return False
    return hmac.compare_digest(s256(verifier), challenge)


def local_path(value: str | None, default: str = DEFAULT_NEXT) -> str:
    """``value`` when it is a path of this site (``/dashboard/e/main/tasks?status=running``), else ``default``.

    Refused: anything not starting with one ``/`` (``//evil.example`` and ``/\\evil.example`` are other hosts to
    a browser), a scheme or host, backslashes, control characters and whitespace."""
    if not value or len(value) > 2048 or not value.startswith("/") or value.startswith(("//", "/\\")):
        return default
    if any(ch in value for ch in "\\\r\n\t ") or not value.isprintable():
        return default
    return value


class OneTimeCodes:
    """Payloads waiting for a code, in Redis under ``PREFIX auth:KIND:SHA256(code)``, each spent once."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    def _key(self, kind: str, code: str) -> str:
        return f"{self._prefix}auth:{kind}:{hashlib.sha256(code.encode()).hexdigest()}"

    async def put(self, kind: str, payload: dict[str, Any], ttl_s: float) -> str:
        """A new code for ``payload`` (JSON), valid for ``ttl_s`` seconds or until it is taken."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s: a code must live for some time, got {ttl_s}")
        code = new_code()
        stored = await self._redis.set(
            self._key(kind, code), json.dumps(payload), px=max(1, round(ttl_s * 1000)), nx=True
        )
        if not stored:  # 256 random bits repeating: not in this universe, but never overwrite a waiting code
            raise RuntimeError("a fresh sign-in code collided with a waiting one")
        return code

    async def take(self, kind: str, code: str) -> dict[str, Any] | None:
        """The payload of ``code`` if it is waiting, spending it; None when it was taken, expired or never made."""
        if not code or len(code) > _MAX_CODE:
            return None
        value = await self._redis.getdel(self._key(kind, code))
        if value is None:
            return None
        payload: dict[str, Any] = json.loads(value)
        return payload

    async def waiting(self, kind: str, code: str) -> bool:
        """Whether ``code`` is still waiting (it is not spent by asking)."""
        if not code or len(code) > _MAX_CODE:
            return False
        return bool(await self._redis.exists(self._key(kind, code)))
