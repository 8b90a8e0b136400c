"""The process runtime runs a command as a supervised host process, through the hook spec."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from levers9.hooks.errors import InvalidRequest
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, Mount, RuntimeContext


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[tuple[Hooks, RuntimeContext]]:
    hooks = Hooks(load_plugins(PluginPolicy()))
    ctx = RuntimeContext(name="process", state_dir=str(tmp_path / "process"))
    try:
        yield hooks, ctx
    finally:
        hooks.close()


async def run(hooks: Hooks, ctx: RuntimeContext, command: list[str], **kw: object) -> str:
    cid = f"p-{secrets.token_hex(5)}"
    spec = ContainerSpec(container_id=cid, image="host", command=command, **kw)  # type: ignore[arg-type]
    await hooks.container_start(ctx, await hooks.container_prepare(ctx, spec))
    return cid


async def wait(hooks: Hooks, ctx: RuntimeContext, cid: str) -> ContainerState:
    deadline = time.monotonic() + 60
    while (state := await hooks.container_state(ctx, cid)).status is not ContainerStatus.EXITED:
        if time.monotonic() > deadline:
            pytest.fail(f"{cid} did not exit")
        await asyncio.sleep(0.02)
    return state


async def test_exit_code_output_and_environment(rt: tuple[Hooks, RuntimeContext], tmp_path: Path) -> None:
    hooks, ctx = rt
    code = "import os, sys; print(os.getcwd(), os.environ['ANSWER']); sys.exit(7)"
    # a workdir the call's user (nobody, under a root worker) may enter: pytest's own are root's alone
    workdir = tempfile.mkdtemp(prefix="levers9-test-", dir="/tmp")
    os.chmod(workdir, 0o755)
    try:
        cid = await run(hooks, ctx, [sys.executable, "-c", code], env={"ANSWER": "42"}, workdir=workdir)
        state = await wait(hooks, ctx, cid)
    finally:
        os.rmdir(workdir)
    assert state.exit_code == 7
    chunk = await hooks.container_logs(ctx, cid, 0)
    assert chunk.data.decode().strip() == f"{workdir} 42"
    assert chunk.eof
    await hooks.container_remove(ctx, cid)
    assert not (tmp_path / "process" / "containers" / cid).exists()


async def test_kill_takes_the_whole_process_group(rt: tuple[Hooks, RuntimeContext]) -> None:
    hooks, ctx = rt
    marker = f"levers9-child-{secrets.token_hex(4)}"
    cid = await run(hooks, ctx, ["bash", "-c", f"(exec -a {marker}-bg sleep 600) & exec -a {marker} sleep 601"])
    assert (await hooks.container_state(ctx, cid)).status is ContainerStatus.RUNNING
    await hooks.container_kill(ctx, cid, signal.SIGKILL)
    state = await wait(hooks, ctx, cid)
    assert state.exit_code == 128 + signal.SIGKILL
    await hooks.container_remove(ctx, cid)
    await hooks.container_remove(ctx, cid)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
    assert not left.strip()
    assert (await hooks.container_state(ctx, cid)).status is ContainerStatus.UNKNOWN


async def test_removing_a_container_whose_command_exited_ends_what_it_left_running(
    rt: tuple[Hooks, RuntimeContext],
) -> None:
    hooks, ctx = rt
    cid = await run(hooks, ctx, ["sh", "-c", "sleep 3600 & echo $!; exit 0"])  # as whoever the runtime picks
    state = await wait(hooks, ctx, cid)
    assert state.exit_code == 0, (await hooks.container_logs(ctx, cid, 0)).data
    orphan = int((await hooks.container_logs(ctx, cid, 0)).data.decode().strip())
    assert _running(orphan)
    await hooks.container_remove(ctx, cid)
    deadline = time.monotonic() + 10
    while _running(orphan):
        assert time.monotonic() < deadline, f"pid {orphan}, left by the container's command, outlived its removal"
        await asyncio.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_what_needs_isolation_is_refused(rt: tuple[Hooks, RuntimeContext], tmp_path: Path) -> None:
    hooks, ctx = rt
    spec = ContainerSpec(
        container_id="p-refused",
        image="/images/python.tar",
        command=["true"],
        mounts=[Mount(source=str(tmp_path), target="/data")],
        network="none",
    )
    with pytest.raises(InvalidRequest) as info:
        await hooks.container_prepare(ctx, spec)
    message = str(info.value)
    assert "image '/images/python.tar'" in message
    assert "mounts" in message
    assert "network 'none'" in message


async def test_the_environment_never_shows_on_a_command_line(rt: tuple[Hooks, RuntimeContext]) -> None:
    hooks, ctx = rt
    secret = f"s3cret-{secrets.token_hex(8)}"
    cid = await run(hooks, ctx, ["sleep", "30"], env={"API_KEY": secret})
    try:
        seen = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if secret.encode() in (entry / "cmdline").read_bytes():
                        seen.append(entry.name)
                except OSError:
                    continue
        assert not seen, f"the secret is in the command line of processes {seen} (readable by anyone with ps)"
        state = await hooks.container_state(ctx, cid)
        assert state.pid is not None
        assert secret.encode() in Path(f"/proc/{state.pid}/environ").read_bytes()  # it did reach the command
    finally:
        await hooks.container_remove(ctx, cid)


async def test_a_dead_workers_containers_are_listed_by_the_runtime_and_removed(tmp_path: Path) -> None:
    """The worker finds what a dead worker left through ``levers9_container_list``, not the runtime's layout."""
    from levers9.worker.leftovers import remove_leftovers

    hooks = Hooks(load_plugins(PluginPolicy()))
    try:
        ctx = RuntimeContext(name="process", state_dir=str(tmp_path / "runtime" / "process"))
        running = await run(hooks, ctx, ["sleep", "300"])
        ended = await run(hooks, ctx, ["true"])
        await wait(hooks, ctx, ended)
        assert await hooks.container_list(ctx) == sorted([running, ended])
        pid = (await hooks.container_state(ctx, running)).pid
        assert pid is not None

        assert await remove_leftovers(hooks, tmp_path) == 2
        assert await hooks.container_list(ctx) == []
        assert (await hooks.container_state(ctx, running)).status is ContainerStatus.UNKNOWN
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid):
            if time.monotonic() > deadline:
                pytest.fail(f"the leftover container's process {pid} still runs")
            await asyncio.sleep(0.05)
    finally:
        hooks.close()


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
