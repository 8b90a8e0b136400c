"""Seconds from ``levers9 machine create --ssh`` to the first call served, and the worker image build beside it.

The path the end-to-end test (tests/e2e/test_agent_machine.py) takes, timed:
a private dockerd (``bench/agents_setup.py``), ``levers9 worker-image build
--docker-host ... --cache-dir <empty dir>`` (a cold build, timed apart), an
sshd on loopback (tests/fixtures/sshd.py) standing for the box, ``levers9 up``
over TLS with the pool ``box`` of provider ``agent_machine``
(tests/fixtures/agent_box.py, whose ``ssh`` block names that sshd), then:

1. ``levers9 machine create --pool box --ssh root@127.0.0.1:PORT
   --agent-dir DIR``, each line it prints stamped as it arrives; it returns
   once the machine shows joined and connected (create -> joined);
2. a program calling one ``@levers9.function`` on the pool, run at once:
   the scheduler provisions a worker (a provision order to the agent, a
   container of the worker image, the worker registering), and the call
   returns (joined -> first call).

Everything is removed at the end: ``machine remove``, the box's supervisor,
agent and containers, the controlplane, sshd and dockerd, and every directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.agents_setup import private_dockerd
from tests.fixtures.agent_box import AgentPlane, Box
from tests.fixtures.levers9_up import _reap
from tests.fixtures.sshd import _start as start_sshd
from tests.fixtures.sshd import _stop as stop_sshd

__all__ = ["SshFigures", "print_ssh", "ssh_join"]

CALL = """
import levers9

@levers9.function(cpu=0.25)
def double(x):
    return x * 2

print("result", double.remote(21))
"""


@dataclass
class SshFigures:
    #: the box's Docker had the worker image before the join (else the join ships it over SSH)
    preloaded: bool
    image_build_s: float = 0.0
    image_size_mib: float = 0.0
    create_to_joined_s: float = 0.0
    joined_to_first_call_s: float = 0.0
    steps: list[tuple[float, str]] = field(default_factory=list)
    error: str = ""


def _build_image(host: str, cache: Path, figures: SshFigures) -> str:
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "levers9",
            "worker-image",
            "build",
            "--docker-host",
            host,
            "--cache-dir",
            str(cache),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    figures.image_build_s = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"levers9 worker-image build failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    figures.image_size_mib = int(result.get("size_bytes", 0)) / 2**20
    return str(result["image"])


def _create(plane: AgentPlane, box: Box, figures: SshFigures) -> float:
    assert plane.sshd is not None
    began = time.monotonic()
    args = [
        sys.executable,
        "-m",
        "levers9",
        "machine",
        "create",
        "--pool",
        "box",
        "--ssh",
        f"root@127.0.0.1:{plane.sshd.port}",
        "--agent-dir",
        str(box.agent_dir),
    ]
    env = {**plane.env, "LEVERS9_TOKEN": plane.operator_token}
    with subprocess.Popen(
        args, env=env, cwd=plane.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as create:
        assert create.stdout is not None
        for line in create.stdout:
            figures.steps.append((time.monotonic() - began, line.rstrip()))
        code = create.wait(600)
    if code != 0:
        shown = "\n".join(line for _, line in figures.steps)
        raise RuntimeError(f"levers9 machine create --ssh failed ({code}):\n{shown}\n--- box:\n{box.log()[-2000:]}")
    return time.monotonic() - began


def ssh_join(*, preloaded: bool) -> SshFigures:
    """One join and first call; ``preloaded``: the image is built into the box's Docker first (timed), else the
    join finds the box without it and streams it over SSH (a fresh box)."""
    figures = SshFigures(preloaded)
    root = Path(tempfile.mkdtemp(prefix="l9-bench-ssh-"))
    sshd = None
    try:
        with private_dockerd() as daemon:
            image = _build_image(daemon.host, root / "image-cache", figures)
            if not preloaded:
                daemon.cli("rmi", image)
            (root / "sshd").mkdir()
            sshd = start_sshd(root / "sshd", verbose=False)
            plane = AgentPlane(root / "plane", dockerd=daemon, image=image, sshd=sshd)
            box = Box(daemon, root / "box")
            try:
                plane.start()
                figures.create_to_joined_s = _create(plane, box, figures)
                began = time.monotonic()
                done = plane.python(CALL, timeout=600)
                figures.joined_to_first_call_s = time.monotonic() - began
                if "result 42" not in done.stdout:
                    raise RuntimeError(f"the first call failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
                for machine in plane.machines():
                    plane.operator("machine", "remove", machine["name"], "--yes", timeout=300)
            finally:
                try:
                    box.teardown()
                finally:
                    plane.stop()
                    _reap(root)
    except Exception as exc:  # reported, not raised: the other figures stand
        figures.error = f"{type(exc).__name__}: {exc}"
    finally:
        if sshd is not None:
            stop_sshd(sshd)
        shutil.rmtree(root, ignore_errors=True)
    return figures


def print_ssh(f: SshFigures) -> None:
    how = "the worker image already in the box's Docker" if f.preloaded else "a fresh box: the image sent over SSH"
    print(f"\n### `levers9 machine create --ssh` to the first call ({how})\n")
    if f.preloaded:
        print(f"- `levers9 worker-image build` (cold cache): {f.image_build_s:.1f} s, image {f.image_size_mib:.0f} MiB")
    if f.error:
        print(f"- did not complete: {f.error[:3000]}")
    for at, line in f.steps:
        print(f"    {at:6.1f} s  {line}")
    if not f.error:
        total = f.create_to_joined_s + f.joined_to_first_call_s
        print("\n| step | seconds |\n|--|--:|")
        print(f"| `machine create --ssh` -> joined and connected | {f.create_to_joined_s:.1f} |")
        print(f"| joined -> first call returned | {f.joined_to_first_call_s:.1f} |")
        print(f"| total | {total:.1f} |")
