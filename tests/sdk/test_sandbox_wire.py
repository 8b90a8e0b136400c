"""The sandbox SDK on the wire: requests sent, errors mapped, NDJSON output assembled into lines as it comes.

Against a local HTTP server answering as the controlplane's REST routes do (tests/fixtures/sandbox_rest.py),
for what the end-to-end tests cannot provoke on purpose: a line cut into partial pieces, a multi-byte
character split across base64 pieces, a stream that breaks off, a reader already holding the output,
and every error type.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import levers9
from levers9.sdk import sandbox_errors as errors
from levers9.sdk.sandbox_process import SandboxProcess, SandboxProcessResponse
from tests.fixtures.sandbox_rest import FakeSandboxAPI, error, info, serve_sandbox_api

ID = "sb-1"


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSandboxAPI]:
    with serve_sandbox_api(tmp_path, monkeypatch) as served:
        yield served


def _connect(api: FakeSandboxAPI) -> levers9.SandboxInstance:
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
    return levers9.Sandbox().connect(ID)


def _piece(stream: str, data: bytes | str, partial: bool = False, *, b64: bool = False) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    if b64:
        record = {"stream": stream, "data": base64.b64encode(raw).decode(), "encoding": "base64", "partial": partial}
    else:
        record = {"stream": stream, "data": raw.decode(), "encoding": "utf-8", "partial": partial}
    return json.dumps(record).encode() + b"\n"


def _gave_up() -> bytes:
    """The line a stream ends with when the test never came for its output: the test then fails."""
    return json.dumps({"error": {"type": "TestGaveUp", "message": "the first line was not read within 30 s"}}).encode()


def _exec_answers(api: FakeSandboxAPI, output: Any, *, process: int = 1, pid: int = 7) -> None:
    api.on("POST", f"/sandboxes/{ID}/processes", (201, {"process": process, "pid": pid, "argv": ["x"]}))

    async def stream(_: Request) -> Response:
        return StreamingResponse(output(), media_type="application/x-ndjson")

    api.on("GET", f"/sandboxes/{ID}/processes/{process}/output", stream)


def test_create_sends_the_settings_with_the_token_and_returns_the_instance(api: FakeSandboxAPI) -> None:
    api.on("POST", "/sandboxes", (201, info("sb-9", name="agent")))
    sandbox = levers9.Sandbox(cpu=0.5, memory="256Mi", name="agent", keep_warm_seconds=120).create()
    assert sandbox.sandbox_id() == "sb-9" == sandbox.id
    assert sandbox.info["name"] == "agent"
    [sent] = api.seen("POST", "/sandboxes")
    assert sent.headers["authorization"] == "Bearer t0k"
    body = sent.json()
    assert (body["cpu_millicores"], body["memory_mib"], body["timeout_s"], body["name"]) == (500, 256, 120.0, "agent")
    assert body["image"] == "host"

    api.on("POST", "/sandboxes", (201, info("sb-10")))
    levers9.Sandbox().create_from_memory_snapshot("snap-3")
    assert api.seen("POST", "/sandboxes")[-1].json()["snapshot"] == "snap-3"


def test_connect_to_an_ended_or_unknown_sandbox_names_it(api: FakeSandboxAPI) -> None:
    api.on("GET", "/sandboxes/sb-old", (200, info("sb-old", state="ended", reason="timed out after 300 s")))
    with pytest.raises(errors.SandboxEnded, match="sandbox sb-old has ended: timed out after 300 s"):
        levers9.Sandbox().connect("sb-old")
    api.on("GET", "/sandboxes/sb-dead", (200, info("sb-dead", state="gone", reason="its worker died")))
    with pytest.raises(errors.SandboxGone, match="sb-dead is gone: its worker died"):
        levers9.Sandbox().connect("sb-dead")
    api.on("GET", "/sandboxes/sb-x", error(404, "SandboxNotFound", "no sandbox sb-x"))
    with pytest.raises(errors.SandboxNotFound, match=r"connect to sandbox sb-x: no sandbox sb-x \(SandboxNotFound\)"):
        levers9.Sandbox().connect("sb-x")


@pytest.mark.parametrize(
    ("status", "kind", "raised"),
    [
        (409, "SandboxEnded", errors.SandboxEnded),
        (409, "SandboxGone", errors.SandboxGone),
        (503, "SandboxesFull", errors.SandboxUnavailable),
        (503, "NoSandboxWorker", errors.SandboxUnavailable),
        (502, "StartFailed", errors.SandboxUnavailable),
        (502, "WorkerUnreachable", errors.SandboxConnectionError),
        (429, "TooManyProcesses", errors.SandboxProcessError),
        (400, "BadRequest", errors.SandboxRequestError),
        (422, "validation_error", errors.SandboxRequestError),
        # the controlplane's spelling of the worker's types
        (409, "sandbox_gone", errors.SandboxGone),
        (409, "sandbox_ended", errors.SandboxEnded),
        (503, "no_sandbox_worker", errors.SandboxUnavailable),
        (502, "worker_unreachable", errors.SandboxConnectionError),
        (400, "invalid_request", errors.SandboxRequestError),
        (400, "not_supported", errors.SandboxNotSupported),
        (429, "too_many_processes", errors.SandboxProcessError),
    ],
)
def test_each_error_type_is_its_own_exception(
    api: FakeSandboxAPI, status: int, kind: str, raised: type[Exception]
) -> None:
    sandbox = _connect(api)
    api.on("POST", f"/sandboxes/{ID}/processes", error(status, kind, "the controlplane's words"))
    with pytest.raises(raised) as caught:
        sandbox.process.exec("true")
    assert isinstance(caught.value, errors.SandboxError)
    assert (caught.value.type, caught.value.status, caught.value.sandbox_id) == (kind, status, ID)
    assert str(caught.value) == f"exec 'true' in sandbox {ID}: the controlplane's words ({kind})"


def test_file_errors_are_the_builtin_os_errors(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)
    api.on("GET", f"/sandboxes/{ID}/files/stat", error(404, "ENOENT", "no such file: /nope"))
    with pytest.raises(FileNotFoundError, match="stat /nope in sandbox sb-1: no such file"):
        sandbox.fs.stat_file("/nope")
    api.on("POST", f"/sandboxes/{ID}/files/mkdir", error(409, "EEXIST", "/tmp exists"))
    with pytest.raises(FileExistsError):
        sandbox.fs.create_directory("/tmp")
    api.on("DELETE", f"/sandboxes/{ID}/files", error(403, "EACCES", "read-only"))
    with pytest.raises(PermissionError):
        sandbox.fs.delete_file("/etc/passwd")
    api.on("GET", f"/sandboxes/{ID}/files/list", error(400, "BadPath", "'..' leaves the sandbox's root"))
    with pytest.raises(errors.SandboxFileSystemError, match=r"\(BadPath\)"):
        sandbox.fs.list_files("/../etc")
    api.on("GET", f"/sandboxes/{ID}/files/list", error(400, "ENOTDIR", "/etc/passwd is not a directory"))
    with pytest.raises(errors.SandboxFileSystemError, match="ENOTDIR"):
        sandbox.fs.list_files("/etc/passwd")
    with pytest.raises(ValueError, match="absolute path"):
        sandbox.fs.read_text("relative.txt")
    # the controlplane's spelling
    api.on("GET", f"/sandboxes/{ID}/files/stat", error(404, "file_not_found", "no such file: /nope"))
    with pytest.raises(FileNotFoundError):
        sandbox.fs.stat_file("/nope")
    api.on("DELETE", f"/sandboxes/{ID}/files", error(403, "permission_denied", "read-only"))
    with pytest.raises(PermissionError):
        sandbox.fs.delete_file("/etc/passwd")
    api.on("DELETE", f"/sandboxes/{ID}/files", error(400, "eloop", "too many links"))
    with pytest.raises(errors.SandboxFileSystemError, match=r"\(eloop\)"):
        sandbox.fs.delete_file("/loop")


def test_answers_without_an_error_body_and_missing_routes(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)

    async def html(_: Request) -> Response:
        return Response(b"<html>bad gateway</html>", status_code=502)

    api.on("POST", f"/sandboxes/{ID}/ttl", html)
    with pytest.raises(errors.SandboxError, match="answered 502 without an error body: <html>bad gateway") as caught:
        sandbox.update_ttl(60)
    assert caught.value.status == 502
    # expose_port, snapshots and images may be missing on a controlplane: the route's 404 says so
    with pytest.raises(errors.SandboxNotSupported, match="does not expose sandbox ports yet"):
        sandbox.expose_port(8000)
    with pytest.raises(errors.SandboxNotSupported, match="does not snapshot sandboxes yet"):
        sandbox.snapshot_memory()
    # ...but a sandbox that is not found is still that
    api.on("POST", f"/sandboxes/{ID}/ports/8000", error(404, "SandboxNotFound", "no sandbox sb-1"))
    with pytest.raises(errors.SandboxNotFound):
        sandbox.expose_port(8000)
    api.on("POST", f"/sandboxes/{ID}/ports/8000", (200, {"port": 8000, "url": "http://gw/sb-1/8000"}))
    assert sandbox.expose_port(8000) == "http://gw/sb-1/8000"


def test_snapshots_taken_listed_restored_and_deleted(api: FakeSandboxAPI) -> None:
    from levers9.sdk.sandbox import delete_snapshot, list_snapshots

    api.on("POST", "/sandboxes", (201, info(ID)))
    sandbox = levers9.Sandbox(snapshots=True).create()
    assert api.seen("POST", "/sandboxes")[-1].json()["snapshots"] is True
    assert "snapshots" not in levers9.Sandbox()._body("host", "3.11", None)
    taken = {"id": "sbs_1", "sandbox_id": ID, "pool": "local", "size_bytes": 10, "created_at": 1.0}
    api.on("POST", f"/sandboxes/{ID}/snapshots", (201, {"snapshot": taken}))
    assert sandbox.snapshot_memory() == "sbs_1"
    api.on("GET", "/sandbox-snapshots", (200, {"snapshots": [taken]}))
    assert list_snapshots() == [taken]
    api.on("POST", "/sandboxes", (201, info("sb-2")))
    assert levers9.Sandbox().create_from_memory_snapshot("sbs_1").id == "sb-2"
    assert api.seen("POST", "/sandboxes")[-1].json()["snapshot"] == "sbs_1"
    api.on("DELETE", "/sandbox-snapshots/sbs_1", (200, {}))
    delete_snapshot("sbs_1")
    assert len(api.seen("DELETE", "/sandbox-snapshots/sbs_1")) == 1
    with pytest.raises(ValueError, match="not a snapshot id"):
        delete_snapshot("../x")


def test_ttl_terminate_and_status(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)
    api.on("POST", f"/sandboxes/{ID}/ttl", (200, info(ID)))
    sandbox.update_ttl(-1)
    sandbox.update_ttl(90)
    assert [r.json() for r in api.seen("POST", f"/sandboxes/{ID}/ttl")] == [{"seconds": 0}, {"seconds": 90.0}]
    with pytest.raises(ValueError, match="update_ttl"):
        sandbox.update_ttl(0)
    assert sandbox.status() == (-1, "running")
    api.on("DELETE", f"/sandboxes/{ID}", (200, info(ID, state="ended", reason="terminated")))
    assert sandbox.terminate() is True
    api.on("DELETE", f"/sandboxes/{ID}", error(409, "SandboxEnded", "sandbox sb-1 was terminated"))
    assert sandbox.terminate() is False
    # one that had ended is not asked to end again (the controlplane would answer with its info, as for one now)
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID, state="ended", reason="terminated")))
    assert sandbox.terminate() is False
    assert len(api.seen("DELETE", f"/sandboxes/{ID}")) == 2
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID, state="gone", reason="its container died")))
    assert sandbox.status() == (1, "gone")


def test_unreachable_controlplane_names_the_url_and_context(
    api: FakeSandboxAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from levers9.sdk.context import Context, save_context
    from tests.fixtures.ports import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    save_context(Context(name="nowhere", grpc="127.0.0.1:1", http=closed, token="t0k"))
    with pytest.raises(errors.SandboxConnectionError, match=f"cannot reach the controlplane at {closed}"):
        levers9.Sandbox(context="nowhere").connect(ID)


def test_output_lines_come_as_written_before_the_process_ends(api: FakeSandboxAPI) -> None:
    """A line is readable while the process still runs; partial pieces join; base64 and a split character too."""
    sandbox = _connect(api)
    first_read = threading.Event()

    async def output() -> AsyncIterator[bytes]:
        yield _piece("stdout", "ready\n")
        # the process goes on only once the test has read the first line: it cannot have ended before
        if not await asyncio.to_thread(first_read.wait, 30):
            yield _gave_up()
            return
        yield _piece("stderr", "warn", partial=True)
        yield _piece("stdout", "two\nthr", partial=True)
        yield _piece("stderr", "ing\n")
        snowman = "☃".encode()
        yield _piece("stdout", b"ee " + snowman[:1], partial=True, b64=True)
        yield _piece("stdout", snowman[1:] + b"\n\xff\n", b64=True)
        yield _piece("stdout", "no newline", partial=True)
        yield b'{"exit": 3}\n'

    _exec_answers(api, output)
    process = sandbox.process.exec("python", "-c", "...", cwd="/tmp", env={"A": "1"})
    assert isinstance(process, SandboxProcess)
    assert process.pid == 7
    lines = iter(process.stdout)
    assert next(lines) == "ready\n"
    first_read.set()
    assert list(lines) == ["two\n", "three ☃\n", "\ufffd\n", "no newline"]
    assert process.stderr.read() == "warning\n"
    assert process.wait() == 3
    assert list(process.logs) == ["ready\n", "two\n", "warning\n", "three ☃\n", "\ufffd\n", "no newline"]
    # a stream is read once, like a file; stdout, stderr and logs each keep their own place
    assert process.stdout.read() == ""
    assert levers9.SandboxProcessStream is type(process.stdout)
    [sent] = api.seen("POST", f"/sandboxes/{ID}/processes")
    assert sent.json() == {"argv": ["python", "-c", "..."], "cwd": "/tmp", "env": {"A": "1"}}


def test_several_processes_stream_at_once(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)
    gates = [threading.Event(), threading.Event()]

    def output(index: int) -> Any:
        async def lines() -> AsyncIterator[bytes]:
            yield _piece("stdout", f"p{index} started\n")
            if not await asyncio.to_thread(gates[index].wait, 30):
                yield _gave_up()
                return
            yield _piece("stdout", f"p{index} done\n")
            yield b'{"exit": 0}\n'

        return lines

    _exec_answers(api, output(0), process=1, pid=10)
    one = sandbox.process.exec("a")
    _exec_answers(api, output(1), process=2, pid=11)
    two = sandbox.process.exec("b")
    # both are running, each has sent its first line: neither waits on the other's stream
    assert next(iter(two.stdout)) == "p1 started\n"
    assert next(iter(one.stdout)) == "p0 started\n"
    gates[1].set()
    assert two.wait() == 0
    gates[0].set()
    assert one.wait(timeout=30) == 0
    assert one.stdout.read() == "p0 done\n"  # a stream is read once, like a file: the rest of it


def test_run_code_blocks_and_returns_output_and_exit_code(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)

    async def output() -> AsyncIterator[bytes]:
        yield _piece("stdout", "42\n")
        yield _piece("stderr", "oops\n")
        yield b'{"exit": 1}\n'

    _exec_answers(api, output)
    response = sandbox.process.run_code("print(42)")
    assert isinstance(response, SandboxProcessResponse)
    assert (response.exit_code, response.stdout, response.stderr, response.result) == (
        1,
        "42\n",
        "oops\n",
        "42\noops\n",
    )
    assert api.seen("POST", f"/sandboxes/{ID}/processes")[-1].json() == {"code": "print(42)"}


def test_a_sandbox_that_dies_under_a_process_raises_after_its_lines(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)

    async def output() -> AsyncIterator[bytes]:
        yield _piece("stdout", "working\n")
        yield json.dumps({"error": {"type": "SandboxGone", "message": "sandbox sb-1: its container died"}}).encode()

    _exec_answers(api, output)
    process = sandbox.process.exec("x")
    lines = iter(process.stdout)
    assert next(lines) == "working\n"
    with pytest.raises(errors.SandboxGone, match="its container died"):
        next(lines)
    with pytest.raises(errors.SandboxGone):
        process.wait()


def test_a_stream_that_breaks_off_is_explained_by_the_sandbox_state(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)

    async def output() -> AsyncIterator[bytes]:
        yield _piece("stdout", "working\n")
        api.on("GET", f"/sandboxes/{ID}", (200, info(ID, state="gone", reason="its worker stopped answering")))

    _exec_answers(api, output)
    process = sandbox.process.exec("x")
    with pytest.raises(errors.SandboxGone, match="its worker stopped answering"):
        process.wait()
    lines = iter(process.stdout)
    assert next(lines) == "working\n"  # the lines that came are still there, then the error
    with pytest.raises(errors.SandboxGone):
        next(lines)


def test_output_read_elsewhere_still_gives_the_exit_code(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)
    api.on(
        "GET",
        f"/sandboxes/{ID}/processes",
        (200, {"processes": [{"process": 4, "pid": 44, "argv": ["sleep", "1"], "running": True, "exit_code": None}]}),
    )
    api.on("GET", f"/sandboxes/{ID}/processes/4/output", error(409, "output_busy", "being read already"))
    states = iter([{"running": True, "exit_code": None}, {"running": False, "exit_code": 5}])

    async def status(_: Request) -> Response:
        return JSONResponse({"process": 4, "pid": 44, **next(states)})

    api.on("GET", f"/sandboxes/{ID}/processes/4", status)
    process = sandbox.process.get_process(44)
    assert sandbox.process.list_processes()[44] is process  # one object per process: one reader
    assert process.wait(timeout=30) == 5
    with pytest.raises(errors.SandboxProcessError, match="being read already"):
        process.stdout.read()
    with pytest.raises(errors.SandboxProcessError, match=r"no process with pid 3 in sandbox sb-1 \(.*: 44\)"):
        sandbox.process.get_process(3)


def test_wait_with_a_timeout_and_kill(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)
    killed = threading.Event()

    async def output() -> AsyncIterator[bytes]:
        await asyncio.to_thread(killed.wait, 30)
        yield b'{"exit": -9}\n'

    async def kill(request: Request) -> Response:
        assert (await request.json()) == {"signal": 9}
        killed.set()
        return JSONResponse({"running": False})

    _exec_answers(api, output)
    api.on("POST", f"/sandboxes/{ID}/processes/1/kill", kill)
    api.on("GET", f"/sandboxes/{ID}/processes/1", (200, {"process": 1, "pid": 7, "running": True}))
    process = sandbox.process.exec("sleep", "100")
    with pytest.raises(errors.ProcessTimeout, match=r"process 7 in sandbox sb-1 is still running after 0\.2 s"):
        process.wait(timeout=0.2)
    assert process.status() == (-1, "running")
    assert process.kill() is False
    assert process.wait() == -9


def test_files_both_ways_streamed(api: FakeSandboxAPI, tmp_path: Path) -> None:
    sandbox = _connect(api)
    stored: dict[str, bytes] = {}
    pieces: list[int] = []

    async def put(request: Request) -> Response:
        data = b""
        async for part in request.stream():
            pieces.append(len(part))
            data += part
        stored[request.query_params["path"]] = data
        return JSONResponse({"size": len(data)})

    async def get(request: Request) -> Response:
        data = stored[request.query_params["path"]]

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 65536):
                yield data[start : start + 65536]

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    api.on("PUT", f"/sandboxes/{ID}/files", put)
    api.on("GET", f"/sandboxes/{ID}/files", get)
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    assert sandbox.fs.upload_file(local, "/data/big.bin") == local.stat().st_size
    assert stored["/data/big.bin"] == local.read_bytes()
    [sent] = [r for r in api.seen("PUT", f"/sandboxes/{ID}/files")]
    assert sent.headers.get("transfer-encoding") == "chunked"  # streamed, not sent with a length known up front
    back = tmp_path / "back"
    back.mkdir()
    assert sandbox.fs.download_file("/data/big.bin", back) == local.stat().st_size
    assert hashlib.sha256((back / "big.bin").read_bytes()).digest() == hashlib.sha256(local.read_bytes()).digest()
    assert [p.name for p in back.iterdir()] == ["big.bin"]  # no temporary left behind
    sandbox.fs.write_text("/a.txt", "héllo")
    assert sandbox.fs.read_text("/a.txt") == "héllo"
    assert sandbox.fs.read_bytes("/a.txt") == "héllo".encode()


def test_a_failed_download_leaves_the_target_as_it_was(api: FakeSandboxAPI, tmp_path: Path) -> None:
    sandbox = _connect(api)
    api.on("GET", f"/sandboxes/{ID}/files", error(404, "ENOENT", "no such file: /nope"))
    (tmp_path / "here").mkdir()
    target = tmp_path / "here" / "kept.txt"
    target.write_text("old")
    with pytest.raises(FileNotFoundError):
        sandbox.fs.download_file("/nope", target)
    assert target.read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["kept.txt"]


def test_stat_and_list_map_the_published_field_names(api: FakeSandboxAPI) -> None:
    sandbox = _connect(api)
    entry = {"name": "a.txt", "path": "/tmp/a.txt", "size": 5, "mode": 0o100644, "is_dir": False, "mtime": 1.7e9}
    api.on("GET", f"/sandboxes/{ID}/files/stat", (200, {"entry": entry}))
    api.on("GET", f"/sandboxes/{ID}/files/list", (200, {"entries": [entry, {**entry, "is_dir": True}]}))
    found = sandbox.fs.stat_file("/tmp/a.txt")
    assert isinstance(found, levers9.SandboxFileInfo)
    assert (found.name, found.size, found.is_dir, found.mod_time, found.permissions) == (
        "a.txt",
        5,
        False,
        1700000000,
        0o644,
    )
    assert [e.is_dir for e in sandbox.fs.list_files("/tmp")] == [False, True]
    assert api.seen("GET", f"/sandboxes/{ID}/files/list")[-1].query == {"path": "/tmp"}
    api.on("POST", f"/sandboxes/{ID}/files/mkdir", (200, {}))
    sandbox.fs.create_directory("/x/y", parents=False)
    assert api.seen("POST", f"/sandboxes/{ID}/files/mkdir")[-1].query == {"path": "/x/y", "parents": "false"}
    api.on("DELETE", f"/sandboxes/{ID}/files", (200, {}))
    sandbox.fs.delete_directory("/x")
    assert api.seen("DELETE", f"/sandboxes/{ID}/files")[-1].query == {"path": "/x", "recursive": "true"}


def test_aio_variants(api: FakeSandboxAPI) -> None:
    api.on("POST", "/sandboxes", (201, info(ID)))
    api.on("PUT", f"/sandboxes/{ID}/files", (200, {"size": 2}))
    api.on("GET", f"/sandboxes/{ID}", (200, info(ID)))
    api.on("DELETE", f"/sandboxes/{ID}", (200, info(ID, state="ended")))

    async def output() -> AsyncIterator[bytes]:
        yield _piece("stdout", "a\nb\n")
        yield b'{"exit": 0}\n'

    _exec_answers(api, output)

    async def main() -> tuple[list[str], int, int, bool]:
        sandbox = await levers9.Sandbox().aio.create()
        process = await sandbox.process.exec("echo")
        lines = [line async for line in process.stdout]
        size = await sandbox.fs.write_text("/a", "hi")
        return lines, await process.wait(), size, await sandbox.terminate()

    assert asyncio.run(main()) == (["a\n", "b\n"], 0, 2, True)
