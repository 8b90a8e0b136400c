"""A blueprint function run on a booted EC2 worker of a runc (or gVisor) pool: the image travels to the cloud.

`levers9 up` runs two pools: ``builder``, its own local runc workers with ``builds: true`` (as in
tests/e2e/test_agent_blueprints.py, with the run's shared Debian base, tests/fixtures/debian_base.py), and
``cloud``, an EC2 pool of runtime ``runc`` (then ``gvisor``) whose API is moto at the wire
(tests/fakes/ec2_cloud.py). The :class:`~levers9.testing.cloud_boot.CloudBooter` plays EC2's hypervisor:
the instance the plugin launches gets an emulated first boot of the user data the plugin gave it, in a
network namespace that reaches only the controlplane's gRPC port (registration), its HTTP port (the /v2/
registry relay the worker pulls the image through: ``RegisterResponse.registry_url``) and the instance's
metadata service (tests/fakes/imds.py: the worker proves which instance it runs on). The function asks for
more memory than the build pool's workers have, so only the EC2 machine can take it; it runs there under
runc in a user namespace (or in a gVisor sandbox), its bridge in the boot's network namespace.

What the emulated boot runs is the script's first path (this interpreter's ``levers9``, the right version,
as root on the "machine"), so the docker flags the script gives a runc or gvisor worker container are not
run here (tests/core/test_bootstrap.py carries them); this test checks that the user data the plugin passed
names the pool's runtime (which the provisioner fills in) and holds those flags, and that a blueprint image
runs on a cloud worker.

Nothing may be left: the idle machine is terminated (its boot stopped), the fake holds no live instance,
and of the containers that took an address record while the test ran (the build's and the cloud worker's)
no record, network namespace pin, cgroup or mount remains; no process of the boot is alive.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from levers9.builder.base import BaseLayer
from levers9.testing.cloud_boot import CloudBooter
from tests.fakes.ec2_cloud import FakeEc2
from tests.fakes.imds import FakeImds
from tests.fixtures.blueprint_probe import probe_app
from tests.fixtures.ec2_boot import AMI, boot_logs, boots, ec2, imds
from tests.fixtures.levers9_up import Up, _processes_mentioning
from tests.fixtures.wait import wait_for

__all__ = ["boots", "ec2", "imds"]

pytestmark = pytest.mark.timeout(1200)

#: every bridge's address records (levers9.engine.node.NETWORK_STATE)
NETWORK_STATE = Path("/run/levers9/network")
CGROUPS = Path("/sys/fs/cgroup")

CONFIG = """\
version: 1
scheduler:
  worker_keepalive_s: 3
  reconcile_interval_s: 5
  register_timeout_s: 120
  # named so the user data holds the docker path too; the emulated boot takes the first path (levers9 installed)
  worker_image: ghcr.io/levers9/worker:e2e
pools:
  builder:
    provider: local
    runtime: runc
    builds: true
    workspace: default
    cpu: 1
    memory: 2048
    min_workers: 0
    max_workers: 1
    settings:
      stop_grace_s: 5
  cloud:
    provider: ec2
    runtime: {runtime}
    workspace: default
    cpu: 2
    memory: 3072
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

APP = probe_app("built for the cloud")


def _records() -> list[dict[str, Any]]:
    found = []
    for path in NETWORK_STATE.glob("*/l9-*.json") if NETWORK_STATE.is_dir() else []:
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # removed while read
    return found


class Watcher:
    """The containers of this test's workers: those that take an address record on a bridge while the test runs
    and whose root file system is mounted below one of ``roots`` (the build worker's and the boots' state
    directories). The machine's other tests share the records directory; their containers are not counted."""

    def __init__(self, *roots: str) -> None:
        self.roots = roots
        self.before = {r["container_id"] for r in _records()}
        self.seen: dict[str, dict[str, Any]] = {}
        #: the containers whose host-side veth was seen in this host's network namespace: not a booted worker's
        self.on_host: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            records = [r for r in _records() if r["container_id"] not in self.before]
            mounts = Path("/proc/self/mountinfo").read_text().splitlines() if records else []
            for record in records:
                cid = record["container_id"]
                if cid not in self.seen and any(cid in m and any(r in m for r in self.roots) for m in mounts):
                    self.seen[cid] = record
                if cid in self.seen and Path(f"/sys/class/net/{record['veth_host']}").exists():
                    self.on_host.add(cid)
            time.sleep(0.1)


