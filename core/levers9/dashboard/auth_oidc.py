"""OpenID Connect's authorization code flow, as the dashboard's relying party (any standard issuer).

What is checked, and what each failure means (:class:`SignInFailed` carries a message for the person and the
HTTP status of the page that shows it):

* the issuer's discovery document must name the configured issuer exactly (a proxy or a typo that serves another
  issuer's document is refused) and an authorization, token and JWKS endpoint; it is fetched again after
  :data:`DISCOVERY_TTL_S`, and a failure to reach it is a 502 that names the issuer;
* each sign-in has a state, a nonce and a PKCE S256 verifier of its own, kept server-side in Redis under the state
  (:mod:`levers9.dashboard.auth_codes`) for :data:`~levers9.dashboard.auth_signin.OIDC_STATE_TTL_S`, spent by the
  callback that brings it back: a callback with another, an old or a reused state is refused;
* the code is traded at the token endpoint with the client's secret (basic or post, as the issuer supports) and
  the verifier; the ID token's signature is checked against the issuer's JWKS (a key id it does not know makes
  the JWKS be fetched once more, for a rotated key), then its issuer, audience (and authorized party), expiry,
  issue time and nonce (authlib's ``CodeIDToken``, with 60 s of leeway for clocks);
* a person is only matched or created by a verified email: ``email_verified`` must be true in the ID token or
  in the userinfo answer, else the sign-in is refused naming the email.

authlib and joserfc are imported inside the functions: the CLI and the SDK never load them.
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx

from levers9.config.model import OidcConfig

__all__ = ["DISCOVERY_TTL_S", "Identity", "SignInFailed", "authorization_url", "finish"]

#: how long a discovery document (and its JWKS) is used before it is fetched again
DISCOVERY_TTL_S = 600.0
#: how long one request to the issuer may take
REQUEST_TIMEOUT_S = 15.0
#: the clock skew allowed between the issuer and this controlplane
LEEWAY_S = 60


class SignInFailed(Exception):
    """A sign-in that cannot go on; ``str()`` is said to the person, ``status`` is the page's."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Identity:
    """Who the issuer vouched for."""

    issuer: str
    subject: str
    email: str
    name: str


_discovered: dict[str, tuple[float, dict[str, Any]]] = {}
_keys: dict[str, tuple[float, dict[str, Any]]] = {}


