"""The dashboard in a real Chromium against a real `levers9 up`: live pages, stopping a version, following a task's
output, what a viewer may not do, another workspace's task, clean pages on a desktop and a phone, the keyboard.

A session is the ``levers9_session`` cookie holding a user token, as signing in sets it: the owner's is the token
`levers9 up` wrote to its context, a viewer's one the owner issues with ``POST /api/v1/tokens {"role": "viewer"}``
(signing in itself is tests/e2e/test_sign_in.py's). The tests share one `levers9 up` (:func:`shared_up`), each
with deployments and functions of its own names. Screenshots of each main page go to the test's output folder
(``$LEVERS9_TEST_OUTPUT``). Nothing here waits a fixed time: each wait is for what the page shows, with a bound.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from collections.abc import Callable

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.dashboard.test_pages import PAGES
from tests.fixtures.browser import DESKTOP, PHONE, Pages
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)

#: how long the page may take to show what changed (a region is re-rendered every second)
SHOWN_S = 20_000  # milliseconds, Playwright's unit

NAV = ["Deployments", "Tasks", "Pools", "Machines", "Volumes", "Secrets", "Tokens", "Members", "Environments", "Usage"]

APP = """
import levers9

@levers9.endpoint
def {name}(who: str = "you") -> str:
    return "hello, " + who
"""

#: a call that prints a line, waits for the test's go file, prints another and returns
FOLLOWED = """
import os, time, levers9

@levers9.function()
def {name}(go):
    print("first line before go <b>not bold</b>", flush=True)
    while not os.path.exists(go):
        time.sleep(0.1)
    print("second line after go", flush=True)
    return 7

call = {name}.spawn({go!r})
print("TASK", call.task_id)
"""


def _base(up: Up) -> str:
    return f"http://127.0.0.1:{up.http_port}"


async def _session(pages: Pages, up: Up, token: str, viewport: tuple[int, int] = DESKTOP) -> Page:
    page = await pages.open(viewport)
    await page.context.add_cookies([{"name": "levers9_session", "value": token, "url": _base(up)}])
    return page


def _viewer_token(up: Up) -> str:
    made = httpx.post(
        f"{_base(up)}/api/v1/tokens",
        json={"role": "viewer", "subject": "dashboard viewer"},
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    assert made.json()["role"] == "viewer"
    token: str = made.json()["token"]
    return token


async def _deploy(up: Up, name: str) -> None:
    app = up.root / f"{name}.py"
    app.write_text(textwrap.dedent(APP.format(name=name)))
    done = await asyncio.to_thread(up.levers9, "deploy", str(app))
    assert done.returncode == 0, done.stderr + up.log()[-2000:]


def _call(up: Up, name: str, version: int) -> int:
    response = httpx.post(
        f"{_base(up)}/endpoint/{name}/v{version}",
        json={"who": "test"},
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=120,
    )
    return response.status_code


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        await asyncio.sleep(0.25)


async def _not_reloaded(page: Page) -> None:
    """Mark the page's window; :func:`_same_window` later proves no reload or navigation replaced it."""
    await page.evaluate("window.levers9TestMark = 'kept'")


async def _same_window(page: Page) -> None:
    assert await page.evaluate("window.levers9TestMark") == "kept", "the page was reloaded"


async def test_a_cli_deployment_appears_live_and_stopping_it_on_the_page_ends_that_version(
    shared_up: Up, pages: Pages
) -> None:
    up = shared_up
    page = await _session(pages, up, up.token())
    url = f"{_base(up)}/dashboard/e/main/deployments"
    await page.goto(url)
    await expect(page.get_by_role("heading", name="Deployments")).to_be_visible()
    await _not_reloaded(page)

    await _deploy(up, "dash_hello")
    row = page.locator('tr[data-deployment="dash_hello"][data-version="1"]')
    await expect(row).to_be_visible(timeout=SHOWN_S)
    await _same_window(page)
    assert _call(up, "dash_hello", 1) == 200
    await pages.screenshot("deployments-desktop", page)

    await row.get_by_role("button", name="Stop dash_hello version 1").click()
    await page.wait_for_url(url)
    await expect(row).to_have_count(0, timeout=SHOWN_S)
    await expect(page.get_by_text("dash_hello: stopped v1")).to_be_visible()
    await _until(lambda: _call(up, "dash_hello", 1) == 404, 30, "the stopped version answering 404")
    assert pages.log(page).problems(on=_base(up)) == []


