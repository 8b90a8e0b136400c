"""Volumes on a real `levers9 up`: calls write and read one volume's files, `levers9 cp/ls/rm` reach them too.

The user's way: ``levers9.Volume(name, mount_path)`` in a function's ``volumes=``; the volume is made on
the first call, the worker mounts the volumes' JuiceFS file system (SQLite metadata and a data directory in
``up``'s data directory) and binds the volume's directory into the container. The CLI reaches the same
files through the controlplane's own mount. Nothing may stay mounted once `up` has stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fixtures.levers9_up import Up
from tests.fixtures.volume_apps import MEET

APP = """\
import json
import os
import levers9

weights = levers9.Volume(name="weights", mount_path="/data/weights")


@levers9.function(volumes=[weights], memory=256)
def write(name: str, text: str) -> int:
    os.makedirs("/data/weights/out", exist_ok=True)
    with open(f"/data/weights/out/{{name}}", "w") as f:
        f.write(text)
    return os.getuid()


@levers9.function(volumes=[weights], memory=256)
def read(name: str) -> dict:
    with open(f"/data/weights/{{name}}", "rb") as f:
        text = f.read().decode(errors="replace")
    return {{"text": text, "listing": sorted(os.listdir("/data/weights"))}}


def main() -> None:
    uid = write.remote("a.txt", "{marker}")
    print(json.dumps({{"uid": uid, "read": read.remote("out/a.txt"), "uploaded": read.remote("up/in.bin")["text"][:8]}}))
"""


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_calls_and_the_cli_share_a_volumes_files(levers9_up: Up, runtime: str, tmp_path: Path) -> None:
    levers9_up.use_runtime(runtime)
    levers9_up.start()
    # the CLI first: a volume made by hand, a file copied in (read by a call below), listed and read back
    made = levers9_up.levers9("volume", "create", "weights")
    assert made.returncode == 0, made.stderr
    upload = tmp_path / "in.bin"
    upload.write_bytes(b"uploaded" + os.urandom(3 * 1024 * 1024))
    done = levers9_up.levers9("cp", str(upload), "weights:up/")
    assert done.returncode == 0, done.stderr
    app = levers9_up.root / "volume_app.py"
    app.write_text(APP.format(marker="written by a call"))
    run = levers9_up.levers9("run", f"{app.name}::main", timeout=600)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- up:\n{levers9_up.log()[-4000:]}"
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["read"]["text"] == "written by a call"
    assert answer["read"]["listing"] == ["out", "up"]
    assert answer["uploaded"] == "uploaded"
    listed = levers9_up.levers9("ls", "weights:", "-r", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(e["path"] for e in json.loads(listed.stdout)) == ["out/a.txt", "up/in.bin"]
    back = tmp_path / "back"
    back.mkdir()
    done = levers9_up.levers9("cp", "weights:up/in.bin", str(back))
    assert done.returncode == 0, done.stderr
    assert hashlib.sha256((back / "in.bin").read_bytes()).digest() == hashlib.sha256(upload.read_bytes()).digest()
    for escaping in ("weights:../x", "weights:/../../etc/passwd"):
        refused = levers9_up.levers9("ls", escaping)
        assert refused.returncode == 1, refused.stderr
        assert "leads out of the volume" in refused.stderr
    gone = levers9_up.levers9("rm", "-r", "weights:out")
    assert gone.returncode == 0, gone.stderr
    assert "removed 2 entries" in gone.stdout
    missing = levers9_up.levers9("ls", "nope:")
    assert missing.returncode == 1, missing.stderr
    assert "volume 'nope' does not exist" in missing.stderr
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []


def test_a_pool_that_reaches_volumes_through_the_controlplane_mounts_them_over_webdav(
    levers9_up: Up, tmp_path: Path
) -> None:
    """volume_access: controlplane: the worker holds no credential of the file system, only a token per volume."""
    levers9_up.use_runtime("runc")
    levers9_up.home.mkdir(parents=True, exist_ok=True)
    config = levers9_up.config_text().replace("    builds:", "    volume_access: controlplane\n    builds:", 1)
    (levers9_up.home / "levers9.yaml").write_text(config)
    levers9_up.start()
    upload = tmp_path / "in.bin"
    upload.write_bytes(b"uploaded" + os.urandom(1024 * 1024))
    assert levers9_up.levers9("volume", "create", "weights").returncode == 0
    done = levers9_up.levers9("cp", str(upload), "weights:up/")
    assert done.returncode == 0, done.stderr
    app = levers9_up.root / "volume_app.py"
    app.write_text(APP.format(marker="written over webdav"))
    run = levers9_up.levers9("run", f"{app.name}::main", timeout=600)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- up:\n{levers9_up.log()[-4000:]}"
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert answer["read"]["text"] == "written over webdav"
    assert answer["uploaded"] == "uploaded"
    # what the call closed is on the volume when its outcome comes back: the worker waited for the upload
    back = tmp_path / "a.txt"
    done = levers9_up.levers9("cp", "weights:out/a.txt", str(back))
    assert done.returncode == 0, done.stderr
    assert back.read_text() == "written over webdav"
    # the worker mounted the volume with rclone (the call's container is kept warm, so its mount is still up),
    # the token in rclone's environment only; no juicefs runs for the worker
    procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    rclones = [p for p in procs if _cmdline(p).split(" ")[0].endswith("rclone") and str(levers9_up.root) in _cmdline(p)]
    assert rclones, "no rclone mount serves the worker"
    for p in rclones:
        assert "TOKEN" not in _cmdline(p).upper()
        assert b"RCLONE_CONFIG_VOLUME_BEARER_TOKEN=" in (p / "environ").read_bytes()
    juicefs = [_cmdline(p) for p in procs if "juicefs" in _cmdline(p) and str(levers9_up.root) in _cmdline(p)]
    assert all("/volumes/mnt" in c for c in juicefs), juicefs  # the controlplane's own mount alone
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


TWO_POOLS = """\
version: 1
scheduler:
  worker_keepalive_s: 3
  reconcile_interval_s: 5
  register_timeout_s: 60
pools:
  direct:
    provider: local
    runtime: runc
    cpu: 1
    memory: 2048
    min_workers: 1
    max_workers: 1
  webdav:
    provider: local
    runtime: runc
    cpu: 1
    memory: 2048
    min_workers: 1
    max_workers: 1
    volume_access: controlplane
"""


def test_two_calls_on_two_workers_one_direct_and_one_over_webdav_share_a_file(levers9_up: Up) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.home.mkdir(parents=True, exist_ok=True)
    (levers9_up.home / "levers9.yaml").write_text(TWO_POOLS)
    levers9_up.start(wait_workers=2)
    app = levers9_up.root / "meet_app.py"
    app.write_text(MEET)
    run = levers9_up.levers9("run", f"{app.name}::main", timeout=600)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- up:\n{levers9_up.log()[-4000:]}"
    answers = json.loads(run.stdout.strip().splitlines()[-1])
    assert [(a["me"], a["read"], a["whole"]) for a in answers] == [
        ("a", "from b from ", len("from b ") * 1000),
        ("b", "from a from ", len("from a ") * 1000),
    ]
    workers = levers9_up.workers()
    assert sorted(str(w["pool"]) for w in workers) == ["direct", "webdav"]
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []
