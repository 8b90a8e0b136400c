"""Sandboxes through the controlplane's REST API, on a real `levers9 up` whose pool runs them under runc.

The controlplane reaches each worker's sandbox server through the worker's tunnel (which a pool with
``sandboxes`` always opens); these tests drive a sandbox as a program in another language would: REST and
NDJSON only.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.levers9_up import Up, _finish, _processes_mentioning

pytestmark = pytest.mark.e2e


def _client(up: Up, token: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{up.http_port}/api/v1",
        headers={"authorization": f"Bearer {token or up.token()}"},
        timeout=120,
    )


def _start(up: Up, *, sandboxes: int = 3) -> httpx.Client:
    up.use_runtime("runc")
    up.sandboxes = sandboxes
    up.min_workers = up.max_workers = 1
    up.start()
    return _client(up)


@pytest.fixture(scope="module")
def sandbox_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """One `levers9 up` with a runc pool of one worker running at most 3 sandboxes, for the tests that end theirs."""
    root = tmp_path_factory.mktemp("sandbox-up")
    up = Up(root)
    try:
        _start(up)
        yield up
    finally:
        _finish(up, root)


@pytest.fixture(autouse=True)
def _terminated() -> Iterator[None]:
    """Every sandbox a test made is terminated after it, passed or failed (the next test has the worker's room)."""
    yield
    while _made:
        client, sid = _made.pop()
        with contextlib.suppress(httpx.HTTPError):  # its `levers9 up` may have stopped first
            client.delete(f"/sandboxes/{sid}")


_made: list[tuple[httpx.Client, object]] = []


def _create(client: httpx.Client, **fields: object) -> dict[str, object]:
    """A sandbox made for a test of this module; the autouse fixture terminates it after the test."""
    info = create_sandbox(client, **fields)
    _made.append((client, info["id"]))
    return info


def create_sandbox(client: httpx.Client, **fields: object) -> dict[str, object]:
    """A sandbox made over REST (300 s to live unless ``fields`` say otherwise), its info."""
    answer = client.post("/sandboxes", json={"timeout_s": 300, **fields})
    assert answer.status_code == 201, answer.text
    info: dict[str, object] = answer.json()
    return info


def _exec(client: httpx.Client, sid: object, **body: object) -> int:
    answer = client.post(f"/sandboxes/{sid}/processes", json=body)
    assert answer.status_code == 201, answer.text
    process: int = answer.json()["process"]
    return process


def _output(client: httpx.Client, sid: object, process: int) -> tuple[str, str, int | None]:
    out, err, code = "", "", None
    with client.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            item = json.loads(line)
            if "exit" in item:
                code = item["exit"]
            elif item.get("stream") == "stdout":
                out += item["data"]
            elif item.get("stream") == "stderr":
                err += item["data"]
    return out, err, code


def _error(answer: httpx.Response) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["type"], error["message"]


def test_a_sandbox_streams_output_as_it_comes_and_takes_files_both_ways(sandbox_up: Up) -> None:
    client = _client(sandbox_up)
    info = _create(client, name="first", env={"GREETING": "hello"})
    sid = info["id"]
    assert (info["state"], info["pool"], info["name"]) == ("running", "local", "first")
    assert str(info["worker_id"]).startswith("wkr_")
    assert sid in [s["id"] for s in client.get("/sandboxes").json()["sandboxes"]]

    # a line reaches the caller while the process still runs: it waits for a file only the caller writes
    script = 'echo "$GREETING one"; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; echo bad >&2; exit 3'
    process = _exec(client, sid, argv=["sh", "-c", script])
    with client.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
        lines = stream.iter_lines()
        first = json.loads(next(lines))
        assert (first["stream"], first["data"]) == ("stdout", "hello one\n")
        status = client.get(f"/sandboxes/{sid}/processes/{process}").json()
        assert status["running"] is True
        put = client.put(f"/sandboxes/{sid}/files", params={"path": "/tmp/go"}, content=b"")
        assert put.status_code == 200, put.text
        rest = [json.loads(line) for line in lines]
    assert {"stream": "stdout", "data": "two\n", "encoding": "utf-8", "partial": False} in rest
    assert {"stream": "stderr", "data": "bad\n", "encoding": "utf-8", "partial": False} in rest
    assert rest[-1] == {"exit": 3}

    # no credential of levers9's in reach: not in its processes' environment, nor in any process's it can read
    seen = _output(client, sid, _exec(client, sid, argv=["sh", "-c", "env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'"]))
    assert "GREETING=hello" in seen[0]
    assert "LEVERS9_RUNNER_MODE=sandbox" in seen[0]  # the runner's own environment was read too
    assert "l9_" not in seen[0]
    assert sandbox_up.token() not in seen[0]
    assert "LEVERS9_TOKEN" not in seen[0]

    # Python code, and several processes at once
    first_code, second_code = _exec(client, sid, code="print(6 * 7)"), _exec(client, sid, argv=["echo", "side"])
    assert _output(client, sid, first_code) == ("42\n", "", 0)
    assert _output(client, sid, second_code) == ("side\n", "", 0)
    listed = client.get(f"/sandboxes/{sid}/processes").json()["processes"]
    assert {p["process"] for p in listed} >= {process, first_code, second_code}

    # a file of 6 MiB up and down, unchanged, and the directory calls
    data = os.urandom(6 * 1024 * 1024)
    missing_dir = client.put(f"/sandboxes/{sid}/files", params={"path": "/l9-files/data.bin"}, content=b"x")
    assert _error(missing_dir)[:2] == (404, "file_not_found")
    assert client.post(f"/sandboxes/{sid}/files/mkdir", params={"path": "/l9-files"}).status_code == 200
    put = client.put(f"/sandboxes/{sid}/files", params={"path": "/l9-files/data.bin"}, content=data)
    assert put.json() == {"size": len(data)}, put.text
    got = client.get(f"/sandboxes/{sid}/files", params={"path": "/l9-files/data.bin"})
    assert got.content == data
    stat = client.get(f"/sandboxes/{sid}/files/stat", params={"path": "/l9-files/data.bin"}).json()["entry"]
    assert (stat["size"], stat["is_dir"]) == (len(data), False)
    names = [
        e["name"] for e in client.get(f"/sandboxes/{sid}/files/list", params={"path": "/l9-files"}).json()["entries"]
    ]
    assert names == ["data.bin"]
    summed = _output(client, sid, _exec(client, sid, argv=["sha256sum", "/l9-files/data.bin"]))[0]
    assert summed.startswith(hashlib.sha256(data).hexdigest())
    assert client.delete(f"/sandboxes/{sid}/files", params={"path": "/l9-files/data.bin"}).status_code == 200
    missing = client.get(f"/sandboxes/{sid}/files/stat", params={"path": "/l9-files/data.bin"})
    assert _error(missing)[:2] == (404, "file_not_found")

    # a path that would leave the sandbox's root, and one that is not absolute
    for path in ("/../../etc/shadow", "etc/passwd"):
        assert _error(client.get(f"/sandboxes/{sid}/files", params={"path": path}))[:2] == (400, "bad_path")

    ended = client.delete(f"/sandboxes/{sid}").json()
    assert (ended["state"], ended["reason"]) == ("ended", "terminated")
    status, kind, message = _error(client.post(f"/sandboxes/{sid}/processes", json={"argv": ["true"]}))
    assert (status, kind) == (409, "sandbox_ended")
    assert "terminated" in message
    assert sid not in [s["id"] for s in client.get("/sandboxes").json()["sandboxes"]]
    assert sid in [s["id"] for s in client.get("/sandboxes", params={"all": "true"}).json()["sandboxes"]]


def test_another_workspace_sees_no_sandbox_and_gets_none_on_a_pool_that_is_not_its(sandbox_up: Up) -> None:
    client = _client(sandbox_up)
    sid = _create(client)["id"]
    made = sandbox_up.levers9("token", "create", "--workspace", "team-b")
    assert made.returncode == 0, made.stderr
    other = _client(sandbox_up, made.stdout.strip())
    assert other.get("/sandboxes").json() == {"sandboxes": []}
    unknown = _error(other.get("/sandboxes/sb-0000000000000000"))
    for answer in (
        other.get(f"/sandboxes/{sid}"),
        other.post(f"/sandboxes/{sid}/processes", json={"argv": ["true"]}),
        other.get(f"/sandboxes/{sid}/files", params={"path": "/etc/hostname"}),
        other.delete(f"/sandboxes/{sid}"),
    ):
        # the same answer as for a sandbox that never was, so ids cannot be probed
        assert _error(answer)[:2] == unknown[:2] == (404, "sandbox_not_found")
    # the only pool with sandboxes serves the workspace `default` alone
    status, kind, message = _error(other.post("/sandboxes", json={}))
    assert (status, kind) == (400, "no_sandbox_pool")
    assert "no pool of this controlplane serves sandboxes to this workspace" in message
    assert client.get(f"/sandboxes/{sid}").json()["state"] == "running"


def test_bad_requests_name_what_is_wrong(sandbox_up: Up) -> None:
    client = _client(sandbox_up)
    status, kind, message = _error(client.post("/sandboxes", json={"pool": "nowhere"}))
    assert (status, kind) == (400, "invalid_request")
    assert "'nowhere'" in message
    assert "pools with sandboxes: local" in message
    status, kind, message = _error(client.post("/sandboxes", json={"secrets": ["NOT_A_SECRET"]}))
    assert (status, kind) == (400, "invalid_request")
    assert "NOT_A_SECRET" in message
    assert _error(client.post("/sandboxes", json={"env": {"LEVERS9_TOKEN": "x"}}))[:2] == (400, "invalid_request")
    status, kind, message = _error(client.post("/sandboxes", json={"gpu_count": 1}))  # a count alone: any GPU
    assert (status, kind) == (503, "no_sandbox_worker")
    assert "has no GPU; the sandbox takes 1x any GPU" in message
    assert client.post("/sandboxes", json={"cpu_millicores": "lots"}).status_code == 422
    # an image is resolved on the worker with its privileges: the worker's own root, or a path, is no image
    for image in ("/", "/var/lib"):
        status, kind, message = _error(client.post("/sandboxes", json={"image": image}))
        assert (status, kind) == (400, "invalid_request")
        assert "image" in message
        assert "images.local_dirs" in message


def _room(client: httpx.Client) -> tuple[int, int, int]:
    (worker,) = client.get("/workers").json()
    return worker["cpu_free"], worker["memory_free"], worker["running"]


def test_timeouts_end_sandboxes_and_a_full_worker_is_said_so(sandbox_up: Up) -> None:
    client = _client(sandbox_up)
    assert _room(client) == (2000, 4096, 0)
    short = _create(client, timeout_s=2, cpu_millicores=500, memory_mib=256)["id"]
    idle = _create(client, idle_timeout_s=2, cpu_millicores=500, memory_mib=256)["id"]
    # the room sandboxes hold is the scheduler's too: no call is placed into it, and the worker is not idle
    assert _room(client) == (1000, 3584, 2)
    status, kind, message = _error(client.post("/sandboxes", json={"cpu_millicores": 1500}))
    assert (status, kind) == (503, "no_sandbox_worker")
    assert "no room for 1500 millicores and 1024 MiB" in message
    busy = _create(client, idle_timeout_s=2, cpu_millicores=500, memory_mib=256)["id"]
    _exec(client, busy, argv=["sleep", "8"])  # a process that runs is use
    # the worker runs at most 3: a fourth is refused, naming why, though it would fit
    status, kind, message = _error(client.post("/sandboxes", json={"cpu_millicores": 100, "memory_mib": 64}))
    assert (status, kind) == (503, "no_sandbox_worker")
    assert "already runs its most sandboxes" in message
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = {sid: client.get(f"/sandboxes/{sid}").json() for sid in (short, idle)}
        if all(s["state"] == "ended" for s in states.values()):
            break
        time.sleep(0.5)
    assert states[short]["reason"].startswith("it timed out"), states[short]
    assert states[idle]["reason"].startswith("it was idle"), states[idle]
    assert client.get(f"/sandboxes/{busy}").json()["state"] == "running"
    # the two that ended gave their room back (the worker said so; nobody had to ask about them first)
    assert _room(client) == (1500, 3840, 1)
    client.delete(f"/sandboxes/{busy}")
    assert _room(client) == (2000, 4096, 0)


def _worker_pid(up: Up) -> int:
    for pid, cmd in _processes_mentioning(str(up.root)):
        if cmd.endswith("-m levers9 worker"):
            return pid
    raise AssertionError("no levers9 worker runs")


def test_a_sandbox_whose_worker_dies_is_gone_with_a_clear_error_not_a_hang(levers9_up: Up) -> None:
    client = _start(levers9_up, sandboxes=2)
    info = _create(client)
    sid, worker = info["id"], info["worker_id"]
    process = _exec(client, sid, argv=["sh", "-c", "echo started; sleep 600"])
    with client.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
        lines = stream.iter_lines()
        assert json.loads(next(lines))["data"] == "started\n"
        os.kill(_worker_pid(levers9_up), signal.SIGKILL)
        last = json.loads(next(lines))
    assert last["error"]["type"] == "sandbox_gone", last
    assert str(worker) in last["error"]["message"]
    # once the worker's keepalive lapsed, every request says the worker left, at once
    deadline = time.monotonic() + 60
    while (info := client.get(f"/sandboxes/{sid}").json())["state"] != "gone":
        assert time.monotonic() < deadline, info
        time.sleep(0.5)
    assert str(worker) in str(info["reason"])
    status, kind, message = _error(client.post(f"/sandboxes/{sid}/processes", json={"argv": ["true"]}))
    assert (status, kind) == (409, "sandbox_gone")
    assert f"worker {worker}" in message
    assert "has left" in message


def test_an_exposed_port_is_served_through_the_gateway_with_the_workspaces_token(sandbox_up: Up) -> None:
    client = _client(sandbox_up)
    sid = _create(client, ports=[8000], workdir="/tmp")["id"]
    client.put(f"/sandboxes/{sid}/files", params={"path": "/tmp/hello.txt"}, content=b"hello from the sandbox\n")
    # nothing listens yet: refused, so no URL is handed out that does not answer
    status, kind, message = _error(client.post(f"/sandboxes/{sid}/ports/8000"))
    assert (status, kind) == (409, "port_not_listening")
    assert "port 8000" in message
    status, kind, message = _error(client.post(f"/sandboxes/{sid}/ports/9000"))
    assert (status, kind) == (400, "invalid_request")
    assert "ports: 8000" in message
    _exec(client, sid, argv=["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"], cwd="/tmp")
    deadline = time.monotonic() + 30
    while (exposed := client.post(f"/sandboxes/{sid}/ports/8000")).status_code != 200:
        assert time.monotonic() < deadline, exposed.text
        time.sleep(0.2)
    url = exposed.json()["url"]
    assert url == f"http://127.0.0.1:{sandbox_up.http_port}/sandbox/{sid}/8000/"
    token = {"authorization": f"Bearer {sandbox_up.token()}"}
    assert httpx.get(url + "hello.txt", headers=token, timeout=30).text == "hello from the sandbox\n"
    assert httpx.get(url + "hello.txt", timeout=30).status_code == 401
    made = sandbox_up.levers9("token", "create", "--workspace", "team-c")
    other = {"authorization": f"Bearer {made.stdout.strip()}"}
    assert httpx.get(url + "hello.txt", headers=other, timeout=30).status_code == 404
    # the server stopped: the gateway says nothing listens, not a hang
    for process in client.get(f"/sandboxes/{sid}/processes").json()["processes"]:
        client.post(f"/sandboxes/{sid}/processes/{process['process']}/kill", json={})
    deadline = time.monotonic() + 30
    while (gone := httpx.get(url, headers=token, timeout=30)).status_code == 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert gone.status_code == 502, gone.text
    assert "nothing listens" in gone.json()["error"]["message"]


def test_many_sandboxes_run_at_once_on_one_worker(levers9_up: Up) -> None:
    levers9_up.cpu = 4
    client = _start(levers9_up, sandboxes=12)
    room = {"cpu_millicores": 250, "memory_mib": 128}
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        made = list(pool.map(lambda _: _create(client, **room), range(12)))
        assert len({info["worker_id"] for info in made}) == 1
        assert _room(client) == (1000, 4096 - 12 * 128, 12)
        said = list(
            pool.map(
                lambda info: _output(client, info["id"], _exec(client, info["id"], argv=["echo", info["id"]])), made
            )
        )
    assert [out for out, _, _ in said] == [f"{info['id']}\n" for info in made]
    # the thirteenth is one too many for the worker, though its room would hold it
    status, kind, message = _error(client.post("/sandboxes", json=room))
    assert (status, kind) == (503, "no_sandbox_worker")
    assert "already runs its most sandboxes" in message
    for info in made:
        assert client.delete(f"/sandboxes/{info['id']}").json()["state"] == "ended"
    assert _room(client) == (4000, 4096, 0)
