"""Fixtures of the builder's tests: a real Debian base, real runc and runsc, a bridge of their own.

The base is the shared Debian bookworm one (``debian_base``, :mod:`tests.fixtures.debian_base`: built
with ``mmdebstrap`` by its first user on the machine), unpacked once per session into a session
image cache that every test here shares. A missing tool fails the test with the command that
installs it.

Each test that runs containers gets a :class:`Box`: the runtime's hooks, a runtime context on a bridge
and subnet of its own, and at the end a check that nothing is left (containers, mounts, network
namespaces, host-guard rules, user-namespace directories) before the bridge is destroyed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from levers9.builder.base import BaseLayer
from levers9.builder.build import BaseImage
from levers9.engine import host_guard
from levers9.engine.images import ImageStore
from levers9.engine.node import NETWORK_STATE, bridge_for
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, load_plugins
from levers9.hooks.types import RuntimeContext

RUNTIMES = ["runc", "gvisor"]
TOOLS = {"runc": "apt-get install -y runc", "runsc": "apt-get install -y runsc", "skopeo": "apt-get install -y skopeo"}


def require(tool: str) -> str:
    """The tool's path; the test fails (never skips) naming the command that installs it when it is missing."""
    path = shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}") if os.path.exists(p)), None)
    if path is None:
        pytest.fail(f"{tool} is not installed: {TOOLS.get(tool, f'apt-get install -y {tool}')}")
    return path


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image-cache")


@pytest.fixture(scope="session")
def base(debian_base: BaseLayer, image_cache: Path) -> BaseImage:
    """The base unpacked into the session's image cache and gzipped, as a build's caller hands it over."""
    return BaseImage.debian(debian_base, ImageStore(image_cache))


@dataclass
class Box:
    """One runtime's hooks and context, on a bridge of the test's own."""

    hooks: Hooks
    runtime: RuntimeContext
    store: ImageStore
    bridge: str
    state_dir: Path
    extra: list[str] = field(default_factory=list)


def leftovers(box: Box) -> list[str]:
    """What a build or a test container left behind: anything at all is a failure."""
    found = []
    containers = box.state_dir / "containers"
    if containers.is_dir() and any(containers.iterdir()):
        found.append(f"container directories {sorted(p.name for p in containers.iterdir())}")
    mounts = Path("/proc/self/mountinfo").read_text()
    if str(box.state_dir) in mounts:
        found.append("a mount under the runtime's state directory")
    builds = box.state_dir / "builds"
    if builds.is_dir() and any(builds.iterdir()):
        found.append(f"build work directories {sorted(p.name for p in builds.iterdir())}")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    found += [f"veth {line.split(':')[1].strip()}" for line in links.splitlines() if f"master {box.bridge}" in line]
    attached = bridge_for(box.runtime.settings).attachments()
    if attached:
        found.append(f"bridge attachments {attached} (netns: {netns.split()})")
    rules = host_guard.allowances(box.bridge)
    if rules:
        found.append(f"host-guard allowances {rules}")
    ps = subprocess.run(["pgrep", "-f", str(box.state_dir)], capture_output=True, text=True, check=False).stdout
    if ps.split():
        found.append(f"processes {ps.split()} naming the runtime's state directory")
    return found


@pytest.fixture(params=RUNTIMES)
async def box(request: pytest.FixtureRequest, tmp_path: Path, image_cache: Path) -> AsyncIterator[Box]:
    name: str = request.param
    require("runsc" if name == "gvisor" else "runc")
    hooks = Hooks(load_plugins(PluginPolicy()))
    bridge = f"l9b{secrets.token_hex(5)}"
    subnet = f"10.{210 + secrets.randbelow(40)}.{secrets.randbelow(250)}.0/24"
    settings = hooks.runtime_settings_model(name)
    assert settings is not None
    runtime = RuntimeContext(
        name=name,
        settings=settings(bridge=bridge, subnet=subnet, image_cache=str(image_cache)),
        state_dir=str(tmp_path / name),
    )
    made = Box(hooks, runtime, ImageStore(image_cache), bridge, tmp_path / name)
    try:
        yield made
    finally:
        for cid in [*made.extra, *await hooks.container_list(runtime)]:
            await hooks.container_remove(runtime, cid)
        left = leftovers(made)
        bridge_for(runtime.settings).destroy()
        shutil.rmtree(NETWORK_STATE / bridge, ignore_errors=True)  # the bridge's (now empty) state directory
        hooks.close()
    assert not left, f"left behind: {left}"


@pytest.fixture
def plain_box(tmp_path: Path, image_cache: Path) -> Iterator[Box]:
    """The process runtime's hooks, which cannot say what a container changed."""
    hooks = Hooks(load_plugins(PluginPolicy()))
    runtime = RuntimeContext(name="process", settings=None, state_dir=str(tmp_path / "process"))
    yield Box(hooks, runtime, ImageStore(image_cache), "none", tmp_path / "process")
    hooks.close()
