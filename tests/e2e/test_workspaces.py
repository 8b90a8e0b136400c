"""Members, roles and environments as a user meets them through `levers9 up`: the CLI, a function, REST.

One `levers9 up` (its `default` workspace; the local pool serves it): an owner makes an environment and a secret of
the same name in main and in staging; a function run with `-e staging` (the SDK's context environment) sees
staging's value, run without sees main's, and both run on the workspace's pool. A viewer reads and is refused what a
member does, each on one error line naming the role. The context never shows its token.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.timeout(600)

APP = """
import os, levers9

@levers9.function(secrets=["API_KEY"])
def key():
    return os.environ.get("API_KEY")

print("KEY", key.remote())
"""


def _app(up: Up, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = up.root / "key_app.py"
    path.write_text(textwrap.dedent(APP))
    return subprocess.run(
        [sys.executable, str(path)], env={**up.env, **env}, capture_output=True, text=True, timeout=300, cwd=up.root
    )


def test_environments_members_and_roles_through_the_cli(levers9_up: Up) -> None:
    up = levers9_up
    up.start()

    made = up.levers9("environment", "create", "staging")
    assert made.returncode == 0, made.stderr
    listed = json.loads(up.levers9("environment", "list", "--json").stdout)
    assert [e["name"] for e in listed] == ["main", "staging"]

    for args, value in (
        (("secret", "create", "API_KEY"), "main-value"),
        (("-e", "staging", "secret", "create", "API_KEY"), "staging-value"),
    ):
        created = up.levers9(*args, stdin=value + "\n")
        assert created.returncode == 0, created.stderr
    in_staging = _app(up, {"LEVERS9_ENVIRONMENT": "staging"})
    assert in_staging.returncode == 0, in_staging.stderr
    assert "KEY staging-value" in in_staging.stdout
    in_main = _app(up, {})
    assert in_main.returncode == 0, in_main.stderr
    assert "KEY main-value" in in_main.stdout
    # the staging task is staging's: main's listing does not show it
    main_tasks = json.loads(up.levers9("tasks", "--json").stdout)
    staging_tasks = json.loads(up.levers9("-e", "staging", "tasks", "--json").stdout)
    assert len(main_tasks) == len(staging_tasks) == 1
    assert main_tasks[0]["id"] != staging_tasks[0]["id"]

    # an unknown environment is one clear line
    unknown = up.levers9("tasks", "-e", "nope")
    assert unknown.returncode != 0
    assert "environment" in unknown.stderr
    assert "nope" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    # members: the owner invites a viewer; a viewer's token reads and is refused the rest
    invited = up.levers9("workspace", "invite", "vera@example.com", "--role", "viewer")
    assert invited.returncode == 0, invited.stderr
    assert "vera@example.com is a viewer" in invited.stdout
    members = json.loads(up.levers9("workspace", "members", "--json").stdout)
    assert ("vera@example.com", "viewer") in [(m["email"], m["role"]) for m in members]
    viewer = httpx.post(
        f"http://127.0.0.1:{up.http_port}/api/v1/tokens",
        headers={"authorization": f"Bearer {up.token()}"},
        json={"role": "viewer", "subject": "read-only dashboard"},
        timeout=10,
    )
    assert viewer.status_code == 201, viewer.text
    as_viewer = {"LEVERS9_TOKEN": viewer.json()["token"]}
    assert up.levers9("tasks", env=as_viewer).returncode == 0
    refused = up.levers9("-e", "staging", "secret", "create", "OTHER", stdin="x\n", env=as_viewer)
    assert refused.returncode != 0
    assert "needs the owner role" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    ran = _app(up, as_viewer)
    assert ran.returncode != 0
    assert "needs the member role" in ran.stderr

    # the controlplane machine's own `levers9 token create` makes role-bound tokens too
    made = up.levers9("token", "create", "--role", "viewer")
    assert made.returncode == 0, made.stderr
    me = httpx.get(
        f"http://127.0.0.1:{up.http_port}/api/v1/me",
        headers={"authorization": f"Bearer {made.stdout.strip()}"},
        timeout=10,
    ).json()
    assert (me["workspace"], me["role"]) == ("default", "viewer")
    wrong = up.levers9("token", "create", "--role", "admin")
    assert wrong.returncode == 2
    assert "--role must be viewer, member or owner" in wrong.stderr

    # the context says where it acts and as whom, never the token
    shown = up.levers9("-e", "staging", "context", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    context = json.loads(shown.stdout)
    assert (context["workspace"], context["environment"], context["role"], context["token"]) == (
        "default",
        "staging",
        "owner",
        True,
    )
    assert up.token() not in shown.stdout

    # nothing runs in staging now (its task ended): deleting it succeeds, and takes its secret with it
    deleted = up.levers9("environment", "delete", "staging", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    gone = up.levers9("-e", "staging", "secret", "list")
    assert gone.returncode != 0
    assert "environment" in gone.stderr


ENDPOINTS = """
import levers9

