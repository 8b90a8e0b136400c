"""Containers run for real under runc and gVisor (runsc), through the hook spec and the plugin manager.

Every test removes what it made, and a fixture checks afterwards that nothing
is left: no mount, cgroup, network namespace, shim, forwarder or directory.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, RuntimeContext

RUNTIMES = ["runc", "gvisor"]


@dataclass
class Box:
    hooks: Hooks
    ctx: RuntimeContext
    made: list[str]

    async def run(self, command: list[str], **kw: Any) -> str:
        cid = f"t-{secrets.token_hex(6)}"
        spec = ContainerSpec(container_id=cid, image="host", command=command, **kw)
        self.made.append(cid)
        prepared = await self.hooks.container_prepare(self.ctx, spec)
        await self.hooks.container_start(self.ctx, prepared)
        return cid

    async def wait(self, cid: str, timeout: float = 60) -> ContainerState:
        """Until the container exits (a deadline for a hang, not a timing assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            state = await self.hooks.container_state(self.ctx, cid)
            if state.status is ContainerStatus.EXITED:
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"container {cid} still {state.status} after {timeout} s")
            await asyncio.sleep(0.05)

    async def output(self, cid: str) -> str:
        data, offset = b"", 0
        while True:
            chunk = await self.hooks.container_logs(self.ctx, cid, offset)
            data += chunk.data
            offset = chunk.next_offset
            if chunk.eof:
                return data.decode()
            await asyncio.sleep(0.02)


def leftovers(state_dir: Path, ids: list[str], bridge: str) -> list[str]:
    found = []
    mounts = Path("/proc/self/mountinfo").read_text()
    if str(state_dir) in mounts:
        found.append("a mount under the state dir")
    for cid in ids:
        for cg in Path("/sys/fs/cgroup").glob(f"*/levers9/{cid}"):
            found.append(f"cgroup {cg}")
        if (state_dir / "containers" / cid).exists():
            found.append(f"directory of {cid}")
        ps = subprocess.run(["pgrep", "-f", cid], capture_output=True, text=True, check=False).stdout.split()
        if ps:
            found.append(f"processes {ps} mentioning {cid}")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    found += [f"veth {line.split(':')[1].strip()}" for line in links.splitlines() if f"master {bridge}" in line]
    return found + ([f"netns left: {netns}"] if any(f"l9-{c}" in netns for c in ids) else [])


@pytest.fixture(params=RUNTIMES)
async def box(request: pytest.FixtureRequest, tmp_path: Path, require: Callable[[str], str]) -> AsyncIterator[Box]:
    name: str = request.param
    require("runsc" if name == "gvisor" else "runc")
    hooks = Hooks(load_plugins(PluginPolicy()))
    bridge = f"l9t{secrets.token_hex(5)}"
    subnet = f"10.{210 + secrets.randbelow(40)}.{secrets.randbelow(250)}.0/24"
    settings = hooks.runtime_settings_model(name)
    assert settings is not None
    cache = tmp_path.parent / "image-cache"  # shared by the tests of this session's worker: unpacked once
    ctx = RuntimeContext(
        name=name,
        settings=settings(bridge=bridge, subnet=subnet, image_cache=str(cache)),
        state_dir=str(tmp_path / name),
    )
    b = Box(hooks, ctx, [])
    try:
        yield b
    finally:
        for cid in b.made:
            await hooks.container_remove(ctx, cid)
        from levers9.engine.node import bridge_for

        bridge_for(ctx.settings).destroy()
        hooks.close()
    left = leftovers(tmp_path / name, b.made, bridge)
    assert not left, f"left behind: {left}"


async def test_exit_code_and_output(box: Box) -> None:
    cid = await box.run(["python3", "-c", "import sys; print('hello from', sys.argv[0]); sys.exit(3)"])
    state = await box.wait(cid)
    assert state.exit_code == 3
    assert not state.oom_killed
    assert "hello from -c" in await box.output(cid)


async def test_environment_and_secrets_are_inside(box: Box) -> None:
    env = {"GREETING": "hi there", "LEVERS9_SECRET_TOKEN": "s3cr3t-value"}
    cid = await box.run(["python3", "-c", "import os, json; print(json.dumps(dict(os.environ)))"], env=env)
    assert (await box.wait(cid)).exit_code == 0
    inside = json.loads((await box.output(cid)).strip().splitlines()[-1])
    assert inside["GREETING"] == "hi there"
    assert inside["LEVERS9_SECRET_TOKEN"] == "s3cr3t-value"
    assert inside["HOSTNAME"] == cid


async def test_kill_a_running_container(box: Box) -> None:
    cid = await box.run(["sleep", "600"])
    assert (await box.hooks.container_state(box.ctx, cid)).status is ContainerStatus.RUNNING
    await box.hooks.container_kill(box.ctx, cid, signal.SIGKILL)
    state = await box.wait(cid)
    assert state.exit_code == 128 + signal.SIGKILL
    assert not state.oom_killed
    await box.hooks.container_kill(box.ctx, cid, signal.SIGKILL)  # killing an exited container succeeds


async def test_the_memory_limit_is_enforced_and_reported(box: Box) -> None:
    code = "x = bytearray(400 * 1024 * 1024); print('allocated', len(x))"
    cid = await box.run(["python3", "-c", code], memory_mib=96)
    state = await box.wait(cid)
    assert "allocated" not in await box.output(cid)
    assert state.exit_code != 0
    assert state.oom_killed, f"exit {state.exit_code} was not reported as an OOM kill"


async def test_a_forwarded_port_is_reachable(box: Box) -> None:
    server = "import http.server as h; h.HTTPServer(('0.0.0.0', 8000), h.SimpleHTTPRequestHandler).serve_forever()"
    cid = await box.run(["python3", "-c", server], ports=[8000], workdir="/etc")
    state = await box.hooks.container_state(box.ctx, cid)
    assert state.address is not None

    def get() -> bytes:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{state.address}/passwd", timeout=5) as response:
                    return bytes(response.read())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    assert await asyncio.to_thread(get)  # /etc/passwd served from inside the container


async def test_remove_kills_a_running_container_and_is_idempotent(box: Box) -> None:
    cid = await box.run(["sleep", "600"])
    await box.hooks.container_remove(box.ctx, cid)
    await box.hooks.container_remove(box.ctx, cid)
    state = await box.hooks.container_state(box.ctx, cid)
    assert state.status is ContainerStatus.UNKNOWN


async def test_network_none_has_only_loopback(box: Box) -> None:
    code = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    cid = await box.run(["python3", "-c", code], network="none")
    assert (await box.wait(cid)).exit_code == 0
    assert (await box.output(cid)).strip().splitlines()[-1] == "['lo']"
