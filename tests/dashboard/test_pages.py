"""The dashboard's pages over real Services through the HTTP app (httpx's ASGI transport): sessions, roles,
CSRF, the security headers, escaping, 404 pages and the static files. The browser tests (tests/e2e) drive the
same pages in Chromium against a real `levers9 up`."""

from __future__ import annotations

import re

import httpx
import pytest

from levers9.dashboard import live
from levers9.dashboard.pages import CONTENT_SECURITY_POLICY
from levers9.dashboard.session import CSRF_HEADER, SESSION_COOKIE, csrf_token
from levers9.state.sql.records import PlacementEvent, Role, WorkspaceRecord
from tests.controlplane.conftest import Api

PAGES = [
    "deployments",
    "tasks",
    "pools",
    "machines",
    "volumes",
    "secrets",
    "tokens",
    "members",
    "environments",
    "usage",
]


async def _person(api: Api, workspace: str, email: str, role: Role, name: str = "") -> tuple[WorkspaceRecord, str]:
    """A person who is a ``role`` of ``workspace`` (made if missing), and a session token for them there."""
    record = await api.services.workspaces.get_or_create(workspace)
    user = await api.services.users.signed_in("https://issuer.test", email, email, name)
    await api.services.members.put(record.id, user.id, Role.OWNER if role is Role.OWNER else role)
    _, token = await api.services.tokens.issue(
        "user", workspace_id=record.id, subject=f"dashboard session ({email})", user_id=user.id, role=Role.OWNER
    )
    return record, token


def _as(api: Api, token: str) -> httpx.AsyncClient:
    api.client.cookies.clear()
    api.client.cookies.set(SESSION_COOKIE, token, domain="levers9.test")
    return api.client


def _secure(response: httpx.Response) -> None:
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "same-origin"
    assert response.headers["cache-control"] == "no-store"


async def test_root_and_dashboard_send_people_without_a_session_to_sign_in(api: Api) -> None:
    response = await api.client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == "/dashboard/"
    response = await api.client.get("/dashboard/")
    assert response.status_code == 303
    assert response.headers["location"] == "/auth/sign-in?next=%2Fdashboard%2F"
    _secure(response)
    response = await api.client.get("/dashboard/e/main/tasks?status=running")
    assert response.headers["location"] == "/auth/sign-in?next=%2Fdashboard%2Fe%2Fmain%2Ftasks%3Fstatus%3Drunning"
    # a token that does not verify is no session either
    response = await _as(api, "l9_user_not-a-token").get("/dashboard/e/main/tasks")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/auth/sign-in?next=")
    # and a POST without one changes nothing: 401
    response = await api.client.post("/dashboard/e/main/secrets", data={"name": "A", "value": "b"})
    assert response.status_code == 401


async def test_every_page_renders_for_an_owner_with_the_security_headers_and_no_token(api: Api) -> None:
    _, token = await _person(api, "team", "owner@example.com", Role.OWNER)
    client = _as(api, token)
    response = await client.get("/dashboard/")
    assert response.status_code == 303
    assert response.headers["location"] == "/dashboard/e/main/deployments"
    for name in PAGES:
        response = await client.get(f"/dashboard/e/main/{name}")
        assert response.status_code == 200, (name, response.text[:2000])
        _secure(response)
        assert response.headers["content-type"].startswith("text/html")
        html = response.text
        assert token not in html, name
        assert "owner@example.com" in html
        assert ">team<" in html
        assert 'href="/auth/workspaces"' in html  # the workspace's name leads to the switcher
        assert f'name="csrf" value="{csrf_token(token)}"' in html  # the sign-out form at least
        assert 'href="#main"' in html  # the skip link
        assert "<script>" not in html
        assert " style=" not in html
    for name in ("dashboard.css", "dashboard.js", "favicon.svg"):
        response = await client.get(f"/dashboard/static/{name}")
        assert response.status_code == 200
        assert response.content
        _secure_static = response.headers["x-content-type-options"] == "nosniff"
        assert _secure_static
    assert (await client.get("/dashboard/static/..%2Fpages.py")).status_code == 404
    response = await client.get("/dashboard/no/such/page")
    assert response.status_code == 404
    assert "text/html" in response.headers["content-type"]
    _secure(response)
    # the framework's own answers there carry the headers too: a method a page does not take, OPTIONS, HEAD
    for method, path in (("PATCH", "/dashboard/e/main/tasks"), ("OPTIONS", "/auth/sign-in"), ("HEAD", "/")):
        response = await client.request(method, path)
        _secure(response)
    # and the API's answers are left as they were
    assert "content-security-policy" not in (await client.get("/api/v1/health")).headers


