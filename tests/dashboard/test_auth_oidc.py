"""The ID token checks of levers9.dashboard.auth_oidc, against an issuer served here over real HTTP whose tokens each
test shapes: a wrong signature, issuer, audience or nonce, an expired token and an unverified email are refused;
a key the cached JWKS lacks is fetched again (a rotated key). The whole flow against a real provider, through a
browser, is in tests/e2e/test_sign_in.py; that provider cannot be made to issue a bad token, hence this one."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from levers9.config.model import OidcConfig
from levers9.dashboard import auth_oidc
from tests.fixtures.ports import free_port

CLIENT = "levers9-test"
NONCE = "nonce-of-this-sign-in"


@dataclass
class Issuer:
    url: str
    key: RSAKey
    #: the claims the next token answer's ID token carries (on top of the defaults), and the key that signs it
    claims: dict[str, Any] = field(default_factory=dict)
    signer: RSAKey | None = None
    #: the keys the JWKS publishes
    published: list[RSAKey] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)

    @property
    def config(self) -> OidcConfig:
        return OidcConfig(issuer=self.url, client_id=CLIENT, client_secret="s3cret")

    def id_token(self) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "sub": "person-1",
            "aud": CLIENT,
            "iat": now,
            "exp": now + 300,
            "nonce": NONCE,
            "email": "ada@example.org",
            "email_verified": True,
            "name": "Ada",
            **self.claims,
        }
        claims = {k: v for k, v in claims.items() if v is not None}
        signer = self.signer or self.key
        return jwt.encode({"alg": "RS256", "kid": signer.kid}, claims, signer)


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    issuer = Issuer(url, RSAKey.generate_key(2048, parameters={"kid": "key-1"}))
    issuer.published = [issuer.key]

    async def discovery(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": url,
                "authorization_endpoint": f"{url}/authorize",
                "token_endpoint": f"{url}/token",
                "jwks_uri": f"{url}/jwks",
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            }
        )

    async def jwks(request: web.Request) -> web.Response:
        return web.json_response(KeySet(list(issuer.published)).as_dict(private=False))

    async def token(request: web.Request) -> web.Response:
        form = dict(await request.post())
        issuer.token_requests.append({k: str(v) for k, v in form.items()} | {"auth": request.headers["authorization"]})
        return web.json_response({"access_token": "at", "token_type": "Bearer", "id_token": issuer.id_token()})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_get("/jwks", jwks)
    app.router.add_post("/token", token)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield issuer
    finally:
        await runner.cleanup()
        auth_oidc._discovered.pop(url, None)
        auth_oidc._keys.pop(url, None)


async def finish(issuer: Issuer) -> auth_oidc.Identity:
    return await auth_oidc.finish(
        issuer.config, "http://127.0.0.1:1994/auth/oidc/callback", code="the-code", nonce=NONCE, verifier="v" * 43
    )


async def test_a_good_token_names_the_person(issuer: Issuer) -> None:
    who = await finish(issuer)
    assert who == auth_oidc.Identity(issuer.url, "person-1", "ada@example.org", "Ada")
    [sent] = issuer.token_requests
    assert sent["grant_type"] == "authorization_code"
    assert sent["code"] == "the-code"
    assert sent["code_verifier"] == "v" * 43
    assert sent["redirect_uri"] == "http://127.0.0.1:1994/auth/oidc/callback"
    assert sent["auth"].startswith("Basic ")


async def test_the_authorization_url_carries_state_nonce_and_an_s256_challenge(issuer: Issuer) -> None:
    url = await auth_oidc.authorization_url(
        issuer.config, "http://127.0.0.1:1994/auth/oidc/callback", state="st", nonce="no", challenge="ch"
    )
    assert url.startswith(f"{issuer.url}/authorize?response_type=code&client_id={CLIENT}&")
    for part in ("state=st", "nonce=no", "code_challenge=ch", "code_challenge_method=S256", "scope=openid+email"):
        assert part in url


@pytest.mark.parametrize(
    ("claims", "said"),
    [
        ({"iss": "https://another.example"}, "not accepted"),
        ({"aud": "another-client"}, "not accepted"),
        ({"nonce": "another-sign-in"}, "not accepted"),
        ({"nonce": None}, "not accepted"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "not accepted"),
        ({"email_verified": False}, "has not verified the email address ada@example.org"),
        ({"email": None}, "did not say your email address"),
    ],
)
async def test_a_bad_token_is_refused(issuer: Issuer, claims: dict[str, Any], said: str) -> None:
    issuer.claims = claims
    with pytest.raises(auth_oidc.SignInFailed, match=said):
        await finish(issuer)


async def test_a_token_signed_by_another_key_is_refused(issuer: Issuer) -> None:
    issuer.signer = RSAKey.generate_key(2048, parameters={"kid": "key-1"})  # the published key's id, not its key
    with pytest.raises(auth_oidc.SignInFailed, match="not validly signed"):
        await finish(issuer)


async def test_a_rotated_key_is_fetched_again(issuer: Issuer) -> None:
    await finish(issuer)  # the JWKS is cached now
    rotated = RSAKey.generate_key(2048, parameters={"kid": "key-2"})
    issuer.published = [issuer.key, rotated]
    issuer.signer = rotated
    who = await finish(issuer)
    assert who.subject == "person-1"


async def test_an_issuer_that_does_not_answer_is_a_502() -> None:
    config = OidcConfig(issuer=f"http://127.0.0.1:{free_port()}", client_id=CLIENT)
    with pytest.raises(auth_oidc.SignInFailed, match="could not be reached") as refused:
        await auth_oidc.authorization_url(config, "http://x/cb", state="s", nonce="n", challenge="c")
    assert refused.value.status == 502
