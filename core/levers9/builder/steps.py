"""Running one build step: a container on the layers below it, whose changes become the step's layer.

A ``run``, ``apt`` or ``pip`` step runs ``/bin/sh -c <script>`` in a container of the pool's runtime,
through the runtime hooks like any container (prepare, start, state and logs polled, remove), on an
image made of the layers below it: the base's and the earlier steps', all unpacked in the node's image
cache. That image is handed to the runtime as an OCI layout directory holding only a manifest and a
config (:func:`levers9.builder.layout.write_layout` without blobs), written in the build's private
work directory and deleted with it: every layer it names is found in the cache by its diff id, so
nothing is unpacked or copied, and no ref a user could name reaches those layers (users name images
by their own paths and registry refs; this directory exists only while the step runs, under a
directory only the worker can read).

What the container gets:

* the image's environment (the base's and the env steps'), its working directory, and on top of them
  the build's own variables: the egress proxy (``http_proxy``, ``https_proxy`` and their upper-case
  forms, and apt's ``Acquire::http(s)::Proxy``), pip's configuration (:mod:`levers9.builder.sources`)
  for pip steps, and the step's secrets;
* each of the step's secrets twice: as an environment variable of its name, and as the file
  ``/run/secrets/<NAME>`` (mode 0400) of a directory bind-mounted read-only; neither is in the
  captured layer (a mount is not the container's upper directory, and the empty mount point the runtime
  makes is left out: :mod:`levers9.engine.changes`), nor in the image's config or history;
* the build machine's pip CA bundle, read-only at :data:`levers9.builder.sources.CA_TARGET`, when
  pip is configured with one;
* a network namespace on the worker's bridge whose only way out is the build's egress proxy: its
  address is admitted to the proxy after ``prepare`` and before ``start``, and forgotten before the
  container is removed (so its address is no one's way out once it goes to another container).

Then :meth:`levers9.hooks.facade.Hooks.container_changes` writes the container's changes as a layer
tar, which goes into the node's cache under its diff id and is gzipped as the registry's blob.

Invariants: the container is removed whatever happens: a failed step, an error of the builder's
own, a cancelled build (a ``KeyboardInterrupt`` in ``asyncio.run`` is one) all remove it before the
error goes on, and a second cancellation during that removal waits for it too. A step that exits
non-zero raises :class:`StepFailed` with its exit code and its last lines of output, secrets masked.
A ``copy`` step runs no container: its layer is the content's tar with every name put under the
destination (:func:`copy_layer`), names checked as they are copied.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import secrets as token
import shlex
import shutil
import signal
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from levers9.blueprints.spec import Step
from levers9.builder.egress import EgressProxy
from levers9.builder.layout import Layer, gzip_layer, write_layout
from levers9.builder.sources import CA_TARGET, PipSettings
from levers9.engine.images import ImageStore
from levers9.engine.network import Bridge
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import ContainerSpec, ContainerStatus, Mount, RuntimeContext

__all__ = [
    "SECRETS_DIR",
    "TAIL_LINES",
    "BuildError",
    "StepFailed",
    "StepLimits",
    "StepRunner",
    "copy_layer",
    "describe",
    "keep_layer",
    "step_script",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: where a step's container finds its secrets, one file per name
SECRETS_DIR = "/run/secrets"
#: how many of a failed step's last lines of output its error quotes
TAIL_LINES = 20
#: apt, told to go through the proxy one request per connection (the proxy does not keep connections alive),
#: and to fetch no translations of package descriptions (nothing in an image reads them, as in Debian's own
#: container images; each is one more index to download)
_APT_OPTIONS = ("-o", "Acquire::http::Pipeline-Depth=0", "-o", "Acquire::Retries=3", "-o", "Acquire::Languages=none")
_POLL_S = 0.1
_HOOK_TIMEOUT_S = 120.0
#: how long writing a step's changes may take (a big pip install is gigabytes)
CHANGES_TIMEOUT_S = 3600.0


class BuildError(Levers9Error):
    """A build could not run a step for a reason of the builder's or the machine's, not the step's own."""


