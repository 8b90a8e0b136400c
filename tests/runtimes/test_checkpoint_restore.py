"""Checkpoint and restore for real: gVisor does it; CRIU on this kernel says why it cannot.

The application sleeps 5 s at start-up, then builds state it keeps in memory
(a random token) and prints it forever. A restored container must carry on
from the checkpoint: its first line is the steady-state line with the same
token, and it never prints the start-up line.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import levers9_criu
from levers9.containers.node import bridge_for
from levers9.hooks.errors import CheckpointUnavailable, RestoreFailed
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerStatus, RuntimeContext
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.database import open_database
from levers9.state.sql.workspaces import WorkspaceStore
from levers9.worker.startup import start_container

APP = """
import secrets, time
print("starting up", flush=True)
time.sleep(5)
token = secrets.token_hex(8)
print("READY", token, flush=True)
n = 0
while True:
    n += 1
    print("alive", token, n, flush=True)
    time.sleep(0.1)
"""


async def text(hooks: Hooks, ctx: RuntimeContext, cid: str) -> str:
    return (await hooks.container_logs(ctx, cid, 0)).data.decode()


async def until(hooks: Hooks, ctx: RuntimeContext, cid: str, needle: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while needle not in (out := await text(hooks, ctx, cid)):
        if time.monotonic() > deadline:
            pytest.fail(f"{cid} never printed {needle!r}; it printed: {out[-500:]!r}")
        await asyncio.sleep(0.05)
    return out


@pytest.fixture
async def gvisor(tmp_path: Path, require: Callable[[str], str]) -> AsyncIterator[tuple[Hooks, RuntimeContext]]:
    require("runsc")
    hooks = Hooks(load_plugins(PluginPolicy()))
    settings = hooks.runtime_settings_model("gvisor")
    assert settings is not None
    ctx = RuntimeContext(
        name="gvisor",
        settings=settings(
            bridge=f"l9t{secrets.token_hex(5)}",
            subnet="10.249.0.0/24",
            image_cache=str(tmp_path.parent / "image-cache"),
        ),
        state_dir=str(tmp_path / "gvisor"),
    )
    try:
        yield hooks, ctx
    finally:
        for cdir in (tmp_path / "gvisor" / "containers").glob("*"):
            await hooks.container_remove(ctx, cdir.name)
        bridge_for(ctx.settings).destroy()
        hooks.close()
    assert not list((tmp_path / "gvisor" / "containers").glob("*")), "containers left behind"


def spec(cid: str) -> ContainerSpec:
    # no network: gVisor checkpoints only sandboxes on its own network stack or none (not the host's)
    return ContainerSpec(container_id=cid, image="host", command=["python3", "-c", APP], network="none")


async def test_gvisor_checkpoint_keeps_running_and_restore_skips_start_up(
    gvisor: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    hooks, ctx = gvisor
    support = await hooks.checkpoint_support(ctx)
    assert support.available, support.reason
    assert support.mechanism == "runsc"

    await start_container(hooks, ctx, spec("cold"))
    token = (await until(hooks, ctx, "cold", "READY")).split("READY ", 1)[1].split()[0]
    image = await hooks.checkpoint(ctx, "cold", str(tmp_path / "images" / "ck1"), timeout=300)
    assert image.size_bytes > 0
    assert image.runtime == "gvisor"

    # the original carries on after the checkpoint, with its state
    seen = len(await text(hooks, ctx, "cold"))
    assert (await hooks.container_state(ctx, "cold")).status is ContainerStatus.RUNNING
    deadline = time.monotonic() + 30
    while len(after := await text(hooks, ctx, "cold")) == seen:
        assert time.monotonic() < deadline, "the checkpointed container stopped printing"
        await asyncio.sleep(0.05)
    assert f"alive {token}" in after[seen:]
    await hooks.container_remove(ctx, "cold")

    # a new container of the same stub, restored: same in-memory token, no start-up
    prepared = await hooks.container_prepare(ctx, spec("warm"))
    state = await hooks.restore(ctx, prepared, image, timeout=300)
    assert state.status is ContainerStatus.RUNNING
    out = await until(hooks, ctx, "warm", "alive")
    assert "starting up" not in out
    assert "READY" not in out
    assert out.splitlines()[0].startswith(f"alive {token} ")
    await hooks.container_kill(ctx, "warm", signal.SIGKILL)


async def test_a_corrupted_checkpoint_starts_cold_and_is_marked_failed(
    gvisor: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    hooks, ctx = gvisor
    await start_container(hooks, ctx, spec("source"))
    await until(hooks, ctx, "source", "READY")
    image = await hooks.checkpoint(ctx, "source", str(tmp_path / "images" / "ck2"), timeout=300)
    await hooks.container_remove(ctx, "source")
    for f in Path(image.path).glob("*"):
        f.write_bytes(b"\0garbage" * 1000)

    db = await open_database(f"sqlite:///{tmp_path / 'levers9.db'}")
    try:
        ws = await WorkspaceStore(db).create("ws")
        store = CheckpointStore(db)
        record = await store.create(ws.id, "gvisor", path=image.path)
        record = await store.set_status(record.id, "available", size_bytes=image.size_bytes)

        started = await start_container(hooks, ctx, spec("next"), checkpoint=record, checkpoints=store)
        assert started.restored_from is None
        assert started.restore_error
        assert started.state.status is ContainerStatus.RUNNING
        await until(hooks, ctx, "next", "starting up")  # a cold start, from the top
        marked = await store.get(record.id)
        assert marked is not None
        assert marked.status == "restore_failed"
        assert marked.error
    finally:
        await db.close()


async def test_restoring_a_missing_image_fails_cleanly(gvisor: tuple[Hooks, RuntimeContext], tmp_path: Path) -> None:
    from levers9.hooks.types import CheckpointImage

    hooks, ctx = gvisor
    prepared = await hooks.container_prepare(ctx, spec("orphan"))
    image = CheckpointImage(checkpoint_id="gone", runtime="gvisor", path=str(tmp_path / "nope"), size_bytes=0)
    with pytest.raises(RestoreFailed, match="missing its image"):
        await hooks.restore(ctx, prepared, image)
    assert (await hooks.container_state(ctx, "orphan")).status is ContainerStatus.UNKNOWN


async def test_criu_on_this_kernel_is_reported_unavailable_and_the_container_keeps_running(
    tmp_path: Path, require: Callable[[str], str]
) -> None:
    require("criu")
    require("runc")
    levers9_criu.clear_cache()
    hooks = Hooks(load_plugins(PluginPolicy()))
    settings = hooks.runtime_settings_model("runc")
    assert settings is not None
    ctx = RuntimeContext(name="runc", settings=settings(bridge=f"l9t{secrets.token_hex(5)}", subnet="10.248.0.0/24",
                         image_cache=str(tmp_path.parent / "image-cache")), state_dir=str(tmp_path / "runc"))  # fmt: skip
    try:
        support = await hooks.checkpoint_support(ctx)
        assert support.mechanism == "criu"
        await start_container(hooks, ctx, ContainerSpec(container_id="c1", image="host", command=["sleep", "600"]))
        if support.available:
            pytest.fail("criu check passes on this host: this test expects the kernel MACHINE.md describes")
        assert "criu check" in (support.reason or "")
        with pytest.raises(CheckpointUnavailable) as info:
            await hooks.checkpoint(ctx, "c1", str(tmp_path / "img"))
        assert info.value.reason == support.reason
        assert (await hooks.container_state(ctx, "c1")).status is ContainerStatus.RUNNING
    finally:
        await hooks.container_remove(ctx, "c1")
        bridge_for(ctx.settings).destroy()
        hooks.close()
