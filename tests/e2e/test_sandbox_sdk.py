"""levers9.Sandbox and `levers9 sandbox` against a real `levers9 up` whose pool runs sandboxes under runc.

The SDK runs in this process, pointed at the `up`'s own context (its ``http`` field is what the SDK uses);
the CLI runs as a user runs it, a subprocess with the same home. What the REST routes answer is tested in
tests/e2e/test_sandboxes.py; here, that the SDK's and the CLI's names do what docs/sandboxes.md says.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import levers9
from levers9.sdk import sandbox_errors as errors
from tests.fixtures.levers9_up import Up, _finish

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """One `levers9 up`: a runc pool of one worker running at most 4 sandboxes."""
    root = tmp_path_factory.mktemp("sandbox-sdk-up")
    served = Up(root)
    try:
        served.use_runtime("runc")
        served.sandboxes = 4
        served.min_workers = served.max_workers = 1
        served.start()
        yield served
    finally:
        _finish(served, root)


@pytest.fixture
def sdk(up: Up, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[levers9.SandboxInstance]]:
    """This process's SDK on the `up`'s context; every sandbox appended to the list is terminated after the test."""
    for name in [n for n in os.environ if n.startswith("LEVERS9_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LEVERS9_HOME", str(up.home))
    made: list[levers9.SandboxInstance] = []
    yield made
    for sandbox in made:
        with contextlib.suppress(errors.SandboxError):  # its `up` may have stopped first
            sandbox.terminate()


def _started(made: list[levers9.SandboxInstance], **options: object) -> levers9.SandboxInstance:
    sandbox = levers9.Sandbox(keep_warm_seconds=300, **options).create()  # type: ignore[arg-type]
    made.append(sandbox)
    return sandbox


def test_exec_streams_lines_as_they_come_and_code_and_files_work(
    sdk: list[levers9.SandboxInstance], tmp_path: Path
) -> None:
    sandbox = _started(sdk, name="sdk-first", env={"GREETING": "hello"})
    assert sandbox.info["state"] == "running"
    assert sandbox.status() == (-1, "running")

    # a line arrives while the process still runs: it waits for a file that only this test writes, after it
    script = 'echo "$GREETING one"; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; echo bad >&2; exit 3'
    process = sandbox.process.exec("sh", "-c", script)
    lines = iter(process.stdout)
    assert next(lines) == "hello one\n"
    assert process.status() == (-1, "running")
    sandbox.fs.write_text("/tmp/go", "")
    assert list(lines) == ["two\n"]
    assert process.stderr.read() == "bad\n"
    assert process.wait() == 3
    # both streams in the order their lines came: two pipes, so "two" and "bad" may come either way round
    logs = list(process.logs)
    assert logs[0] == "hello one\n"
    assert sorted(logs[1:]) == ["bad\n", "two\n"]

    response = sandbox.process.run_code("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)\nsys.exit(2)")
    assert isinstance(response, levers9.SandboxProcessResponse)
    assert (response.exit_code, response.stdout, response.stderr) == (2, "42\n", "warn\n")
    cwd = sandbox.process.exec("sh", "-c", 'pwd; echo "$EXTRA"', cwd="/tmp", env={"EXTRA": "given"})
    assert cwd.stdout.read() == "/tmp\ngiven\n"

    # a 20 MiB file up and down, unchanged, and the directory calls
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(20 * 1024 * 1024))
    sandbox.fs.create_directory("/l9-sdk/deep")
    assert sandbox.fs.upload_file(local, "/l9-sdk/deep/data.bin") == 20 * 1024 * 1024
    inside = sandbox.process.exec("sha256sum", "/l9-sdk/deep/data.bin")
    assert inside.stdout.read().split()[0] == hashlib.sha256(local.read_bytes()).hexdigest()
    back = tmp_path / "back.bin"
    assert sandbox.fs.download_file("/l9-sdk/deep/data.bin", back) == 20 * 1024 * 1024
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(local.read_bytes()).digest()
    found = sandbox.fs.stat_file("/l9-sdk/deep/data.bin")
    assert (found.name, found.size, found.is_dir) == ("data.bin", 20 * 1024 * 1024, False)
    assert [(f.name, f.is_dir) for f in sandbox.fs.list_files("/l9-sdk")] == [("deep", True)]
    sandbox.fs.write_bytes("/l9-sdk/small", b"\x00\xff")
    assert sandbox.fs.read_bytes("/l9-sdk/small") == b"\x00\xff"
    sandbox.fs.delete_file("/l9-sdk/small")
    with pytest.raises(FileNotFoundError, match="/l9-sdk/small"):
        sandbox.fs.read_text("/l9-sdk/small")
    sandbox.fs.create_directory("/l9-sdk/deep")  # with its parents: one that exists is fine
    with pytest.raises(FileExistsError):
        sandbox.fs.create_directory("/l9-sdk/deep", parents=False)
    with pytest.raises(errors.SandboxFileSystemError):
        sandbox.fs.read_text("/l9-sdk/../../etc/passwd")
    sandbox.fs.delete_directory("/l9-sdk")
    with pytest.raises(FileNotFoundError):
        sandbox.fs.stat_file("/l9-sdk")

    # every process it ran, by pid
    listed = sandbox.process.list_processes()
    assert {process.pid, response.pid, cwd.pid} <= set(listed)
    assert listed[process.pid] is process
    assert sandbox.process.get_process(process.pid) is process


def test_several_processes_at_once_and_connect_from_a_second_object(sdk: list[levers9.SandboxInstance]) -> None:
    sandbox = _started(sdk)
    waiting = 'echo "started $0"; while [ ! -e "/tmp/$0" ]; do sleep 0.05; done; echo "done $0"'
    processes = [sandbox.process.exec("sh", "-c", waiting, name) for name in ("a", "b", "c")]
    # all three run at once: each has written its first line, and none can end before its file exists
    streams = [iter(p.stdout) for p in processes]
    assert [next(s) for s in streams] == ["started a\n", "started b\n", "started c\n"]
    assert [p.status()[1] for p in processes] == ["running"] * 3

    # another object (another program would do the same) finds the sandbox by its id and ends the processes
    other = levers9.Sandbox().connect(sandbox.sandbox_id())
    assert other.id == sandbox.id
    for name in ("c", "a", "b"):
        other.fs.write_text(f"/tmp/{name}", "")
    assert [list(s) for s in streams] == [["done a\n"], ["done b\n"], ["done c\n"]]
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    assert other.process.run_code("print('from the other')").result == "from the other\n"  # type: ignore[union-attr]

    killed = other.process.exec("sleep", "100")
    assert killed.kill() is True  # it was running when the signal went
    assert killed.wait() == -9

    # terminated: every call says so, naming the sandbox, rather than hang
    assert sandbox.terminate() is True
    assert sandbox.terminate() is False
    with pytest.raises(errors.SandboxEnded, match=sandbox.id):
        other.process.exec("true")
    with pytest.raises(errors.SandboxEnded, match=sandbox.id):
        levers9.Sandbox().connect(sandbox.id)
    assert sandbox.status() == (0, "ended")
    with pytest.raises(errors.SandboxNotFound):
        levers9.Sandbox().connect("sb-0000000000000000")


def test_aio(sdk: list[levers9.SandboxInstance]) -> None:
    async def main() -> tuple[list[str], int, str]:
        sandbox = await levers9.Sandbox(keep_warm_seconds=300).aio.create()
        sdk.append(sandbox.sync)
        process = await sandbox.process.exec("sh", "-c", "echo one; echo two")
        lines = [line async for line in process.stdout]
        await sandbox.fs.write_text("/tmp/x", "async")
        text = await sandbox.fs.read_text("/tmp/x")
        code = await process.wait()
        assert await sandbox.terminate() is True
        return lines, code, text

    assert asyncio.run(main()) == (["one\n", "two\n"], 0, "async")


def test_cli_list_exec_logs_kill(up: Up, sdk: list[levers9.SandboxInstance]) -> None:
    sandbox = _started(sdk, name="for-the-cli")
    listed = up.levers9("sandbox", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line.split("\t") for line in listed.stdout.splitlines() if line.startswith(sandbox.id))
    assert row[1:4] == ["for-the-cli", "local", "running"]

    ran = up.levers9("sandbox", "exec", sandbox.id, "--", "sh", "-c", "echo out; echo err >&2; exit 4")
    assert (ran.returncode, ran.stdout, ran.stderr) == (4, "out\n", "err\n")

    # a process nobody reads (started over REST, as another language would): `logs` shows its output
    with httpx.Client(
        base_url=f"http://127.0.0.1:{up.http_port}/api/v1", headers={"authorization": f"Bearer {up.token()}"}
    ) as client:
        started = client.post(f"/sandboxes/{sandbox.id}/processes", json={"argv": ["sh", "-c", "echo logged"]})
        assert started.status_code == 201, started.text
        pid = started.json()["pid"]
    logs = up.levers9("sandbox", "logs", sandbox.id, str(pid))
    assert (logs.returncode, logs.stdout) == (0, "logged\n"), logs.stderr

    killed = up.levers9("sandbox", "kill", sandbox.id)
    assert (killed.returncode, killed.stdout) == (0, f"terminated sandbox {sandbox.id}\n"), killed.stderr
    after = up.levers9("sandbox", "exec", sandbox.id, "--", "true")
    assert after.returncode == 1
    assert sandbox.id in after.stderr
    assert "ended" in after.stderr
    ended = up.levers9("sandbox", "list", "--all")
    assert any(line.startswith(sandbox.id) and "\tended" in line for line in ended.stdout.splitlines())


def test_expose_port_gives_a_gateway_url_once_something_listens(up: Up, sdk: list[levers9.SandboxInstance]) -> None:
    sandbox = _started(sdk, ports=[8000])
    sandbox.fs.write_text("/tmp/hello.txt", "hello through the gateway\n")
    with pytest.raises(errors.SandboxError, match="port 8000") as caught:
        sandbox.expose_port(8000)
    assert caught.value.type == "port_not_listening"
    server = sandbox.process.exec("python3", "-m", "http.server", "8000", "--bind", "0.0.0.0", cwd="/tmp")
    deadline = time.monotonic() + 60
    url = ""
    while not url:
        url, refusal = _exposed(sandbox, 8000)
        if not url:
            assert refusal == "port_not_listening", refusal
            assert time.monotonic() < deadline, "nothing listened on port 8000 within 60 s"
            assert server.status()[1] == "running", server.stderr.read()
            time.sleep(0.2)
    token = {"authorization": f"Bearer {up.token()}"}
    assert httpx.get(url + "hello.txt", headers=token, timeout=30).text == "hello through the gateway\n"


def _exposed(sandbox: levers9.SandboxInstance, port: int) -> tuple[str, str]:
    """(the port's URL, "") once exposed, or ("", the refusal's type)."""
    try:
        return sandbox.expose_port(port), ""
    except errors.SandboxError as exc:
        return "", exc.type


COUNTER = """
import secrets, time
token, n = secrets.token_hex(8), 0
while True:
    print(token, n, flush=True)
    n += 1
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def gvisor_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """One `levers9 up`: a gVisor pool of one worker running at most 4 sandboxes (snapshots need gVisor)."""
    root = tmp_path_factory.mktemp("sandbox-sdk-gvisor")
    served = Up(root)
    try:
        served.use_runtime("gvisor")
        served.sandboxes = 4
        served.min_workers = served.max_workers = 1
        served.start()
        yield served
    finally:
        _finish(served, root)


