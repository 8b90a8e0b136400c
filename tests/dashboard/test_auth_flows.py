"""Signing in, in process (real services on SQLite and Redis, the real HTTP app through httpx's ASGI transport):
one-time links, the CLI's code exchange with PKCE, switching workspace and signing out. The browser versions of
these flows, against a real `levers9 up`, are in tests/e2e/test_sign_in.py."""

from __future__ import annotations

import html
import re
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from levers9.controlplane.http import create_http_app
from levers9.dashboard.auth_codes import s256
from levers9.dashboard.session import SESSION_COOKIE, csrf_token
from levers9.services.core import Services
from levers9.state.sql.records import Role, UserRecord, WorkspaceRecord
from tests.fixtures.services import ONE_POOL_CONFIG, opened_services

VERIFIER = "v" * 20 + "-erifier.that-is_long~enough-for-rfc-7636"


@dataclass
class Site:
    services: Services
    client: httpx.AsyncClient
    person: UserRecord
    workspace: WorkspaceRecord
    #: an API token of the person in the workspace
    token: str

    async def session(self) -> str:
        """A signed-in session of the person (through a link, as a browser gets one)."""
        answer = await self.client.post("/api/v1/auth/links", headers={"authorization": f"Bearer {self.token}"})
        assert answer.status_code == 201, answer.text
        path = urllib.parse.urlsplit(answer.json()["url"]).path
        used = await self.client.post(path)
        assert used.status_code == 303, used.text
        return str(used.cookies[SESSION_COOKIE])


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    async with opened_services(tmp_path, ONE_POOL_CONFIG, f"sqlite:///{tmp_path / 'levers9.db'}") as services:
        workspace = await services.workspaces.get_or_create("team")
        person = await services.users.get_or_create("ada@example.org", "Ada")
        await services.members.put(workspace.id, person.id, Role.OWNER)
        _, token = await services.tokens.issue("user", workspace_id=workspace.id, user_id=person.id)
        app = create_http_app(services)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1994") as client:
            yield Site(services, client, person, workspace, token)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_a_link_signs_in_once_and_its_page_does_not_spend_it(site: Site) -> None:
    made = await site.client.post("/api/v1/auth/links", headers=bearer(site.token))
    assert made.status_code == 201
    url = made.json()["url"]
    assert url.startswith("http://127.0.0.1:1994/auth/link/")
    path = urllib.parse.urlsplit(url).path
    for _ in range(2):  # a mail scanner's or a chat preview's GET
        page = await site.client.get(path)
        assert page.status_code == 200
        assert f'action="{path}"' in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
    used = await site.client.post(path)
    assert used.status_code == 303
    assert used.headers["location"] == "/dashboard/"
    cookie = used.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie
    assert "samesite=lax" in cookie.lower()
    assert "Secure" not in cookie  # plain http here: a Secure cookie would never come back
    session = used.cookies[SESSION_COOKIE]
    me = await site.client.get("/api/v1/me", headers=bearer(session))
    assert me.json()["email"] == "ada@example.org"
    assert me.json()["workspace"] == "team"
    again = await site.client.post(path)
    assert again.status_code == 404
    assert "used already or has expired" in again.text
    assert SESSION_COOKIE not in again.cookies
    assert (await site.client.get(path)).status_code == 404


async def test_a_token_of_nobody_gets_no_link(site: Site) -> None:
    _, service_token = await site.services.tokens.issue("user", workspace_id=site.workspace.id)
    refused = await site.client.post("/api/v1/auth/links", headers=bearer(service_token))
    assert refused.status_code == 403
    assert "acts for no person" in refused.json()["error"]["message"]
    assert (await site.client.post("/api/v1/auth/links")).status_code == 401


async def test_a_removed_member_cannot_use_their_link(site: Site) -> None:
    other = await site.services.users.get_or_create("bob@example.org")
    await site.services.members.put(site.workspace.id, other.id, Role.VIEWER)
    _, token = await site.services.tokens.issue("user", workspace_id=site.workspace.id, user_id=other.id)
    path = urllib.parse.urlsplit((await site.client.post("/api/v1/auth/links", headers=bearer(token))).json()["url"])
    await site.services.members.remove(site.workspace.id, other.id)
    refused = await site.client.post(path.path)
    assert refused.status_code == 403
    assert SESSION_COOKIE not in refused.cookies


def cli_query(challenge: str, **extra: str) -> str:
    """The query `levers9 login` opens /auth/cli/start with (its port 53682 here), ``extra`` added."""
    values = {"port": "53682", "state": "state-of-this-login", "code_challenge": challenge}
    return urllib.parse.urlencode({**values, "code_challenge_method": "S256", **extra})


