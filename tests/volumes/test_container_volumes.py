"""A volume in runc and gVisor containers: the worker's JuiceFS mount, a volume's directory bound in.

Each runtime's worker squashes every user to the uid its containers' root is on the host
(``RuntimeCapabilities.root_host_uid``): a container's root makes, changes, chmods and removes files
there as their owner, and reads what the controlplane wrote (files of mode 0666/0777 whatever their
owner). Another workspace's container on the same worker, even as root, finds no way to the volume: the
file system's root is not in it, nor its credentials.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import ContainerSpec, ContainerStatus, Mount, RuntimeContext
from levers9.volumes.juicefs import FileSystem, JuiceFsMount, fuse_mounts_below
from levers9.volumes.paths import VolumeRoot

SECRET = "metadata-password-" + secrets.token_hex(4)


@dataclass
class Worker:
    hooks: Hooks
    ctx: RuntimeContext
    mount: JuiceFsMount
    made: list[str]

    async def run(self, script: str, mounts: list[Mount], timeout_s: float = 60) -> str:
        """Run ``sh -c script`` to its end (a deadline of ``timeout_s`` for a hang); its output."""
        cid = f"t-{secrets.token_hex(6)}"
        spec = ContainerSpec(container_id=cid, image="host", command=["sh", "-c", script], mounts=mounts)
        self.made.append(cid)
        prepared = await self.hooks.container_prepare(self.ctx, spec)
        await self.hooks.container_start(self.ctx, prepared)
        deadline = time.monotonic() + timeout_s
        while (await self.hooks.container_state(self.ctx, cid)).status is not ContainerStatus.EXITED:
            assert time.monotonic() < deadline, f"container {cid} did not end"
            await asyncio.sleep(0.05)
        data, offset = b"", 0
        while True:
            chunk = await self.hooks.container_logs(self.ctx, cid, offset)
            data, offset = data + chunk.data, chunk.next_offset
            if chunk.eof:
                return data.decode()


@pytest.fixture(params=["runc", "gvisor"])
async def worker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Worker]:
    name: str = request.param
    binary = "runsc" if name == "gvisor" else "runc"
    if shutil.which(binary) is None:
        pytest.fail(f"{binary} is not installed: apt-get install -y {binary}")
    hooks = Hooks(load_plugins(PluginPolicy()))
    settings = hooks.runtime_settings_model(name)
    assert settings is not None
    bridge = f"l9v{secrets.token_hex(5)}"
    subnet = f"10.{210 + secrets.randbelow(40)}.{secrets.randbelow(250)}.0/24"
    ctx = RuntimeContext(
        name=name,
        settings=settings(bridge=bridge, subnet=subnet, image_cache=str(tmp_path.parent / "image-cache")),
        state_dir=str(tmp_path / name),
    )
    capabilities = await hooks.runtime_capabilities(ctx)
    assert capabilities.available, capabilities.unavailable_reason
    fs = FileSystem(
        metadata_url=f"sqlite3://{tmp_path / 'meta.db'}",
        storage="file",
        bucket=f"{tmp_path / 'data'}/",
        name="test-volumes",
        env={"META_PASSWORD": SECRET},
    )
    await asyncio.to_thread(fs.format)
    mount = await asyncio.to_thread(
        fs.mount, tmp_path / "fs", cache_dir=tmp_path / "cache", owner=capabilities.root_host_uid
    )
    w = Worker(hooks, ctx, mount, [])
    try:
        yield w
    finally:
        for cid in w.made:
            await hooks.container_remove(ctx, cid)
        from levers9.engine.node import bridge_for

        bridge_for(ctx.settings).destroy()
        hooks.close()
        await asyncio.to_thread(mount.stop)
    assert fuse_mounts_below(tmp_path) == []


async def test_a_containers_root_owns_its_volume_and_reads_what_the_controlplane_wrote(worker: Worker) -> None:
    volume = worker.mount.target / "ws_a" / "vol_1"
    volume.mkdir(parents=True)
    volume.chmod(0o777)
    with VolumeRoot(volume).open_write("inputs/data.txt") as out:  # as the controlplane writes (cp)
        out.write(b"uploaded\n")
    script = (
        "set -e; cat /data/inputs/data.txt; echo more >> /data/inputs/data.txt; python3 -c '"
        'import os, json; os.makedirs("/data/out/deep"); open("/data/out/deep/f", "w").write("made\\n"); '
        'os.chmod("/data/out/deep/f", 0o600); os.utime("/data/out/deep/f", (0, 1577836800)); '
        'os.rename("/data/out/deep/f", "/data/out/g"); os.rmdir("/data/out/deep"); st = os.stat("/data/out/g"); '
        'print(json.dumps({"uid": st.st_uid, "mode": oct(st.st_mode & 0o777), "mtime": st.st_mtime}))\''
    )
    text = await worker.run(script, [Mount(source=str(volume), target="/data", read_only=False, idmap=False)])
    assert "uploaded" in text, text
    made = json.loads(text.strip().splitlines()[-1])
    assert made == {"uid": 0, "mode": "0o600", "mtime": 1577836800}, text  # the container's root owns what it made
    assert (volume / "inputs" / "data.txt").read_text() == "uploaded\nmore\n"
    assert (volume / "out" / "g").read_text() == "made\n"


async def test_another_workspaces_container_cannot_reach_the_volume(worker: Worker) -> None:
    mine = worker.mount.target / "ws_a" / "vol_1"
    mine.mkdir(parents=True)
    (mine / "secret.txt").write_text("workspace a's\n")
    theirs = worker.mount.target / "ws_b" / "vol_2"
    theirs.mkdir(parents=True)
    # the other workspace's container, as root, looks everywhere it can for the file, its mount and its keys
    script = (
        # the image is the host's: its system and checkout directories are left out of the search (slow in a
        # gVisor sandbox on a loaded machine; they hold nothing a worker mounts)
        'grep -rl "workspace a\'s" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=work '
        "--exclude-dir=lib 2>/dev/null | head -5; "
        "ls /data; cat /proc/mounts; env; "
        "for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; cat $p/environ 2>/dev/null | tr '\\0' ' '; echo; done; "
        "mount -t fuse.juicefs x /mnt 2>&1; mount --bind / /mnt 2>&1; ls /mnt | head -3; echo END"
    )
    text = await worker.run(
        script, [Mount(source=str(theirs), target="/data", read_only=False, idmap=False)], timeout_s=600
    )
    assert "END" in text, text
    assert "secret.txt" not in text, text
    assert "workspace a's" not in text.replace(script, ""), text
    assert "ws_a" not in text, text
    assert SECRET not in text, text
    assert str(worker.mount.target) not in text, text
