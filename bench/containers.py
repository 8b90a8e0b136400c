"""Container start-up through levers9 against the bare runtime, and restore against cold start.

1. Start latency: for runc and gVisor, a container running ``true`` from the
   same prepared bundle, started bare (``runc run`` / ``runsc run`` in the
   foreground, until it exits) and through levers9's hooks (``container_start``
   until the container is seen exited). Preparing (overlay mount, network
   namespace, config) is timed separately: it happens before a task is due,
   and the bare run reuses what it built.
2. Restore: a gVisor container whose start-up sleeps 5 s and then builds its
   state, cold (prepare + start until it prints READY) against restored from a
   checkpoint (prepare + restore until it prints its steady-state line).

Run: ``.venv/bin/python bench/containers.py`` (as root; ``--help`` for options).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from levers9.engine.node import bridge_for
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerStatus, RuntimeContext

APP = """
import secrets, time
print("starting up", flush=True)
time.sleep(5)
token = secrets.token_hex(8)
print("READY", token, flush=True)
while True:
    print("alive", token, flush=True)
    time.sleep(0.1)
"""


def context(hooks: Hooks, name: str, root: Path) -> RuntimeContext:
    settings = hooks.runtime_settings_model(name)
    assert settings is not None
    return RuntimeContext(
        name=name,
        settings=settings(bridge="l9bench", subnet="10.247.0.0/24", image_cache=str(root / "images")),
        state_dir=str(root / name),
    )


async def wait_exit(hooks: Hooks, ctx: RuntimeContext, cid: str) -> None:
    while (await hooks.container_state(ctx, cid)).status is not ContainerStatus.EXITED:
        await asyncio.sleep(0.002)


async def wait_log(hooks: Hooks, ctx: RuntimeContext, cid: str, needle: str) -> None:
    while needle not in (await hooks.container_logs(ctx, cid, 0)).data.decode():
        await asyncio.sleep(0.005)


async def start_latency(hooks: Hooks, ctx: RuntimeContext, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"bare": [], "levers9": [], "prepare": []}
    binary = ctx.name == "gvisor"
    for i in range(runs):
        cid = f"b-{secrets.token_hex(4)}"
        spec = ContainerSpec(container_id=cid, image="host", command=["true"], network="none")
        t0 = time.perf_counter()
        prepared = await hooks.container_prepare(ctx, spec)
        times["prepare"].append(time.perf_counter() - t0)
        # bare: the same bundle, the runtime binary with the same global flags, in the foreground
        from levers9.engine.runc import engine as runc_engine
        from levers9_gvisor import engine as gvisor_engine

        engine = gvisor_engine(ctx) if binary else runc_engine(ctx)
        argv = [*engine._argv(cid), "run", "--bundle", str(prepared.bundle_dir), f"{cid}-bare"]
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times["bare"].append(time.perf_counter() - t0)
        subprocess.run([*engine._argv(cid), "delete", "--force", f"{cid}-bare"], capture_output=True, check=False)
        t0 = time.perf_counter()
        await hooks.container_start(ctx, prepared)
        await wait_exit(hooks, ctx, cid)
        times["levers9"].append(time.perf_counter() - t0)
        await hooks.container_remove(ctx, cid)
        print(
            f"  {ctx.name} run {i + 1}: bare {times['bare'][-1] * 1000:.0f} ms, levers9 "
            f"{times['levers9'][-1] * 1000:.0f} ms",
            file=sys.stderr,
        )
    return times


async def restore_vs_cold(hooks: Hooks, ctx: RuntimeContext, root: Path, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"cold": [], "restore": [], "checkpoint": []}
    for i in range(runs):
        cold, warm = f"cold-{secrets.token_hex(3)}", f"warm-{secrets.token_hex(3)}"
        spec = ContainerSpec(container_id=cold, image="host", command=["python3", "-c", APP], network="none")
        t0 = time.perf_counter()
        await hooks.container_start(ctx, await hooks.container_prepare(ctx, spec))
        await wait_log(hooks, ctx, cold, "READY")
        times["cold"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        image = await hooks.checkpoint(ctx, cold, str(root / "checkpoints" / cold), timeout=300)
        times["checkpoint"].append(time.perf_counter() - t0)
        await hooks.container_remove(ctx, cold)
        t0 = time.perf_counter()
        prepared = await hooks.container_prepare(ctx, spec.model_copy(update={"container_id": warm}))
        await hooks.restore(ctx, prepared, image, timeout=300)
        await wait_log(hooks, ctx, warm, "alive")
        times["restore"].append(time.perf_counter() - t0)
        await hooks.container_remove(ctx, warm)
        print(
            f"  restore run {i + 1}: cold {times['cold'][-1]:.2f} s, restore {times['restore'][-1]:.3f} s, "
            f"image {image.size_bytes / 1e6:.1f} MB",
            file=sys.stderr,
        )
    return times


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    versions = []
    for tool in ("runc", "runsc"):
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()
        versions.append(out[0] if out else f"{tool}: missing")
    return f"{cpu}, {os.cpu_count()} cores; {'; '.join(versions)}; kernel {platform.release()}"


async def main(runs: int, restores: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="l9-bench-ct-"))
    hooks = Hooks(load_plugins(PluginPolicy()))
    contexts = [context(hooks, name, root) for name in ("runc", "gvisor")]
    try:
        print(f"- machine: {machine()}")
        print(f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; median of {runs} runs\n")
        print("| runtime | bare run of `true` | through levers9 | ratio | prepare (not in either) |")
        print("|--|--:|--:|--:|--:|")
        for ctx in contexts:
            t = await start_latency(hooks, ctx, runs)
            bare, ours, prep = (statistics.median(t[k]) for k in ("bare", "levers9", "prepare"))
            print(
                f"| {ctx.name} | {bare * 1000:.0f} ms | {ours * 1000:.0f} ms | {ours / bare:.2f}x | {prep * 1000:.0f} ms |"
            )
        t = await restore_vs_cold(hooks, contexts[1], root, restores)
        cold, warm, ck = (statistics.median(t[k]) for k in ("cold", "restore", "checkpoint"))
        print("\n| gVisor, 5 s start-up | cold start | restore | speed-up | checkpoint (container keeps running) |")
        print("|--|--:|--:|--:|--:|")
        print(f"| median of {restores} | {cold:.2f} s | {warm:.3f} s | {cold / warm:.1f}x | {ck:.2f} s |")
    finally:
        for ctx in contexts:
            for cdir in (Path(ctx.state_dir) / "containers").glob("*"):
                await hooks.container_remove(ctx, cdir.name)
        bridge_for(contexts[0].settings).destroy()
        hooks.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--restores", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.restores))