async def test_an_unknown_environment_and_another_workspaces_task_are_404_pages(api: Api) -> None:
    _, token = await _person(api, "team", "owner@example.com", Role.OWNER)
    other = await api.services.workspaces.get_or_create("other")
    theirs = await api.services.tasks.create(other.id, {"id": "x"})
    client = _as(api, token)
    response = await client.get(f"/dashboard/e/main/tasks/{theirs.id}")
    assert response.status_code == 404
    assert "text/html" in response.headers["content-type"]
    assert theirs.id in response.text  # the page names what it did not find, exactly as for a missing one
    missing = await client.get("/dashboard/e/main/tasks/task_missing")
    assert missing.status_code == 404
    _secure(response)
    response = await client.get("/dashboard/e/nowhere/tasks")
    assert response.status_code == 404
    assert "nowhere" in response.text


async def test_state_changes_need_the_csrf_token_and_the_role(api: Api) -> None:
    workspace, owner = await _person(api, "team", "owner@example.com", Role.OWNER)
    _, viewer = await _person(api, "team", "viewer@example.com", Role.VIEWER)
    client = _as(api, owner)
    # no token: refused before anything happens
    response = await client.post("/dashboard/e/main/secrets", data={"name": "API_KEY", "value": "s3cret"})
    assert response.status_code == 403
    assert "CSRF" in response.text
    _secure(response)
    # another session's token is not this one's
    response = await client.post(
        "/dashboard/e/main/secrets", data={"name": "API_KEY", "value": "s3cret", "csrf": csrf_token(viewer)}
    )
    assert response.status_code == 403
    assert await api.services.secrets.list(workspace.id) == []
    # the form field, or the header
    response = await client.post(
        "/dashboard/e/main/secrets", data={"name": "API_KEY", "value": "s3cret", "csrf": csrf_token(owner)}
    )
    assert response.status_code == 200
    assert "API_KEY" in response.text
    assert "s3cret" not in response.text
    response = await client.post("/dashboard/e/main/secrets/API_KEY/delete", headers={CSRF_HEADER: csrf_token(owner)})
    assert response.status_code == 303
    assert await api.services.secrets.list(workspace.id) == []
    # a viewer: 403 with or without its own CSRF token, and the page offers no such form
    client = _as(api, viewer)
    page = await client.get("/dashboard/e/main/secrets")
    assert page.status_code == 200
    assert 'action="/dashboard/e/main/secrets"' not in page.text
    for data in ({"name": "B", "value": "c"}, {"name": "B", "value": "c", "csrf": csrf_token(viewer)}):
        response = await client.post("/dashboard/e/main/secrets", data=data)
        assert response.status_code == 403
    assert await api.services.secrets.list(workspace.id) == []
    response = await client.post("/dashboard/e/main/deployments/app/versions/1/stop", data={"csrf": csrf_token(viewer)})
    assert response.status_code == 403
    assert "member role" in response.text


async def test_a_bad_form_value_is_a_400_page_naming_the_field(api: Api) -> None:
    _, owner = await _person(api, "team", "owner@example.com", Role.OWNER)
    client = _as(api, owner)
    csrf = csrf_token(owner)
    response = await client.post("/dashboard/e/main/tokens", data={"subject": "ci", "role": "king", "csrf": csrf})
    assert response.status_code == 400
    assert "role:" in response.text
    response = await client.post("/dashboard/e/main/tokens", data={"subject": "", "csrf": csrf})
    assert response.status_code == 400
    assert "subject:" in response.text
    response = await client.get("/dashboard/e/main/tasks?status=sleeping")
    assert response.status_code == 400
    assert "status:" in response.text
    response = await client.get("/dashboard/e/main/usage?since=yesterday")
    assert response.status_code == 400
    assert "since:" in response.text


