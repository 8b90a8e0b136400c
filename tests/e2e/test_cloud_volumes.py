"""A volume on a booted EC2 worker that reaches nothing but the controlplane: mounted over its WebDAV.

`levers9 up` has one pool, ``cloud``: EC2 (moto at the wire, tests/fakes/ec2_cloud.py), runtime ``runc``,
and no ``volume_access`` set, so its workers reach volumes through the controlplane (the default off the
``local`` provider). The :class:`~levers9.testing.cloud_boot.CloudBooter` boots the instance the plugin
launches in a network namespace that reaches only the controlplane's gRPC and HTTP ports and the fake
metadata service, as in tests/e2e/test_cloud_blueprints.py: neither the volumes' metadata nor their data
is within its reach. The worker mounts the volume with rclone from the controlplane's WebDAV (the HTTP
port), scoped to the workspace, and binds it into the call's runc container.

The call reads a file `levers9 cp` put in and writes one `levers9 cp` takes out (byte for byte); inside
the call the volume is rclone's FUSE mount. The idle machine is then terminated: its boot stopped, no
FUSE mount below the boot's root and no process of it is left.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from levers9.testing.cloud_boot import CloudBooter
from levers9.volumes.juicefs import fuse_mounts_below
from tests.fakes.ec2_cloud import FakeEc2
from tests.fakes.imds import FakeImds
from tests.fixtures.ec2_boot import AMI, boot_logs, boots, ec2, imds
from tests.fixtures.levers9_up import Up, _processes_mentioning
from tests.fixtures.volume_apps import round_trip_app
from tests.fixtures.wait import wait_for

__all__ = ["boots", "ec2", "imds"]

pytestmark = pytest.mark.timeout(900)


CONFIG = """\
version: 1
scheduler:
  worker_keepalive_s: 3
  reconcile_interval_s: 5
  register_timeout_s: 120
pools:
  cloud:
    provider: ec2
    runtime: runc
    workspace: default
    cpu: 2
    memory: 2048
    region: us-east-1
    min_workers: 0
    max_workers: 1
    idle_timeout_s: 5
    settings:
      ami: {ami}
      endpoint_url: {ec2_url}
      instance_types: [t3.large]
      availability_zones: [us-east-1a]
      access_key_id_env: L9_E2E_AWS_KEY_ID
      secret_access_key_env: L9_E2E_AWS_SECRET
      identity_certificate_file: {certificate}
"""


def test_a_booted_ec2_worker_reaching_only_the_controlplane_reads_and_writes_a_volume(
    levers9_up: Up, ec2: FakeEc2, imds: FakeImds, monkeypatch: pytest.MonkeyPatch, boots: Path, tmp_path: Path
) -> None:
    up = levers9_up
    up.use_runtime("runc")  # fails unless this host has root and runc (the booted worker runs it)
    up.min_workers = 0
    monkeypatch.setenv("L9_E2E_AWS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("L9_E2E_AWS_SECRET", "l9-e2e-secret-not-a-real-key")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # the controlplane is on no instance
    up.home.mkdir(parents=True, exist_ok=True)
    (up.home / "levers9.yaml").write_text(CONFIG.format(ami=AMI, ec2_url=ec2.url, certificate=imds.certificate_file))
    app = up.root / "cloud_volume_app.py"
    app.write_text(round_trip_app("data", "/data", "written on the EC2 machine"))
    booter = CloudBooter(
        [ec2.instances],
        ports=[up.grpc_port, up.http_port, imds.port],
        platform=lambda i: imds.platform(i),  # type: ignore[arg-type]
        root=boots,
        grace=60,
    )
    with booter:
        up.start(wait_workers=0)
        upload = tmp_path / "up.bin"
        upload.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
        made = up.levers9("volume", "create", "data")
        assert made.returncode == 0, made.stderr
        copied = up.levers9("cp", str(upload), "data:in/up.bin")
        assert copied.returncode == 0, copied.stderr

        done = up.levers9("run", f"{app.name}::main", timeout=600)
        assert done.returncode == 0, f"levers9 run failed:\n{done.stdout}\n{done.stderr}\n{boot_logs(up, booter)}"
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["sha256"] == hashlib.sha256(upload.read_bytes()).hexdigest(), answer
        assert answer["listing"] == ["in", "out"], answer
        assert answer["fstypes"] == ["fuse.rclone"], answer  # the controlplane's WebDAV: the only way it has
        [instance] = ec2.instances()
        assert list(booter.boots) == [instance.id], boot_logs(up, booter)
        back = tmp_path / "back"
        back.mkdir()
        out = up.levers9("cp", "data:out/written.txt", str(back))
        assert out.returncode == 0, out.stderr
        assert (back / "written.txt").read_text() == "written on the EC2 machine"

        wait_for(
            lambda: all(i.gone for i in ec2.instances()),
            "the idle EC2 machine to be terminated",
            180,
            lambda: boot_logs(up, booter),
        )
        wait_for(lambda: instance.id in booter.stopped, "the terminated machine's boot to be stopped", 90)
        assert fuse_mounts_below(boots) == [], boot_logs(up, booter)
        assert _processes_mentioning(str(boots)) == []
        up.stop()
    assert fuse_mounts_below(up.root) == []
