"""Launching a warm container: its recipe (spec, environment, mounts, ports), its start, and its end.

The recipe is the same for every runtime except where the runtime's
:class:`~levers9.hooks.types.RuntimeCapabilities` say otherwise, never by the
runtime's name:

- a runtime that gives containers their own filesystem gets the runner's
  packages (:data:`RUNNER_PACKAGES`, standard library plus cloudpickle) and the
  stub's handler as read-only mounts at fixed paths. Packages on overlayfs (a
  worker in a container of the worker image) are mounted from a copy in the
  worker's state directory, made once: an overlayfs directory cannot be
  idmapped, and without that a runc container gets no user namespace; one whose containers see
  the host's filesystem (``host_filesystem``) is told their host paths, and its
  GPUs are picked by ``CUDA_VISIBLE_DEVICES`` since nothing else hides the rest;
- a runtime whose containers share the host's network (``host_network``) has the
  runner listen on 127.0.0.1 only; otherwise the container has a bridge network
  and only the runner's port is forwarded to the worker's loopback.

A container of a checkpointed stub boots through :mod:`levers9.checkpoint.boot`.
Connecting to the runner once it is up is :mod:`levers9.worker.warm.runner_client`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import sys
from pathlib import Path

from levers9.checkpoint.boot import boot_checkpointed, wants_checkpoint
from levers9.checkpoint.snapshot import Checkpointing
from levers9.files import write_atomic
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    Mount,
    RuntimeCapabilities,
    RuntimeContext,
)
from levers9.runner import main as runner
from levers9.worker.calls import StubSpec
from levers9.worker.volumes import WorkerVolumes
from levers9.worker.warm.scaling import WarmContainer, WarmStub

__all__ = [
    "EXIT_WAIT_S",
    "HANDLER_DIR",
    "HANDLER_FILE",
    "PYTHON_DIR",
    "RUNNER_PACKAGES",
    "STOP_GRACE_S",
    "Launcher",
    "PortPicker",
    "StartFailed",
    "container_id",
    "write_handler",
]

log = logging.getLogger(__name__)

#: seconds between SIGTERM and SIGKILL when a call's container is stopped under it
STOP_GRACE_S = 3.0
#: seconds a container whose connection broke is given to be seen as exited, before it is killed
EXIT_WAIT_S = 10.0
#: how much of a container's output an error quotes
LOG_TAIL_BYTES = 4000

#: where, inside a container, the runner's own packages and the stub's handler are mounted
PYTHON_DIR = "/opt/levers9/python"
HANDLER_DIR = "/opt/levers9/handler"
HANDLER_FILE = "handler.pkl"
#: what ``python -m levers9.runner`` imports beyond the standard library (tests/worker/test_runner_stdlib.py)
RUNNER_PACKAGES = ("levers9", "cloudpickle")
#: file systems whose directories cannot be idmapped into a container's user namespace
NO_IDMAP = frozenset({"overlay"})


class StartFailed(Exception):
    """A container did not come up to serve calls; the message says why, with its output."""


def container_id(stub: StubSpec) -> str:
    short = re.sub(r"[^A-Za-z0-9]", "", stub.stub_id)[:12] or "stub"
    return f"l9-{short}-{secrets.token_hex(4)}"


def write_handler(handler_dir: Path, handler: bytes) -> None:
    """The stub's pickled handler, readable by the worker only (it is mounted into the stub's containers)."""
    handler_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(handler_dir / HANDLER_FILE, handler, mode=0o600)


class PortPicker:
    """Ports for the containers' runners and HTTP servers, none used twice by this pool."""

    def __init__(self) -> None:
        self._taken: set[int] = set()

    def pick(self) -> int:
        """A port no other container of this pool uses, below the kernel's ephemeral range.

        Outgoing connections take their local ports from that range, so a port picked below it cannot be
        taken between the pick and the runner binding it (on the host network of the process runtime).
        """
        low = _ephemeral_low()
        for _ in range(200):
            port = random.randrange(max(1024, low - 20000), low)
            if port not in self._taken and _bindable(port):
                self._taken.add(port)
                return port
        raise Levers9Error("no free TCP port found for a container's runner")

    def release(self, *ports: int) -> None:
        for port in ports:
            self._taken.discard(port)


