"""levers9's own wheel over the controlplane's HTTP listener: what boxes install the agent from (issue 35 item 16).

The name ``levers9`` on the public package index is another project's, so a box
never installs ours by name: it fetches ``GET /api/v1/wheels/<file>`` and checks
the sha256 the controlplane gave. Here the REST app over real services answers
the listing and the file without a token, the bytes hash to what it says, the
wheel installs with pip (from the file alone, no index) and runs ``levers9
--version`` from where it was installed, and no other name or path is ever
answered (the routes are no proxy).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from levers9.__about__ import __version__
from levers9.controlplane.wheels import OwnWheels
from levers9.images.rootfs import ImageError
from levers9.images.wheel import build, wheel_name
from tests.controlplane.conftest import Api


async def test_the_wheel_is_listed_and_served_without_a_token_with_its_sha256(api: Api) -> None:
    listed = await api.client.get("/api/v1/wheels")
    assert listed.status_code == 200, listed.text
    [wheel] = listed.json()["wheels"]
    assert wheel["filename"] == wheel_name() == f"levers9-{__version__}-py3-none-any.whl"
    assert wheel["url"] == f"http://levers9.test/api/v1/wheels/{wheel['filename']}"

    served = await api.client.get(f"/api/v1/wheels/{wheel['filename']}")
    assert served.status_code == 200, served.text
    assert served.headers["content-type"] == "application/octet-stream"
    assert hashlib.sha256(served.content).hexdigest() == wheel["sha256"] == served.headers["x-checksum-sha256"]
    assert len(served.content) == wheel["size"]

    with zipfile.ZipFile(BytesIO(served.content)) as archive:
        names = set(archive.namelist())
        info = f"levers9-{__version__}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        record = archive.read(f"{info}/RECORD").decode()
    assert {
        "levers9/__init__.py",
        "levers9/cli/main.py",
        "levers9_agent_machine/__init__.py",
        "levers9_runc/__init__.py",
        f"{info}/entry_points.txt",
        f"{info}/WHEEL",
    } <= names
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert f"Version: {__version__}" in metadata.splitlines()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires
    assert not [line for line in requires if line.split()[1].startswith("levers9")]
    assert len(record.splitlines()) == len(names)


async def test_no_other_name_or_path_is_answered(api: Api) -> None:
    for path in (
        "/api/v1/wheels/levers9-0.0.1-py3-none-any.whl",
        "/api/v1/wheels/..%2F..%2Fpyproject.toml",
        "/api/v1/wheels/%2Fetc%2Fpasswd",
        "/api/v1/wheels/https:%2F%2Fpypi.org%2Fsimple%2Flevers9",
    ):
        answer = await api.client.get(path)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"]["type"] == "not_found"
        if "%2F" not in path:  # a name the route took: its answer names what is served
            assert f"the wheels served: {wheel_name()}" in answer.json()["error"]["message"]
    assert (await api.client.post("/api/v1/wheels")).status_code == 405


def test_the_same_installation_gives_the_same_bytes() -> None:
    assert build().sha256 == build().sha256


def test_the_served_wheel_installs_with_pip_from_the_file_alone_and_runs(tmp_path: Path) -> None:
    wheel = build()
    path = tmp_path / wheel.filename
    path.write_bytes(wheel.data)
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, f"python -m venv (apt-get install -y python3-venv): {made.stderr}"
    target = tmp_path / "site"
    installed = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            f"levers9[agent] @ file://{path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # the installed copy comes first on the path; its requirements are this interpreter's
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            "import levers9, levers9_agent_machine, sys; print(levers9.__file__); "
            "from levers9.cli.main import main; sys.argv = ['levers9', '--version']; main()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    first, second = ran.stdout.splitlines()[:2]
    assert first.startswith(str(target)), ran.stdout
    assert second == f"levers9 {__version__}"


async def test_booted_machines_get_the_wheels_url_and_hash_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the scheduler's ``ctx.wheel`` answers for a booted machine's script (WorkerBootstrap.wheel_url)."""
    wheel = build()
    assert await OwnWheels("https://cp.example:8443/").url_and_hash() == (
        f"https://cp.example:8443/api/v1/wheels/{wheel.filename}",
        wheel.sha256,
    )
    assert await OwnWheels().url_and_hash() is None  # no HTTP URL to give

    def unbuildable() -> None:
        raise ImageError("the package levers9_x cannot be imported here")

    monkeypatch.setattr("levers9.controlplane.wheels.build", unbuildable)
    assert await OwnWheels("https://cp.example:8443").url_and_hash() is None  # logged; the server serves on