async def _get_json(client: httpx.AsyncClient, url: str, what: str, issuer: str) -> dict[str, Any]:
    try:
        answer = await client.get(url, timeout=REQUEST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise SignInFailed(f"the identity provider {issuer} could not be reached ({what}): {exc}", 502) from None
    if answer.status_code != 200:
        raise SignInFailed(f"the identity provider {issuer} answered {answer.status_code} for its {what}", 502)
    try:
        document = answer.json()
    except ValueError:
        raise SignInFailed(f"the identity provider {issuer}'s {what} is not JSON", 502) from None
    if not isinstance(document, dict):
        raise SignInFailed(f"the identity provider {issuer}'s {what} is not a JSON object", 502)
    return document


async def discover(client: httpx.AsyncClient, oidc: OidcConfig) -> dict[str, Any]:
    """The issuer's discovery document (cached for :data:`DISCOVERY_TTL_S`)."""
    cached = _discovered.get(oidc.issuer)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    url = f"{oidc.issuer}/.well-known/openid-configuration"
    document = await _get_json(client, url, "discovery document", oidc.issuer)
    if str(document.get("issuer", "")).rstrip("/") != oidc.issuer:
        raise SignInFailed(
            f"the discovery document at {url} names issuer {document.get('issuer')!r}, not {oidc.issuer!r} "
            "(auth.oidc.issuer must be the issuer exactly as its tokens name it)",
            502,
        )
    for endpoint in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        if not isinstance(document.get(endpoint), str):
            raise SignInFailed(f"the discovery document at {url} names no {endpoint}", 502)
    _discovered[oidc.issuer] = (time.monotonic() + DISCOVERY_TTL_S, document)
    return document


async def authorization_url(oidc: OidcConfig, redirect_uri: str, *, state: str, nonce: str, challenge: str) -> str:
    """Where to send the browser to sign in at the issuer."""
    async with httpx.AsyncClient() as client:
        document = await discover(client, oidc)
    query = urllib.parse.urlencode(
        {
            "response_type": "code",
            "client_id": oidc.client_id,
            "redirect_uri": redirect_uri,
            "scope": oidc.scopes,
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
    )
    endpoint = str(document["authorization_endpoint"])
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


async def _key_set(client: httpx.AsyncClient, oidc: OidcConfig, jwks_uri: str, *, fresh: bool) -> Any:
    from joserfc.jwk import KeySet

    cached = _keys.get(oidc.issuer)
    if fresh or cached is None or cached[0] <= time.monotonic():
        cached = (time.monotonic() + DISCOVERY_TTL_S, await _get_json(client, jwks_uri, "JWKS", oidc.issuer))
        _keys[oidc.issuer] = cached
    try:
        return KeySet.import_key_set(cached[1])  # type: ignore[arg-type]
    except Exception as exc:
        raise SignInFailed(f"the identity provider {oidc.issuer}'s JWKS cannot be read: {exc}", 502) from None


def _token_request(oidc: OidcConfig, document: dict[str, Any], form: dict[str, str]) -> dict[str, Any]:
    """The token request's arguments for httpx: the client authenticated as the issuer supports."""
    if oidc.client_secret is None:
        return {"data": {**form, "client_id": oidc.client_id}}
    methods = document.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
    if "client_secret_basic" not in methods and "client_secret_post" in methods:
        return {"data": {**form, "client_id": oidc.client_id, "client_secret": oidc.client_secret}}
    quoted = (urllib.parse.quote(oidc.client_id, safe=""), urllib.parse.quote(oidc.client_secret, safe=""))
    return {"data": form, "auth": quoted}  # RFC 6749 2.3.1: each form-urlencoded before Basic


async def finish(oidc: OidcConfig, redirect_uri: str, *, code: str, nonce: str, verifier: str) -> Identity:
    """Trade ``code`` for the ID token, check it (see the module docstring) and answer whom it names."""
    from authlib.oidc.core import CodeIDToken
    from joserfc import jwt
    from joserfc.errors import JoseError as JoserfcError
    from joserfc.jws import JWSRegistry

    async with httpx.AsyncClient() as client:
        document = await discover(client, oidc)
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        try:
            answer = await client.post(
                str(document["token_endpoint"]),
                headers={"accept": "application/json"},
                timeout=REQUEST_TIMEOUT_S,
                **_token_request(oidc, document, form),
            )
        except httpx.HTTPError as exc:
            raise SignInFailed(
                f"the identity provider {oidc.issuer} could not be reached (token): {exc}", 502
            ) from None
        try:
            tokens = answer.json()
        except ValueError:
            tokens = {}
        if answer.status_code != 200 or not isinstance(tokens, dict) or not tokens.get("id_token"):
            error = tokens.get("error", "") if isinstance(tokens, dict) else ""
            detail = f" ({error})" if error else ""
            raise SignInFailed(
                f"the identity provider {oidc.issuer} did not trade the sign-in code for an ID token: "
                f"{answer.status_code}{detail}; check auth.oidc.client_id and client_secret, then sign in again",
                502,
            )
        registry = JWSRegistry(algorithms=["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"])
        id_token = str(tokens["id_token"])
        try:
            try:
                keys = await _key_set(client, oidc, str(document["jwks_uri"]), fresh=False)
                decoded = jwt.decode(id_token, keys, registry=registry)
            except JoserfcError:  # a key the cached set lacks: the issuer may have rotated its keys
                keys = await _key_set(client, oidc, str(document["jwks_uri"]), fresh=True)
                decoded = jwt.decode(id_token, keys, registry=registry)
        except (JoserfcError, ValueError) as exc:
            raise SignInFailed(f"the ID token from {oidc.issuer} is not validly signed: {exc}", 400) from None
        claims = CodeIDToken(
            decoded.claims,
            decoded.header,
            {
                "iss": {"essential": True, "value": oidc.issuer},
                "aud": {"essential": True, "value": oidc.client_id},
                "sub": {"essential": True},
                "nonce": {"essential": True, "value": nonce},
            },
            {"nonce": nonce, "client_id": oidc.client_id, "access_token": tokens.get("access_token")},
        )
        try:
            claims.validate(leeway=LEEWAY_S)
        except (JoserfcError, ValueError) as exc:  # authlib 1.9's claims raise joserfc's errors
            raise SignInFailed(f"the ID token from {oidc.issuer} was not accepted: {exc}", 400) from None
        values: dict[str, Any] = dict(claims)
        if (not values.get("email") or "email_verified" not in values) and tokens.get("access_token"):
            userinfo_url = document.get("userinfo_endpoint")
            if isinstance(userinfo_url, str):
                extra = await _userinfo(client, oidc, userinfo_url, str(tokens["access_token"]))
                if extra.get("sub") == values.get("sub"):  # OpenID Connect Core 5.3.2: another sub is not them
                    values = {**extra, **values}
    subject = str(values.get("sub") or "")
    email = str(values.get("email") or "")
    if not email:
        raise SignInFailed(
            f"{oidc.issuer} did not say your email address (the email scope is needed), so levers9 cannot tell "
            "which member you are",
            403,
        )
    if values.get("email_verified") not in (True, "true"):
        raise SignInFailed(
            f"{oidc.issuer} has not verified the email address {email}; verify it there, then sign in again", 403
        )
    name = str(values.get("name") or values.get("preferred_username") or "")
    return Identity(oidc.issuer, subject, email, name[:128])


async def _userinfo(client: httpx.AsyncClient, oidc: OidcConfig, url: str, access_token: str) -> dict[str, Any]:
    try:
        answer = await client.get(url, headers={"authorization": f"Bearer {access_token}"}, timeout=REQUEST_TIMEOUT_S)
    except httpx.HTTPError:
        return {}
    if answer.status_code != 200:
        return {}
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