@levers9.endpoint
def where(name: str = "you") -> str:
    return "{where}, " + name

@levers9.endpoint(public=True)
def hello() -> str:
    return "hello from {where}"

@levers9.queue
def double(item: int) -> int:
    return item * 2
"""


def test_the_gateway_serves_each_environment_its_own_deployments(levers9_up: Up) -> None:
    up = levers9_up
    up.start()
    assert up.levers9("environment", "create", "staging").returncode == 0
    for env, where in (({}, "main"), ({"LEVERS9_ENVIRONMENT": "staging"}, "staging")):
        app = up.root / f"endpoints_{where}.py"
        app.write_text(textwrap.dedent(ENDPOINTS.format(where=where)))
        deployed = up.levers9("deploy", str(app), "--json", env=env)
        assert deployed.returncode == 0, deployed.stderr + up.log()[-2000:]
    base = f"http://127.0.0.1:{up.http_port}"
    owner = {"authorization": f"Bearer {up.token()}"}
    staging = {**owner, "X-Levers9-Environment": "staging"}
    with httpx.Client(base_url=base, timeout=120) as http:
        assert http.post("/endpoint/where", headers=owner, json={"name": "ada"}).json() == "main, ada"
        assert http.post("/endpoint/where", headers=staging, json={"name": "ada"}).json() == "staging, ada"
        # public ones by name, no token: @WORKSPACE for main, @WORKSPACE:ENV for another environment
        assert http.post("/endpoint/@default/hello", json={}).json() == "hello from main"
        assert http.post("/endpoint/@default:staging/hello", json={}).json() == "hello from staging"
        assert http.post("/endpoint/@default:prod/hello", json={}).status_code == 404
        # a viewer reads the deployments and may call a public endpoint, but not run one that is not public
        issued = http.post("/api/v1/tokens", headers=owner, json={"role": "viewer"})
        assert issued.status_code == 201, issued.text
        viewer = {"authorization": f"Bearer {issued.json()['token']}"}
        refused = http.post("/endpoint/where", headers=viewer, json={})
        assert refused.status_code == 403
        assert "member role" in refused.json()["error"]["message"]
        assert http.post("/endpoint/hello", headers=viewer, json={}).json() == "hello from main"
        assert http.get("/api/v1/deployments", headers=viewer).status_code == 200
        # a queue: a viewer may not enqueue, but reads the status of an item a member enqueued
        assert http.post("/queue/double", headers=viewer, json={"item": 2}).status_code == 403
        queued = http.post("/queue/double", headers=owner, json={"item": 21})
        assert queued.status_code == 202, queued.text
        item = f"/queue/double/tasks/{queued.json()['task_id']}"
        read = http.get(item, headers=viewer)
        assert read.status_code == 200, read.text
        # a sandbox's ports run code too
        assert http.get("/sandbox/sb-nope/8000/", headers=viewer).status_code == 403
        # an unknown environment in the header is a 404 naming it, not main's deployment
        lost = http.post("/endpoint/where", headers={**owner, "X-Levers9-Environment": "prod"}, json={})
        assert lost.status_code == 404
        assert "prod" in lost.json()["error"]["message"]
