"""A sandbox mounts its workspace's volumes, as a call's container does (issue 39's ``volumes=``).

A real `levers9 up` with a runc pool running sandboxes; the volume is made and filled with the CLI, a
sandbox reads and writes it, and the CLI sees what the sandbox wrote. Both ways a worker reaches volumes:
mounting the volumes' file system itself (``direct``, the local pool's default) and each volume over the
controlplane's WebDAV with a token for that worker and volume alone (``controlplane``).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("access", ["direct", "controlplane"])
def test_a_sandbox_reads_and_writes_its_workspaces_volume(levers9_up: Up, access: str, tmp_path: Path) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.sandboxes = 2
    levers9_up.home.mkdir(parents=True, exist_ok=True)
    config = levers9_up.config_text().replace("    builds:", f"    volume_access: {access}\n    builds:", 1)
    (levers9_up.home / "levers9.yaml").write_text(config)
    levers9_up.start()
    assert levers9_up.levers9("volume", "create", "shared").returncode == 0
    (tmp_path / "in.txt").write_text("put there by the CLI")
    done = levers9_up.levers9("cp", str(tmp_path / "in.txt"), "shared:")
    assert done.returncode == 0, done.stderr
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{levers9_up.http_port}/api/v1",
        headers={"authorization": f"Bearer {levers9_up.token()}"},
        timeout=120,
    )
    made = client.post("/sandboxes", json={"volumes": [{"name": "shared", "mount_path": "/data"}], "timeout_s": 120})
    assert made.status_code == 201, f"{made.text}\n--- up:\n{levers9_up.log()[-3000:]}"
    sid = made.json()["id"]
    read = client.get(f"/sandboxes/{sid}/files", params={"path": "/data/in.txt"})
    assert read.content == b"put there by the CLI", read.text
    script = "cat /data/in.txt > /data/from-sandbox.txt && echo ' and copied by a sandbox' >> /data/from-sandbox.txt"
    started = client.post(f"/sandboxes/{sid}/processes", json={"argv": ["sh", "-c", script]})
    process = started.json()["process"]
    with client.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
        lines = [json.loads(line) for line in stream.iter_lines()]
    assert lines[-1] == {"exit": 0}, lines
    assert client.delete(f"/sandboxes/{sid}").json()["state"] == "ended"
    back = tmp_path / "back"
    back.mkdir()
    done = levers9_up.levers9("cp", "shared:from-sandbox.txt", str(back))
    assert done.returncode == 0, done.stderr
    assert (back / "from-sandbox.txt").read_text() == "put there by the CLI and copied by a sandbox\n"
    # a volume another workspace names is its own (made new, empty), never this one
    other = levers9_up.levers9("token", "create", "--workspace", "team-b").stdout.strip()
    foreign = client.post(
        "/sandboxes",
        json={"volumes": [{"name": "shared", "mount_path": "/data"}]},
        headers={"authorization": f"Bearer {other}"},
    )
    assert foreign.status_code == 400, foreign.text  # its pool serves the workspace `default` alone
    bad = client.post("/sandboxes", json={"volumes": [{"name": "shared", "mount_path": "/"}]})
    assert (bad.status_code, bad.json()["error"]["type"]) == (400, "invalid_request"), bad.text
    assert "mount_path" in bad.text or "volumes" in bad.text
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []
