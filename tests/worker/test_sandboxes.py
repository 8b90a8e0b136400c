"""The worker's sandboxes, driven over its loopback HTTP API, in real runc and gVisor containers.

:class:`~levers9.worker.sandboxes.Sandboxes` boots each sandbox through the warm pool's Launcher
(the ``host`` image) and :class:`~levers9.worker.sandbox_api.SandboxAPI` serves them on 127.0.0.1;
the tests speak HTTP to it as the controlplane will through the worker's tunnel: create, exec with
output streamed while the process runs, files both ways, the errors, the lifecycle (timeout, idle
timeout, the cap, a container killed under a sandbox, the worker stopping). No controlplane. Each test
ends with the sandboxes closed, the pool closed and the world's leftover check of tests/worker/test_pool.py
(no process, mount, cgroup, network namespace or directory left).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from levers9.worker.environment import options_from_env
from levers9.worker.sandbox_api import WORKSPACE_HEADER, SandboxAPI
from levers9.worker.sandboxes import Sandboxes, SandboxRefused, SandboxSpec
from levers9.worker.session import WorkerOptions, WorkerProcess
from tests.worker.test_pool import ISOLATED, PYTHON, World, _world


@dataclass
class Served:
    world: World
    sandboxes: Sandboxes
    api: SandboxAPI
    http: httpx.AsyncClient

    async def create(self, **fields: Any) -> dict[str, Any]:
        answer = await self.http.post("/sandboxes", json={"workspace_id": "ws1", "python_version": PYTHON, **fields})
        assert answer.status_code == 201, answer.text
        created: dict[str, Any] = answer.json()
        self.world.seen.add(created["container_id"])
        return created

    async def exec(self, sid: str, **body: Any) -> int:
        answer = await self.http.post(f"/sandboxes/{sid}/processes", json=body)
        assert answer.status_code == 201, answer.text
        number: int = answer.json()["process"]
        return number

    async def output(self, sid: str, number: int) -> list[dict[str, Any]]:
        async with self.http.stream("GET", f"/sandboxes/{sid}/processes/{number}/output") as answer:
            assert answer.status_code == 200
            return [json.loads(line) async for line in answer.aiter_lines() if line]

    async def info(self, sid: str) -> dict[str, Any]:
        answer = await self.http.get(f"/sandboxes/{sid}")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    async def ended(self, sid: str) -> dict[str, Any]:
        """Its info once it has ended (whatever ends it is the test's to cause)."""
        for _ in range(600):
            found = await self.info(sid)
            if found["state"] != "running":
                return found
            await asyncio.sleep(0.05)
        raise AssertionError(f"the sandbox {sid} never ended: {found}")


@contextlib.asynccontextmanager
async def served(runtime: str, tmp_path: Path, **kw: Any) -> AsyncIterator[Served]:
    async with _world(runtime, tmp_path) as world, served_on(world, **kw) as s:
        yield s


@contextlib.asynccontextmanager
async def served_on(world: World, **kw: Any) -> AsyncIterator[Served]:
    """Sandboxes on ``world``'s pool (its launcher, ports and GPUs), served over HTTP, closed at the end."""
    pool = world.pool
    sandboxes = Sandboxes(pool.launcher, pool.client, pool._ports, state_dir=pool.state_dir, gpus=pool.gpu_ledger, **kw)
    api = SandboxAPI(sandboxes)
    await api.start()
    headers = {"Authorization": f"Bearer {api.secret}"}
    http = httpx.AsyncClient(base_url=api.url, headers=headers, timeout=120)
    try:
        yield Served(world, sandboxes, api, http)
    finally:
        await http.aclose()
        await api.close()
        await sandboxes.close()
        assert not (pool.state_dir / "sandboxes").exists()


async def until(condition: Callable[[], bool], timeout_s: float = 120) -> None:
    """Wait until ``condition()`` holds, failing after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.05)


def _error(answer: httpx.Response) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["message"]


async def test_a_sandbox_over_http_runs_processes_and_files(runtime: str, tmp_path: Path) -> None:
    async with served(runtime, tmp_path) as s:
        sb = await s.create(env={"GREETING": "hello"}, secrets={"TOKEN": "s3cret"}, workdir="/tmp")
        sid = sb["id"]
        assert sb["state"] == "running"
        assert [x["id"] for x in (await s.http.get("/sandboxes")).json()["sandboxes"]] == [sid]

        # output streams while the process runs: the first line arrives, and the process still runs then
        slow = await s.exec(sid, code="import time\nprint('one', flush=True)\ntime.sleep(1.5)\nprint('two')")
        async with s.http.stream("GET", f"/sandboxes/{sid}/processes/{slow}/output") as answer:
            lines = answer.aiter_lines()
            first = json.loads(await anext(lines))
            status = (await s.http.get(f"/sandboxes/{sid}/processes/{slow}")).json()
            rest = [json.loads(line) async for line in lines if line]
        assert (first["stream"], first["data"], status["running"]) == ("stdout", "one\n", True)
        assert rest == [{"stream": "stdout", "data": "two\n", "encoding": "utf-8", "partial": False}, {"exit": 0}]

        # two at once; the spec's env, secrets and workdir are there, the worker's own variables are not
        sleeper = await s.exec(sid, argv=["sleep", "60"])
        env = await s.exec(sid, argv=["sh", "-c", "echo $GREETING $TOKEN $(pwd); env | grep -c LEVERS9_ >&2"])
        assert await s.output(sid, env) == [
            {"stream": "stdout", "data": "hello s3cret /tmp\n", "encoding": "utf-8", "partial": False},
            {"stream": "stderr", "data": "0\n", "encoding": "utf-8", "partial": False},
            {"exit": 1},
        ]
        listed = (await s.http.get(f"/sandboxes/{sid}/processes")).json()["processes"]
        assert [p["running"] for p in listed if p["process"] == sleeper] == [True]
        killed = await s.http.post(f"/sandboxes/{sid}/processes/{sleeper}/kill", json={"signal": 15})
        assert killed.json() == {"running": True}
        assert (await s.output(sid, sleeper))[-1] == {"exit": -15}
        binary = await s.exec(sid, argv=["printf", "\\377\\n"])
        assert (await s.output(sid, binary))[0] == {
            "stream": "stdout",
            "data": "/wo=",
            "encoding": "base64",
            "partial": False,
        }

        # files both ways: 3 MB in (streamed, several chunks), hashed inside, and back out byte for byte
        data = os.urandom(3 * 1024 * 1024 + 17)
        assert (await s.http.post(f"/sandboxes/{sid}/files/mkdir", params={"path": "/tmp/w/in"})).status_code == 200
        put = await s.http.put(f"/sandboxes/{sid}/files", params={"path": "/tmp/w/in/blob"}, content=data)
        assert put.json() == {"size": len(data)}
        digest = await s.exec(sid, argv=["sha256sum", "/tmp/w/in/blob"])
        assert (await s.output(sid, digest))[0]["data"].split()[0] == hashlib.sha256(data).hexdigest()
        got = await s.http.get(f"/sandboxes/{sid}/files", params={"path": "/tmp/w/in/blob"})
        assert got.content == data
        made = await s.exec(sid, code="open('/tmp/w/out.txt', 'w').write('from inside')")
        assert (await s.output(sid, made))[-1] == {"exit": 0}
        assert (await s.http.get(f"/sandboxes/{sid}/files", params={"path": "/tmp/w/out.txt"})).text == "from inside"
        listing = (await s.http.get(f"/sandboxes/{sid}/files/list", params={"path": "/tmp/w"})).json()["entries"]
        assert [(e["name"], e["is_dir"]) for e in listing] == [("in", True), ("out.txt", False)]
        stat = await s.http.get(f"/sandboxes/{sid}/files/stat", params={"path": "/tmp/w/in/blob"})
        assert stat.json()["entry"]["size"] == len(data)
        empty = await s.http.put(f"/sandboxes/{sid}/files", params={"path": "/tmp/w/empty"}, content=b"")
        assert empty.json() == {"size": 0}
        removed = await s.http.delete(f"/sandboxes/{sid}/files", params={"path": "/tmp/w", "recursive": "true"})
        assert removed.status_code == 200

        # the errors, each a status and a code naming what was wrong
        missing = await s.http.get(f"/sandboxes/{sid}/files", params={"path": "/tmp/w/out.txt"})
        assert _error(missing)[:2] == (404, "ENOENT")
        for outside in ("/tmp/../../etc/passwd", "etc/passwd"):
            refused = await s.http.get(f"/sandboxes/{sid}/files/stat", params={"path": outside})
            assert _error(refused)[:2] == (400, "BadPath")
            assert outside in _error(refused)[2]
        no_dir = await s.http.put(f"/sandboxes/{sid}/files", params={"path": "/nowhere/f"}, content=b"x")
        assert _error(no_dir)[:2] == (404, "ENOENT")
        no_program = await s.http.post(f"/sandboxes/{sid}/processes", json={"argv": ["/no/such/program"]})
        assert _error(no_program)[:2] == (404, "ENOENT")
        assert _error(await s.http.post(f"/sandboxes/{sid}/processes", json={"argv": "ls"}))[:2] == (400, "BadRequest")
        assert _error(await s.http.get(f"/sandboxes/{sid}/processes/999"))[:2] == (404, "NoSuchProcess")
        assert _error(await s.http.get("/sandboxes/sb-nope"))[:2] == (404, "SandboxNotFound")

        # the secret, and the workspace
        stranger = httpx.AsyncClient(base_url=s.api.url, headers={"Authorization": "Bearer wrong"})
        async with stranger:
            assert _error(await stranger.get("/sandboxes"))[:2] == (401, "Unauthorized")
            assert _error(await stranger.get(f"/sandboxes/{sid}"))[:2] == (401, "Unauthorized")
        other = {WORKSPACE_HEADER: "ws2"}
        assert _error(await s.http.get(f"/sandboxes/{sid}", headers=other))[:2] == (404, "SandboxNotFound")
        denied = await s.http.post(f"/sandboxes/{sid}/processes", json={"argv": ["true"]}, headers=other)
        assert _error(denied)[:2] == (404, "SandboxNotFound")
        assert (await s.http.get("/sandboxes", headers=other)).json() == {"sandboxes": []}

        # terminate: its container is gone, and it says so from then on
        ended = (await s.http.delete(f"/sandboxes/{sid}")).json()
        assert (ended["state"], ended["reason"]) == ("ended", "terminated")
        assert (await s.world.pool.launcher.state(sb["container_id"])).status == "unknown"
        late = await s.http.post(f"/sandboxes/{sid}/processes", json={"argv": ["true"]})
        assert _error(late) == (409, "SandboxEnded", f"the sandbox {sid} has ended: terminated")


async def test_timeout_idle_timeout_the_cap_and_the_worker_stopping(runtime: str, tmp_path: Path) -> None:
    async with served(runtime, tmp_path, max_sandboxes=3) as s:
        kept = (await s.create(timeout_s=1))["id"]
        assert (await s.http.post(f"/sandboxes/{kept}/ttl", json={"seconds": 600})).status_code == 200
        other = (await s.create())["id"]
        working = (await s.create(idle_timeout_s=1))["id"]
        full = await s.http.post("/sandboxes", json={"workspace_id": "ws1", "python_version": PYTHON})
        assert _error(full)[:2] == (503, "SandboxesFull")
        assert "3 sandboxes" in _error(full)[2]
        sleeper = await s.exec(working, argv=["sleep", "600"])  # a running process is use: never idle meanwhile
        assert (await s.http.delete(f"/sandboxes/{other}")).json()["state"] == "ended"  # a place again

        timed = (await s.create(timeout_s=1))["id"]
        ended = await s.ended(timed)
        assert (ended["state"], ended["reason"]) == ("ended", "it timed out (1 s after it was created)")
        idle = (await s.create(idle_timeout_s=1))["id"]
        ended = await s.ended(idle)
        assert (ended["state"], ended["reason"]) == ("ended", "it was idle for 1 s (idle_timeout)")

        # no request reached working for over a second (idle ran its whole idle_timeout since), but its sleep runs
        assert (await s.info(working))["state"] == "running"
        killed = await s.http.post(f"/sandboxes/{working}/processes/{sleeper}/kill", json={})
        assert killed.json() == {"running": True}
        assert (await s.ended(working))["reason"] == "it was idle for 1 s (idle_timeout)"  # once nothing runs
        assert (await s.info(kept))["state"] == "running"  # its first timeout passed long ago: update_ttl held

        # the worker stopping ends what still runs, and takes no new one
        await s.sandboxes.close()
        assert ((await s.info(kept))["state"], (await s.info(kept))["reason"]) == ("ended", "the worker stopped")
        late = await s.http.post("/sandboxes", json={"workspace_id": "ws1", "python_version": PYTHON})
        assert _error(late)[:2] == (503, "SandboxesFull")


async def test_a_sandbox_whose_container_is_killed_says_so(runtime: str, tmp_path: Path) -> None:
    async with served(runtime, tmp_path) as s:
        sb = await s.create()
        sid = sb["id"]
        sleeper = await s.exec(sid, code="print('up', flush=True); import time; time.sleep(60)")
        async with s.http.stream("GET", f"/sandboxes/{sid}/processes/{sleeper}/output") as answer:
            lines = answer.aiter_lines()
            assert json.loads(await anext(lines))["data"] == "up\n"
            box = s.sandboxes.get(sid).box
            await s.world.pool.launcher.kill(box)  # under the sandbox, as the OOM killer or a crash would
            last = [json.loads(line) async for line in lines if line]
        assert last[-1]["error"]["code"] == "SandboxGone"
        assert "its container exited or its connection broke" in last[-1]["error"]["message"]
        gone = await s.ended(sid)
        assert gone["state"] == "gone"
        status, code, message = _error(await s.http.post(f"/sandboxes/{sid}/processes", json={"argv": ["true"]}))
        assert (status, code) == (409, "SandboxGone")
        assert sid in message
        assert "its container exited" in message
        ending = s.sandboxes.get(sid).ending
        assert ending is not None
        await ending  # its container is removed right after it is marked
        assert (await s.world.pool.launcher.state(sb["container_id"])).status == "unknown"


async def test_what_a_sandbox_cannot_be_given_is_refused_by_name(tmp_path: Path) -> None:
    async with served("process", tmp_path) as s:
        on_host = await s.http.post("/sandboxes", json={"workspace_id": "ws1"})
        assert _error(on_host)[:2] == (400, "BadRequest")
        assert "host's filesystem" in _error(on_host)[2]
        for body, named in (
            ({"workspace_id": "ws1", "block_network": "yes"}, "block_network"),
            ({"workspace_id": "ws1", "allow_list": ["pypi.org"]}, "allow_list"),
            ({"workspace_id": "ws1", "memory_mib": "lots"}, "memory_mib"),
            ({"workspace_id": "ws1", "env": {"LEVERS9_TOKEN": "x"}}, "LEVERS9_TOKEN"),
            ({"workspace_id": "ws1", "colour": "red"}, "colour"),
            ({}, "workspace_id"),
        ):
            refused = await s.http.post("/sandboxes", json=body)
            assert _error(refused)[:2] == (400, "BadRequest"), body
            assert named in _error(refused)[2]
        with pytest.raises(SandboxRefused, match="timeout_s is -1"):
            SandboxSpec(workspace_id="ws1", timeout_s=-1).check()
        assert _error(await s.http.get("/sandboxes", headers={"Authorization": ""}))[:2] == (401, "Unauthorized")


@pytest.fixture(params=ISOLATED)
def runtime(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


async def test_the_worker_serves_sandboxes_only_when_switched_on(tmp_path: Path) -> None:
    assert "sandboxes" not in options_from_env({})
    assert options_from_env({"LEVERS9_SANDBOXES": "4"})["sandboxes"] == 4
    assert WorkerOptions(controlplane="grpc://127.0.0.1:1", token="t").sandboxes == 0  # off unless asked for
    async with _world("runc", tmp_path) as world:
        options = WorkerOptions(controlplane="grpc://127.0.0.1:1", token="t", state_dir=tmp_path / "w", sandboxes=2)
        worker = WorkerProcess(options, world.pool.hooks)
        await worker._open_sandboxes(world.pool, options.sandboxes)
        api = worker.sandbox_api
        assert api is not None
        async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {api.secret}"}) as http:
            created = await http.post("/sandboxes", json={"workspace_id": "ws1", "python_version": PYTHON})
            assert created.status_code == 201, created.text
            world.seen.add(created.json()["container_id"])
            sandboxes = worker.sandboxes
            assert sandboxes is not None
            await worker._close_sandboxes()  # the worker stopping (or its runtime changing)
            assert sandboxes.get(created.json()["id"]).reason == "the worker stopped"
            with pytest.raises(httpx.ConnectError):
                await http.get("/sandboxes")
        assert (worker.sandboxes, worker.sandbox_api) == (None, None)