async def test_a_viewer_sees_no_stop_button_and_a_forged_stop_is_refused(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    await _deploy(up, "dash_guarded")
    viewer = await asyncio.to_thread(_viewer_token, up)
    page = await _session(pages, up, viewer)
    url = f"{_base(up)}/dashboard/e/main/deployments"
    await page.goto(url)
    row = page.locator('tr[data-deployment="dash_guarded"][data-version="1"]')
    await expect(row).to_be_visible(timeout=SHOWN_S)
    await expect(page.locator(".role")).to_have_text("viewer")
    assert await page.get_by_role("button", name=re.compile("^Stop")).count() == 0
    assert pages.log(page).problems(on=_base(up)) == []
    csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
    assert csrf

    stop = f"{_base(up)}/dashboard/e/main/deployments/dash_guarded/versions/1/stop"
    cookies = {"levers9_session": viewer}
    without = httpx.post(stop, cookies=cookies, timeout=30)
    assert without.status_code == 403, without.text
    with_token = httpx.post(stop, cookies=cookies, data={"csrf": csrf}, timeout=30)
    assert with_token.status_code == 403, with_token.text
    assert "member role" in with_token.text
    # the owner's page still shows it serving, and it answers
    assert await asyncio.to_thread(_call, up, "dash_guarded", 1) == 200


async def test_a_running_tasks_output_is_followed_live(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    go = up.exchange / "dash-follow-go"
    done = await asyncio.to_thread(up.python, FOLLOWED.format(name="dash_follow", go=str(go)))
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.split("TASK", 1)[1].strip()
    page = await _session(pages, up, up.token())
    url = f"{_base(up)}/dashboard/e/main/tasks/{task_id}"
    await page.goto(url)
    logs = page.locator("pre#logs")
    await expect(logs).to_contain_text("first line before go", timeout=60_000)
    await expect(page.locator("#task-status")).to_have_text("running", timeout=SHOWN_S)
    assert "second line" not in (await logs.inner_text())
    assert await logs.locator("b").count() == 0  # the output is text, never markup
    await _not_reloaded(page)
    await pages.screenshot("task-running-desktop", page)

    go.write_text("go")
    await expect(logs).to_contain_text("second line after go", timeout=SHOWN_S)
    await expect(page.locator("#task-status")).to_have_text("complete", timeout=SHOWN_S)
    await expect(page.locator("#log-state")).to_contain_text("finished", timeout=SHOWN_S)
    await _same_window(page)
    # the placement history: where the scheduler placed it
    await expect(page.locator("#task table")).to_contain_text("placed")
    await expect(page.locator("#task table")).to_contain_text("local")
    assert pages.log(page).problems(on=_base(up)) == []

    # the task list shows it, and filters by status
    listing = await _session(pages, up, up.token())
    await listing.goto(f"{_base(up)}/dashboard/e/main/tasks?status=complete")
    await expect(listing.locator(f'tr[data-task="{task_id}"]')).to_be_visible()
    await listing.goto(f"{_base(up)}/dashboard/e/main/tasks?status=error")
    await expect(listing.locator(f'tr[data-task="{task_id}"]')).to_have_count(0)
    assert pages.log(listing).problems(on=_base(up)) == []


async def test_another_workspaces_task_is_a_404_page(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    go = up.exchange / "dash-theirs-go"
    go.write_text("go")
    done = await asyncio.to_thread(up.python, FOLLOWED.format(name="dash_theirs", go=str(go)))
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.split("TASK", 1)[1].strip()
    other = await asyncio.to_thread(up.levers9, "token", "create", "--workspace", "dash-other")
    assert other.returncode == 0, other.stderr
    page = await _session(pages, up, other.stdout.strip())
    response = await page.goto(f"{_base(up)}/dashboard/e/main/tasks/{task_id}")
    assert response is not None
    assert response.status == 404
    await expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    await expect(page.locator("main")).to_contain_text(task_id)
    # the owner's own session sees it
    mine = await _session(pages, up, up.token())
    response = await mine.goto(f"{_base(up)}/dashboard/e/main/tasks/{task_id}")
    assert response is not None
    assert response.status == 200


@pytest.mark.parametrize(("viewport", "label"), [(DESKTOP, "desktop"), (PHONE, "phone")])
async def test_every_page_is_clean_and_shown_on_a_desktop_and_a_phone(
    shared_up: Up, pages: Pages, viewport: tuple[int, int], label: str
) -> None:
    up = shared_up
    page = await _session(pages, up, up.token(), viewport)
    for name in PAGES:
        url = f"{_base(up)}/dashboard/e/main/{name}"
        response = await page.goto(url)
        assert response is not None
        assert response.status == 200, name
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        await expect(page.locator("h1")).to_be_visible()
        await page.wait_for_load_state("load")
        await pages.screenshot(f"{name}-{label}", page, full_page=True)
        # nothing wider than the screen but the tables' own scrolling boxes
        overflow = await page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"{name} is {overflow} px wider than the {label} screen"
    assert pages.log(page).problems(on=_base(up)) == []


async def test_the_keyboard_reaches_the_skip_link_and_every_section(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    page = await _session(pages, up, up.token())
    await page.goto(f"{_base(up)}/dashboard/e/main/tasks")
    await page.keyboard.press("Tab")
    focused = page.locator(":focus")
    await expect(focused).to_have_text("Skip to content")
    await page.keyboard.press("Enter")
    assert page.url.endswith("#main")
    await page.goto(f"{_base(up)}/dashboard/e/main/tasks")
    reached = []
    for _ in range(40):
        await page.keyboard.press("Tab")
        text = (await page.evaluate("document.activeElement ? document.activeElement.textContent : ''")).strip()
        if text in NAV and text not in reached:
            reached.append(text)
        if len(reached) == len(NAV):
            break
    assert reached == NAV
    # the focused link is visibly outlined
    outline = await page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"
    await page.keyboard.press("Enter")
    await page.wait_for_url(re.compile(r"/dashboard/e/main/usage$"))
    assert pages.log(page).problems(on=_base(up)) == []


async def test_a_volume_is_browsed_uploaded_to_and_downloaded_from(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    made = await asyncio.to_thread(up.levers9, "volume", "create", "dash-vol")
    assert made.returncode == 0, made.stderr
    page = await _session(pages, up, up.token())
    await page.goto(f"{_base(up)}/dashboard/e/main/volumes")
    await page.get_by_role("link", name="dash-vol").click()
    await expect(page.get_by_text("This folder is empty.")).to_be_visible()
    upload = up.root / "notes.txt"
    upload.write_text("hello volume\n")
    await page.locator("#upload-file").set_input_files(str(upload))
    await page.get_by_role("button", name="Upload").click()
    link = page.get_by_role("link", name="notes.txt")
    await expect(link).to_be_visible(timeout=SHOWN_S)
    await pages.screenshot("volume-desktop", page)
    href = await link.get_attribute("href")
    assert href is not None
    downloaded = httpx.get(f"{_base(up)}{href}", cookies={"levers9_session": up.token()}, timeout=30)
    assert downloaded.status_code == 200
    assert downloaded.content == b"hello volume\n"
    assert "attachment" in downloaded.headers["content-disposition"]
    assert pages.log(page).problems(on=_base(up)) == []

    # a viewer browses and downloads, but has no upload form, and a forged upload is refused
    viewer = await asyncio.to_thread(_viewer_token, up)
    as_viewer = await _session(pages, up, viewer)
    await as_viewer.goto(f"{_base(up)}/dashboard/e/main/volumes/dash-vol/files")
    await expect(as_viewer.get_by_role("link", name="notes.txt")).to_be_visible()
    assert await as_viewer.locator("#upload-file").count() == 0
    csrf = await as_viewer.locator('input[name="csrf"]').first.get_attribute("value")
    assert csrf
    forged = httpx.put(
        f"{_base(up)}/dashboard/e/main/volumes/dash-vol/upload/evil.txt",
        content=b"x",
        headers={"X-CSRF-Token": csrf},
        cookies={"levers9_session": viewer},
        timeout=30,
    )
    assert forged.status_code == 403, forged.text
    await as_viewer.reload()
    assert await as_viewer.get_by_role("link", name="evil.txt").count() == 0


async def test_a_sessions_live_streams_are_bounded_and_end_when_it_is_revoked(shared_up: Up) -> None:
    """Over HTTP without a browser: the region's events, the ninth stream of a session refused, and the end of
    every stream when the session's token is revoked."""
    up = shared_up
    made = httpx.post(
        f"{_base(up)}/api/v1/tokens",
        json={"role": "viewer", "subject": "revoked viewer"},
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    token, token_id = made.json()["token"], made.json()["id"]
    url = f"{_base(up)}/dashboard/e/main/live/deployments"
    async with httpx.AsyncClient(cookies={"levers9_session": token}, timeout=30) as client:
        streams = []
        try:
            for _ in range(8):
                stream = await client.send(client.build_request("GET", url), stream=True)
                assert stream.status_code == 200
                streams.append(stream)
            lines = streams[0].aiter_lines()
            assert await anext(lines) == "event: region"
            ninth = await client.get(url)
            assert ninth.status_code == 429
            assert "8 live views" in ninth.text
            revoked = httpx.delete(
                f"{_base(up)}/api/v1/tokens/{token_id}", headers={"authorization": f"Bearer {up.token()}"}, timeout=30
            )
            assert revoked.status_code == 200, revoked.text
            rest = [line async for line in lines]  # the stream ends: this loop finishes
            assert "event: signed-out" in rest
            assert "data: Your session ended: sign in again." in rest
        finally:
            for stream in streams:
                await stream.aclose()
        # and the revoked session is no session: a page redirects to sign in, a stream says signed-out at once
        again = await client.get(url)
        assert again.text == "event: signed-out\ndata: Your session ended: sign in again.\n\n"
        page = await client.get(f"{_base(up)}/dashboard/e/main/deployments")
        assert page.status_code == 303
        assert page.headers["location"].startswith("/auth/sign-in?next=")


async def test_closing_a_live_view_frees_its_place(shared_up: Up) -> None:
    """A stream whose client went is ended by the server: the session may open as many again."""
    up = shared_up
    token = await asyncio.to_thread(_viewer_token, up)
    url = f"{_base(up)}/dashboard/e/main/live/tasks"

    async def open_eight(client: httpx.AsyncClient) -> list[int]:
        """The statuses of 8 streams opened at once (each 200 one read to its first event), all closed again."""
        streams = []
        try:
            for _ in range(8):
                stream = await client.send(client.build_request("GET", url), stream=True)
                streams.append(stream)
                if stream.status_code == 200:
                    assert await anext(stream.aiter_lines()) == "event: region"
        finally:
            for stream in streams:
                await stream.aclose()
        return [stream.status_code for stream in streams]

    async with httpx.AsyncClient(cookies={"levers9_session": token}, timeout=30) as client:
        assert await open_eight(client) == [200] * 8
        deadline = time.monotonic() + 30
        while (statuses := await open_eight(client)) != [200] * 8:
            assert time.monotonic() < deadline, f"closed live views were not freed: {statuses}"
            await asyncio.sleep(0.25)


async def test_an_open_page_goes_to_sign_in_when_its_session_is_revoked(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    made = httpx.post(
        f"{_base(up)}/api/v1/tokens",
        json={"role": "viewer", "subject": "signed out viewer"},
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    page = await _session(pages, up, made.json()["token"])
    await page.goto(f"{_base(up)}/dashboard/e/main/tasks")
    await expect(page.locator("#tasks")).to_be_visible()
    revoked = httpx.delete(
        f"{_base(up)}/api/v1/tokens/{made.json()['id']}", headers={"authorization": f"Bearer {up.token()}"}, timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    # the live region's stream ends with signed-out; the page reloads and is sent to sign in, to come back here
    await page.wait_for_url(re.compile(r"/auth/sign-in\?next=%2Fdashboard%2Fe%2Fmain%2Ftasks$"), timeout=SHOWN_S)
    assert pages.log(page).problems(on=_base(up)) == []


async def test_a_live_update_keeps_the_keyboards_place(shared_up: Up, pages: Pages) -> None:
    up = shared_up
    await _deploy(up, "dash_focus_a")
    page = await _session(pages, up, up.token())
    await page.goto(f"{_base(up)}/dashboard/e/main/deployments")
    stop = page.get_by_role("button", name="Stop dash_focus_a version 1")
    await stop.focus()
    await _deploy(up, "dash_focus_b")  # the region is replaced with one more row
    await expect(page.locator('tr[data-deployment="dash_focus_b"]')).to_be_visible(timeout=SHOWN_S)
    label = await page.evaluate("document.activeElement.getAttribute('aria-label')")
    assert label == "Stop dash_focus_a version 1"
    assert pages.log(page).problems(on=_base(up)) == []
