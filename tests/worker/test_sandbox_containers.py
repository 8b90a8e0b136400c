"""A sandbox's runner in real containers of runc and gVisor, started the way a worker starts one.

The container is booted by the worker's :class:`~levers9.worker.warm.launch.Launcher` from a stub of
kind ``sandbox`` (the ``host`` image), its runner reached by the pool's
:class:`~levers9.worker.warm.runner_client.RunnerClient`, and driven by a
:class:`~levers9.worker.warm.sandbox_client.SandboxSession`: output streamed while the process runs,
processes side by side, kill, files both ways, the errors, and a clear error when the container dies.
Each test ends with the container removed and the world's leftover check (no process, mount, cgroup,
network namespace or directory left; tests/worker/test_pool.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from levers9.hooks.errors import Levers9Error
from levers9.worker.calls import SANDBOX_KIND
from levers9.worker.warm.launch import EXIT_WAIT_S, container_id
from levers9.worker.warm.sandbox_client import SandboxError, SandboxGone, SandboxSession
from levers9.worker.warm.scaling import WarmContainer, WarmStub
from tests.worker.test_pool import ISOLATED, World, _world


@pytest.fixture(params=ISOLATED)
async def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with _world(request.param, tmp_path) as w:
        yield w


@contextlib.asynccontextmanager
async def sandbox(world: World, tmp_path: Path) -> AsyncIterator[tuple[SandboxSession, WarmContainer]]:
    """A sandbox container of ``world``'s runtime and a session with its runner; removed at the end."""
    stub = world.stub(lambda: None, kind=SANDBOX_KIND)
    handler_dir = tmp_path / "sandbox-handler"  # a sandbox has no handler: mounted empty
    handler_dir.mkdir(mode=0o700)
    group = WarmStub(key=stub.stub_id, spec=stub, handler_dir=handler_dir)
    launcher = world.pool.launcher
    box = WarmContainer(cid=container_id(stub), port=world.pool._ports.pick(), token=secrets.token_urlsafe(32), gpus=[])
    world.seen.add(box.cid)
    session: SandboxSession | None = None
    try:
        await launcher.boot(group, box)
        reader, writer = await world.pool.client.connect(box)
        session = SandboxSession(reader, writer, name=box.cid).start()
        yield session, box
    finally:
        if session is not None:
            await session.close()  # the runner ends when its worker hangs up, and its container with it
        if box.prepared:
            try:
                if box.started and await launcher.wait_exited(box.cid, EXIT_WAIT_S) is None:
                    await launcher.kill(box)
            finally:
                with contextlib.suppress(Levers9Error):
                    await launcher.remove(box.cid)
        world.pool._ports.release(box.port)
        shutil.rmtree(handler_dir, ignore_errors=True)


async def _exists(session: SandboxSession, path: str) -> bool:
    try:
        await session.stat_file(path)
    except SandboxError as exc:
        if exc.code != "ENOENT":
            raise
        return False
    return True


async def test_processes_and_files_in_a_sandbox_container(isolated: World, tmp_path: Path) -> None:
    async with sandbox(isolated, tmp_path) as (session, _):
        # output arrives line by line while the process runs
        slow = await session.run_code("import time\nprint('one', flush=True)\ntime.sleep(1)\nprint('two', flush=True)")
        # (the runner's own word that the process still ran when its first line had come)
        lines = [(chunk.data, (await slow.status()).running) async for chunk in slow.output()]
        assert lines[0] == (b"one\n", True)
        assert [line for line, _ in lines] == [b"one\n", b"two\n"]
        assert await slow.wait() == 0

        # two at once, listed; kill ends one, the other goes on
        sleeper = await session.exec("sleep", "60")
        counter = await session.exec("sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done", cwd="/tmp")
        listed = {p.process: p for p in await session.list_processes()}
        assert listed[sleeper.id].running
        assert listed[counter.id].argv == ("sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done")
        assert listed[counter.id].cwd == "/tmp"
        assert await sleeper.kill() is True
        assert await sleeper.wait() == -signal.SIGKILL
        assert (await counter.read_all())[0] == b"1\n2\n3\n"
        assert await counter.wait() == 0
        assert not (await session.status(sleeper.id)).running

        # the runner is PID 1 and reaps a background job whose shell has ended: no zombie stays
        parent = await session.run_code("import os; print(os.getppid())")
        assert (await parent.read_all())[0] == b"1\n"
        orphaning = await session.exec("sh", "-c", "sleep 0.3 > /dev/null 2>&1 & echo $!")
        orphan = int((await orphaning.read_all())[0])
        assert await orphaning.wait() == 0
        for _ in range(200):
            if not await _exists(session, f"/proc/{orphan}"):  # there while it runs, and as a zombie
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the orphan {orphan} was never reaped")

        # the runner's token and mode are not in a process's environment
        env = await session.run_code("import os; print(sorted(k for k in os.environ if k.startswith('LEVERS9_')))")
        assert (await env.read_all())[0] == b"[]\n"

        # files both ways: 5 MB in, read back and hashed inside, read out byte-identical
        data = os.urandom(5 * 1024 * 1024)
        await session.create_directory("/tmp/work/in")
        assert await session.write_file("/tmp/work/in/blob.bin", data) == len(data)
        digest = await session.exec("sha256sum", "/tmp/work/in/blob.bin")
        assert (await digest.read_all())[0].split()[0].decode() == hashlib.sha256(data).hexdigest()
        made = await session.run_code("open('/tmp/work/out.txt', 'w').write('from inside\\n')")
        assert await made.wait() == 0
        assert await session.read_file("/tmp/work/out.txt") == b"from inside\n"
        assert await session.read_file("/tmp/work/in/blob.bin") == data
        assert [(e.name, e.is_dir) for e in await session.list_files("/tmp/work")] == [("in", True), ("out.txt", False)]
        assert (await session.stat_file("/tmp/work/in/blob.bin")).size == len(data)
        await session.delete_file("/tmp/work", recursive=True)
        with pytest.raises(SandboxError) as gone:
            await session.stat_file("/tmp/work")
        assert (gone.value.code, gone.value.path) == ("ENOENT", "/tmp/work")

        # the errors, each naming what was wrong, the session going on after each
        with pytest.raises(SandboxError) as no_parent:
            await session.write_file("/tmp/nowhere/f.txt", b"x")
        assert no_parent.value.code == "ENOENT"
        assert "the directory /tmp/nowhere does not exist" in str(no_parent.value)
        with pytest.raises(SandboxError) as relative:
            await session.read_file("tmp/f.txt")
        assert relative.value.code == "BadPath"
        with pytest.raises(SandboxError) as a_dir:
            await session.read_file("/tmp")
        assert a_dir.value.code == "EISDIR"
        with pytest.raises(SandboxError) as no_program:
            await session.exec("/no/such/program")
        assert no_program.value.code == "ENOENT"
        assert "/no/such/program" in str(no_program.value)
        assert await (await session.exec("true")).wait() == 0


async def test_a_sandbox_whose_container_dies_fails_its_waiters_with_a_clear_error(
    isolated: World, tmp_path: Path
) -> None:
    async with sandbox(isolated, tmp_path) as (session, box):
        sleeper = await session.exec("sleep", "60")
        await isolated.pool.launcher.kill(box)  # the container is killed under the session
        with pytest.raises(SandboxGone) as gone:
            await sleeper.wait()
        assert "its container exited or its connection broke" in str(gone.value)
        with pytest.raises(SandboxGone):
            await session.exec("true")
