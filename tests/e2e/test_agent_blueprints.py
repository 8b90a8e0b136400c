"""A blueprint function run on a joined machine: the agent's worker container runs runc (or gVisor) containers.

Every part is real, as in tests/e2e/test_agent_machine.py: `levers9 up` over TLS, this machine joined
over SSH as a box (tests/fixtures/agent_box.py), the worker image built from this checkout, the agent
and its ``l9w-*`` worker container on the session's private dockerd. The box's pool runs ``runtime:
runc`` (then ``gvisor``), so the agent starts the worker container with what they need
(levers9.agent.runtime_access).

The image is built where builds run today: on the controlplane machine's own local runc pool
(``builder``, ``builds: true``, with the run's shared Debian base cache, tests/fixtures/debian_base.py);
the worker image carries no mmdebstrap, so a box's worker cannot make a Debian base itself. The build
pushes through the controlplane's /v2/ relay; the box's worker pulls the image through it (the https
address it reaches the controlplane at, verified with the controlplane's CA) and runs the function in a
container of it, under runc in a user namespace (or in a gVisor sandbox). The function asks for more memory than the build pool's workers have, so only the
box can take it.

Nothing may be left: the worker container and its state volume go when the machine is removed, and
of the containers the worker ran (watched while the test runs: the records its engine keeps in the
box's /run/levers9/network whose namespace is pinned inside the worker container) no address record,
veth, cgroup or mount remains on the box.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from levers9.builder.base import BaseLayer
from tests.fixtures.agent_box import AgentPlane, Box, agent_plane, box_logs, join, wait_until
from tests.fixtures.blueprint_probe import probe_app

__all__ = ["agent_plane"]

pytestmark = pytest.mark.timeout(1500)

#: the records of the default bridge's containers (levers9.engine.node.NETWORK_STATE / bridge)
RECORDS = Path("/run/levers9/network/l9br0")
CGROUPS = Path("/sys/fs/cgroup")

APP = probe_app("blueprint built")


class Watcher:
    """The box's worker container's own containers, as the records on the box's bridge name them.

    A record is the worker container's when its network namespace is pinned in that container's mount
    namespace (seen from here through ``/proc/<its pid>/root``); a host worker's are pinned on the host.
    """

    def __init__(self, box: Box) -> None:
        self.box = box
        self.seen: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _pid(self) -> int:
        workers = [c for c in self.box.workers() if c["state"] == "running"]
        if not workers:
            return 0
        shown = self.box.dockerd.cli("inspect", "--format", "{{.State.Pid}}", workers[0]["id"], check=False)
        return int(shown.stdout.strip() or 0)

    def _run(self) -> None:
        pid = 0
        while not self._stop.is_set():
            pid = pid or self._pid()
            for record in _records() if pid else []:
                if Path(f"/proc/{pid}/root{record['netns_path']}").exists():
                    self.seen.setdefault(record["container_id"], record)
            time.sleep(0.2)


def _records() -> list[dict[str, Any]]:
    found = []
    for path in RECORDS.glob("l9-*.json") if RECORDS.is_dir() else []:
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # removed while read
    return found


def _left_of(container_ids: set[str], veths: set[str]) -> list[str]:
    """What the box still holds of these containers: address records, veths, cgroups, mounts."""
    left = [f"record of {r['container_id']}" for r in _records() if r["container_id"] in container_ids]
    links = Path("/sys/class/net")
    left += [f"veth {v}" for v in veths if (links / v).exists()]
    for cid in container_ids:
        left += [f"cgroup {c}" for c in CGROUPS.glob(f"*/levers9/{cid}")]
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {line}" for line in mounts.splitlines() if any(cid in line for cid in container_ids)]
    left += [f"mount {line}" for line in mounts.splitlines() if "l9w-" in line]
    return left


#: where the build runs: the controlplane machine's own runc workers (2048 MiB: the function's 2560 fit only the box)
BUILD_POOL = """\
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
"""


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_a_blueprint_function_runs_on_a_joined_machines_oci_worker(
    agent_plane: tuple[AgentPlane, Box], debian_base: BaseLayer, runtime: str
) -> None:
    plane, box = agent_plane
    plane.use_runtime(runtime)
    plane.memory = 3072
    plane.more_pools = BUILD_POOL
    plane.start()
    join(plane, box)
    app = plane.root / "box_app.py"
    app.write_text(APP)
    with Watcher(box) as watcher:
        done = plane.levers9("run", f"{app.name}::main", timeout=900)
        assert done.returncode == 0, f"levers9 run failed:\n{done.stdout}\n{done.stderr}\n{box_logs(plane, box)}"
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["jq"].startswith("jq-1.6"), answer
        assert answer["built"] == "blueprint built"
        assert answer["debian"].startswith("12."), answer  # the blueprint's Debian, not the worker image
        assert answer["in_docker"] is False, answer  # a container of the image, not the worker container
        if runtime == "runc":  # in a user namespace, as on any runc worker: the call's root is not the box's
            assert answer["uid_map"][:2] == ["0", "1000000000"], answer
        for step in ("step 1/2", "step 2/2"):
            assert step in done.stderr, done.stderr

        assert " on builder" in plane.log(), plane.log()[-3000:]  # built on the build pool
        # the call ran on the box's worker: its container, started for the runtime
        [worker] = box.workers()
        inspected = json.loads(box.dockerd.cli("inspect", worker["name"]).stdout)[0]
        host = inspected["HostConfig"]
        assert sorted(host["CapAdd"]) == ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"], host["CapAdd"]
        assert set(host["SecurityOpt"]) == {"seccomp=unconfined", "apparmor=unconfined"}
        assert (host["MaskedPaths"], host["ReadonlyPaths"]) == ([], [])  # systempaths=unconfined
        assert (host["NetworkMode"], host["CgroupnsMode"], host["Init"]) == ("host", "host", True)
        assert not host["Privileged"]
        volume = f"{worker['name']}-state"
        assert box.volumes() == [volume]
        assert f"{volume}:/var/lib/levers9:rw" in host["Binds"], host["Binds"]
        assert watcher.seen, "no container of the box's worker was seen on the bridge"
        ran = set(watcher.seen)
        veths = {r["veth_host"] for r in watcher.seen.values()}

        removed = plane.operator("machine", "remove", box.name, "--yes", timeout=300)
        assert removed.returncode == 0, removed.stderr + plane.log()[-3000:]
        wait_until("the worker container's removal", lambda: not box.workers(), 120, why=lambda: box_logs(plane, box))
        wait_until("the supervisor's end", lambda: box.supervisor_pid() is None, 120, why=box.log)
    assert box.volumes() == []
    assert _left_of(ran, veths) == []
    print(f"\nthe box's worker ran {len(ran)} container(s); nothing of them is left")
