"""The browser fixtures (tests/fixtures/browser.py) against a tiny site served by aiohttp in the test's loop.

The site's pages carry a Content-Security-Policy without inline scripts, as the dashboard's will: the test page
runs its script from a file, which writes the heading and logs a console error; its inline script must be refused
(a console error too), and its missing image is a failed request. The clean page has none of those, and its log
must be empty: a dashboard test that asserts no problems relies on both.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, expect

from tests.fixtures.browser import DESKTOP, PHONE, Pages, output_dir_for, require_chromium
from tests.fixtures.ports import free_port

_CSP = "default-src 'self'"
_TEST_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>levers9 test page</title></head>
<body><h1 id="greeting">waiting for app.js</h1>
<script src="/app.js"></script>
<script>document.title = "the inline script ran";</script>
<img src="/missing.png" alt="">
</body></html>
"""
_APP_JS = """document.getElementById("greeting").textContent = "hello from app.js";
console.error("app.js: the widget failed to load");
"""
_CLEAN_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>clean</title><link rel="icon" href="/favicon.ico"></head>
<body><p id="who">cookie: <span id="cookie"></span></p><script src="/clean.js"></script></body></html>
"""
_CLEAN_JS = """fetch("/whoami").then(r => r.text()).then(t => { document.getElementById("cookie").textContent = t; });
"""
# the smallest valid PNG (1x1, transparent), so the clean page's icon request succeeds
_ICON = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


@pytest.fixture
async def site() -> AsyncIterator[str]:
    """The tiny site on 127.0.0.1, in the test's event loop; its base URL."""

    def page(html: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_: web.Request) -> web.Response:
            return web.Response(text=html, content_type="text/html", headers={"Content-Security-Policy": _CSP})

        return handler

    def script(source: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_: web.Request) -> web.Response:
            return web.Response(text=source, content_type="text/javascript")

        return handler

    async def icon(_: web.Request) -> web.Response:
        return web.Response(body=_ICON, content_type="image/png")

    async def set_cookie(_: web.Request) -> web.Response:
        answer = web.Response(text="set")
        answer.set_cookie("session", "first-page", httponly=True, samesite="Strict")
        return answer

    async def whoami(request: web.Request) -> web.Response:
        return web.Response(text=request.cookies.get("session", "none"))

    app = web.Application()
    app.router.add_get("/", page(_TEST_PAGE))
    app.router.add_get("/app.js", script(_APP_JS))
    app.router.add_get("/clean", page(_CLEAN_PAGE))
    app.router.add_get("/clean.js", script(_CLEAN_JS))
    app.router.add_get("/favicon.ico", icon)
    app.router.add_get("/set-cookie", set_cookie)
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def _until(probe: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Console messages reach the test as events of their own, a moment after the page's DOM shows the change."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"gave up waiting for {what} within {timeout:g} s")
        await asyncio.sleep(0.05)


async def test_a_page_is_read_and_shot_and_its_console_errors_and_failed_requests_are_seen(
    page: Page, pages: Pages, screenshot: Callable[..., Awaitable[Path]], site: str, output_dir: Path
) -> None:
    await page.goto(site)
    await expect(page.locator("#greeting")).to_have_text("hello from app.js")
    assert await page.title() == "levers9 test page"  # the inline script was refused

    log = pages.log(page)
    await _until(lambda: len(log.console_errors) >= 3 and bool(log.failed_requests), "the page's three console errors")
    # Chromium logs each: the script's own error, the refused inline script, and the image's 404
    app, csp, missing = sorted(log.console_errors, key=lambda line: ("app.js" not in line, "Security" not in line))
    assert app == f"app.js: the widget failed to load ({site}/app.js:1)"
    assert "violates the following Content Security Policy directive" in csp, csp
    assert missing.startswith("Failed to load resource: the server responded with a status of 404"), missing
    assert missing.endswith(f"({site}/missing.png:0)"), missing
    assert log.failed_requests == [f"GET {site}/missing.png: 404 Not Found"]
    assert log.page_errors == []
    assert len(log.problems()) == 4, log.problems()

    shot = await screenshot("test-page")
    assert shot == output_dir / "test-page.png"
    assert _png_size(shot) == DESKTOP


@pytest.mark.parametrize("viewport", [PHONE])
async def test_the_page_takes_the_viewport_a_test_asks_for(
    page: Page, screenshot: Callable[..., Awaitable[Path]], site: str
) -> None:
    await page.goto(f"{site}/clean")
    assert await page.evaluate("[window.innerWidth, window.innerHeight]") == list(PHONE)
    assert _png_size(await screenshot("phone")) == PHONE


async def test_each_page_has_its_own_cookies_and_a_clean_page_logs_no_problem(pages: Pages, site: str) -> None:
    first = await pages.open()
    second = await pages.open(PHONE)
    await first.goto(f"{site}/set-cookie")
    await first.goto(f"{site}/clean")
    await second.goto(f"{site}/clean")
    await expect(first.locator("#cookie")).to_have_text("first-page")
    await expect(second.locator("#cookie")).to_have_text("none")
    assert pages.log(first).problems() == []
    assert pages.log(second).problems() == []
    assert _png_size(await pages.screenshot("second", page=second)) == PHONE


async def test_the_browser_reaches_loopback_only(page: Page, site: str) -> None:
    """No test waits on the internet, and a page that loads from elsewhere shows it (see the fixture)."""
    await page.goto(site.replace("127.0.0.1", "localhost") + "/clean")
    await expect(page.locator("#cookie")).to_have_text("none")
    with pytest.raises(PlaywrightError, match="ERR_NAME_NOT_RESOLVED"):
        await page.goto("http://example.com/")


def test_the_output_folder_is_the_test_id_under_levers9_test_output_else_tmp_path(tmp_path: Path) -> None:
    nodeid = "tests/e2e/test_dashboard.py::test_sign_in[phone]"
    assert output_dir_for(nodeid, tmp_path, {}) == tmp_path
    folder = output_dir_for(nodeid, tmp_path, {"LEVERS9_TEST_OUTPUT": str(tmp_path / "out")})
    assert folder == tmp_path / "out" / "tests.e2e.test_dashboard.py__test_sign_in[phone]"
    assert folder.is_dir()
    long = output_dir_for(f"tests/x.py::test_{'a' * 300}", tmp_path, {"LEVERS9_TEST_OUTPUT": str(tmp_path / "out")})
    assert long.parent == tmp_path / "out"
    assert len(long.name) == 147


def test_a_machine_without_chromium_fails_the_test_naming_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install chromium chromium-driver"):
        require_chromium(tmp_path / "chromium")
    require_chromium()  # this machine has it
