"""``sb.process.exec`` over the exec that waits (``POST .../processes?wait=true``): one request whose answer is
the process, then its output to its exit.

Against the local HTTP server that answers as the controlplane's REST routes do (tests/fixtures/sandbox_rest.py):
the handle comes back with the first line while the process runs on, its lines come as written, ``wait``,
``status`` and ``kill`` work, no output route is asked, and a stream that breaks off or carries the sandbox's
end says so. A server that answers the plain start (JSON: a controlplane without ``wait``) is read as before,
through the output route (tests/sdk/test_sandbox_wire.py drives that path throughout).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

import levers9
from levers9.sdk import sandbox_errors as errors
from tests.fixtures.sandbox_rest import FakeSandboxAPI, info, serve_sandbox_api

ID = "sb-1"
PROCESSES = f"/sandboxes/{ID}/processes"
STARTED = {"process": 1, "pid": 7, "argv": ["sh", "-c", "..."]}


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSandboxAPI]:
    with serve_sandbox_api(tmp_path, monkeypatch) as served:
        served.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
        yield served


def _line(record: object) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _out(data: str, stream: str = "stdout") -> bytes:
    return _line({"stream": stream, "data": data, "encoding": "utf-8", "partial": False})


def _waiting(api: FakeSandboxAPI, rest: Callable[[], AsyncIterator[bytes]], process: int = 1) -> None:
    """The exec answers NDJSON when asked to wait: the process (``process``) first, then ``rest``."""

    async def answer(request: Request) -> Response:
        assert request.query_params.get("wait") == "true"

        async def lines() -> AsyncIterator[bytes]:
            yield _line({**STARTED, "process": process})
            async for piece in rest():
                yield piece

        return StreamingResponse(lines(), status_code=201, media_type="application/x-ndjson")

    api.on("POST", PROCESSES, answer)


def test_exec_returns_with_the_first_line_and_its_output_streams_from_the_same_answer(api: FakeSandboxAPI) -> None:
    go_on = threading.Event()

    async def rest() -> AsyncIterator[bytes]:
        yield _out("one\n")
        # the process goes on only once the test holds its handle and read its first line
        if not await asyncio.to_thread(go_on.wait, 30):
            yield _line({"error": {"type": "TestGaveUp", "message": "the test never came for the first line"}})
            return
        yield _out("err\n", "stderr")
        yield _out("two\n")
        yield _line({"exit": 4})

    _waiting(api, rest)
    api.on("GET", f"{PROCESSES}/1", (200, {"process": 1, "pid": 7, "running": True, "exit_code": None}))
    api.on("POST", f"{PROCESSES}/1/kill", (200, {"running": True}))
    sandbox = levers9.Sandbox().connect(ID)
    process = sandbox.process.exec("sh", "-c", "...", cwd="/tmp")
    assert (process.pid, process.args) == (7, ["sh", "-c", "..."])
    lines = iter(process.stdout)
    assert next(lines) == "one\n"
    assert process.status() == (-1, "running")
    assert process.kill(15) is True
    go_on.set()
    assert list(lines) == ["two\n"]
    assert process.wait() == 4
    assert process.stderr.read() == "err\n"
    [sent] = api.seen("POST", PROCESSES)
    assert (sent.query, sent.json()) == ({"wait": "true"}, {"argv": ["sh", "-c", "..."], "cwd": "/tmp"})
    assert api.seen("GET", f"{PROCESSES}/1/output") == []
    assert api.seen("POST", f"{PROCESSES}/1/kill")[0].json() == {"signal": 15}


def test_run_code_and_aio_take_the_same_answer(api: FakeSandboxAPI) -> None:
    async def rest() -> AsyncIterator[bytes]:
        yield _out("42\n")
        yield _line({"exit": 0})

    _waiting(api, rest)
    sandbox = levers9.Sandbox().connect(ID)
    ran = sandbox.process.run_code("print(42)")
    assert isinstance(ran, levers9.SandboxProcessResponse)
    assert (ran.exit_code, ran.stdout, ran.stderr) == (0, "42\n", "")
    _waiting(api, rest, process=2)

    async def aio() -> tuple[int, str]:
        process = await sandbox.process.aio.exec("echo", "42")
        return await process.wait(), await process.stdout.read_aio()

    assert asyncio.run(aio()) == (0, "42\n")
    assert [seen.query for seen in api.seen("POST", PROCESSES)] == [{"wait": "true"}] * 2
    assert [seen for seen in api.requests if seen.path.endswith("/output")] == []


def test_an_answer_that_breaks_off_or_carries_the_end_says_why(api: FakeSandboxAPI) -> None:
    async def cut() -> AsyncIterator[bytes]:
        yield _out("half\n")

    _waiting(api, cut)
    sandbox = levers9.Sandbox().connect(ID)
    # the stream ends without the exit: the sandbox's state says why
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID, state="gone", reason="its worker died")))
    process = sandbox.process.exec("true")
    with pytest.raises(errors.SandboxGone, match="its worker died"):
        process.wait(30)
    assert next(iter(process.stdout)) == "half\n"

    async def ended() -> AsyncIterator[bytes]:
        yield _line({"error": {"type": "sandbox_ended", "message": "sandbox sb-1 timed out"}})

    _waiting(api, ended, process=2)
    with pytest.raises(errors.SandboxEnded, match="timed out"):
        sandbox.process.exec("true").wait(30)


def test_a_refused_exec_raises_at_once_as_before(api: FakeSandboxAPI) -> None:
    sandbox = levers9.Sandbox().connect(ID)
    api.on("POST", PROCESSES, (409, {"error": {"type": "sandbox_ended", "message": "it timed out"}}))
    with pytest.raises(errors.SandboxEnded, match=r"exec 'true' in sandbox sb-1: it timed out \(sandbox_ended\)"):
        sandbox.process.exec("true")

    async def empty(_: Request) -> Response:
        return Response(b"", status_code=201, media_type="application/x-ndjson")

    api.on("POST", PROCESSES, empty)
    with pytest.raises(errors.SandboxError, match="answer \\(201\\) is empty"):
        sandbox.process.exec("true")