class Launcher:
    """Builds, starts, signals and removes the containers of one worker's runtime."""

    def __init__(
        self,
        hooks: Hooks,
        runtime: RuntimeContext,
        capabilities: RuntimeCapabilities,
        *,
        state_dir: Path,
        python: str = sys.executable,
        gpus_present: bool = False,
        start_timeout_s: float = 120.0,
        checkpointing: Checkpointing | None = None,
        volumes: WorkerVolumes | None = None,
    ) -> None:
        self.hooks = hooks
        #: the volumes the stubs' containers mount; None: this worker mounts none
        self.runtime = runtime
        self.capabilities = capabilities
        self.state_dir = state_dir
        #: where the runner's packages are mounted from (copies when they are on overlayfs); known at the first mount
        self._runner_dirs: dict[str, str] | None = None
        self.python = python
        self.gpus_present = gpus_present
        self.start_timeout_s = start_timeout_s
        self.checkpointing = checkpointing
        self.volumes = volumes

    # ----------------------------------------------------------------- the recipe

    def spec(self, group: WarmStub, box: WarmContainer) -> ContainerSpec:
        stub = group.spec
        image_python = self.python if stub.image == "host" else "python3"
        return ContainerSpec(
            container_id=box.cid,
            image=stub.image,
            command=[image_python, "-m", "levers9.runner"],
            env=self.environment(group, box),
            cpu_millicores=stub.cpu_millicores,
            memory_mib=stub.memory_mib,
            gpus=box.gpus,
            mounts=[] if self.capabilities.host_filesystem else self.mounts(group),
            network="host" if self.capabilities.host_network else "bridge",
            # only the runner's port is forwarded to the worker's loopback: the gateway reaches a serving
            # container's HTTP server and a box's ports at the container's own address on the bridge
            ports=[box.port],
        )

    def environment(self, group: WarmStub, box: WarmContainer) -> dict[str, str]:
        stub = group.spec
        env = {**stub.env, **stub.secret_env}
        if self.capabilities.host_filesystem:
            paths = list(dict.fromkeys(str(Path(d).parent) for d in _package_dirs().values()))
            handler = str(group.handler_dir / HANDLER_FILE)
            if self.gpus_present:  # nothing isolates a process from the host's GPUs but CUDA's own filter
                env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in box.gpus)
        else:
            paths = [PYTHON_DIR]
            handler = f"{HANDLER_DIR}/{HANDLER_FILE}"
        if self.capabilities.host_network:
            env[runner.ENV_HOST] = "127.0.0.1"  # the host's network: listen where only this machine can reach
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [stub.env.get("PYTHONPATH")])])
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the code is mounted read-only
        env[runner.ENV_PORT] = str(box.port)
        env[runner.ENV_TOKEN] = box.token
        env[runner.ENV_HANDLER] = handler
        env[runner.ENV_PYTHON] = stub.python_version
        return env

    def mounts(self, group: WarmStub) -> list[Mount]:
        """The runner's packages, at a path of their own so any image can import them, and the handler."""
        if self._runner_dirs is None:
            self._runner_dirs = _idmappable(_package_dirs(), self.state_dir / "runner")
        mounts = [Mount(source=d, target=f"{PYTHON_DIR}/{name}") for name, d in self._runner_dirs.items()]
        return [*mounts, Mount(source=str(group.handler_dir), target=HANDLER_DIR)]

    # ----------------------------------------------------------------- start

    async def boot(self, group: WarmStub, box: WarmContainer) -> None:
        """Prepare and start the container (from a checkpoint when its stub has one); raises StartFailed."""
        spec = self.spec(group, box)
        stub = group.spec
        if stub.volumes:
            spec = spec.model_copy(update={"mounts": [*spec.mounts, *await self._volume_mounts(box.cid, stub)]})
        checkpointing = self.checkpointing
        if checkpointing is not None and await wants_checkpoint(
            checkpointing, self.hooks, self.runtime, self.capabilities, enabled=stub.checkpoint_enabled
        ):
            box.signal_dir = self.state_dir / "signals" / box.cid
            try:
                await boot_checkpointed(
                    checkpointing, self.hooks, self.runtime, self.capabilities, spec, marks=box,
                    signal_dir=box.signal_dir, images_dir=self.state_dir / "images",
                    workspace_id=stub.workspace_id, stub_id=stub.stub_id, token=box.token,
                    timeout_s=self.start_timeout_s,
                )  # fmt: skip
            except (Levers9Error, TimeoutError) as exc:
                raise StartFailed(f"the runtime could not start the container: {exc}") from exc
            return
        box.prepared = True  # a prepare that fails half way still leaves something to remove
        try:
            prepared = await self.hooks.container_prepare(self.runtime, spec, timeout=self.start_timeout_s)
            await self.hooks.container_start(self.runtime, prepared, timeout=self.start_timeout_s)
            box.started = True
        except Levers9Error as exc:
            raise StartFailed(f"the runtime could not start the container: {exc}") from exc

    async def _volume_mounts(self, cid: str, stub: StubSpec) -> list[Mount]:
        """The stub's volumes, mounted on the worker for this container; StartFailed saying why they cannot be."""
        if self.capabilities.host_filesystem:
            raise StartFailed(
                f"{stub.name} mounts volumes, and this pool's runtime ({self.runtime.name}) runs calls on the host's "
                "filesystem, with nothing to mount them into; run it on a pool of runc or gvisor"
            )
        if self.volumes is None:
            raise StartFailed(f"{stub.name} mounts volumes, and this worker was started without volume support")
        try:
            return await self.volumes.acquire(cid, stub.workspace_id, stub.volumes)
        except Levers9Error as exc:
            raise StartFailed(f"mounting the volumes failed: {exc}") from exc

    # ----------------------------------------------------------------- stop and inspect

    async def kill(self, box: WarmContainer) -> None:
        """SIGTERM, then SIGKILL if the container is still there after the grace period."""
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, EXIT_WAIT_S)):
            try:
                await self.hooks.container_kill(self.runtime, box.cid, sig)
            except Levers9Error as exc:
                log.warning("signalling container %s failed: %s", box.cid, exc)
            if await self.wait_exited(box.cid, wait) is not None:
                return

    async def wait_exited(self, cid: str, timeout: float) -> ContainerState | None:
        """The container's state once it has exited (or is unknown); None when it still runs after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = await self.hooks.container_state(self.runtime, cid)
            if state.status in (ContainerStatus.EXITED, ContainerStatus.UNKNOWN):
                return state
            if loop.time() > deadline:
                return None
            await asyncio.sleep(0.02)

    async def state(self, cid: str) -> ContainerState:
        return await self.hooks.container_state(self.runtime, cid)

    async def log_tail(self, cid: str) -> str:
        """The last :data:`LOG_TAIL_BYTES` of the container's output, for error messages."""
        tail, offset = b"", 0
        with contextlib.suppress(Levers9Error):
            for _ in range(256):  # a runaway log is read 1 MiB a time; stop somewhere
                chunk = await self.hooks.container_logs(self.runtime, cid, offset)
                tail = (tail + chunk.data)[-LOG_TAIL_BYTES:]
                if chunk.eof or not chunk.data:
                    break
                offset = chunk.next_offset
        return tail.decode(errors="replace").strip()

    async def remove(self, cid: str) -> None:
        await self.hooks.container_remove(self.runtime, cid)
        if self.volumes is not None:
            await self.volumes.release(cid)


def _package_dirs() -> dict[str, str]:
    """Where the runner's packages live on this host."""
    found = {}
    for name in RUNNER_PACKAGES:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if not locations:
            raise Levers9Error(f"package {name!r}, which the container runner needs, is not importable here")
        found[name] = locations[0]
    return found


def _idmappable(found: dict[str, str], copies: Path) -> dict[str, str]:
    """``found``, or copies of its packages under ``copies`` when one is on a file system that cannot be idmapped."""
    if not any(_fs_type(path) in NO_IDMAP for path in found.values()):
        return found
    copied = {}
    for name, path in found.items():
        target = copies / name
        if not target.exists():
            scratch = copies / f".{name}.{os.getpid()}"
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.copytree(path, scratch, symlinks=True)
            os.replace(scratch, target)
        copied[name] = str(target)
    log.info("the runner's packages are on overlayfs: containers get copies from %s", copies)
    return copied


def _fs_type(path: str) -> str:
    """The type of the file system ``path`` is on: that of the deepest mount point above it in mountinfo."""
    target, deepest, kind = os.path.realpath(path), "", ""
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields, _, rest = line.partition(" - ")
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields.split()[4])
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(deepest):
                deepest, kind = point, rest.split()[0]
    return kind


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
