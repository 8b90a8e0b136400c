"""One request that starts a process and streams its output to its exit: ``POST .../processes?wait=true``
on the worker's sandbox API, in a real runc container (gVisor runs the same route; its runner is what differs).

The answer is NDJSON: the process's number, pid and argv first, then its output exactly as the output route
gives it, then its exit line. The output is that answer's from the start (another reader is refused as busy),
and bad input is refused as JSON before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from levers9.worker.sandbox_api import WORKSPACE_HEADER
from tests.worker.test_sandboxes import _error, served

SLOW = "import sys, time\nprint('one', flush=True)\ntime.sleep(1)\nprint('two', file=sys.stderr)\nsys.exit(3)"


async def test_an_exec_that_waits_streams_its_output_to_its_exit(tmp_path: Path) -> None:
    async with served("runc", tmp_path) as s:
        sid = (await s.create())["id"]
        path = f"/sandboxes/{sid}/processes"
        async with s.http.stream("POST", path, params={"wait": "true"}, json={"code": SLOW}) as answer:
            assert answer.status_code == 201
            assert answer.headers["content-type"].startswith("application/x-ndjson")
            lines = answer.aiter_lines()
            started = json.loads(await anext(lines))
            assert set(started) == {"process", "pid", "argv"}
            assert started["pid"] > 0
            number = started["process"]
            first = json.loads(await anext(lines))
            assert (first["stream"], first["data"]) == ("stdout", "one\n")
            # still running, its output already coming: this answer holds it, another reader is refused
            assert (await s.http.get(f"{path}/{number}")).json()["running"] is True
            assert _error(await s.http.get(f"{path}/{number}/output"))[:2] == (409, "OutputBusy")
            rest: list[dict[str, Any]] = [json.loads(line) async for line in lines if line]
        assert rest == [
            {"stream": "stderr", "data": "two\n", "encoding": "utf-8", "partial": False},
            {"exit": 3},
        ]
        status = (await s.http.get(f"{path}/{number}")).json()
        assert (status["running"], status["exit_code"]) == (False, 3)

        # the same lines as exec then the output route give, argv as well as code
        answer = await s.http.post(path, params={"wait": "1"}, json={"argv": ["sh", "-c", "echo hi; echo err >&2"]})
        assert answer.status_code == 201
        got = [json.loads(line) for line in answer.text.splitlines()]
        plain = await s.exec(sid, argv=["sh", "-c", "echo hi; echo err >&2"])
        assert got[0]["process"] == plain - 1
        assert got[0]["argv"] == ["sh", "-c", "echo hi; echo err >&2"]
        plain_lines = await s.output(sid, plain)
        assert sorted(got[1:-1], key=str) == sorted(plain_lines[:-1], key=str)
        assert plain_lines[-1] == {"exit": 0}
        assert got[-1] == {"exit": 0}

        # wait=false is the plain answer
        answer = await s.http.post(path, params={"wait": "false"}, json={"argv": ["true"]})
        assert answer.status_code == 201
        assert set(answer.json()) == {"process", "pid", "argv"}

        # refused before anything starts, as JSON: a bad flag, bad argv, another workspace's sandbox
        before = len((await s.http.get(path)).json()["processes"])
        bad = await s.http.post(path, params={"wait": "soon"}, json={"argv": ["true"]})
        assert _error(bad)[:2] == (400, "BadRequest")
        assert "wait" in bad.json()["error"]["message"]
        bad = await s.http.post(path, params={"wait": "true"}, json={"argv": []})
        assert _error(bad)[:2] == (400, "BadRequest")
        assert "argv" in bad.json()["error"]["message"]
        other = await s.http.post(
            path, params={"wait": "true"}, json={"argv": ["true"]}, headers={WORKSPACE_HEADER: "ws2"}
        )
        assert _error(other)[:2] == (404, "SandboxNotFound")
        assert len((await s.http.get(path)).json()["processes"]) == before