async def test_a_token_is_shown_once_on_the_page_that_issued_it(api: Api) -> None:
    workspace, owner = await _person(api, "team", "owner@example.com", Role.OWNER)
    client = _as(api, owner)
    response = await client.post(
        "/dashboard/e/main/tokens", data={"subject": "ci", "role": "viewer", "csrf": csrf_token(owner)}
    )
    assert response.status_code == 200
    found = re.search(r'id="issued-token"[^>]*>(l9_user_[^<]+)<', response.text)
    assert found is not None
    assert found.group(1) not in str(response.url)
    assert "location" not in response.headers
    issued = await api.services.auth.verify(found.group(1))
    assert issued.role is Role.VIEWER
    assert issued.workspace_id == workspace.id
    again = await client.get("/dashboard/e/main/tokens")
    assert found.group(1) not in again.text
    assert "ci" in again.text


async def test_values_are_escaped(api: Api) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    _, owner = await _person(api, "team", "owner@example.com", Role.OWNER, name=hostile)
    response = await _as(api, owner).get("/dashboard/e/main/members")
    assert response.status_code == 200
    assert hostile not in response.text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in response.text


def test_an_event_carries_every_line_of_its_data() -> None:
    assert live.event("log", "one\r\ntwo\n") == b"event: log\ndata: one\ndata: two\ndata: \n\n"
    assert live.event("region", "<p>x</p>") == b"event: region\ndata: <p>x</p>\n\n"


@pytest.mark.parametrize("region", sorted(live.REGIONS))
async def test_each_live_region_renders_what_its_page_shows(api: Api, region: str) -> None:
    """A region's HTML is its page's (the stream sends this; tests/e2e watch it change in a browser)."""
    workspace, owner = await _person(api, "team", "owner@example.com", Role.OWNER)
    task = await api.services.tasks.create(workspace.id, {"id": "x"})
    page = "tasks/" + task.id if region == "task" else region
    client = _as(api, owner)
    html = (await client.get(f"/dashboard/e/main/{page}")).text
    principal = await api.services.auth.verify(owner)
    request = _Request(api)
    params = {"id": [task.id]} if region == "task" else {}
    fragment = await live.render_region(request, principal, region, params, csrf=csrf_token(owner))  # type: ignore[arg-type]
    assert fragment.strip()
    assert fragment in html


class _Request:
    """What a region's builders read of a request: the app's state."""

    def __init__(self, api: Api) -> None:
        transport = api.client._transport
        self.app = transport.app  # type: ignore[attr-defined]


async def test_owners_manage_members_environments_and_tokens_from_the_pages(api: Api) -> None:
    workspace, owner = await _person(api, "team", "owner@example.com", Role.OWNER)
    client = _as(api, owner)
    csrf = {"csrf": csrf_token(owner)}
    # invite, change a role, remove
    response = await client.post(
        "/dashboard/e/main/members", data={"email": "new@example.com", "role": "viewer", **csrf}
    )
    assert response.status_code == 303
    roles = {m.email: m.role for m in await api.services.members.list(workspace.id)}
    assert roles["new@example.com"] is Role.VIEWER
    await client.post("/dashboard/e/main/members", data={"email": "new@example.com", "role": "member", **csrf})
    roles = {m.email: m.role for m in await api.services.members.list(workspace.id)}
    assert roles["new@example.com"] is Role.MEMBER
    response = await client.post("/dashboard/e/main/members/new@example.com/remove", data=csrf)
    assert response.status_code == 303
    assert "new@example.com" not in {m.email for m in await api.services.members.list(workspace.id)}
    # the last owner stays: a 409 page
    response = await client.post("/dashboard/e/main/members/owner@example.com/remove", data=csrf)
    assert response.status_code == 409
    # an environment: created, its pages are its own, deleted
    response = await client.post("/dashboard/e/main/environments", data={"name": "staging", **csrf})
    assert response.status_code == 303
    staging = await api.services.workspaces.environment(workspace.id, "staging")
    assert staging is not None
    await api.services.secrets.put(staging.id, "ONLY_STAGING", "x")
    assert "ONLY_STAGING" in (await client.get("/dashboard/e/staging/secrets")).text
    assert "ONLY_STAGING" not in (await client.get("/dashboard/e/main/secrets")).text
    page = (await client.get("/dashboard/e/main/secrets")).text
    assert 'href="/dashboard/e/staging/secrets"' in page  # the switcher keeps the section
    response = await client.post("/dashboard/e/main/environments/main/delete", data=csrf)
    assert response.status_code == 409
    response = await client.post("/dashboard/e/main/environments/staging/delete", data=csrf)
    assert response.status_code == 303
    assert (await client.get("/dashboard/e/staging/secrets")).status_code == 404
    # a token issued, then revoked
    _, other = await api.services.tokens.issue("user", workspace_id=workspace.id, subject="ci")
    principal = await api.services.auth.verify(other)
    response = await client.post(f"/dashboard/e/main/tokens/{principal.token_id}/revoke", data=csrf)
    assert response.status_code == 303
    revoked = await api.services.tokens.get(principal.token_id)
    assert revoked is not None
    assert revoked.revoked_at is not None


