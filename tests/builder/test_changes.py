"""What a container changed, as an OCI layer: ``levers9_container_changes`` on real runc and runsc.

A container on the Debian base writes files (as root and as uid 1000), deletes a base file, replaces a
base directory whole, makes a symlink and a hard link, and has a read-only bind mount; the layer tar
the hook writes must hold exactly its changes in OCI form, with owners as the container saw them (runc
runs it in a user namespace where this host allows it, so on disk they are shifted), and nothing of
the mount point the runtime made.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import tarfile
import time
from pathlib import Path

import pytest

from levers9.builder.build import BaseImage
from levers9.builder.layout import write_layout
from levers9.hooks.errors import InvalidRequest
from levers9.hooks.types import ContainerSpec, ContainerStatus, Mount
from tests.builder.conftest import Box

SCRIPT = """
set -e
mkdir -p /opt/made/sub
echo hello > /opt/made/file
ln -s file /opt/made/link
ln /opt/made/file /opt/made/hard
echo mine > /opt/made/sub/user-file
chown -R 1000:1000 /opt/made/sub
rm /etc/debian_version
rm -rf /etc/apt/apt.conf.d
mkdir /etc/apt/apt.conf.d
echo 'APT::Quiet "1";' > /etc/apt/apt.conf.d/10quiet
cat /run/mounted/value
"""


async def run_to_exit(box: Box, spec: ContainerSpec) -> None:
    prepared = await box.hooks.container_prepare(box.runtime, spec)
    await box.hooks.container_start(box.runtime, prepared)
    deadline = time.monotonic() + 120
    while (
        state := await box.hooks.container_state(box.runtime, spec.container_id)
    ).status is not ContainerStatus.EXITED:
        if time.monotonic() > deadline:
            pytest.fail(f"container {spec.container_id} did not exit within 120 s")
        await asyncio.sleep(0.05)
    output = (await box.hooks.container_logs(box.runtime, spec.container_id, 0)).data.decode()
    assert state.exit_code == 0, output


async def test_hook_changes_of_real_containers(box: Box, base: BaseImage, tmp_path: Path) -> None:
    image = tmp_path / "image"
    write_layout(
        image,
        base.layers,
        {"architecture": "amd64", "os": "linux", "config": {"Env": list(base.env)}},
        with_blobs=False,
    )
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "value").write_text("from the host\n")
    cid = f"t-{secrets.token_hex(6)}"
    spec = ContainerSpec(
        container_id=cid,
        image=str(image),
        command=["/bin/sh", "-c", SCRIPT],
        network="none",
        mounts=[Mount(source=str(mounted), target="/run/mounted", read_only=True)],
    )
    box.extra.append(cid)
    with pytest.raises(InvalidRequest, match="unknown"):
        await box.hooks.container_changes(box.runtime, cid, str(tmp_path / "early.tar"))
    await run_to_exit(box, spec)
    dest = tmp_path / "layer.tar"
    diff = await box.hooks.container_changes(box.runtime, cid, str(dest))
    assert diff is not None
    data = dest.read_bytes()
    assert diff.diff_id == f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert diff.size_bytes == len(data)
    with tarfile.open(dest) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(members["opt/made/file"]).read() == b"hello\n"  # type: ignore[union-attr]
    names = list(members)
    assert names.index("opt/made") < names.index("opt/made/file"), "a directory comes before what it holds"
    assert members["opt/made/link"].issym()
    assert members["opt/made/link"].linkname == "file"
    hard = [members["opt/made/file"], members["opt/made/hard"]]
    assert sorted(m.type for m in hard) == sorted([tarfile.REGTYPE, tarfile.LNKTYPE]), "one file, one link to it"
    # owners as the container saw them, whatever user namespace it had
    assert (members["opt/made/file"].uid, members["opt/made/file"].gid) == (0, 0)
    assert (members["opt/made/sub/user-file"].uid, members["opt/made/sub"].gid) == (1000, 1000)
    assert all(m.uid in (0, 1000, 42) for m in members.values()), {m.name: m.uid for m in members.values()}
    # a deleted file is a whiteout; a directory replaced whole is opaque
    assert members["etc/.wh.debian_version"].isreg()
    assert members["etc/.wh.debian_version"].size == 0
    assert "etc/debian_version" not in members
    assert "etc/apt/apt.conf.d/.wh..wh..opq" in members
    assert "etc/apt/apt.conf.d/10quiet" in members
    # the runtime's mount point is not the container's change, nor is anything of the mount
    assert not [n for n in names if n.startswith("run/mounted")], names
    # a second container started from the layer sees the changes
    store = box.store
    store.add_layer(dest, diff.diff_id)
    top = tmp_path / "top"
    from levers9.builder.layout import Layer

    write_layout(
        top,
        [*base.layers, Layer(diff_id=diff.diff_id)],
        {"architecture": "amd64", "os": "linux", "config": {"Env": list(base.env)}},
        with_blobs=False,
    )
    # (python rather than ls: the runsc Debian ships answers coreutils' statx with EINVAL)
    check = (
        "import os; assert not os.path.exists('/etc/debian_version'); "
        "s = os.stat('/opt/made/sub/user-file'); print(s.st_uid, s.st_gid, os.listdir('/etc/apt/apt.conf.d'))"
    )
    again = f"t-{secrets.token_hex(6)}"
    box.extra.append(again)
    await run_to_exit(
        box, ContainerSpec(container_id=again, image=str(top), network="none", command=["python3", "-c", check])
    )
    listing = (await box.hooks.container_logs(box.runtime, again, 0)).data.decode()
    assert listing.strip() == "1000 1000 ['10quiet']", listing


async def test_a_running_container_is_paused_while_its_changes_are_read(
    box: Box, base: BaseImage, tmp_path: Path
) -> None:
    """It keeps running: it counts on after the read, and the layer holds what it had written by then."""
    image = tmp_path / "image"
    write_layout(
        image,
        base.layers,
        {"architecture": "amd64", "os": "linux", "config": {"Env": list(base.env)}},
        with_blobs=False,
    )
    cid = f"t-{secrets.token_hex(6)}"
    box.extra.append(cid)
    count = "echo made > /made; i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"
    spec = ContainerSpec(container_id=cid, image=str(image), command=["sh", "-c", count], network="none")
    await box.hooks.container_start(box.runtime, await box.hooks.container_prepare(box.runtime, spec))
    counted = await _lines_after(box, cid, 0)
    diff = await box.hooks.container_changes(box.runtime, cid, str(tmp_path / "layer.tar"))
    assert diff is not None
    with tarfile.open(tmp_path / "layer.tar") as tar:
        assert tar.extractfile("made").read() == b"made\n"  # type: ignore[union-attr]
    await _lines_after(box, cid, counted)  # resumed: it counts on
    assert (await box.hooks.container_state(box.runtime, cid)).status is ContainerStatus.RUNNING


async def _lines_after(box: Box, cid: str, seen: int) -> int:
    """Wait until the container's output has more than ``seen`` lines; how many it has."""
    for _ in range(600):
        lines = (await box.hooks.container_logs(box.runtime, cid, 0)).data.decode().split()
        if len(lines) > seen + 2:
            return len(lines)
        await asyncio.sleep(0.05)
    raise AssertionError(f"container {cid} printed no more than {seen} lines in 30 s")


async def test_the_process_runtime_cannot_say_what_changed(plain_box: Box, tmp_path: Path) -> None:
    assert not plain_box.hooks.captures_changes(plain_box.runtime)
    assert await plain_box.hooks.container_changes(plain_box.runtime, "any", str(tmp_path / "layer.tar")) is None


def test_gvisor_writes_its_root_filesystem_through_to_the_host(tmp_path: Path) -> None:
    """Newer runsc builds keep root writes in memory by default; levers9 asks for them on the host."""
    import levers9_gvisor
    from levers9.hooks.types import RuntimeContext

    info = levers9_gvisor.inspect_runsc("runsc")
    assert info.overlay2, "this machine's runsc has the -overlay2 flag"
    engine = levers9_gvisor.engine(RuntimeContext(name="gvisor", settings=None, state_dir=str(tmp_path)))
    argv = engine.flavor.argv
    assert argv[argv.index("--overlay2") + 1] == "none"
