"""Launching a warm container: its recipe (spec, environment, mounts, ports), its start, and its end.

The recipe is the same for every runtime except where the runtime's
:class:`~levers9.hooks.types.RuntimeCapabilities` say otherwise, never by the
runtime's name:

- a runtime that gives containers their own filesystem gets the runner's
  Python tree and the stub's handler as read-only mounts at fixed paths; one
  whose containers see the host's filesystem (``host_filesystem``) is told
  their host paths, and its GPUs are picked by ``CUDA_VISIBLE_DEVICES`` since
  nothing else hides the rest;
- a runtime whose containers share the host's network (``host_network``) has the
  runner listen on 127.0.0.1 only; otherwise the container has a bridge network
  and only the runner's port is forwarded to the worker's loopback.

The trust boundary. A container runs the user's code, so it is given only what
runs there: :data:`CONTAINER_FILES` of levers9 (its ``__init__`` and
``__about__``, :mod:`levers9.payloads`, :mod:`levers9.runner`, and
``levers9.sdk``'s ``__init__`` and ``lifecycle``, for ``levers9.ready()``, the
one SDK call made inside a container), plus cloudpickle: nothing of the
controlplane, state, services, scheduler, hooks, worker, agent or CLI, which
are not importable there (tests/worker/test_container_boundary.py) and, except
in the ``host`` image (the host's Python prefixes, bound read-only, may hold an
installed levers9), not in its filesystem either. A runtime whose containers
see the host's filesystem (``process``) is outside this boundary: its calls are
given the installed packages' host paths, and read what the host lets them.
The worker copies them once into a tree of its state directory, named by the
digest of its content (a new version gets a new tree, never a half-updated
one), and mounts that tree at :data:`PYTHON_DIR`. A copy, not the installed
package: a package directory cannot be mounted in part, and a copy on the
state directory can be idmapped where the installation may not (a worker in a
container of the worker image has its packages on overlayfs, and a runc
container is then given no user namespace).

What user code can still import from levers9, and why. A function pickled by
value whose code names the module ``levers9`` (a script that did ``import
levers9`` for the decorator and reads ``levers9.__version__`` or calls
``levers9.ready()``) makes cloudpickle import ``levers9`` in the container: the
real ``levers9/__init__.py`` is mounted, unchanged, because it imports nothing
but ``__about__`` until a name is asked for. A function whose code names a
decorated function (``other.remote()``, or itself through its decorated name)
pickles a ``levers9.sdk.functions.Function``; its module is not mounted, so
loading it fails, and the runner says so by name. That fails on purpose: the
SDK client is the controlplane's, it needs gRPC and a token the container does
not have, and mounting it would put the worker's code back in reach. An image
that installs levers9 itself does not change this: the mounted package comes
first on ``PYTHONPATH`` and, as a regular package, hides the image's copy.

A container of a checkpointed stub boots through :mod:`levers9.checkpoint.boot`
with this same spec, mounts included; gVisor takes the same mounts as runc.
Connecting to the runner once it is up is :mod:`levers9.worker.warm.runner_client`'s.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import secrets
import shutil
import signal
import sys
from pathlib import Path

from levers9 import ports
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
from levers9.runner import sandbox_wire
from levers9.worker.calls import SANDBOX_KIND, StubSpec
from levers9.worker.volumes import WorkerVolumes
from levers9.worker.warm.scaling import WarmContainer, WarmStub

__all__ = [
    "CONTAINER_FILES",
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
#: seconds a runner is given to end by itself once its worker has hung up, before its container is signalled
HANG_UP_WAIT_S = 1.0
#: how much of a container's output an error quotes
LOG_TAIL_BYTES = 4000

#: where, inside a container, the runner's Python tree and the stub's handler are mounted
PYTHON_DIR = "/opt/levers9/python"
HANDLER_DIR = "/opt/levers9/handler"
HANDLER_FILE = "handler.pkl"
#: what ``python -m levers9.runner`` imports beyond the standard library (tests/worker/test_runner_stdlib.py)
RUNNER_PACKAGES = ("levers9", "cloudpickle")
#: the files and directories of the levers9 package a container gets, relative to it: the runner, what it
#: imports, and what ``levers9.ready()`` needs; nothing else of levers9 (tests/worker/test_container_boundary.py)
CONTAINER_FILES = ("__init__.py", "__about__.py", "payloads.py", "runner", "sdk/__init__.py", "sdk/lifecycle.py")


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
        """A port no other container of this pool uses, in the range levers9's servers pick from.

        That range lies below the kernel's ephemeral range, whose ports outgoing connections take, so a port
        picked there cannot be taken between the pick and the runner binding it (on the host network of the
        process runtime) by a connection (:mod:`levers9.ports`).
        """
        try:
            port = ports.pick(taken=self._taken)
        except OSError as exc:
            raise Levers9Error(f"no free TCP port found for a container's runner: {exc}") from exc
        self._taken.add(port)
        return port

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
        #: the runner's Python tree in the state directory (:func:`container_tree`); made at the first mount
        self._tree: Path | None = None
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
            # On the host's network the runner's port is the worker's loopback's. On a bridge the worker, the
            # gateway and the sandboxes' relay reach the container at its own address there: the runner (which
            # answers only the box's token), a serving container's HTTP server and a box's ports. No port
            # forwarder process is started for it (one was, at 170 ms a container start).
            ports=[box.port] if self.capabilities.host_network else [],
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
        if stub.kind == SANDBOX_KIND:  # no handler: the runner serves processes and files (levers9.runner.sandbox)
            env[sandbox_wire.ENV_MODE] = sandbox_wire.MODE_SANDBOX
        return env

    def mounts(self, group: WarmStub) -> list[Mount]:
        """The runner's Python tree, at a path of its own so any image can import it, and the handler."""
        if self._tree is None:
            self._tree = container_tree(self.state_dir / "runner")
        return [
            Mount(source=str(self._tree), target=PYTHON_DIR),
            Mount(source=str(group.handler_dir), target=HANDLER_DIR),
        ]

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
                    checkpointing,
                    self.hooks,
                    self.runtime,
                    self.capabilities,
                    spec,
                    marks=box,
                    signal_dir=box.signal_dir,
                    images_dir=self.state_dir / "images",
                    workspace_id=stub.workspace_id,
                    stub_id=stub.stub_id,
                    token=box.token,
                    timeout_s=self.start_timeout_s,
                )
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

    async def stop(self, box: WarmContainer, *, hung_up: bool) -> None:
        """Stop and remove ``box``'s container: a runner whose worker hung up (``hung_up``) is given
        :data:`HANG_UP_WAIT_S` to end by itself, then :meth:`kill`. Raises Levers9Error when the runtime
        cannot remove it."""
        if not box.prepared:
            return
        # stopped before removal, also because a runtime may not be able to kill what it just started
        if box.started:
            ended = hung_up and await self.wait_exited(box.cid, HANG_UP_WAIT_S) is not None
            if not ended:
                await self.kill(box)
        await self.remove(box.cid)

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


