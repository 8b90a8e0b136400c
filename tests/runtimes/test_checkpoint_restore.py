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
from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.publish import publish
from levers9.checkpoint.restore import start_container
from levers9.checkpoint.storage import LocalStorage
from levers9.engine.node import bridge_for
from levers9.hooks.errors import CheckpointUnavailable, RestoreFailed
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerStatus, RuntimeContext
from levers9.state.sql.checkpoints import CheckpointStore
from levers9.state.sql.database import open_database
from levers9.state.sql.workspaces import WorkspaceStore

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
    import subprocess

    left = subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True, check=False).stdout
    assert not left.strip(), f"processes left behind: {left}"


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

    db = await open_database(f"sqlite:///{tmp_path / 'levers9.db'}")
    try:
        ws = await WorkspaceStore(db).create("ws")
        store = CheckpointStore(db)
        storage, cache = LocalStorage(tmp_path / "storage"), NodeCache(tmp_path / "cache", max_bytes=10**10)
        record = await publish(
            image, workspace_id=ws.id, stub_id=None, task_id=None, gpu=None, store=store, storage=storage, cache=cache
        )
        assert record.status == "available"
        for f in cache.path_for(record.id).glob("*"):  # the node's copy goes bad
            f.write_bytes(b"\0garbage" * 1000)

        started = await start_container(
            hooks, ctx, spec("next"), checkpoint=record, checkpoints=store, storage=storage, cache=cache
        )
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


async def test_a_published_checkpoint_is_restored_from_storage_on_another_node(
    gvisor: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    hooks, ctx = gvisor
    await start_container(hooks, ctx, spec("origin"))
    token = (await until(hooks, ctx, "origin", "READY")).split("READY ", 1)[1].split()[0]
    image = await hooks.checkpoint(ctx, "origin", str(tmp_path / "images" / "ck3"), timeout=300)
    db = await open_database(f"sqlite:///{tmp_path / 'levers9.db'}")
    try:
        ws = await WorkspaceStore(db).create("ws")
        store, storage = CheckpointStore(db), LocalStorage(tmp_path / "storage")
        record = await publish(
            image,
            workspace_id=ws.id,
            stub_id=None,
            task_id=None,
            gpu=None,
            store=store,
            storage=storage,
            cache=NodeCache(tmp_path / "cache-a", max_bytes=10**10),
        )
        other_node = NodeCache(tmp_path / "cache-b", max_bytes=10**10)  # empty: the image must be downloaded
        started = await start_container(
            hooks, ctx, spec("elsewhere"), checkpoint=record, checkpoints=store, storage=storage, cache=other_node
        )
        assert started.restored_from == record.id
        assert other_node.has(record.id)
        out = await until(hooks, ctx, "elsewhere", "alive")
        assert "starting up" not in out
        assert f"alive {token}" in out.splitlines()[0]
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
    ctx = RuntimeContext(
        name="runc",
        settings=settings(
            bridge=f"l9t{secrets.token_hex(5)}",
            subnet="10.248.0.0/24",
            image_cache=str(tmp_path.parent / "image-cache"),
        ),
        state_dir=str(tmp_path / "runc"),
    )
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


READY_APP = """
import os, secrets, time
print("starting up", flush=True)
time.sleep(2)
token = secrets.token_hex(8)
open(os.environ["LEVERS9_READY_FILE"], "w").close()
while True:
    print("alive", token, flush=True)
    time.sleep(0.1)
"""


async def test_the_worker_checkpoints_once_the_container_says_it_is_ready(
    gvisor: tuple[Hooks, RuntimeContext], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from levers9.checkpoint.restore import checkpoint_when_ready, with_ready_signal

    caplog.set_level("INFO")
    hooks, ctx = gvisor
    base = ContainerSpec(container_id="app", image="host", command=["python3", "-c", READY_APP], network="none")
    signals = tmp_path / "signals" / "app"
    spec_ready = with_ready_signal(base, signals)
    await start_container(hooks, ctx, spec_ready)
    image = await checkpoint_when_ready(
        hooks, ctx, spec_ready, host_dir=signals, image_dir=tmp_path / "images" / "app", free_bytes=10**12
    )
    assert image is not None, (
        f"{caplog.text} / state {await hooks.container_state(ctx, 'app')} / {await text(hooks, ctx, 'app')}"
    )
    assert (signals / "ready").exists()
    assert (await hooks.container_state(ctx, "app")).status is ContainerStatus.RUNNING
    token = (await until(hooks, ctx, "app", "alive")).split("alive ", 1)[1].split()[0]

    prepared = await hooks.container_prepare(
        ctx, with_ready_signal(base.model_copy(update={"container_id": "app2"}), tmp_path / "signals" / "app2")
    )
    await hooks.restore(ctx, prepared, image, timeout=300)
    out = await until(hooks, ctx, "app2", "alive")
    assert "starting up" not in out
    assert out.splitlines()[0] == f"alive {token}"


async def test_no_checkpoint_when_the_container_ends_before_it_is_ready(
    gvisor: tuple[Hooks, RuntimeContext], tmp_path: Path
) -> None:
    from levers9.checkpoint.restore import checkpoint_when_ready, with_ready_signal

    hooks, ctx = gvisor
    spec_ready = with_ready_signal(
        ContainerSpec(container_id="quits", image="host", command=["true"], network="none"), tmp_path / "sig"
    )
    await start_container(hooks, ctx, spec_ready)
    image = await checkpoint_when_ready(
        hooks, ctx, spec_ready, host_dir=tmp_path / "sig", image_dir=tmp_path / "img", free_bytes=10**12
    )
    assert image is None
    assert not (tmp_path / "img").exists()