async def cli_code(site: Site, session: str, challenge: str, **extra: str) -> str:
    """Allow the CLI from the session's confirm page; the code the browser is sent back to the CLI with."""
    site.client.cookies.set(SESSION_COOKIE, session)
    try:
        page = await site.client.get(f"/auth/cli/start?{cli_query(challenge, **extra)}")
        assert page.status_code == 200, page.text
        assert "ada@example.org" in page.text
        assert "form-action 'self' http://127.0.0.1:53682" in page.headers["content-security-policy"]
        form = dict(re.findall(r'name="([a-z_]+)" value="([^"]*)"', page.text))
        assert form["csrf"] == csrf_token(session)
        allowed = await site.client.post("/auth/cli/allow", data=form)
    finally:
        site.client.cookies.clear()
    assert allowed.status_code == 303, allowed.text
    target = urllib.parse.urlsplit(allowed.headers["location"])
    assert (target.scheme, target.netloc, target.path) == ("http", "127.0.0.1:53682", "/callback")
    query = dict(urllib.parse.parse_qsl(target.query))
    assert query["state"] == "state-of-this-login"
    assert set(query) == {"code", "state"}  # never a token
    return query["code"]


async def test_the_cli_trades_its_code_and_verifier_for_a_token_once(site: Site) -> None:
    session = await site.session()
    code = await cli_code(site, session, s256(VERIFIER))
    answer = await site.client.post(
        "/auth/cli/exchange", json={"code": code, "code_verifier": VERIFIER, "hostname": "laptop-7"}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["workspace"], body["environment"], body["email"], body["role"]) == (
        "team",
        "main",
        "ada@example.org",
        "owner",
    )
    assert body["grpc"] == "grpc://127.0.0.1:1993"
    assert body["http"] == "http://127.0.0.1:1994"
    assert "ca_pem" not in body
    me = await site.client.get("/api/v1/me", headers=bearer(body["token"]))
    assert me.json()["email"] == "ada@example.org"
    record = await site.services.tokens.find(body["token"])
    assert record is not None
    assert record.subject == "levers9 login (laptop-7)"
    again = await site.client.post("/auth/cli/exchange", json={"code": code, "code_verifier": VERIFIER})
    assert again.status_code == 400
    assert again.json()["error"]["type"] == "invalid_grant"


async def test_a_wrong_verifier_is_refused_and_spends_the_code(site: Site) -> None:
    session = await site.session()
    code = await cli_code(site, session, s256(VERIFIER))
    wrong = await site.client.post("/auth/cli/exchange", json={"code": code, "code_verifier": "w" * 50})
    assert wrong.status_code == 400
    assert "does not match" in wrong.json()["error"]["message"]
    right = await site.client.post("/auth/cli/exchange", json={"code": code, "code_verifier": VERIFIER})
    assert right.status_code == 400  # someone who tried a code with a guessed verifier burnt it
    missing = await site.client.post("/auth/cli/exchange", json={"code_verifier": VERIFIER})
    assert missing.status_code == 422
    assert missing.json()["error"]["message"].startswith("code:")


async def test_the_exchange_is_refused_over_plain_http_off_loopback(site: Site) -> None:
    session = await site.session()
    code = await cli_code(site, session, s256(VERIFIER))
    far = await site.client.post(
        "http://levers9.example.com/auth/cli/exchange", json={"code": code, "code_verifier": VERIFIER}
    )
    assert far.status_code == 403
    assert far.json()["error"]["type"] == "insecure_transport"


async def test_the_cli_asks_for_an_environment_that_must_exist(site: Site) -> None:
    await site.services.workspaces.create_environment(site.workspace.id, "staging")
    session = await site.session()
    code = await cli_code(site, session, s256(VERIFIER), env="staging")
    body = (await site.client.post("/auth/cli/exchange", json={"code": code, "code_verifier": VERIFIER})).json()
    assert body["environment"] == "staging"
    site.client.cookies.set(SESSION_COOKIE, session)
    missing = await site.client.get(f"/auth/cli/start?{cli_query(s256(VERIFIER), env='nowhere')}")
    assert missing.status_code == 404
    assert "no environment 'nowhere'" in html.unescape(missing.text)


async def test_the_cli_page_sends_someone_signed_out_to_sign_in_and_back(site: Site) -> None:
    query = cli_query(s256(VERIFIER))
    answer = await site.client.get(f"/auth/cli/start?{query}")
    assert answer.status_code == 303
    target = urllib.parse.urlsplit(answer.headers["location"])
    assert target.path == "/auth/sign-in"
    assert urllib.parse.parse_qs(target.query)["next"] == [f"/auth/cli/start?{query}"]
    sign_in = await site.client.get(answer.headers["location"])
    assert sign_in.status_code == 200
    assert "levers9 dashboard" in sign_in.text  # no identity provider here: how to get a link


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"port": "0"}, "port:"),
        ({"port": "http"}, "port:"),
        ({"state": "short"}, "state:"),
        ({"code_challenge_method": "plain"}, "code_challenge_method:"),
        ({"code_challenge": "not-a-challenge"}, "code_challenge:"),
    ],
)
async def test_a_bad_cli_request_names_its_field(site: Site, change: dict[str, str], field: str) -> None:
    values = dict(urllib.parse.parse_qsl(cli_query(s256(VERIFIER))))
    answer = await site.client.get(f"/auth/cli/start?{urllib.parse.urlencode({**values, **change})}")
    assert answer.status_code == 400
    assert field in answer.text


