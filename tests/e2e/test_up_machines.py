"""`levers9 up` and its rented machines: terminated when it stops, kept with --keep-machines, kept across a restart.

`levers9 up` has one pool, ``cloud``: EC2 (moto at the wire, tests/fakes/ec2_cloud.py), runtime ``process``.
The :class:`~levers9.testing.cloud_boot.CloudBooter` boots each instance the plugin launches (its user data:
a real ``levers9 worker``) in a network namespace that reaches only the controlplane's gRPC port and the
fake metadata service (its signed identity document), so a machine is what a user would rent: a launched
instance whose worker registers.

* Ctrl-C (SIGINT) terminates the instance in the fake before `up` exits, and the terminal names it and
  ``--keep-machines`` (before: `up` stopped local workers only, and the instance kept running).
* ``--keep-machines``: the instance keeps running after `up` exits, and the terminal says so; the test
  terminates it itself.
* A clean restart (SIGTERM) of ``up --keep-machines`` while a 60 s call runs on the booted machine: the call
  finishes once (one start, no attempt counted again), the machine is not terminated ("its worker stopped
  reporting"), no second machine is launched; the plain `up` it was restarted as then terminates it on exit.
  Once over the embedded Redis (the restart forgets every worker) and once over a redis-server that keeps
  them (their keepalives lapsed while `up` was down: before the scheduler's return grace after every start,
  the first reaper pass took that for their death and queued the call again).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from levers9.testing.cloud_boot import CloudBooter
from tests.fakes.ec2_cloud import FakeEc2
from tests.fakes.imds import FakeImds
from tests.fixtures.ec2_boot import AMI, boot_logs, boots, ec2, imds
from tests.fixtures.levers9_up import Up
from tests.fixtures.redis import run_on_redis
from tests.fixtures.wait import wait_for

__all__ = ["boots", "ec2", "imds"]

pytestmark = pytest.mark.timeout(900)

CONFIG = """\
version: 1
{state}scheduler:
  worker_keepalive_s: {keepalive}
  reconcile_interval_s: 5
  register_timeout_s: 240
pools:
  cloud:
    provider: ec2
    runtime: process
    workspace: default
    cpu: 2
    memory: 2048
    region: us-east-1
    min_workers: {min_workers}
    max_workers: {max_workers}
    idle_timeout_s: 600
    settings:
      ami: {ami}
      endpoint_url: {ec2_url}
      instance_types: [t3.large]
      availability_zones: [us-east-1a]
      access_key_id_env: L9_E2E_AWS_KEY_ID
      secret_access_key_env: L9_E2E_AWS_SECRET
      identity_certificate_file: {certificate}
"""

#: a worker silent this long is dead: above the silences of a loaded machine (with 3 s, beside a CPU hog, one call
#: got a second machine), and what a restart of `up` waits out so that the keepalives lapse meanwhile
KEEPALIVE_S = 10

#: where the fixture notes the path of the metadata service's signing certificate, for the pool's settings
CERTIFICATE = "imds-certificate-path"

#: a call that notes each start of it in a file the test reads, then runs ``seconds``
LONG_CALL = """
import os, time, levers9

@levers9.function(cpu=0.25, timeout=300)
def long(marker):
    with open(marker, "a") as f:  # one line per start of the call
        f.write(f"{{os.getpid()}}\\n")
    time.sleep({seconds})
    return os.getpid()

