"""A sandbox mounts its workspace's volumes and cloud buckets, as a call's container does (issue 39's ``volumes=``).

A real `levers9 up` with a runc pool running sandboxes; the volume is made and filled with the CLI, a
sandbox reads and writes it, and the CLI sees what the sandbox wrote. Both ways a worker reaches volumes:
mounting the volumes' file system itself (``direct``, the local pool's default) and each volume over the
controlplane's WebDAV with a token for that worker and volume alone (``controlplane``). A cloud bucket on
moto's S3 server at the wire, its keys in workspace secrets, mounted by the worker's rclone.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from levers9.volumes.juicefs import fuse_mounts_below
from tests.fixtures.levers9_up import Up
from tests.fixtures.volume_stores import ACCESS_KEY, SECRET_KEY, S3Store

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


def test_a_sandbox_reads_and_writes_a_cloud_bucket_whose_keys_it_never_sees(levers9_up: Up, moto_s3: S3Store) -> None:
    s3 = moto_s3.client
    bucket = moto_s3.bucket("sandbox-data")
    s3.put_object(Bucket=bucket, Key="inputs/hello.txt", Body=b"hello from the bucket")
    levers9_up.use_runtime("runc")
    levers9_up.sandboxes = 2
    levers9_up.start()
    for name, value in (("BUCKET_KEY", ACCESS_KEY), ("BUCKET_SECRET", SECRET_KEY)):
        levers9_up.secret(name, value)
    config = {
        "access_key": "BUCKET_KEY",
        "secret_key": "BUCKET_SECRET",
        "endpoint": moto_s3.endpoint,
        "force_path_style": True,
        "region": "us-east-1",
    }
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{levers9_up.http_port}/api/v1",
        headers={"authorization": f"Bearer {levers9_up.token()}"},
        timeout=120,
    )
    volumes = [
        {"name": bucket, "mount_path": "/mnt/data", "bucket": config},
        {"name": bucket, "mount_path": "/mnt/frozen", "bucket": {**config, "read_only": True}},
    ]
    made = client.post("/sandboxes", json={"volumes": volumes, "timeout_s": 120})
    assert made.status_code == 201, f"{made.text}\n--- up:\n{levers9_up.log()[-3000:]}"
    sid = made.json()["id"]
    read = client.get(f"/sandboxes/{sid}/files", params={"path": "/mnt/data/inputs/hello.txt"})
    assert read.content == b"hello from the bucket", read.text
    script = (
        "mkdir -p /mnt/data/outputs && echo 'written by a sandbox' > /mnt/data/outputs/result.txt && "
        "(echo x > /mnt/frozen/nope.txt && echo WROTE || echo REFUSED) && env"
    )
    started = client.post(f"/sandboxes/{sid}/processes", json={"argv": ["sh", "-c", script]})
    assert started.status_code == 201, started.text
    process = started.json()["process"]
    with client.stream("GET", f"/sandboxes/{sid}/processes/{process}/output") as stream:
        lines = [json.loads(line) for line in stream.iter_lines()]
    assert lines[-1] == {"exit": 0}, lines
    out = "".join(line.get("data", "") for line in lines if line.get("stream") == "stdout")
    assert "REFUSED" in out
    assert ACCESS_KEY not in out
    assert SECRET_KEY not in out  # the keys are the worker's mount's, never the sandbox's
    assert client.delete(f"/sandboxes/{sid}").json()["state"] == "ended"
    written = s3.get_object(Bucket=bucket, Key="outputs/result.txt")["Body"].read()
    assert written == b"written by a sandbox\n"
    # a bucket whose key names a secret the workspace lacks is refused, naming it
    missing = client.post(
        "/sandboxes",
        json={"volumes": [{"name": bucket, "mount_path": "/mnt/x", "bucket": {**config, "secret_key": "NOPE"}}]},
    )
    assert (missing.status_code, missing.json()["error"]["type"]) == (400, "invalid_request"), missing.text
    assert "'NOPE'" in missing.text
    levers9_up.stop()
    assert fuse_mounts_below(levers9_up.root) == []