def _left_of(records: dict[str, dict[str, Any]], booted: str) -> list[str]:
    """What this host still holds of these containers and of the boots under ``booted``."""
    ids = set(records)
    left = [f"record of {r['container_id']}" for r in _records() if r["container_id"] in ids]
    left += [f"netns pin {r['netns_path']}" for r in records.values() if Path(r["netns_path"]).exists()]
    for cid in ids:
        left += [f"cgroup {c}" for c in CGROUPS.glob(f"*/levers9/{cid}")]
        left += [f"cgroup {c}" for c in CGROUPS.glob(f"levers9/{cid}")]
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {line}" for line in mounts if any(cid in line for cid in ids) or booted in line]
    left += [f"process {pid}: {cmd[:160]}" for pid, cmd in _processes_mentioning(booted)]
    return left


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_a_blueprint_function_runs_on_a_booted_ec2_worker_of_an_oci_pool(
    levers9_up: Up,
    debian_base: BaseLayer,
    ec2: FakeEc2,
    imds: FakeImds,
    monkeypatch: pytest.MonkeyPatch,
    boots: Path,
    runtime: str,
) -> None:
    up = levers9_up
    up.use_runtime(runtime)  # fails unless this host has root and the runtime (the booted worker runs it)
    up.use_runtime("runc")  # the build pool's
    up.min_workers = 0
    monkeypatch.setenv("L9_E2E_AWS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("L9_E2E_AWS_SECRET", "l9-e2e-secret-not-a-real-key")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # the controlplane is on no instance
    up.home.mkdir(parents=True, exist_ok=True)
    (up.home / "levers9.yaml").write_text(
        CONFIG.format(ami=AMI, ec2_url=ec2.url, certificate=imds.certificate_file, runtime=runtime)
    )
    app = up.root / "cloud_app.py"
    app.write_text(APP)
    sources = [ec2.instances]
    booted = str(boots)
    booter = CloudBooter(
        sources,
        ports=[up.grpc_port, up.http_port, imds.port],
        platform=lambda i: imds.platform(i),  # type: ignore[arg-type]
        root=Path(booted),
        grace=60,  # the worker removes its containers when it stops; a gVisor sandbox's can take more than 5 s here
    )
    with booter, Watcher(str(up.root), booted) as watcher:
        up.start()
        done = up.levers9("run", f"{app.name}::main", timeout=900)
        assert done.returncode == 0, f"levers9 run failed:\n{done.stdout}\n{done.stderr}\n{boot_logs(up, booter)}"
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["jq"].startswith("jq-1.6"), answer
        assert answer["built"] == "built for the cloud", answer
        if runtime == "runc":  # in a user namespace, as on any runc worker: the call's root is not the machine's
            assert answer["uid_map"][:2] == ["0", "1000000000"], answer
        for step in ("step 1/2", "step 2/2"):
            assert step in done.stderr, done.stderr
        assert " on builder" in up.log(), up.log()[-3000:]  # built on the build pool

        [instance] = ec2.instances()
        assert list(booter.boots) == [instance.id], boot_logs(up, booter)
        assert booter.refused == {}, booter.refused
        # the plugin booted it with the pool's runtime: a runc worker container's flags and runc's check
        assert f"(runtime {runtime})" in instance.user_data
        assert "--cap-add SYS_ADMIN" in instance.user_data
        assert ("apt-get install -y runc" in instance.user_data) == (runtime == "runc")
        served = {path.split("/")[1] for method, path, status in imds.requests if status == 200}
        assert served == {instance.id}, imds.requests  # the worker proved which instance it runs on

        wait_for(
            lambda: all(i.gone for i in ec2.instances()),
            "the idle EC2 machine to be terminated",
            180,
            lambda: boot_logs(up, booter),
        )
        wait_for(lambda: instance.id in booter.stopped, "the terminated machine's boot to be stopped", 60)
        up.stop()
    seen = dict(watcher.seen)
    assert set(seen) & watcher.on_host, "no container of the build worker was seen"
    assert set(seen) - watcher.on_host, "no container of the booted worker (its bridge in its own namespace) was seen"
    deadline = time.monotonic() + 30
    while (left := _left_of(seen, booted)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], "\n".join(left)
    assert os.listdir(booted) == [], "the booter left a boot root"
    booted_ran = len(set(seen) - watcher.on_host)
    print(f"\n{len(seen)} container(s) ran, {booted_ran} on the booted worker; nothing of them is left")
