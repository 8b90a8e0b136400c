"""A sandbox's runner and the worker's session, in this process, over a socketpair: processes, files, errors.

The runner side (:class:`levers9.runner.sandbox.SandboxRunner`) serves on a thread, as it does in a
container; the worker side (:class:`levers9.worker.warm.sandbox_client.SandboxSession`) drives it over
asyncio. Processes are real processes of this machine, files real files under the test's directory.
A runner that breaks the protocol is played by raw frames written to the session's socket.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from levers9.runner import frames
from levers9.runner import sandbox_wire as wire
from levers9.runner.main import Channel
from levers9.runner.sandbox import SandboxRunner, child_environment
from levers9.worker.warm.sandbox_client import OutputChunk, SandboxError, SandboxGone, SandboxSession


@dataclass
class Pair:
    session: SandboxSession
    runner: SandboxRunner
    thread: threading.Thread


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with _pair() as made:
        yield made


class _pair:
    def __init__(self, **runner_kw: object) -> None:
        self.kw = runner_kw

    async def __aenter__(self) -> Pair:
        ours, theirs = socket.socketpair()
        stream = theirs.makefile("rb")
        runner = SandboxRunner(Channel(theirs), **self.kw)  # type: ignore[arg-type]
        self.thread = threading.Thread(target=self._serve, args=(runner, stream, theirs), daemon=True)
        self.thread.start()
        reader, writer = await asyncio.open_connection(sock=ours)
        self.made = Pair(SandboxSession(reader, writer, name="test").start(), runner, self.thread)
        return self.made

    @staticmethod
    def _serve(runner: SandboxRunner, stream: object, sock: socket.socket) -> None:
        try:
            runner.serve(stream)  # type: ignore[arg-type]
        finally:
            sock.close()

    async def __aexit__(self, *exc: object) -> None:
        await self.made.session.close()
        await asyncio.to_thread(self.thread.join, 10)
        assert not self.thread.is_alive(), "the runner did not end when the worker hung up"
        groups = [p.popen.pid for p in self.made.runner._processes.values()]
        for _ in range(100):  # killed; their ends are reaped by their parents, or by init
            left = [g for g in groups if _group_alive(g)]
            if not left:
                break
            await asyncio.sleep(0.05)
        assert not left, f"process groups left running: {left}"


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group lives (zombies waiting for their reaping do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def _chunks(process: object) -> list[OutputChunk]:
    return [c async for c in process.output()]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- processes


async def test_output_streams_line_by_line_before_the_process_ends(pair: Pair) -> None:
    code = "import sys, time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second', flush=True)\n"
    process = await pair.session.exec(sys.executable, "-c", code)
    assert process.id == 1
    assert process.pid > 0
    seen: list[tuple[bytes, bool]] = []
    async for chunk in process.output():
        seen.append((chunk.data, (await process.status()).running))
    assert seen[0] == (b"first\n", True)  # the runner says it still ran when its first line had come
    assert [line for line, _ in seen] == [b"first\n", b"second\n"]
    assert await process.wait() == 0


async def test_stderr_is_its_own_stream_and_the_exit_code_comes_back(pair: Pair) -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)\n"
    process = await pair.session.exec(sys.executable, "-c", code)
    out, err = await process.read_all()
    assert (out, err) == (b"out\n", b"err\n")
    assert await process.wait() == 3


async def test_a_partial_line_is_flushed_after_a_pause_and_binary_output_is_passed_on(pair: Pair) -> None:
    code = (
        "import sys, time\n"
        "sys.stdout.buffer.write(b'prompt> '); sys.stdout.flush()\n"
        "time.sleep(0.5)\n"
        "sys.stdout.buffer.write(b'\\xff\\x00bytes\\n'); sys.stdout.flush()\n"
    )
    process = await pair.session.exec(sys.executable, "-c", code)
    chunks = await _chunks(process)
    assert chunks[0] == OutputChunk("stdout", b"prompt> ", True)
    assert b"".join(c.data for c in chunks) == b"prompt> \xff\x00bytes\n"


async def test_a_long_line_comes_in_bounded_pieces(pair: Pair) -> None:
    size = wire.MAX_LINE_BYTES * 3 + 10
    process = await pair.session.exec(sys.executable, "-c", f"print('x' * {size})")
    chunks = await _chunks(process)
    assert all(len(c.data) <= wire.MAX_LINE_BYTES for c in chunks if c.partial)
    assert b"".join(c.data for c in chunks) == b"x" * size + b"\n"
    assert chunks[-1].data.endswith(b"\n")


async def test_several_processes_run_at_once_and_are_listed(pair: Pair) -> None:
    sleepers = [await pair.session.exec("sleep", "30", cwd="/tmp") for _ in range(3)]
    quick = await pair.session.run_code("print(6 * 7)")
    assert (await quick.read_all())[0] == b"42\n"
    listed = await pair.session.list_processes()
    assert [p.process for p in listed] == [1, 2, 3, 4]
    assert [p.running for p in listed] == [True, True, True, False]
    assert listed[0].argv == ("sleep", "30")
    assert listed[0].cwd == "/tmp"
    assert listed[3].exit_code == 0
    assert listed[0].pid == sleepers[0].pid
    for sleeper in sleepers:
        assert await sleeper.kill() is True
        assert await sleeper.wait() == -signal.SIGKILL
    status = await pair.session.status(sleepers[0].id)
    assert (status.running, status.exit_code) == (False, -signal.SIGKILL)


async def test_kill_reaches_the_process_group_and_takes_a_signal(pair: Pair, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    code = f"import subprocess\np = subprocess.Popen(['sleep', '30'])\nopen({str(marker)!r}, 'w').write(str(p.pid))\np.wait()\n"
    process = await pair.session.exec(sys.executable, "-c", code)
    while not marker.exists() or not marker.read_text():
        await asyncio.sleep(0.02)
    child = int(marker.read_text())
    assert await process.kill(signal.SIGTERM) is True
    assert await process.wait() == -signal.SIGTERM
    for _ in range(250):  # the child got the signal too; it is reaped by its parent's end (or by init)
        if not _alive(child):
            break
        await asyncio.sleep(0.02)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except OSError:
        return False
    return state != "Z"


async def test_env_is_merged_over_the_runners_without_its_token(tmp_path: Path) -> None:
    environ = {"KEEP": "kept", "LEVERS9_RUNNER_TOKEN": "secret", "PATH": os.environ["PATH"]}
    async with _pair(environ=environ) as made:
        process = await made.session.run_code(
            "import os; print(sorted(k for k in os.environ if k in ('KEEP', 'MINE', 'LEVERS9_RUNNER_TOKEN')))",
            env={"MINE": "given"},
            cwd=str(tmp_path),
        )
        assert (await process.read_all())[0] == b"['KEEP', 'MINE']\n"


def test_the_runner_answers_every_request_the_wire_names(pair: Pair) -> None:
    assert set(pair.runner._handlers) == set(wire.REQUESTS)


def test_the_runners_python_tree_is_taken_off_pythonpath() -> None:
    env = child_environment({"PYTHONPATH": "/opt/levers9/python:/app"}, {}, "/opt/levers9/python")
    assert env["PYTHONPATH"] == "/app"
    assert "PYTHONPATH" not in child_environment({"PYTHONPATH": "/opt/levers9/python"}, {}, "/opt/levers9/python")


async def test_output_past_the_window_blocks_the_process_and_nothing_is_dropped(pair: Pair) -> None:
    lines = 20_000  # about 1.2 MB of output through a window of a tenth of it
    code = f"for i in range({lines}): print(f'{{i:08d}}' + 'y' * 50)"
    process = await pair.session.exec(sys.executable, "-c", code, window=wire.MIN_WINDOW_BYTES)
    await asyncio.sleep(1.0)  # nobody reads: the runner stops at the window, the process at its pipe
    assert process.exit_code is None
    assert process._outstanding <= wire.MIN_WINDOW_BYTES
    out, _ = await process.read_all()
    assert out.splitlines() == [f"{i:08d}".encode() + b"y" * 50 for i in range(lines)]
    assert await process.wait() == 0


async def test_a_background_child_holding_the_pipe_does_not_hold_the_exit(pair: Pair) -> None:
    process = await pair.session.exec("sh", "-c", "sleep 30 & echo started")
    out, _ = await process.read_all()
    assert out == b"started\n"
    assert await process.wait() == 0
    assert _group_alive(process.pid)  # the sleep still runs in its group; the runner kills it as it ends


async def test_at_most_max_processes_run_at_once() -> None:
    async with _pair(max_processes=2) as made:
        first = await made.session.exec("sleep", "30")
        await made.session.exec("sleep", "30")
        with pytest.raises(SandboxError) as refused:
            await made.session.exec("sleep", "30")
        assert refused.value.code == "TooManyProcesses"
        assert "LEVERS9_SANDBOX_MAX_PROCESSES=2" in str(refused.value)
        await first.kill()
        await first.wait()
        third = await made.session.exec("true")
        assert await third.wait() == 0


async def test_exec_errors_name_what_was_wrong(pair: Pair, tmp_path: Path) -> None:
    with pytest.raises(SandboxError) as missing:
        await pair.session.exec("/no/such/program")
    assert missing.value.code == "ENOENT"
    assert "/no/such/program" in str(missing.value)
    with pytest.raises(SandboxError) as bad_cwd:
        await pair.session.exec("true", cwd=str(tmp_path / "nowhere"))
    assert (bad_cwd.value.code, bad_cwd.value.path) == ("ENOENT", str(tmp_path / "nowhere"))
    with pytest.raises(SandboxError) as relative:
        await pair.session.exec("true", cwd="relative/dir")
    assert relative.value.code == "BadPath"
    assert "not absolute" in str(relative.value)
    with pytest.raises(SandboxError) as unknown:
        await pair.session.status(99)
    assert unknown.value.code == "NoSuchProcess"
    sleeper = await pair.session.exec("sleep", "30")
    with pytest.raises(SandboxError) as bad_signal:
        await sleeper.kill(12345)
    assert bad_signal.value.code == "BadRequest"
    assert "12345" in str(bad_signal.value)
    await sleeper.kill()
    # the session goes on after each
    assert await (await pair.session.exec("true")).wait() == 0


# --------------------------------------------------------------------------- files


async def test_a_5_mb_file_round_trips_byte_identical(pair: Pair, tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 123)
    path = str(tmp_path / "big.bin")
    assert await pair.session.write_file(path, data) == len(data)
    assert (tmp_path / "big.bin").read_bytes() == data
    assert await pair.session.read_file(path) == data
    assert await pair.session.write_file(path, b"short") == 5  # replaced, not appended to
    assert await pair.session.read_file(path) == b"short"
    (tmp_path / "big.bin").write_bytes(data)
    with pytest.raises(SandboxError) as too_big:
        await pair.session.read_file(path, max_bytes=1024)
    assert too_big.value.code == "EFBIG"


async def test_directories_list_stat_and_delete(pair: Pair, tmp_path: Path) -> None:
    root = str(tmp_path / "tree")
    await pair.session.create_directory(f"{root}/a/b")
    await pair.session.write_file(f"{root}/a/b/f.txt", b"hello", mode=0o600)
    await pair.session.write_file(f"{root}/a/g.txt", b"")
    listed = await pair.session.list_files(f"{root}/a")
    assert [(e.name, e.is_dir) for e in listed] == [("b", True), ("g.txt", False)]
    stat = await pair.session.stat_file(f"{root}/a/b/f.txt")
    assert (stat.name, stat.size, stat.mode & 0o777, stat.is_dir) == ("f.txt", 5, 0o600, False)
    assert abs(stat.mtime - time.time()) < 3600
    with pytest.raises(SandboxError) as is_dir:
        await pair.session.delete_file(f"{root}/a")
    assert is_dir.value.code == "EISDIR"
    assert "recursive=True" in str(is_dir.value)
    await pair.session.delete_file(f"{root}/a/g.txt")
    await pair.session.delete_file(f"{root}/a", recursive=True)
    assert os.listdir(root) == []


async def test_file_errors_are_typed_and_name_the_path(pair: Pair, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing" / "f.txt")
    with pytest.raises(SandboxError) as no_parent:
        await pair.session.write_file(missing, b"x")
    assert (no_parent.value.code, no_parent.value.op, no_parent.value.path) == ("ENOENT", "write_file", missing)
    assert f"the directory {tmp_path / 'missing'} does not exist" in str(no_parent.value)
    assert "create_directory" in str(no_parent.value)
    with pytest.raises(SandboxError) as not_found:
        await pair.session.read_file(missing)
    assert (not_found.value.code, not_found.value.path) == ("ENOENT", missing)
    with pytest.raises(SandboxError) as a_dir:
        await pair.session.read_file(str(tmp_path))
    assert a_dir.value.code == "EISDIR"
    with pytest.raises(SandboxError) as not_a_dir:
        await pair.session.list_files(__file__)
    assert not_a_dir.value.code == "ENOTDIR"
    with pytest.raises(SandboxError) as not_absolute:
        await pair.session.read_file("etc/passwd")
    assert (not_absolute.value.code, not_absolute.value.path) == ("BadPath", "etc/passwd")
    assert "'etc/passwd' is not absolute" in str(not_absolute.value)
    with pytest.raises(SandboxError) as nul:
        await pair.session.stat_file("/etc/\0passwd")
    assert nul.value.code == "BadPath"
    with pytest.raises(SandboxError) as root:
        await pair.session.delete_file("/", recursive=True)
    assert root.value.code == "BadPath"
    with pytest.raises(SandboxError) as under_a_file:
        await pair.session.create_directory(__file__ + "/sub")
    assert (under_a_file.value.code, under_a_file.value.op) == ("ENOTDIR", "mkdir")


async def test_a_fifo_is_refused_and_does_not_hang_the_runner(pair: Pair, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SandboxError) as reading:
        await pair.session.read_file(str(fifo))
    assert reading.value.code == "EINVAL"
    assert "not a regular file" in str(reading.value)
    with pytest.raises(SandboxError) as writing:
        await pair.session.write_file(str(fifo), b"x")  # nobody reads it: refused at once, not waited on
    assert (writing.value.code, writing.value.path) == ("ENXIO", str(fifo))


async def test_the_runner_refuses_a_bad_path_sent_past_the_client(pair: Pair) -> None:
    """The client checks paths, but the runner checks them again: another worker, or a bug, may not."""
    with pytest.raises(SandboxError) as refused:
        await pair.session._request("read_file", path="relative", offset=0, length=10, parse=lambda a: a)
    assert (refused.value.code, refused.value.op) == ("BadPath", "read_file")
    with pytest.raises(SandboxError) as bad_length:
        await pair.session._request(
            "read_file", path="/etc/hostname", offset=0, length=wire.FILE_CHUNK_BYTES + 1, parse=lambda a: a
        )
    assert bad_length.value.code == "BadRequest"


# --------------------------------------------------------------------------- the session when the runner breaks


@pytest.fixture
def raw() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


async def _raw_session(ours: socket.socket) -> SandboxSession:
    reader, writer = await asyncio.open_connection(sock=ours)
    return SandboxSession(reader, writer, name="raw").start()


async def _answer_next(theirs: socket.socket, kind: str, payload: bytes = b"", **fields: object) -> frames.Frame:
    stream = theirs.makefile("rb")
    request = await asyncio.to_thread(frames.recv_frame, stream)
    assert request is not None
    frames.send_frame(theirs, kind, payload, req=request.header["req"], **fields)
    return request


@pytest.mark.parametrize(
    ("kind", "fields", "says"),
    [
        ("file_data", {"size": 1}, "expected 'processes'"),
        ("processes", {"processes": "all"}, "expected a list"),
        ("processes", {"processes": [{"process": 1}]}, "field 'argv'"),
        (
            "processes",
            {
                "processes": [
                    {"process": 1, "pid": 2, "argv": [], "cwd": "/", "running": True, "exit_code": 0, "started_at": 1.0}
                ]
            },
            "does not go with running=True",
        ),
    ],
)
async def test_a_malformed_answer_ends_the_session_saying_why(
    raw: tuple[socket.socket, socket.socket], kind: str, fields: dict[str, object], says: str
) -> None:
    ours, theirs = raw
    session = await _raw_session(ours)
    answering = asyncio.ensure_future(_answer_next(theirs, kind, **fields))
    with pytest.raises(SandboxGone) as gone:
        await session.list_processes()
    await answering
    assert "broke the protocol" in str(gone.value)
    assert says in str(gone.value)
    with pytest.raises(SandboxGone):
        await session.stat_file("/etc")  # every later call fails at once, the same way
    await session.close()


async def test_output_past_the_window_or_for_an_unknown_process_breaks_the_protocol(
    raw: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = raw
    session = await _raw_session(ours)
    answering = asyncio.ensure_future(_answer_next(theirs, "started", process=7, pid=70))
    process = await session.exec("anything", window=wire.MIN_WINDOW_BYTES)
    await answering
    assert (process.id, process.pid) == (7, 70)
    frames.send_frame(
        theirs, "output", b"x\n" * (wire.MIN_WINDOW_BYTES // 2 + 1), process=7, stream="stdout", partial=False
    )
    with pytest.raises(SandboxGone) as gone:
        await process.wait()
    assert "over its window" in str(gone.value)
    await session.close()


async def test_a_runner_that_dies_fails_what_waits_with_a_clear_error(raw: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = raw
    session = await _raw_session(ours)
    answering = asyncio.ensure_future(_answer_next(theirs, "started", process=1, pid=10))
    process = await session.exec("anything")
    await answering
    waiting = asyncio.ensure_future(process.wait())
    reading = asyncio.ensure_future(session.read_file("/etc/hostname"))
    await asyncio.sleep(0.05)
    theirs.close()  # the container is gone
    for pending in (waiting, reading):
        with pytest.raises(SandboxGone) as gone:
            await asyncio.wait_for(pending, 10)
        assert "its container exited or its connection broke" in str(gone.value)
    await session.close()
