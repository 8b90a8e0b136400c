"""An OpenID Connect sign-in end to end: authlib's client, a real browser, and the real provider (oidc-provider-mock).

The pieces the dashboard's sign-in is made of, proven together before it exists: authlib builds the authorization
URL (state, nonce, a PKCE S256 challenge), Chromium follows it to the provider's page where a person is chosen,
the provider redirects the browser to a local callback server (aiohttp, in the test's loop), and authlib trades the
code for tokens at the token endpoint (with the PKCE verifier and the client's secret); the ID token is checked
as a relying party must (signature against the provider's JWKS, issuer, audience, nonce, expiry) and carries the
chosen person's ``sub`` and ``email``.

The provider does not check PKCE itself (see tests/fixtures/oidc_provider.py), so the test checks the client's
half: the challenge in the URL the browser followed is S256 of the verifier the token request carried.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from aiohttp import web
from authlib.common.security import generate_token
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry
from playwright.async_api import Page, expect

from tests.fixtures.browser import Pages
from tests.fixtures.oidc_provider import OidcProvider
from tests.fixtures.ports import free_port

# authlib 1.9 would rather use the httpx2 package; without it, its client works on httpx and says so once
pytestmark = pytest.mark.filterwarnings("ignore:The httpx module is deprecated:DeprecationWarning")


@dataclass
class Callback:
    redirect_uri: str
    #: the full URL of each request the browser made to the redirect URI
    arrived: asyncio.Queue[str]


@pytest.fixture
async def callback() -> AsyncIterator[Callback]:
    """A relying party's redirect URI on 127.0.0.1, answering a small page and handing each URL to the test."""
    arrived: asyncio.Queue[str] = asyncio.Queue()

    async def receive(request: web.Request) -> web.Response:
        await arrived.put(str(request.url))
        return web.Response(
            text='<!doctype html><title>back</title><link rel="icon" href="data:,"><p>back at the client</p>',
            content_type="text/html",
        )

    app = web.Application()
    app.router.add_get("/callback", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Callback(f"http://127.0.0.1:{port}/callback", arrived)
    finally:
        await runner.cleanup()


async def test_a_person_chosen_at_the_provider_is_signed_in_with_the_code_flow_and_pkce(
    oidc_provider: OidcProvider, page: Page, pages: Pages, callback: Callback
) -> None:
    from authlib.integrations.httpx_client import AsyncOAuth2Client

    client = oidc_provider.register_client([callback.redirect_uri])
    oidc_provider.add_user("person-7", email="ada@example.org", name="Ada Lovelace", email_verified=True)
    metadata = oidc_provider.metadata
    token_requests: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        if str(request.url) == metadata["token_endpoint"]:
            token_requests.append(request)

    verifier, nonce = generate_token(48), generate_token(24)
    async with AsyncOAuth2Client(
        client.client_id,
        client.client_secret,
        scope="openid email profile",
        redirect_uri=callback.redirect_uri,
        code_challenge_method="S256",
        event_hooks={"request": [record]},
    ) as oauth:
        url, state = oauth.create_authorization_url(
            metadata["authorization_endpoint"], code_verifier=verifier, nonce=nonce
        )
        query = parse_qs(urlsplit(url).query)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        assert query["code_challenge"] == [challenge]  # RFC 7636 4.2, worked out here rather than by authlib
        assert query["code_challenge_method"] == ["S256"]

        await page.goto(url)
        await pages.screenshot("provider-sign-in")
        await oidc_provider.sign_in(page, "person-7")
        returned = await asyncio.wait_for(callback.arrived.get(), 30)
        await expect(page.get_by_text("back at the client")).to_be_visible()
        assert parse_qs(urlsplit(returned).query)["state"] == [state]

        token = await oauth.fetch_token(
            metadata["token_endpoint"], authorization_response=returned, state=state, code_verifier=verifier
        )
        userinfo = (await oauth.get(metadata["userinfo_endpoint"])).json()

    [exchange] = token_requests
    sent = parse_qs(exchange.content.decode())
    assert sent["grant_type"] == ["authorization_code"]
    assert sent["code_verifier"] == [verifier]
    assert exchange.headers["authorization"].startswith("Basic ")  # the client's secret, as registered

    keys = KeySet.import_key_set(httpx.get(metadata["jwks_uri"], timeout=10).json())
    decoded = jwt.decode(token["id_token"], keys, registry=JWSRegistry(algorithms=["RS256"]))
    claims = CodeIDToken(
        decoded.claims,
        decoded.header,
        {
            "iss": {"essential": True, "value": oidc_provider.issuer},
            "aud": {"essential": True, "value": client.client_id},
        },
        {"nonce": nonce, "client_id": client.client_id, "access_token": token["access_token"]},
    )
    claims.validate()
    assert claims["sub"] == "person-7"
    assert claims["email"] == "ada@example.org"
    assert claims["name"] == "Ada Lovelace"
    assert claims["aud"] in (client.client_id, [client.client_id])  # a string or a list of one, both standard
    assert userinfo["sub"] == "person-7"
    assert userinfo["email"] == "ada@example.org"
    # the provider's page asks a CDN for its stylesheet, which the browser cannot reach; the client's page is clean
    assert pages.log(page).problems(on=callback.redirect_uri) == []
    assert {entry.where.partition("?")[0] for entry in pages.log(page).entries} <= {metadata["authorization_endpoint"]}
    assert (pages.output_dir / "provider-sign-in.png").read_bytes().startswith(b"\x89PNG")


async def test_the_provider_refuses_an_unregistered_client_and_a_redirect_uri_it_was_not_given(
    oidc_provider: OidcProvider, page: Page, callback: Callback
) -> None:
    """A real issuer's checks hold here too, so a misconfigured dashboard fails its tests as it would in use."""
    client = oidc_provider.register_client([callback.redirect_uri])
    authorize = oidc_provider.metadata["authorization_endpoint"]
    common = "response_type=code&scope=openid&state=s"

    answer = await page.goto(f"{authorize}?client_id=nobody&redirect_uri={callback.redirect_uri}&{common}")
    assert answer is not None
    assert answer.status == 400
    await expect(page.locator("body")).to_contain_text("invalid_client")

    elsewhere = callback.redirect_uri.replace("/callback", "/elsewhere")
    answer = await page.goto(f"{authorize}?client_id={client.client_id}&redirect_uri={elsewhere}&{common}")
    assert answer is not None
    assert answer.status == 400
    assert callback.arrived.empty()

    # the token endpoint authenticates the client before it looks at the code: a wrong secret is invalid_client
    exchange = {"grant_type": "authorization_code", "code": "no-such-code", "redirect_uri": callback.redirect_uri}
    token_endpoint = oidc_provider.metadata["token_endpoint"]
    wrong = httpx.post(token_endpoint, data=exchange, auth=(client.client_id, "not-the-secret"), timeout=10)
    assert (wrong.status_code, wrong.json()["error"]) == (401, "invalid_client")
    right = httpx.post(token_endpoint, data=exchange, auth=(client.client_id, client.client_secret), timeout=10)
    assert (right.status_code, right.json()["error"]) == (400, "invalid_grant")


async def test_a_person_who_denies_sends_the_client_access_denied(
    oidc_provider: OidcProvider, page: Page, callback: Callback
) -> None:
    client = oidc_provider.register_client([callback.redirect_uri])
    authorize = oidc_provider.metadata["authorization_endpoint"]
    await page.goto(
        f"{authorize}?client_id={client.client_id}&redirect_uri={callback.redirect_uri}"
        "&response_type=code&scope=openid&state=s1"
    )
    await oidc_provider.deny(page)
    returned = parse_qs(urlsplit(await asyncio.wait_for(callback.arrived.get(), 30)).query)
    assert returned["error"] == ["access_denied"]
    assert "code" not in returned  # (the mock's refusal leaves out the state, which RFC 6749 4.1.2.1 wants back)