async def test_a_member_stops_a_version_but_manages_nothing(api: Api) -> None:
    _, member = await _person(api, "team", "member@example.com", Role.MEMBER)
    client = _as(api, member)
    csrf = {"csrf": csrf_token(member)}
    # no such deployment: the role allows it, the service says 404
    response = await client.post("/dashboard/e/main/deployments/app/versions/1/stop", data=csrf)
    assert response.status_code == 404
    for path, data in (
        ("/dashboard/e/main/members", {"email": "x@example.com", "role": "owner"}),
        ("/dashboard/e/main/environments", {"name": "mine"}),
        ("/dashboard/e/main/tokens", {"subject": "mine"}),
        ("/dashboard/e/main/secrets", {"name": "MINE", "value": "x"}),
    ):
        response = await client.post(path, data={**data, **csrf})
        assert response.status_code == 403, path
        assert "owner role" in response.text
    tokens = await client.get("/dashboard/e/main/tokens")
    assert tokens.status_code == 200
    assert "Owners list, issue and revoke" in tokens.text


async def test_the_pools_page_says_why_a_pool_starts_nothing_and_a_task_page_why_a_placement_missed(api: Api) -> None:
    workspace, owner = await _person(api, "team", "owner@example.com", Role.OWNER)
    await api.services.scheduler.ctx.unavailable.mark("gpu-l4", "L4", None, "quota_exceeded: no L4 left", 60)
    client = _as(api, owner)
    pools = await client.get("/dashboard/e/main/pools")
    assert pools.status_code == 200
    assert 'data-pool="gpu-l4"' in pools.text
    assert "quota_exceeded: no L4 left" in pools.text
    task = await api.services.tasks.create(workspace.id, {"id": "x"})
    await api.services.tasks.record(
        [
            PlacementEvent(task.id, "skipped", pool="gpu-l4", gpu="L4", reason="quota_exceeded: no L4 left"),
            PlacementEvent(task.id, "placed", pool="cpu", worker_id="wkr_1"),
        ]
    )
    page = await client.get(f"/dashboard/e/main/tasks/{task.id}")
    assert page.status_code == 200
    history = page.text.split("Placement history", 1)[1]
    assert history.index("skipped") < history.index("placed")
    assert "quota_exceeded: no L4 left" in history
    assert "wkr_1" in history


async def test_a_session_of_one_environment_is_offered_no_other(api: Api) -> None:
    workspace, _ = await _person(api, "team", "owner@example.com", Role.OWNER)
    staging = await api.services.workspaces.create_environment(workspace.id, "staging")
    user = await api.services.users.by_email("owner@example.com")
    assert user is not None
    _, token = await api.services.tokens.issue("user", workspace_id=staging.id, subject="staging only", user_id=user.id)
    client = _as(api, token)
    response = await client.get("/dashboard/")
    assert response.headers["location"] == "/dashboard/e/staging/deployments"
    page = await client.get("/dashboard/e/staging/tasks")
    assert page.status_code == 200
    assert 'href="/dashboard/e/main/tasks"' not in page.text
    assert (await client.get("/dashboard/e/main/tasks")).status_code == 403