class StepFailed(Levers9Error):
    """A step's command failed: its exit code (None when it never ran to an exit) and last lines of output."""

    def __init__(self, reason: str, exit_code: int | None, lines: Sequence[str]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.lines = tuple(lines)


@dataclass(frozen=True)
class StepLimits:
    """What one step's container may use, and for how long."""

    cpu_millicores: int = 2000
    memory_mib: int = 4096
    pids_limit: int = 4096
    timeout_s: float = 3600.0


def step_script(step: Step, *, proxy_url: str | None) -> str:
    """The shell script a run, apt or pip step's container runs."""
    if step.op == "run":
        return step.args[0]
    if step.op == "apt":
        options = list(_APT_OPTIONS)
        if proxy_url:
            options += ["-o", f"Acquire::http::Proxy={proxy_url}", "-o", f"Acquire::https::Proxy={proxy_url}"]
        apt = "apt-get " + shlex.join(options)
        packages = shlex.join(step.args)
        return (
            f"set -e\n{apt} update\n"
            f"DEBIAN_FRONTEND=noninteractive {apt} install -y --no-install-recommends {packages}\n"
            f"{apt} clean\nrm -rf /var/lib/apt/lists/*\n"
        )
    if step.op == "pip":
        return f"python3 -m pip install {shlex.join(step.args)}"
    raise BuildError(f"a {step.op} step runs no container")


def describe(step: Step) -> str:
    """One line saying what a step does (its history entry's ``created_by``); secrets by name only."""
    names = f" (secrets: {', '.join(step.secrets)})" if step.secrets else ""
    if step.op == "run":
        return f"RUN{names} /bin/sh -c {step.args[0]}"
    if step.op == "apt":
        return f"APT{names} install {' '.join(step.args)}"
    if step.op == "pip":
        index = f" --index-url {step.index_url}" if step.index_url else ""
        return f"PIP{names} install{index} {' '.join(step.args)}"
    if step.op == "env":
        return "ENV " + " ".join(f"{k}={v}" for k, v in step.env)
    if step.op == "workdir":
        return f"WORKDIR {step.args[0]}"
    return f"COPY {step.content} {step.args[0]}"


def _mask(text: str, values: Sequence[str]) -> str:
    for value in values:
        if value:
            text = text.replace(value, "***")
    return text


@dataclass
class StepRunner:
    """Runs the container steps of one build (see the module docstring)."""

    hooks: Hooks
    runtime: RuntimeContext
    store: ImageStore
    #: the build's private scratch directory
    work: Path
    proxy: EgressProxy | None
    bridge: Bridge | None
    pip: PipSettings = field(default_factory=PipSettings)
    limits: StepLimits = field(default_factory=StepLimits)

    async def run(
        self,
        index: int,
        step: Step,
        *,
        layers: Sequence[Layer],
        config: dict[str, Any],
        workdir: str,
        secrets: Mapping[str, str],
        on_line: Callable[[str], None],
    ) -> Layer:
        """Run ``step`` (the ``index``-th, from 1) on ``layers`` with the image ``config``; its layer, kept.

        Raises :class:`StepFailed` when its command fails, :class:`BuildError` when the builder cannot
        run it, and removes its container in every case.
        """
        missing = [layer.diff_id for layer in layers if self.store.layer_path(layer.diff_id) is None]
        if missing:
            raise BuildError(f"step {index}: layers {', '.join(missing)} below it are not in the node cache")
        unset = [name for name in step.secrets if name not in secrets]
        if unset:
            raise BuildError(f"step {index}: the secrets {', '.join(unset)} it names were not given to the build")
        step_dir = self.work / f"step-{index}"
        step_dir.mkdir(mode=0o700)
        try:
            image = step_dir / "image"
            write_layout(image, layers, config, with_blobs=False)
            values = {name: secrets[name] for name in step.secrets}
            env = self._env(step, values)
            mounts = self._mounts(step_dir, values)
            script = step_script(step, proxy_url=self.proxy.url if self.proxy else None)
            spec = ContainerSpec(
                container_id=f"l9b-{token.token_hex(6)}-{index}",
                image=str(image),
                command=["/bin/sh", "-c", script],
                env=env,
                workdir=workdir,
                cpu_millicores=self.limits.cpu_millicores,
                memory_mib=self.limits.memory_mib,
                pids_limit=self.limits.pids_limit,
                mounts=mounts,
                network="bridge",
            )
            masked = list(values.values())
            tar = step_dir / "layer.tar"
            await _always_removed(self._container(spec, tar, masked, on_line), lambda: self._remove(spec.container_id))
            return await asyncio.to_thread(keep_layer, self.store, tar)
        finally:
            await asyncio.to_thread(shutil.rmtree, step_dir, True)

    def _env(self, step: Step, values: Mapping[str, str]) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.proxy is not None:
            for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
                env[name] = self.proxy.url
            env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.1"
        if step.op == "pip":
            env.update(self.pip.environment(step.index_url))
        env.update(values)
        return env

    def _mounts(self, step_dir: Path, values: Mapping[str, str]) -> list[Mount]:
        mounts = []
        if values:
            directory = step_dir / "secrets"
            directory.mkdir(mode=0o700)
            for name, value in values.items():
                fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
                with os.fdopen(fd, "w") as f:
                    f.write(value)
            directory.chmod(0o500)
            mounts.append(Mount(source=str(directory), target=SECRETS_DIR, read_only=True))
        if self.pip.cert is not None:
            mounts.append(Mount(source=str(self.pip.cert), target=CA_TARGET, read_only=True))
        return mounts

    async def _container(
        self, spec: ContainerSpec, tar: Path, masked: list[str], on_line: Callable[[str], None]
    ) -> None:
        hooks, runtime, cid = self.hooks, self.runtime, spec.container_id
        prepared = await _settled(hooks.container_prepare(runtime, spec, timeout=_HOOK_TIMEOUT_S))
        ip = self._address(cid)
        if self.proxy is not None and ip is not None:
            await _settled(self.proxy.admit(ip))
        try:
            await _settled(hooks.container_start(runtime, prepared, timeout=_HOOK_TIMEOUT_S))
            tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
            state = await self._follow(cid, masked, tail, on_line)
        finally:
            if self.proxy is not None and ip is not None:
                await _settled(self.proxy.forget(ip))
        if state is None:
            raise StepFailed(f"did not finish within {self.limits.timeout_s:g} s and was killed", None, list(tail))
        exit_code, oom = state
        if oom:
            raise StepFailed(
                f"was killed for using more than its {self.limits.memory_mib} MiB of memory", exit_code, list(tail)
            )
        if exit_code != 0:
            raise StepFailed(f"exited with code {exit_code}", exit_code, list(tail))
        diff = await hooks.container_changes(runtime, cid, str(tar), timeout=CHANGES_TIMEOUT_S)
        if diff is None:
            raise BuildError(f"runtime {runtime.name!r} cannot build images; builds need runc or gvisor")

    def _address(self, container_id: str) -> str | None:
        if self.bridge is None:
            return None
        for attachment in self.bridge.attachments():
            if attachment.container_id == container_id:
                return attachment.ip
        return None

    async def _follow(
        self, cid: str, masked: list[str], tail: collections.deque[str], on_line: Callable[[str], None]
    ) -> tuple[int | None, bool] | None:
        """Stream the container's output until it exits: (exit code, killed for memory), or None on timeout."""
        hooks, runtime = self.hooks, self.runtime
        offset, pending = 0, b""
        deadline = time.monotonic() + self.limits.timeout_s
        while True:
            state = await hooks.container_state(runtime, cid)
            chunk = await hooks.container_logs(runtime, cid, offset)
            offset = chunk.next_offset
            pending += chunk.data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = _mask(raw.decode("utf-8", "replace").rstrip("\r"), masked)
                tail.append(line)
                on_line(line)
            if state.status is ContainerStatus.EXITED and chunk.eof:
                if pending:
                    line = _mask(pending.decode("utf-8", "replace"), masked)
                    tail.append(line)
                    on_line(line)
                return state.exit_code, state.oom_killed
            if time.monotonic() > deadline:
                await hooks.container_kill(runtime, cid, signal.SIGKILL)
                return None
            if not chunk.data:
                await asyncio.sleep(_POLL_S)

    async def _remove(self, container_id: str) -> None:
        await self.hooks.container_remove(self.runtime, container_id, timeout=_HOOK_TIMEOUT_S)


async def _settled(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even when cancelled meanwhile, then raise the cancellation.

    A hook cancelled while its thread runs keeps running; what it makes (a prepared container) must exist
    before the removal that follows, or the removal would finish first and leave it behind.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def _always_removed(work: Awaitable[None], remove: Callable[[], Awaitable[None]]) -> None:
    """Await ``work``, then ``remove()`` whatever happened: after an error, and after a cancellation too."""
    try:
        await work
    except BaseException:
        try:
            await _settled(remove())
        except Exception as exc:  # the step's own error is the one to report
            log.error("removing a build container failed: %s", exc)
        raise
    await _settled(remove())


def keep_layer(store: ImageStore, tar: Path) -> Layer:
    """Keep the layer tar ``tar``: gzipped as the registry's blob, unpacked into the node cache; the tar is deleted."""
    try:
        layer = gzip_layer(tar, store.cache_dir)
        store.add_layer(tar, layer.diff_id)
    finally:
        tar.unlink(missing_ok=True)
    return layer


def copy_layer(content: Path, digest: str, destination: str, dest: Path) -> None:
    """Write the copy step's layer: the tar ``content`` (checked against ``digest``) with names under ``destination``.

    Raises :class:`StepFailed` when the content is not what its digest says or holds a name that is
    absolute, has ``..`` or is not a file, directory or link.
    """
    sha = hashlib.sha256()
    with open(content, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    if f"sha256:{sha.hexdigest()}" != digest:
        raise StepFailed(f"its files' tar {content} has digest sha256:{sha.hexdigest()}, not {digest}", None, [])
    prefix = destination.strip("/")
    with (
        tarfile.open(content, "r:") as source,
        open(dest, "xb") as out,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as layer,
    ):
        for member in source:
            name = _inside(member.name)
            if name is None:
                continue
            copied = _rerooted(member, prefix, name)
            data: IO[bytes] | None = source.extractfile(member) if member.isreg() else None
            layer.addfile(copied, data)


def _inside(name: str) -> str | None:
    """A member's name as a relative path, or StepFailed when it is absolute or climbs with ``..``; None: the root."""
    if name.startswith("/"):
        raise StepFailed(f"its files' tar holds the absolute name {name!r}", None, [])
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StepFailed(f"its files' tar holds the name {name!r}, which climbs out with '..'", None, [])
    return "/".join(parts) or None


def _rerooted(member: tarfile.TarInfo, prefix: str, name: str) -> tarfile.TarInfo:
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise StepFailed(f"its files' tar holds {member.name!r}, which is not a file, directory or link", None, [])
    copied = tarfile.TarInfo(f"{prefix}/{name}" if prefix else name)
    for attribute in ("size", "mode", "mtime", "type", "uid", "gid", "uname", "gname"):
        setattr(copied, attribute, getattr(member, attribute))
    copied.pax_headers = {k: v for k, v in member.pax_headers.items() if k.startswith("SCHILY.xattr.user.")}
    if member.issym():
        copied.linkname = member.linkname
    elif member.islnk():
        target = _inside(member.linkname)
        if target is None:
            raise StepFailed(f"its files' tar hard-links {member.name!r} to the root", None, [])
        copied.linkname = f"{prefix}/{target}" if prefix else target
    return copied
