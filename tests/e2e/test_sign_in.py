"""Signing in to the dashboard end to end: a real `levers9 up`, a real Chromium, a real OpenID provider and the real
`levers9 login` as a subprocess.

* the one-time link `levers9 up` prints signs its person in once (a second use is refused), and appears in no
  file but the terminal's output;
* OpenID Connect against oidc-provider-mock: an invited person, a person whose email domain may join, a person
  with no membership (refused with the invite message and no session), a denial at the provider;
* `levers9 login --no-browser`: the browser follows the printed URL (sign-in first when signed out), allows the
  CLI, and the context it writes works for `levers9 tasks`; the token appears nowhere on screen;
* signing out ends the session: the old cookie is sent to sign in again.

Screenshots of the sign-in pages go to the test's output folder (tests/fixtures/browser.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.async_api import Page, expect

from tests.fixtures.browser import PHONE, Pages
from tests.fixtures.levers9_up import Up
from tests.fixtures.oidc_provider import OidcProvider

pytestmark = pytest.mark.timeout(600)

LINK = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/auth/link/[A-Za-z0-9_-]{43}) \(sign-in link, once, 15 min\)")
UP_EMAIL = "owner@levers9.localhost"


def base(up: Up) -> str:
    return f"http://127.0.0.1:{up.http_port}"


def printed_link(up: Up) -> str:
    found = LINK.search(up.log())
    assert found is not None, up.log()[-3000:]
    return found.group(1)


def api(up: Up, method: str, path: str, token: str, **body: object) -> httpx.Response:
    return httpx.request(
        method, f"{base(up)}/api/v1{path}", headers={"authorization": f"Bearer {token}"}, json=body or None, timeout=30
    )


async def session_of(page: Page) -> str | None:
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    return cookies.get("levers9_session")


async def sign_in_with_link(page: Page, link: str) -> None:
    await page.goto(link)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(lambda url: "/dashboard/" in url)


@pytest.fixture
def up(levers9_up: Up) -> Up:
    levers9_up.min_workers = 0  # no calls run here
    return levers9_up


async def test_the_link_up_prints_signs_in_once(up: Up, pages: Pages) -> None:
    up.start()
    link = printed_link(up)
    me = api(up, "GET", "/me", up.token())
    assert me.json()["email"] == UP_EMAIL  # the context's token acts for up's person, an owner
    assert me.json()["role"] == "owner"

    page = await pages.open()
    answer = await page.goto(link)
    assert answer is not None
    assert answer.status == 200
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    await pages.screenshot("link", page)
    assert await session_of(page) is None  # the page alone signs nobody in
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(lambda url: "/dashboard/" in url)
    session = await session_of(page)
    assert session is not None
    assert api(up, "GET", "/me", session).json()["email"] == UP_EMAIL
    assert pages.log(page).problems(on=f"{base(up)}/auth/") == []

    later = await pages.open(PHONE)
    answer = await later.goto(link)
    assert answer is not None
    assert answer.status == 404
    await expect(later.locator("main")).to_contain_text("used already or has expired")
    await pages.screenshot("link-used", later)
    assert await session_of(later) is None

    # the link is printed on the terminal (the log file here is up's stdout) and written to no other file
    code = link.rsplit("/", 1)[1]
    assert up.log().count(code) == 1  # the banner's line; no log line of up names it, not even its use
    for path in up.root.rglob("*"):
        if path.is_file() and not path.name.startswith("up-") and path.stat().st_size < 50_000_000:
            assert code.encode() not in path.read_bytes(), path

    # `levers9 dashboard` asks for a fresh link for the context's person
    made = up.levers9("dashboard", "--no-browser")
    assert made.returncode == 0, made.stderr
    fresh = re.search(r"(http://127\.0\.0\.1:\d+/auth/link/\S+)", made.stdout)
    assert fresh is not None, made.stdout
    assert fresh.group(1) != link
    third = await pages.open()
    await sign_in_with_link(third, fresh.group(1))
    assert await session_of(third) is not None

    # a restart keeps the person and their token, and prints a new link
    up.stop()
    token = up.token()
    up.start()
    assert up.token() == token
    assert LINK.findall(up.log())[-1] != link


async def test_people_sign_in_through_openid_connect(up: Up, oidc_provider: OidcProvider, pages: Pages) -> None:
    client = oidc_provider.register_client([f"{base(up)}/auth/oidc/callback"])
    up.write_config()
    config = up.home / "levers9.yaml"
    config.write_text(
        config.read_text()
        + "auth:\n  oidc:\n"
        + f"    issuer: {oidc_provider.issuer}\n    client_id: {client.client_id}\n"
        + "    client_secret: ${TEST_OIDC_SECRET}\n    name: Test IdP\n"
    )
    os.environ["TEST_OIDC_SECRET"] = client.client_secret  # up's environment is this process's (less LEVERS9_*)
    try:
        up.start()
    finally:
        del os.environ["TEST_OIDC_SECRET"]
    owner = up.token()
    assert api(up, "PUT", "/members/ada@team.example", owner, role="member").status_code == 201
    assert api(up, "PUT", "/workspace/join", owner, domain="join.example", role="viewer").status_code == 200
    oidc_provider.add_user("ada-1", email="ada@team.example", name="Ada", email_verified=True)
    oidc_provider.add_user("carl-2", email="carl@join.example", name="Carl", email_verified=True)
    oidc_provider.add_user("dora-3", email="dora@nowhere.example", name="Dora", email_verified=True)
    oidc_provider.add_user("eve-4", email="eve@team.example", name="Eve", email_verified=False)

    async def sign_in(sub: str, shot: str | None = None) -> Page:
        page = await pages.open()
        await page.goto(f"{base(up)}/auth/sign-in?next=/dashboard/")
        if shot:
            await pages.screenshot(shot, page)
        await page.get_by_role("link", name="Sign in with Test IdP").click()
        await oidc_provider.sign_in(page, sub)
        await page.wait_for_url(lambda url: url.startswith(base(up)))
        await page.wait_for_load_state()
        problems = pages.log(page).problems(on=f"{base(up)}/auth/")
        # a refusal is a page with its status (403), which the log counts as a failed request; nothing else
        assert [p for p in problems if not re.search(r"403|Forbidden", p) or "/auth/oidc/callback?" not in p] == []
        return page

    invited = await sign_in("ada-1", "sign-in")
    assert "/dashboard/" in invited.url
    session = await session_of(invited)
    assert session is not None
    me = api(up, "GET", "/me", session).json()
    assert (me["email"], me["workspace"], me["role"]) == ("ada@team.example", "default", "member")

    joined = await sign_in("carl-2")
    session = await session_of(joined)
    assert session is not None
    me = api(up, "GET", "/me", session).json()
    assert (me["email"], me["workspace"], me["role"]) == ("carl@join.example", "default", "viewer")

    stranger = await sign_in("dora-3")
    await expect(stranger.locator("main")).to_contain_text("Ask an owner to invite dora@nowhere.example")
    await pages.screenshot("not-invited", stranger)
    assert await session_of(stranger) is None

    unverified = await sign_in("eve-4")
    await expect(unverified.locator("main")).to_contain_text("has not verified the email address eve@team.example")
    assert await session_of(unverified) is None

    denied = await pages.open()
    await denied.goto(f"{base(up)}/auth/oidc/start?next=//evil.example/")
    await oidc_provider.deny(denied)
    await denied.wait_for_url(lambda url: url.startswith(base(up)))
    await expect(denied.locator("main")).to_contain_text("did not sign you in (access_denied")
    await pages.screenshot("denied", denied)
    assert await session_of(denied) is None

    forged = await pages.open()
    answer = await forged.goto(f"{base(up)}/auth/oidc/callback?code=made-up&state=never-issued-by-levers9")
    assert answer is not None
    assert answer.status == 400
    await expect(forged.locator("main")).to_contain_text("was not started here")

    # a state started in one browser, brought to another (someone signing a victim in as themselves): refused
    started = await pages.open()
    await started.goto(f"{base(up)}/auth/oidc/start")
    await started.wait_for_url(lambda url: url.startswith(oidc_provider.issuer))
    state = urllib.parse.parse_qs(urllib.parse.urlsplit(started.url).query)["state"][0]
    victim = await pages.open()
    answer = await victim.goto(f"{base(up)}/auth/oidc/callback?code=theirs&state={state}")
    assert answer is not None
    assert answer.status == 400
    await expect(victim.locator("main")).to_contain_text("started in another browser")
    assert await session_of(victim) is None


def read_lines(stream: object, into: list[str], seen: threading.Event) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.append(line)
        if "/auth/cli/start?" in line:
            seen.set()


async def test_levers9_login_completes_through_the_browser(up: Up, pages: Pages, tmp_path: Path) -> None:
    up.start()
    home = tmp_path / "cli-home"
    env = {k: v for k, v in up.env.items() if not k.startswith("LEVERS9_")}
    env["LEVERS9_HOME"] = str(home)
    cli = subprocess.Popen(
        [sys.executable, "-m", "levers9", "login", "--url", base(up), "--no-browser", "--name", "mine"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    seen = threading.Event()
    reader = threading.Thread(target=read_lines, args=(cli.stdout, out, seen), daemon=True)
    reader.start()
    try:
        assert seen.wait(60), "".join(out)
        [start] = [line.strip() for line in out if "/auth/cli/start?" in line]
        assert start.startswith(f"{base(up)}/auth/cli/start?")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(start).query)
        assert query["code_challenge_method"] == ["S256"]

        page = await pages.open()
        visited: list[str] = []
        page.context.on("request", lambda request: visited.append(request.url))
        await page.goto(start)  # signed out: to the sign-in page, which comes back here afterwards
        assert urllib.parse.urlsplit(page.url).path == "/auth/sign-in"
        assert urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)["next"][0].startswith("/auth/cli/start?")
        await pages.screenshot("cli-sign-in", page)
        await sign_in_with_link(page, printed_link(up))
        await page.goto(start)
        await expect(page.locator("#cli-email")).to_have_text(UP_EMAIL)
        await pages.screenshot("cli-allow", page)
        await page.get_by_role("button", name="Allow").click()
        await expect(page.get_by_text("levers9 login finishes there")).to_be_visible()
        cli.wait(60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
        reader.join(10)
    assert cli.stderr is not None
    errors = cli.stderr.read()
    cli.stderr.close()
    assert cli.returncode == 0, "".join(out) + errors
    printed = "".join(out) + errors
    assert f"signed in as {UP_EMAIL} in workspace default (owner); context 'mine' written to" in printed
    assert pages.log(page).problems(on=f"{base(up)}/auth/") == []

    contexts = yaml.safe_load((home / "config").read_text())
    assert contexts["current"] == "mine"
    saved = contexts["contexts"]["mine"]
    assert saved["grpc"] == f"grpc://127.0.0.1:{up.grpc_port}"
    assert saved["http"] == base(up)
    assert saved["workspace"] == "default"
    token = saved["token"]
    assert token not in printed  # never on screen
    assert [url for url in visited if token in url] == []  # nor in a URL the browser went to
    assert any(url.startswith("http://127.0.0.1:") and "/callback?code=" in url for url in visited)
    assert token not in up.log()
    assert token != up.token()
    assert api(up, "GET", "/me", token).json()["email"] == UP_EMAIL

    tasks = subprocess.run(
        [sys.executable, "-m", "levers9", "tasks"], env=env, capture_output=True, text=True, timeout=120
    )
    assert tasks.returncode == 0, tasks.stderr


async def test_signing_out_ends_the_session(up: Up, pages: Pages) -> None:
    up.start()
    page = await pages.open()
    await sign_in_with_link(page, printed_link(up))
    session = await session_of(page)
    assert session is not None
    await page.get_by_role("button", name="Sign out").click()
    await page.wait_for_url(lambda url: urllib.parse.urlsplit(url).path == "/auth/sign-in")
    await pages.screenshot("signed-out", page)
    assert await session_of(page) is None
    assert api(up, "GET", "/me", session).status_code == 401

    old = await pages.open()
    await old.context.add_cookies([{"name": "levers9_session", "value": session, "url": base(up)}])
    await old.goto(f"{base(up)}/dashboard/")
    assert urllib.parse.urlsplit(old.url).path == "/auth/sign-in"