async def test_allowing_the_cli_needs_the_csrf_token(site: Site) -> None:
    session = await site.session()
    site.client.cookies.set(SESSION_COOKIE, session)
    values = dict(urllib.parse.parse_qsl(cli_query(s256(VERIFIER))))
    forged = await site.client.post("/auth/cli/allow", data=values)
    assert forged.status_code == 403
    assert "location" not in forged.headers


async def test_switching_workspace_needs_membership_and_moves_the_session(site: Site) -> None:
    other = await site.services.workspaces.get_or_create("lab")
    stranger = await site.services.workspaces.get_or_create("elsewhere")
    await site.services.members.put(other.id, site.person.id, Role.VIEWER)
    session = await site.session()
    site.client.cookies.set(SESSION_COOKIE, session)
    listed = await site.client.get("/auth/workspaces")
    assert "Switch to lab" in listed.text
    no_csrf = await site.client.post("/auth/switch", data={"workspace": "lab"})
    assert no_csrf.status_code == 403
    refused = await site.client.post("/auth/switch", data={"workspace": stranger.name, "csrf": csrf_token(session)})
    assert refused.status_code == 403
    moved = await site.client.post("/auth/switch", data={"workspace": "lab", "csrf": csrf_token(session)})
    assert moved.status_code == 303
    fresh = moved.cookies[SESSION_COOKIE]
    me = (await site.client.get("/api/v1/me", headers=bearer(fresh))).json()
    assert (me["workspace"], me["role"]) == ("lab", "viewer")
    assert (await site.client.get("/api/v1/me", headers=bearer(session))).status_code == 401


async def test_signing_out_revokes_the_session(site: Site) -> None:
    session = await site.session()
    site.client.cookies.set(SESSION_COOKIE, session)
    forged = await site.client.post("/auth/sign-out")
    assert forged.status_code == 403
    out = await site.client.post("/auth/sign-out", data={"csrf": csrf_token(session)})
    assert out.status_code == 303
    assert out.headers["location"] == "/auth/sign-in"
    assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"]
    assert (await site.client.get("/api/v1/me", headers=bearer(session))).status_code == 401


async def test_oidc_without_an_issuer_is_a_page_not_an_error(site: Site) -> None:
    start = await site.client.get("/auth/oidc/start")
    assert start.status_code == 404
    assert "no identity provider" in start.text
    callback = await site.client.get("/auth/oidc/callback?error=access_denied")
    assert callback.status_code == 404


async def test_over_tls_the_session_cookie_is_secure(site: Site) -> None:
    made = await site.client.post("https://127.0.0.1:1994/api/v1/auth/links", headers=bearer(site.token))
    assert made.json()["url"].startswith("https://127.0.0.1:1994/auth/link/")
    used = await site.client.post(made.json()["url"])
    assert used.status_code == 303
    assert "Secure" in used.headers["set-cookie"]


async def test_the_public_url_names_links_and_makes_cookies_secure_behind_a_proxy(tmp_path: Path) -> None:
    config = ONE_POOL_CONFIG + "auth:\n  public_url: https://levers9.example.com/\n  link_ttl_s: 60\n"
    async with opened_services(tmp_path, config, f"sqlite:///{tmp_path / 'levers9.db'}") as services:
        workspace = await services.workspaces.get_or_create("team")
        person = await services.users.get_or_create("ada@example.org")
        await services.members.put(workspace.id, person.id, Role.MEMBER)
        _, token = await services.tokens.issue("user", workspace_id=workspace.id, user_id=person.id)
        transport = httpx.ASGITransport(app=create_http_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1994") as client:
            made = await client.post("/api/v1/auth/links", headers=bearer(token))
            url = made.json()["url"]
            assert url.startswith("https://levers9.example.com/auth/link/")
            # the proxy in front speaks TLS to the browser and plain HTTP to levers9
            used = await client.post(urllib.parse.urlsplit(url).path)
            assert used.status_code == 303
            assert "Secure" in used.headers["set-cookie"]


async def test_another_sites_form_cannot_spend_a_link(site: Site) -> None:
    made = await site.client.post("/api/v1/auth/links", headers=bearer(site.token))
    path = urllib.parse.urlsplit(made.json()["url"]).path
    forged = await site.client.post(path, headers={"origin": "https://evil.example"})
    assert forged.status_code == 403
    assert SESSION_COOKIE not in forged.cookies
    used = await site.client.post(path, headers={"origin": "http://127.0.0.1:1994"})  # not spent by the refusal
    assert used.status_code == 303
    assert SESSION_COOKIE in used.cookies


async def test_the_sign_in_page_says_who_is_signed_in_already(site: Site) -> None:
    site.client.cookies.set(SESSION_COOKIE, await site.session())
    page = await site.client.get("/auth/sign-in?next=/dashboard/e/main/tasks")
    assert page.status_code == 200
    assert "You are signed in as ada@example.org in workspace team" in page.text
    assert 'href="/dashboard/e/main/tasks"' in page.text