def container_tree(copies: Path) -> Path:
    """The directory a container gets at :data:`PYTHON_DIR`: :data:`CONTAINER_FILES` of levers9, and cloudpickle.

    Copied under ``copies`` into a directory named by the digest of what it holds, made in a scratch
    directory renamed into place, so a worker that starts again reuses it and no container sees half of one.
    """
    found = _package_dirs()
    files = {f"levers9/{rel}": src for rel, src in _container_files(Path(found["levers9"])).items()}
    files |= {f"cloudpickle/{rel}": src for rel, src in _package_files(Path(found["cloudpickle"])).items()}
    digest = hashlib.sha256(f"compiled by {sys.implementation.cache_tag}\0".encode())
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + files[rel].read_bytes() + b"\0")
    target = copies / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    scratch = copies / f".{target.name}.{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    for rel, src in files.items():
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        shutil.copyfile(src, scratch / rel)
    # Compiled once here, for this worker's Python (the host image's): a container's Python reads the bytecode
    # instead of compiling every module of the runner and cloudpickle at each start, since it cannot write any
    # (the tree is mounted read-only). Another Python version finds no bytecode of its own and compiles, as before.
    compileall.compile_dir(str(scratch), quiet=2, workers=1)
    for path in [scratch, *scratch.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
        else:
            path.chmod(0o644)
    try:
        os.replace(scratch, target)
    except OSError:
        if not target.is_dir():
            raise
        shutil.rmtree(scratch, ignore_errors=True)  # another start of this worker made the same tree first
        return target
    log.info("the runner's Python tree for containers is %s", target)
    return target


def _container_files(package: Path) -> dict[str, Path]:
    """:data:`CONTAINER_FILES` of the levers9 package at ``package``, file by file, relative to it."""
    files: dict[str, Path] = {}
    for rel in CONTAINER_FILES:
        path = package / rel
        if path.is_dir():
            files |= {f"{rel}/{sub}": src for sub, src in _package_files(path).items()}
        elif path.is_file():
            files[rel] = path
        else:
            raise Levers9Error(f"{path}, which containers get, is missing from the levers9 installation")
    return files


def _package_files(package: Path) -> dict[str, Path]:
    """The Python source files of a package directory, relative to it; no bytecode, nothing else."""
    return {str(p.relative_to(package)): p for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts}
