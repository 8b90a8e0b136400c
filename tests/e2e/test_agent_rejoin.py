"""Agent machines joined again, and the agent installed from the controlplane's own wheel (issue 35 items 14, 16).

Every part is real, as in test_agent_machine.py: `levers9 up` over TLS, the
session's sshd and private dockerd, the SSH join, the agent under its
supervisor. Item 14: running the same ``machine create --ssh`` twice just
works, and a box whose machine was removed joins again at once (its revoked
credential replaced, not reused). Item 16: the command ``machine create``
prints, run as printed in a shell, fetches levers9's wheel from the
controlplane over TLS (its CA from the command), checks its sha256, hands pip
that file, and the ``levers9`` so installed joins: pip here installs from the
file alone (``--no-index --no-deps``: no package index is reached in CI; the
third-party distributions are this interpreter's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from levers9.images.wheel import wheel_name
from tests.fixtures.agent_box import AgentPlane, Box, agent_plane, wait_until

__all__ = ["agent_plane"]

pytestmark = pytest.mark.timeout(900)


def _create_ssh(plane: AgentPlane, box: Box) -> subprocess.CompletedProcess[str]:
    assert plane.sshd is not None
    return plane.operator(
        "machine",
        "create",
        "--pool",
        "box",
        "--ssh",
        f"root@127.0.0.1:{plane.sshd.port}",
        "--agent-dir",
        str(box.agent_dir),
        timeout=600,
    )


def _why(plane: AgentPlane, box: Box, done: subprocess.CompletedProcess[str]) -> str:
    return f"{done.stdout}{done.stderr}\n--- box log:\n{box.log()[-3000:]}\n--- up:\n{plane.log()[-3000:]}"


def test_create_ssh_twice_just_works_and_a_removed_box_joins_again(agent_plane: tuple[AgentPlane, Box]) -> None:
    plane, box = agent_plane
    plane.start()
    first = _create_ssh(plane, box)
    assert first.returncode == 0, _why(plane, box, first)
    [machine] = plane.machines()
    assert (machine["state"], machine["connected"]) == ("joined", True)

    # the same command again: the machine exists and its box runs its agent; nothing new, no failure on the name
    again = _create_ssh(plane, box)
    assert again.returncode == 0, _why(plane, box, again)
    assert f"machine {machine['name']} ({machine['id']}) exists and has joined pool box" in again.stdout
    assert "already running, left as it is" in again.stdout
    assert [(m["id"], m["state"]) for m in plane.machines()] == [(machine["id"], "joined")]

    removed = plane.operator("machine", "remove", machine["name"], "--yes", timeout=300)
    assert removed.returncode == 0, removed.stderr
    wait_until("the supervisor's end", lambda: box.supervisor_pid() is None, 120, why=box.log)
    assert plane.machines() == []

    # the box keeps the removed machine's revoked credential: it is replaced and the box joins again at once
    began = time.monotonic()
    rejoined = _create_ssh(plane, box)
    took = time.monotonic() - began
    print(f"\nBENCH machine create --ssh of a removed box: {took:.1f} s")
    assert rejoined.returncode == 0, _why(plane, box, rejoined)
    assert f"agent {machine['id']}, which this controlplane no longer has (removed)" in rejoined.stdout
    [fresh] = plane.machines()
    assert fresh["id"] != machine["id"]
    assert (fresh["name"], fresh["state"], fresh["connected"]) == (machine["name"], "joined", True)
    replaced = box.state_dir / "agent.json.replaced"
    assert machine["id"] in replaced.read_text()
    assert fresh["id"] in (box.state_dir / "agent.json").read_text()


def _tools(root: Path, site: Path, dockerd_host: str) -> Path:
    """A ``bin`` directory whose ``pip`` installs into ``site`` from the given file only, and whose ``levers9`` is
    the one installed there (on this interpreter, whose third-party packages it uses)."""
    venv = root / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, f"python -m venv (apt-get install -y python3-venv): {made.stderr}"
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "pip").write_text(
        f'#!/bin/sh\necho "pip $*" >> {root}/pip.log\n'
        f'exec {venv}/bin/python -m pip "$@" --no-index --no-deps --target {site}\n'
    )
    (bin_dir / "levers9").write_text(
        f"#!/bin/sh\nPYTHONPATH={site}; export PYTHONPATH\n"
        f'{sys.executable} -c "import levers9; print(levers9.__file__)" > {root}/imported-from\n'
        f'exec {sys.executable} -m levers9 "$@" --docker-host {dockerd_host}\n'
    )
    for tool in ("pip", "levers9"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def test_the_printed_join_command_installs_the_agent_from_the_controlplanes_wheel(
    agent_plane: tuple[AgentPlane, Box],
) -> None:
    plane, box = agent_plane
    plane.start()
    made = plane.operator("machine", "create", "--pool", "box", "--name", "from-wheel")
    assert made.returncode == 0, made.stderr
    command = made.stdout.strip().splitlines()[-1]
    assert "levers9==" not in command
    wheel = wheel_name()
    assert f'--cacert "$d"/ca.pem https://127.0.0.1:{plane.http_port}/api/v1/wheels/{wheel}' in command

    root = box.agent_dir / "wheel-box"
    site = root / "site"
    root.mkdir(parents=True)
    bin_dir = _tools(root, site, box.dockerd.host)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(root),
        "LEVERS9_AGENT_DIR": str(root / "agent"),
        "TMPDIR": str(root),
    }
    process = subprocess.Popen(
        ["/bin/sh", "-c", command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=root,
    )
    try:
        wait_until(
            "the agent installed from the wheel joined",
            lambda: any(m["name"] == "from-wheel" and m["connected"] for m in plane.machines()),
            300,
            why=lambda: process.poll() is not None and (process.stdout.read() if process.stdout else ""),
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate(timeout=30)
    assert ": OK" in out, out  # sha256sum -c checked the file against the hash in the command
    assert "levers9[agent] @ file://" in (root / "pip.log").read_text()
    assert (root / "imported-from").read_text().startswith(str(site)), "levers9 ran from the installed wheel"
    [fetched] = list(root.glob(f"tmp.*/{wheel}"))
    assert fetched.stat().st_size > 0
    removed = plane.operator("machine", "remove", "from-wheel", "--yes", timeout=300)
    assert removed.returncode == 0, removed.stderr
