"""`levers9 deploy`, `deployments` and `stop` against a real `levers9 up`: versions serve until stopped."""

from __future__ import annotations

import json
import textwrap

import httpx

from tests.fixtures.levers9_up import Up

APP = """
import levers9

@levers9.endpoint
def greet(name: str = "you") -> str:
    return "{greeting}, " + name

@levers9.queue
def work(item: int) -> int:
    return item * 2
"""


def _deploy(up: Up, greeting: str) -> list[dict[str, object]]:
    app = up.root / "webapp.py"
    app.write_text(textwrap.dedent(APP.format(greeting=greeting)))
    done = up.levers9("deploy", str(app), "--json")
    assert done.returncode == 0, done.stderr + up.log()[-2000:]
    deployed: list[dict[str, object]] = json.loads(done.stdout)
    return deployed


def _listed(up: Up) -> dict[str, dict[str, object]]:
    done = up.levers9("deployments", "--json")
    assert done.returncode == 0, done.stderr
    return {d["name"]: d for d in json.loads(done.stdout)}


def test_each_deploy_adds_a_version_and_older_ones_serve_until_stopped(levers9_up: Up) -> None:
    levers9_up.start(wait_workers=0)
    first = _deploy(levers9_up, "hello")
    assert sorted((d["name"], d["kind"], d["version"]) for d in first) == [
        ("greet", "endpoint", 1),
        ("work", "queue", 1),
    ]
    # the queue did not change, yet it gets a version too: a deploy versions the whole app
    second = _deploy(levers9_up, "howdy")
    assert sorted((d["name"], d["version"]) for d in second) == [("greet", 2), ("work", 2)]

    greet = _listed(levers9_up)["greet"]
    assert greet["active_version"] == 2
    versions = greet["versions"]
    assert isinstance(versions, list)
    assert [(v["version"], v["serving"]) for v in versions] == [(1, True), (2, True)]
    assert versions[0]["stub_id"] != versions[1]["stub_id"]  # changed code is a new stub

    stopped = levers9_up.levers9("stop", "greet", "--version", "1")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped greet v1" in stopped.stdout
    versions = _listed(levers9_up)["greet"]["versions"]
    assert isinstance(versions, list)
    assert [(v["version"], v["serving"]) for v in versions] == [(1, False), (2, True)]

    missing = levers9_up.levers9("stop", "greet", "--version", "9")
    assert missing.returncode == 1
    assert "greet v9" in missing.stderr
    table = levers9_up.levers9("deployments")
    assert table.returncode == 0, table.stderr
    assert "stopped" in table.stdout
    assert "serving (default)" in table.stdout


def test_another_workspace_sees_none_of_the_deployments(levers9_up: Up) -> None:
    levers9_up.start(wait_workers=0)
    _deploy(levers9_up, "hello")
    other = levers9_up.levers9("token", "create", "--workspace", "team-b")
    assert other.returncode == 0, other.stderr
    base = f"http://127.0.0.1:{levers9_up.http_port}/api/v1"
    as_b = {"authorization": f"Bearer {other.stdout.strip()}"}
    as_a = {"authorization": f"Bearer {levers9_up.token()}"}
    assert [d["name"] for d in httpx.get(f"{base}/deployments", headers=as_a).json()] == ["greet", "work"]
    assert httpx.get(f"{base}/deployments", headers=as_b).json() == []
    # the same answer as for a deployment that does not exist
    foreign = httpx.post(f"{base}/deployments/greet/versions/1/stop", headers=as_b)
    unknown = httpx.post(f"{base}/deployments/nothing/versions/1/stop", headers=as_b)
    assert (foreign.status_code, unknown.status_code) == (404, 404)
    assert _listed(levers9_up)["greet"]["versions"][0]["serving"] is True  # type: ignore[index]
    bad = httpx.post(f"{base}/deployments/greet/versions/0/stop", headers=as_a)
    assert bad.status_code == 422
