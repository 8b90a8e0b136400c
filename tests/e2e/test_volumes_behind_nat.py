"""A worker behind NAT reaches a volume over the controlplane's WebDAV; a worker outside mounts it directly.

The NAT worker is a `levers9 worker` started by hand inside a network namespace that drops every connection
opened towards it (:func:`tests.tunnel.netns.namespace`): it reaches the controlplane, and nothing else
reaches it. Its pool, ``nat``, has ``volume_access: controlplane``, so it mounts each volume with rclone
from the controlplane's advertised HTTP address (``listen.advertise_http``: this host's end of the veth,
since the controlplane's own name, ``localhost``, is the namespace's own loopback there) with a token for
that volume alone. The ``local`` pool's worker mounts the JuiceFS file system itself.

Two calls that each fill a worker run at once, so one runs on each worker (the task list says which): each
writes a file, then reads the other's. What the NAT worker's call wrote is then read by the direct call and
by `levers9 cp`. The NAT worker's rclone serves the WebDAV URL from its environment, its token never on
its command line, and no juicefs runs for that worker. At the end nothing is mounted or running and the
namespace is gone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from levers9.services.volume_access import DAV_PREFIX
from levers9.volumes.juicefs import fuse_mounts_below
from tests.fixtures.levers9_up import Up, end_session
from tests.fixtures.volume_apps import MEET
from tests.tunnel.netns import Namespace, namespace

pytestmark = pytest.mark.timeout(600)

CONFIG = """\
version: 1
scheduler:
  worker_keepalive_s: 3
  reconcile_interval_s: 5
  register_timeout_s: 60
listen:
  # every interface, so the namespace can dial in; plain text on a test-only link
  host: 0.0.0.0
  plaintext: true
  advertise_http: http://{host_ip}:{http_port}
pools:
  local:
    provider: local
    runtime: runc
    cpu: 1
    memory: 2048
    min_workers: 1
    max_workers: 1
  nat:
    # no provider worker: its one worker is the one started by hand in the namespace
    provider: local
    runtime: runc
    cpu: 1
    memory: 2048
    min_workers: 0
    max_workers: 0
    volume_access: controlplane
