"""A root worker's process runtime runs commands as nobody: not able to read what root keeps, yet supervised.

These run the real process runtime through the hook spec, as root (the
machine these tests run on sets up runc and gVisor as root, so it is root):
the command's uid, its home, its output, the kill of its whole group and
the removal of everything it was given are all checked on real processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import secrets
import shutil
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
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, RuntimeContext
from levers9_process import ProcessSettings


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[tuple[Hooks, RuntimeContext]]:
    if os.geteuid() != 0:
        pytest.fail("these tests check what a root worker does: run them as root (scripts/setup does)")
    hooks = Hooks(load_plugins(PluginPolicy()))
    state = tmp_path / "process"
    state.mkdir(mode=0o700)
    ctx = RuntimeContext(name="process", state_dir=str(state))
    try:
        yield hooks, ctx
    finally:
        hooks.close()


def nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


async def start(hooks: Hooks, ctx: RuntimeContext, command: list[str], **kw: object) -> str:
    cid = f"u-{secrets.token_hex(5)}"
    spec = ContainerSpec(container_id=cid, image="host", command=command, **kw)
    await hooks.container_start(ctx, await hooks.container_prepare(ctx, spec))
    return cid


async def finish(hooks: Hooks, ctx: RuntimeContext, cid: str) -> tuple[ContainerState, str]:
    deadline = time.monotonic() + 60
    while (state := await hooks.container_state(ctx, cid)).status is not ContainerStatus.EXITED:
        if time.monotonic() > deadline:
            pytest.fail(f"{cid} did not exit")
        await asyncio.sleep(0.02)
    return state, (await hooks.container_logs(ctx, cid, 0)).data.decode()


async def test_a_root_workers_command_runs_as_nobody_with_a_home_of_its_own(
    rt: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    hooks, ctx = rt
    private = tmp_path / "worker-secret"
    private.write_text("l9_machine_not_for_calls")
    private.chmod(0o600)
    script = (
        'echo "ids $(id -u) $(id -g) $(id -G)"; echo "home $HOME"; echo x > "$HOME/written" && echo writable; '
        f"cat {private} 2>/dev/null || echo unreadable; cat /proc/{os.getpid()}/environ 2>/dev/null || echo noenv; "
        "pwd; exit 3"
    )
    cid = await start(hooks, ctx, ["/bin/sh", "-c", script], workdir="/")
    state, output = await finish(hooks, ctx, cid)
    uid, gid = nobody()
    lines = output.splitlines()
    assert state.exit_code == 3, output
    assert lines[0] == f"ids {uid} {gid} {gid}", "no root, and no supplementary group of root's"
    home = Path(lines[1].removeprefix("home "))
    assert home.is_dir()
    assert home.stat().st_uid == uid
    assert home.stat().st_mode & 0o077 == 0
    assert lines[2:] == ["writable", "unreadable", "noenv", "/"]
    await hooks.container_remove(ctx, cid)
    assert not home.exists(), "the call's home is removed with it"
    assert not (Path(ctx.state_dir) / "containers" / cid).exists()


async def test_nobody_reads_its_handler_file_through_a_copy_and_its_whole_group_is_killed(
    rt: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    hooks, ctx = rt
    handler = tmp_path / "handlers" / "handler.pkl"
    handler.parent.mkdir(mode=0o700)
    handler.write_bytes(b"pickled-function")
    handler.chmod(0o600)
    marker = f"levers9-nobody-{secrets.token_hex(4)}"
    script = f'cat "$LEVERS9_HANDLER_FILE"; echo; (exec -a {marker}-bg sleep 600) & exec -a {marker} sleep 601'
    cid = await start(hooks, ctx, ["bash", "-c", script], env={"LEVERS9_HANDLER_FILE": str(handler)})
    deadline = time.monotonic() + 30
    while b"pickled-function" not in (await hooks.container_logs(ctx, cid, 0)).data:
        assert time.monotonic() < deadline, (await hooks.container_logs(ctx, cid, 0)).data
        await asyncio.sleep(0.02)
    state = await hooks.container_state(ctx, cid)
    assert state.status is ContainerStatus.RUNNING
    assert state.pid is not None
    assert Path(f"/proc/{state.pid}").stat().st_uid == nobody()[0]
    await hooks.container_kill(ctx, cid, signal.SIGKILL)
    state, _ = await finish(hooks, ctx, cid)
    assert state.exit_code == 128 + signal.SIGKILL
    await hooks.container_remove(ctx, cid)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
    assert not left.strip(), f"processes of the killed group are left: {left}"
    assert handler.read_bytes() == b"pickled-function", "the original is untouched"


async def test_a_command_nobody_cannot_reach_is_refused_with_the_fix(
    rt: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    """Fail closed: such a call never runs as root (it did, with a warning in the worker's log only)."""
    hooks, ctx = rt
    hidden = tmp_path / "private-bin"
    hidden.mkdir(mode=0o700)
    program = hidden / "whoami.sh"
    program.write_text("#!/bin/sh\nid -u\n")
    program.chmod(0o755)
    spec = ContainerSpec(container_id=f"u-{secrets.token_hex(5)}", image="host", command=[str(program)])
    with pytest.raises(InvalidRequest) as refused:
        await hooks.container_prepare(ctx, spec)
    message = str(refused.value)
    assert f"nobody (uid {nobody()[0]}) cannot reach the program {program} (blocked at /" in message
    assert "allow_calls_as_worker_user: true" in message
    assert not (Path(ctx.state_dir) / "containers" / spec.container_id).exists(), "a refused call leaves nothing"


async def test_a_pool_that_allows_it_runs_such_a_command_as_the_worker_and_says_why(
    rt: tuple[Hooks, RuntimeContext], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hooks, base = rt
    ctx = base.model_copy(update={"settings": ProcessSettings(allow_calls_as_worker_user=True)})
    hidden = tmp_path / "private-bin"
    hidden.mkdir(mode=0o700)
    program = hidden / "whoami.sh"
    program.write_text("#!/bin/sh\nid -u\n")
    program.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="levers9.runtime.process"):
        cid = await start(hooks, ctx, [str(program)])
        state, output = await finish(hooks, ctx, cid)
    await hooks.container_remove(ctx, cid)
    assert state.exit_code == 0
    assert output.strip() == "0"
    warning = next(r.getMessage() for r in caplog.records if cid in r.getMessage())
    assert "not as nobody" in warning
    assert str(hidden) in warning


def test_a_home_a_killed_worker_left_is_swept_once_its_container_is_gone() -> None:
    """Homes live in the shared /tmp, outside the worker's state: a SIGKILLed worker cannot remove its own."""
    from levers9.engine.process import RunAs, sweep_homes

    uid, gid = nobody()
    me = RunAs(uid=uid, gid=gid, name="nobody")
    made: dict[str, Path] = {}
    for what in ("gone", "live", "fresh"):
        home = Path(tempfile.mkdtemp(prefix=f"levers9-u-{what}{secrets.token_hex(4)}-", dir="/tmp"))
        os.chown(home, uid, gid)
        made[what] = home
    for what in ("gone", "live"):
        os.utime(made[what], (time.time() - 3600, time.time() - 3600))
    live_id = made["live"].name.removeprefix("levers9-").rpartition("-")[0]
    # a process whose argv names the container, as its shim's does
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", live_id])
    # Popen returns once exec closed the error pipe, which the kernel does before it writes the new argv:
    # for a moment the holder's cmdline is empty (seen in 4 of 200 tries on a loaded machine)
    deadline = time.monotonic() + 10
    while live_id.encode() not in Path(f"/proc/{holder.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the holder never showed its argv"
        time.sleep(0.001)
    try:
        removed = sweep_homes(me)
        assert str(made["gone"]) in removed
        assert not made["gone"].exists()
        assert made["live"].exists(), "its container still runs"
        assert made["fresh"].exists(), "just made: its container may be starting"
    finally:
        holder.kill()
        holder.wait()
        for home in made.values():
            shutil.rmtree(home, ignore_errors=True)