def _ticks(lines: Iterator[str], count: int) -> list[tuple[str, int]]:
    found = []
    for _ in range(count):
        token, number = next(lines).split()
        found.append((token, int(number)))
    return found


def test_a_memory_snapshot_restores_a_running_process_with_its_state(
    gvisor_up: Up, monkeypatch: pytest.MonkeyPatch
) -> None:
    from levers9.sdk.sandbox import delete_snapshot, list_snapshots

    for name in [n for n in os.environ if n.startswith("LEVERS9_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LEVERS9_HOME", str(gvisor_up.home))
    original = levers9.Sandbox(keep_warm_seconds=300, snapshots=True).create()
    restored: levers9.SandboxInstance | None = None
    try:
        original.fs.write_text("/tmp/before.txt", "written before the snapshot\n")
        counter = original.process.run_code(COUNTER, blocking=False)
        assert isinstance(counter, levers9.SandboxProcess)
        before = _ticks(iter(counter.stdout), 3)
        token = before[0][0]

        snapshot_id = original.snapshot_memory()
        assert snapshot_id in [s["id"] for s in list_snapshots()]
        restored = levers9.Sandbox().create_from_memory_snapshot(snapshot_id)
        assert restored.id != original.id
        carried = restored.process.list_processes()[counter.pid]
        assert carried.status() == (-1, "running")
        resumed = _ticks(iter(carried.stdout), 5)
        # the same process, its memory intact: the token it drew before, counting on from where it was
        assert {t for t, _ in resumed} == {token}
        assert resumed[0][1] > before[-1][1]
        assert [n for _, n in resumed] == list(range(resumed[0][1], resumed[0][1] + 5))
        assert restored.fs.read_text("/tmp/before.txt") == "written before the snapshot\n"
        assert original.status() == (-1, "running")  # the original ran on

        delete_snapshot(snapshot_id)
        assert snapshot_id not in [s["id"] for s in list_snapshots()]
    finally:
        for sandbox in (original, restored):
            if sandbox is not None:
                with contextlib.suppress(errors.SandboxError):
                    sandbox.terminate()