call = long.spawn({marker!r})
print("SPAWNED", call.task_id, flush=True)
print("RESULT", call.get(timeout=600), flush=True)
"""


@pytest.fixture
def cloud_up(
    levers9_up: Up, ec2: FakeEc2, imds: FakeImds, monkeypatch: pytest.MonkeyPatch, boots: Path
) -> Iterator[tuple[Up, FakeEc2, CloudBooter]]:
    """`levers9 up` (not started) with the ``cloud`` pool on the fake EC2, and the booter of its instances."""
    monkeypatch.setenv("L9_E2E_AWS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("L9_E2E_AWS_SECRET", "l9-e2e-secret-not-a-real-key")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # the controlplane is on no instance
    levers9_up.min_workers = 0
    levers9_up.home.mkdir(parents=True, exist_ok=True)
    (levers9_up.home / CERTIFICATE).write_text(str(imds.certificate_file))  # named in the config's pool
    booter = CloudBooter(
        [ec2.instances],
        ports=[levers9_up.grpc_port, imds.port],
        platform=lambda i: imds.platform(i),  # type: ignore[arg-type]
        root=boots,
        grace=30,
    )
    with booter:
        yield levers9_up, ec2, booter
        levers9_up.stop()


def _write_config(up: Up, ec2: FakeEc2, *, min_workers: int, max_workers: int, redis_url: str = "") -> None:
    up.home.mkdir(parents=True, exist_ok=True)
    certificate = (up.home / CERTIFICATE).read_text()
    state = f"state:\n  redis_url: {redis_url}\n" if redis_url else ""
    text = CONFIG.format(
        state=state,
        keepalive=KEEPALIVE_S,
        min_workers=min_workers,
        max_workers=max_workers,
        ami=AMI,
        ec2_url=ec2.url,
        certificate=certificate,
    )
    (up.home / "levers9.yaml").write_text(text)


def _booted_machine(up: Up, ec2: FakeEc2, booter: CloudBooter) -> str:
    """The one instance of the pool, once its booted worker registered; its id."""
    up.start(wait_workers=0)
    wait_for(lambda: up.workers(), "the booted EC2 machine's worker to register", 300, lambda: boot_logs(up, booter))
    [instance] = ec2.instances()
    assert instance.running, instance
    return instance.id


def _stopped_cleanly(up: Up) -> None:
    assert up.process is not None
    assert up.process.returncode == 0, up.log()[-3000:]


def _live(ec2: FakeEc2) -> list[str]:
    return [i.id for i in ec2.instances() if not i.gone]


def test_ctrl_c_terminates_the_pools_rented_machine_and_says_so(cloud_up: tuple[Up, FakeEc2, CloudBooter]) -> None:
    up, ec2, booter = cloud_up
    _write_config(up, ec2, min_workers=1, max_workers=1)
    instance = _booted_machine(up, ec2, booter)

    up.stop(sig=signal.SIGINT)  # what Ctrl-C sends
    _stopped_cleanly(up)
    # terminated before `up` exited, not left to anyone: nobody reconciles this pool while `up` is down
    assert _live(ec2) == [], f"the machine outlived levers9 up:\n{boot_logs(up, booter)}"
    said = up.log()
    assert f"terminating 1 machine(s) of levers9 up's pools: {instance} (pool cloud, ec2)" in said, said[-3000:]
    assert "--keep-machines keeps them running" in said
    assert f"terminated {instance} (pool cloud, ec2)" in said, said[-3000:]
    wait_for(lambda: instance in booter.stopped, "the terminated machine's boot to be stopped", 90)


def test_keep_machines_leaves_the_rented_machine_running(cloud_up: tuple[Up, FakeEc2, CloudBooter]) -> None:
    up, ec2, booter = cloud_up
    _write_config(up, ec2, min_workers=1, max_workers=1)
    up.options = ["--keep-machines"]
    instance = _booted_machine(up, ec2, booter)

    up.stop(sig=signal.SIGINT)
    _stopped_cleanly(up)
    assert _live(ec2) == [instance], boot_logs(up, booter)
    said = up.log()
    assert f"--keep-machines: leaving 1 machine(s) running: {instance} (pool cloud, ec2)" in said, said[-3000:]
    assert "terminating" not in said, said[-3000:]
    ec2.terminate_all()  # the test's own clean-up: `up` left it running, as asked
    wait_for(lambda: instance in booter.stopped, "the terminated machine's boot to be stopped", 90)


async def _answers(client: Redis) -> None:
    await client.ping()


def _status(up: Up, task_id: str) -> str:
    listed = json.loads(up.levers9("tasks", "--json").stdout or "[]")
    return next((str(t["status"]) for t in listed if t["id"] == task_id), "")


@pytest.mark.parametrize("redis", ["embedded", "redis-server"])
def test_a_clean_restart_of_up_keeps_the_machine_and_its_running_call(
    cloud_up: tuple[Up, FakeEc2, CloudBooter], redis: str, request: pytest.FixtureRequest
) -> None:
    """With the embedded Redis the restart forgets every worker; with a redis-server it keeps them, and their
    keepalives lapsed while `up` was down, which must not count as their death."""
    up, ec2, booter = cloud_up
    redis_url = ""
    if redis == "redis-server":
        redis_url = request.getfixturevalue("redis_server")
        run_on_redis(redis_url, _answers)  # emptied first: what another test left
    # room for a second machine, which must not come
    _write_config(up, ec2, min_workers=0, max_workers=2, redis_url=redis_url)
    up.options = ["--keep-machines"]
    up.start(wait_workers=0)
    marker = up.exchange / "starts.log"
    program = up.root / "long_call.py"
    program.write_text(LONG_CALL.format(seconds=60, marker=str(marker)))
    app = subprocess.Popen(
        [sys.executable, str(program)],
        env=up.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=up.root,
    )
    try:
        assert app.stdout is not None
        spawned = app.stdout.readline().split()
        assert spawned[:1] == ["SPAWNED"], app.stderr.read() if app.stderr else ""
        task_id = spawned[1]
        wait_for(
            lambda: marker.exists() and marker.read_text().strip() and _status(up, task_id) == "running",
            "the call to run on the booted machine",
            300,
            lambda: boot_logs(up, booter),
            interval=0.5,
        )
        live = _live(ec2)
        assert len(live) == 1, f"{len(live)} machines for one call:\n{boot_logs(up, booter)}"
        [instance] = live

        up.stop()  # SIGTERM: a clean stop, machines kept
        stopped = time.monotonic()
        _stopped_cleanly(up)
        assert _live(ec2) == [instance], boot_logs(up, booter)
        first_log = up.log()
        time.sleep(max(0.0, stopped + KEEPALIVE_S + 1 - time.monotonic()))  # down longer than a keepalive
        up.options = []  # started again as plain `levers9 up`, which terminates the machine when it stops
        up.start(wait_workers=0)
        out, err = app.communicate(timeout=400)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    logs = first_log + up.log()
    assert app.returncode == 0, f"{err}\n{boot_logs(up, booter)}"
    starts = marker.read_text().split()
    assert len(starts) == 1, f"the call started {len(starts)} times: {starts}\n{boot_logs(up, booter)}"
    assert out.split("RESULT", 1)[1].split()[0] == starts[0], "the result is the first run's"
    tasks = {t["id"]: t for t in json.loads(up.levers9("tasks", "--json").stdout)}
    assert tasks[task_id]["status"] == "complete"
    assert tasks[task_id]["attempts"] == 0, "the call was not queued again"
    assert "stopped reporting" not in logs, logs[-6000:]
    assert _live(ec2) == [instance], f"the machine was replaced:\n{boot_logs(up, booter)}"
    assert ec2.calls("RunInstances") == 1, "a second machine was launched"
    assert len(up.workers()) == 1

    up.stop()
    assert _live(ec2) == [], f"the plain `levers9 up` left its machine running:\n{boot_logs(up, booter)}"
    wait_for(lambda: instance in booter.stopped, "the terminated machine's boot to be stopped", 90)