"""


def _join_network(ns: Namespace) -> list[str]:
    """Run in the namespace's network alone. Not `ip netns exec`: it mounts the namespace's sysfs over /sys in a
    mount namespace of its own, which hides the cgroup file system runc needs ('no cgroup mount found in
    mountinfo'); a machine behind NAT has its own cgroups, so the worker keeps this host's."""
    if shutil.which("nsenter") is None:
        pytest.fail("this test needs nsenter: apt-get install util-linux")
    return ["nsenter", f"--net=/run/netns/{ns.name}", "--"]


def _start_worker(up: Up, ns: Namespace) -> subprocess.Popen[bytes]:
    issued = up.levers9("token", "create", "--kind", "worker", "--pool", "nat")
    assert issued.returncode == 0, issued.stderr
    env = {**up.env, "LEVERS9_TOKEN": issued.stdout.strip(), "LEVERS9_STOP_GRACE_S": "5"}
    log = (up.root / "worker.log").open("wb")
    try:
        return subprocess.Popen(
            [
                *_join_network(ns),
                sys.executable,
                "-m",
                "levers9",
                "worker",
                "--log-level",
                "info",
                "--controlplane",
                f"grpc://{ns.host_ip}:{up.grpc_port}",
                "--pool",
                "nat",
                "--state-dir",
                str(up.root / "worker-state"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def _processes() -> list[Path]:
    return [p for p in Path("/proc").iterdir() if p.name.isdigit()]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _environ(proc: Path) -> dict[str, str]:
    try:
        raw = (proc / "environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _task_pool(up: Up, task_id: str) -> str:
    r = httpx.get(
        f"http://127.0.0.1:{up.http_port}/api/v1/tasks/{task_id}",
        headers={"authorization": f"Bearer {up.token()}"},
        timeout=10,
    )
    r.raise_for_status()
    return str(r.json()["pool"])


def test_a_call_behind_nat_writes_over_webdav_what_a_direct_call_and_the_cli_read(
    levers9_up: Up, tmp_path: Path
) -> None:
    up = levers9_up
    up.use_runtime("runc")
    up.home.mkdir(parents=True, exist_ok=True)
    ns_was: list[str] = []
    with namespace(drop_inbound=True) as ns:
        ns_was.append(ns.name)
        (up.home / "levers9.yaml").write_text(CONFIG.format(host_ip=ns.host_ip, http_port=up.http_port))
        up.start(wait_workers=1)
        worker = _start_worker(up, ns)

        def logs() -> str:
            worker_log = up.root / "worker.log"
            return (
                up.log()[-5000:] + "\n--- worker:\n" + (worker_log.read_text() if worker_log.exists() else "")[-5000:]
            )

        try:
            workers = up.wait_workers(2)
            assert sorted(str(w["pool"]) for w in workers) == ["local", "nat"], logs()
            app = up.root / "meet_app.py"
            app.write_text(MEET)
            try:
                run = up.levers9("run", f"{app.name}::main", timeout=300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"levers9 run did not end within 300 s\n{logs()}")
            assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs()}"
            answers = json.loads(run.stdout.strip().splitlines()[-1])
            assert [(a["me"], a["read"], a["whole"]) for a in answers] == [
                ("a", "from b from ", len("from b ") * 1000),
                ("b", "from a from ", len("from a ") * 1000),
            ]
            # one call on each worker: the NAT worker's wrote its file over WebDAV, the direct one read it
            pools = {a["me"]: _task_pool(up, a["task"]) for a in answers}
            assert sorted(pools.values()) == ["local", "nat"], pools
            behind_nat = next(me for me, pool in pools.items() if pool == "nat")

            # the CLI reads it too, through the controlplane's own mount
            back = tmp_path / "back"
            back.mkdir()
            done = up.levers9("cp", f"shared:{behind_nat}.txt", str(back))
            assert done.returncode == 0, done.stderr
            assert (back / f"{behind_nat}.txt").read_text() == f"from {behind_nat} " * 1000

            # the NAT worker mounted the volume with rclone inside the namespace (its call's container is kept
            # warm, so the mount is still up), from the advertised WebDAV URL, its token in the environment only
            state = str(up.root / "worker-state")
            ns_inode = (Path("/run/netns") / ns.name).stat().st_ino
            rclones = [p for p in _processes() if _cmdline(p).split(" ")[0].endswith("rclone") and state in _cmdline(p)]
            assert rclones, f"no rclone mount serves the NAT worker\n{logs()}"
            for p in rclones:
                env = _environ(p)
                assert env.get("RCLONE_CONFIG_VOLUME_URL", "").startswith(
                    f"http://{ns.host_ip}:{up.http_port}{DAV_PREFIX}/"
                ), env.get("RCLONE_CONFIG_VOLUME_URL")
                token = env.get("RCLONE_CONFIG_VOLUME_BEARER_TOKEN", "")
                assert token, "rclone has no bearer token in its environment"
                assert token not in _cmdline(p)
                assert "TOKEN" not in _cmdline(p).upper()
                assert (p / "ns" / "net").stat().st_ino == ns_inode, "rclone runs outside the namespace"
            assert [kind for point, kind in fuse_mounts_below(Path(state))] == ["fuse.rclone"], logs()
            juicefs = [_cmdline(p) for p in _processes() if "juicefs" in _cmdline(p) and state in _cmdline(p)]
            assert juicefs == [], juicefs
            assert worker.poll() is None, logs()
        finally:
            end_session(worker)
            up.stop()
    assert fuse_mounts_below(up.root) == []
    left = [
        p for p in _processes() if any(t in _cmdline(p) for t in ("rclone", "juicefs")) and str(up.root) in _cmdline(p)
    ]
    assert left == [], [_cmdline(p) for p in left]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert ns_was[0] not in netns, netns
