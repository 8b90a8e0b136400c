"""A volume on a joined machine: the agent's worker container mounts it over the controlplane's WebDAV.

Every part is real, as in tests/e2e/test_agent_blueprints.py: `levers9 up` over TLS, this machine joined
over SSH as a box (tests/fixtures/agent_box.py), the worker image built from this checkout, the agent and
its ``l9w-*`` worker container (pool runtime ``runc``) on the session's private dockerd. An agent machine
reaches nothing but the controlplane (``volume_access: controlplane``, the only access the provider
allows), so its worker mounts the volume with the image's rclone and ``/dev/fuse`` from the controlplane's
WebDAV, scoped to the workspace, and binds it into the call's container.

The call reads a file the CLI copied in and writes one the CLI then copies out, byte for byte; inside the
call the volume is a FUSE mount of rclone's (``fuse.rclone``), not JuiceFS. Once the machine is removed,
nothing of the worker container, its state volume or its mounts is left on the box.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.fixtures.agent_box import AgentPlane, Box, agent_plane, box_logs, join, wait_until
from tests.fixtures.volume_apps import round_trip_app

__all__ = ["agent_plane"]

pytestmark = pytest.mark.timeout(900)


def _rclone_mounts(mine: Path) -> list[str]:
    """The host's rclone mounts, less those of other tests: a mount point in another test's temporary directory
    (tests/volumes/test_rclone.py leaves mounts there on purpose, for its sweep to find) is none of this one's."""
    others = mine.parent.parent  # the pytest base directory every test's tmp_path lies in (popen-gwN/<test>)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if "fuse.rclone" not in line:
            continue
        point = Path(line.split()[4])
        if point.is_relative_to(others) and not point.is_relative_to(mine):
            continue
        found.append(line)
    return found


def test_a_call_on_a_joined_machine_reads_and_writes_a_volume_over_the_controlplane(
    agent_plane: tuple[AgentPlane, Box], tmp_path: Path
) -> None:
    plane, box = agent_plane
    plane.use_runtime("runc")
    plane.start()
    before = _rclone_mounts(tmp_path)
    made = plane.levers9("volume", "create", "shared")
    assert made.returncode == 0, made.stderr
    upload = tmp_path / "up.bin"
    upload.write_bytes(os.urandom(2 * 1024 * 1024 + 3))
    copied = plane.levers9("cp", str(upload), "shared:in/up.bin")
    assert copied.returncode == 0, copied.stderr
    join(plane, box)
    app = plane.root / "box_volume_app.py"
    app.write_text(round_trip_app("shared", "/data/shared", "written on the box"))

    done = plane.levers9("run", f"{app.name}::main", timeout=600)
    assert done.returncode == 0, f"levers9 run failed:\n{done.stdout}\n{done.stderr}\n{box_logs(plane, box)}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["sha256"] == hashlib.sha256(upload.read_bytes()).hexdigest(), answer
    assert answer["listing"] == ["in", "out"], answer
    assert answer["fstypes"] == ["fuse.rclone"], answer  # the controlplane's WebDAV, not the file system itself
    assert answer["in_docker"] is False, answer  # a container the worker started, not the worker container

    back = tmp_path / "back"
    back.mkdir()
    out = plane.levers9("cp", "shared:out/written.txt", str(back))
    assert out.returncode == 0, out.stderr + box_logs(plane, box)
    assert (back / "written.txt").read_text() == "written on the box"

    [worker] = box.workers()
    host = json.loads(box.dockerd.cli("inspect", worker["name"]).stdout)[0]["HostConfig"]
    assert [d["PathOnHost"] for d in host["Devices"]] == ["/dev/fuse"], host["Devices"]
    removed = plane.operator("machine", "remove", box.name, "--yes", timeout=300)
    assert removed.returncode == 0, removed.stderr + plane.log()[-3000:]
    wait_until("the worker container's removal", lambda: not box.workers(), 120, why=lambda: box_logs(plane, box))
    assert box.volumes() == []
    # other tests' workers mount and unmount meanwhile: only none of this test's may stay
    assert set(_rclone_mounts(tmp_path)) <= set(before)
