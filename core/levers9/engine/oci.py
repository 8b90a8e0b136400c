"""Running containers with an OCI runtime (runc or runsc): the engine behind both runtime plugins.

The hooks are stateless calls from worker threads, so everything about a
container lives in its own directory under the runtime's state dir::

    containers/<id>/
      meta.json        the spec, the network attachment, forwarded ports
      bundle/          config.json, and rootfs/ (an overlay mount)
      upper/ work/     the container's private writable layer
      output.log       stdout and stderr, appended by the container
      shim.pid         the shim supervising it (see levers9.engine.shim)
      exit.json        how it ended, written by the shim

and a container in a user namespace has its root filesystem, its idmapped
layers and bind sources and its ``/sys`` in a directory of its own below
:data:`levers9.engine.userns.MOUNT_ROOT`, named by a hash of its directory
here (:meth:`OciEngine.userns_dir`).

Removal undoes each step in reverse and is idempotent, so a worker that
crashed half way can call it again and nothing is left: no mount, cgroup,
network namespace, forwarder or directory. The directory is deleted only
once nothing is mounted below it any more (a delete through an idmapped
mount would reach the image's layers or the host's directories); until then
removal fails and can be called again.

A flavor with an ``id_mapping`` (runc, where the host allows it) runs each
container in a user namespace (:mod:`levers9.engine.userns`), except a
container the worker may checkpoint (CRIU cannot restore one), one with
GPUs (the NVIDIA hooks are not known to work in one), and one whose
mounts cannot be idmapped: those run as before, and ``meta.json`` says why
(``user_namespace_off``). A container in a user namespace cannot be
checkpointed: :meth:`OciEngine.checkpoint` refuses it up front.

A checkpoint holds the container's memory and, as :data:`ROOTFS_CHANGES` in
the image directory, its root filesystem's changes (its overlay's upper
directory as an OCI layer, :mod:`levers9.engine.changes`): the memory image
names files by path, and a file the container wrote lives on the host, not in
the memory. Restoring the image into another container first unpacks those
changes into its fresh upper directory (:mod:`levers9.engine.layers`), so its
processes find their files, on this machine or another. The in-place restore
that keeps a checkpointed container running reuses its own upper directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from levers9.engine import cgroups, shim
from levers9.engine.cdi import apply_edits, load_specs
from levers9.engine.changes import ChangesError, bundle_changes
from levers9.engine.layers import extract_layer
from levers9.engine.rootfs import mount_overlay, unmount, unmount_all
from levers9.engine.spec import cgroups_path, oci_config
from levers9.engine.userns import (
    MOUNT_ROOT,
    IdMapping,
    MappedMounts,
    UsernsError,
    map_mounts,
    mounts_dir,
    release_dir,
    sweep,
)
from levers9.files import write_atomic
from levers9.hooks.errors import CheckpointUnavailable, InvalidRequest, Levers9Error, RestoreFailed
from levers9.hooks.types import (
    CheckpointImage,
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    LayerDiff,
    LogChunk,
    PreparedContainer,
)

if TYPE_CHECKING:
    from levers9.engine.image_types import ResolvedImage
    from levers9.engine.images import ImageStore
    from levers9.engine.network import Bridge

__all__ = ["ROOTFS_CHANGES", "START_TIMEOUT_S", "ContainerRecords", "OciEngine", "OciFlavor"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
CONTAINER_PID = "container.pid"
STOP_TIMEOUT_S = 15.0
#: seconds ``pause`` and ``resume`` are given (a running container's changes are read while it is paused)
PAUSE_TIMEOUT_S = 30.0
LOG_CHUNK = 1 << 20
#: the container's root filesystem changes, in a checkpoint's image directory (an OCI layer tar)
ROOTFS_CHANGES = "rootfs-changes.tar"


@dataclass(frozen=True)
class OciFlavor:
    """How to drive one OCI runtime binary."""

    #: the levers9 runtime name (``runc``, ``gvisor``)
    name: str
    #: the binary with its global flags (``runc --root R``, ``runsc --root R --platform ptrace``)
    argv: tuple[str, ...]
    #: the foreground run command after the global flags
    run: tuple[str, ...] = ("run",)
    no_new_privileges: bool = True
    oci_hooks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: extra global flags per container network mode (runsc takes ``--network`` per sandbox)
    network_flags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: whether ``checkpoint --leave-running`` keeps the container running (runc with CRIU); if not, the engine
    #: checkpoints and restores in place
    leave_running: bool = False
    #: container ids to host ids for containers given a user namespace; None gives none a user namespace
    id_mapping: IdMapping | None = None
    #: the runtime's own variant of the seccomp profile (:func:`levers9.engine.seccomp.profile`); None: the profile
    seccomp: dict[str, Any] | None = None


class ContainerRecords:
    """A runtime's containers as directories: what every engine keeps, and how logs are read back."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def _dir(self, container_id: str) -> Path:
        return self.state_dir / "containers" / container_id

    def container_ids(self) -> list[str]:
        """Every container with a directory here: prepared, running, ended or half removed."""
        root = self.state_dir / "containers"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def _meta(self, container_id: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self._dir(container_id) / "meta.json").read_text())
            return data
        except (OSError, ValueError):
            return None

    def _write_meta(self, container_id: str, meta: dict[str, Any]) -> None:
        write_atomic(self._dir(container_id) / "meta.json", json.dumps(meta))

    def _exit(self, container_id: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self._dir(container_id) / shim.EXIT_FILE).read_text())
            return data
        except (OSError, ValueError):
            return None

    def logs(self, container_id: str, offset: int) -> LogChunk:
        path = self._dir(container_id) / shim.LOG_FILE
        ended = self._exit(container_id) is not None
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(LOG_CHUNK)
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return LogChunk(data=b"", next_offset=offset, eof=True)
        nxt = offset + len(data)
        return LogChunk(data=data, next_offset=nxt, eof=ended and nxt >= size)

    def _exited_state(self, container_id: str, ended: dict[str, Any]) -> ContainerState:
        # the shim forks no `date`: it started the container just before writing child.pid, and wrote
        # exit.json just after the container ended (shim.py)
        cdir = self._dir(container_id)
        return ContainerState(
            container_id=container_id,
            status=ContainerStatus.EXITED,
            exit_code=ended.get("exit_code"),
            oom_killed=bool(ended.get("oom_killed")),
            started_at=_time(ended.get("started_at")) or _mtime(cdir / shim.CHILD_FILE),
            finished_at=_time(ended.get("finished_at")) or _mtime(cdir / shim.EXIT_FILE),
        )

    def _wait_for_shim(self, container_id: str, *, until_gone: bool = False) -> None:
        """After a kill: until the shim has written how the container ended (and, with ``until_gone``, has
        finished deleting it, which must happen before the same id is used again), or gave up."""
        cdir = self._dir(container_id)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(_pid(cdir / shim.PID_FILE)) and (until_gone or self._exit(container_id) is None):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        shim_pid = _pid(cdir / shim.PID_FILE)
        if shim_pid and _alive(shim_pid):
            with contextlib.suppress(OSError):
                os.kill(shim_pid, signal.SIGKILL)

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        """Start ``argv`` as nobody's child (setsid --fork), so it outlives a worker restart.

        ``env`` is its whole environment when given: values that must not show in ``ps`` (secrets,
        tokens) go there, never into the arguments.
        """
        subprocess.run(
            ["setsid", "--fork", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=True,
            env=env,
        )


class OciEngine(ContainerRecords):
    def __init__(self, flavor: OciFlavor, state_dir: Path, *, images: ImageStore, bridge: Bridge | None) -> None:
        super().__init__(state_dir)
        self.flavor = flavor
        self.images = images
        self.bridge = bridge

    def _argv(self, container_id: str) -> tuple[str, ...]:
        """The runtime's argv for this container: its global flags plus those of its network mode."""
        network = ((self._meta(container_id) or {}).get("spec") or {}).get("network", "bridge")
        return (*self.flavor.argv, *self.flavor.network_flags.get(network, ()))

    def _run(self, container_id: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._argv(container_id), *args, container_id],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ------------------------------------------------------------------ prepare

    def prepare(self, spec: ContainerSpec) -> PreparedContainer:
        cdir = self._dir(spec.container_id)
        bundle = cdir / "bundle"
        if (cdir / "meta.json").exists():
            meta = self._meta(spec.container_id) or {}
            if meta.get("spec") != spec.model_dump(mode="json"):
                raise InvalidRequest(f"container {spec.container_id} already exists with a different spec")
            return PreparedContainer(
                container_id=spec.container_id, runtime=self.flavor.name, spec=spec, bundle_dir=str(bundle)
            )
        image = self.images.resolve(spec.image)
        cdir.mkdir(parents=True, exist_ok=True)
        try:
            netns: str | None = None
            attachment: dict[str, Any] | None = None
            if spec.network == "bridge":
                if self.bridge is None:
                    raise InvalidRequest("network 'bridge' needs the worker's bridge, which this runtime was not given")
                self.bridge.ensure()
                _sweep(self.bridge)
                att = self.bridge.attach(spec.container_id, owner=cdir)
                netns = att.netns_path
                attachment = {"ip": att.ip, "netns": att.netns_path}
            mapped, userns_off = self._map(spec, image, netns)
            upper = cdir / "upper"
            upper.mkdir(exist_ok=True)
            if mapped is not None and self.flavor.id_mapping is not None:
                # the overlay's root directory is its upper layer's: owned by the container's root
                os.chown(upper, self.flavor.id_mapping.host_id, self.flavor.id_mapping.host_id)
            rootfs = mapped.directory / "rootfs" if mapped is not None else bundle / "rootfs"
            mount_overlay(list(mapped.layers if mapped else image.layers), upper, cdir / "work", rootfs)
            sources = mapped.sources if mapped is not None else {}
            # GPUs: the host's CDI spec when it has one (exact nodes, libraries and hooks), else device
            # nodes by index plus the runtime's own GPU hook (the NVIDIA prestart hook for runc)
            cdi = load_specs() if spec.gpus else None
            config = oci_config(
                spec,
                rootfs=str(rootfs),
                image_env=image.config.env,
                image_workdir=image.config.workdir,
                binds=[(sources.get(b.source, b.source), b.target) for b in image.binds],
                netns_path=netns,
                no_new_privileges=self.flavor.no_new_privileges,
                hooks=None if cdi else (self.flavor.oci_hooks or None),
                id_mapping=self.flavor.id_mapping if mapped is not None else None,
                sysfs_source=str(mapped.sysfs) if mapped is not None and mapped.sysfs is not None else None,
                mount_sources=sources,
                seccomp=self.flavor.seccomp,
            )
            if cdi is not None:
                apply_edits(config, cdi.edits_for(spec.gpus))
            bundle.mkdir(exist_ok=True)
            (bundle / "config.json").write_text(json.dumps(config))  # no indent: the C encoder, 1-2 ms less
            (cdir / shim.LOG_FILE).touch()
            mapping = self.flavor.id_mapping
            self._write_meta(
                spec.container_id,
                {
                    "spec": spec.model_dump(mode="json"),
                    "network": attachment,
                    "forwards": [],
                    "user_namespace": {"host_id": mapping.host_id, "size": mapping.size}
                    if mapped and mapping
                    else None,
                    "user_namespace_off": userns_off,
                },
            )
        except BaseException:
            self.remove(spec.container_id)
            raise
        return PreparedContainer(
            container_id=spec.container_id, runtime=self.flavor.name, spec=spec, bundle_dir=str(bundle)
        )

    def _map(
        self, spec: ContainerSpec, image: ResolvedImage, netns: str | None
    ) -> tuple[MappedMounts | None, str | None]:
        """The idmapped mounts of a container that gets a user namespace, else None and why it gets none."""
        mapping = self.flavor.id_mapping
        if mapping is None:
            return None, None
        if spec.checkpointable:
            return None, "the worker may checkpoint it, and CRIU cannot restore a container in a user namespace"
        if spec.gpus:
            return None, "it has GPUs, and the NVIDIA container hooks are not known to work in a user namespace"
        sources = [(b.source, True) for b in image.binds]
        sources += [(m.source, m.read_only) for m in spec.mounts if m.idmap and os.path.exists(m.source)]
        plain = [(m.source, m.read_only) for m in spec.mounts if not m.idmap]
        try:
            sweep()  # what killed workers left of other containers' mounts
            directory = mounts_dir(self._userns_key(spec.container_id), mapping, owner=self._dir(spec.container_id))
            return map_mounts(
                directory,
                mapping,
                list(image.layers),
                sources,
                netns=netns,
                host_network=spec.network == "host",
                plain=plain,
            ), None
        except (UsernsError, OSError) as exc:
            self._unmount_userns_dir(spec.container_id)
            log.warning("container %s runs without a user namespace: %s", spec.container_id, exc)
            return None, str(exc)

    def _userns_key(self, container_id: str) -> str:
        # the runtime's state directory is in the key: tests (and two workers) may reuse container ids
        return hashlib.sha256(str(self._dir(container_id).resolve()).encode()).hexdigest()[:24]

    def userns_dir(self, container_id: str) -> Path:
        """Where the container's root filesystem and idmapped mounts are when it has a user namespace."""
        return MOUNT_ROOT / self._userns_key(container_id)

    def _unmount_userns_dir(self, container_id: str) -> None:
        release_dir(self._userns_key(container_id))  # raises when a mount stays: nothing is deleted through one

    # ------------------------------------------------------------------ start and restore

    def start(self, container: PreparedContainer) -> ContainerState:
        cid = container.container_id
        return self._launch(
            container, [*self.flavor.run, *self._pid_file(cid), "--bundle", self._bundle(container), cid]
        )

    def _pid_file(self, container_id: str) -> list[str]:
        """The runtime writes the container's pid here once it exists: how start and state see it without asking."""
        return ["--pid-file", str(self._dir(container_id) / CONTAINER_PID)]

    def restore(self, container: PreparedContainer, image: CheckpointImage) -> ContainerState:
        return self._restore(container, image, changes=True)

    def _restore(self, container: PreparedContainer, image: CheckpointImage, *, changes: bool) -> ContainerState:
        if not Path(image.path).is_dir():
            self.remove(container.container_id)
            raise RestoreFailed(f"checkpoint {image.checkpoint_id} is missing its image at {image.path}")
        cid = container.container_id
        layer = Path(image.path) / ROOTFS_CHANGES
        if changes and layer.is_file():
            try:
                self._apply_changes(container, layer)
            except (Levers9Error, OSError) as exc:
                self.remove(cid)
                raise RestoreFailed(
                    f"the root filesystem of checkpoint {image.checkpoint_id} was not restored: {exc}"
                ) from exc
        action = ["restore", "--image-path", image.path, *self._pid_file(cid), "--bundle", self._bundle(container), cid]
        state = self._launch(container, action, confirm=True)
        exit_info = self._exit(container.container_id)
        if state.status is ContainerStatus.EXITED and exit_info and exit_info.get("exit_code") not in (0, None):
            output = self.logs(container.container_id, 0).data.decode(errors="replace")[-2000:]
            self.remove(container.container_id)
            raise RestoreFailed(f"restoring {image.checkpoint_id} failed: {output.strip() or 'no output'}")
        return state

    def _apply_changes(self, container: PreparedContainer, layer: Path) -> None:
        """Unpack a checkpoint's root filesystem changes into the prepared container's upper directory.

        The overlay is unmounted meanwhile (overlayfs does not allow changing its layers under it) and mounted
        again over the same layers.
        """
        cid = container.container_id
        meta = self._meta(cid) or {}
        if meta.get("user_namespace"):
            raise InvalidRequest(f"container {cid} runs in a user namespace; a checkpoint cannot be restored into it")
        cdir = self._dir(cid)
        rootfs = cdir / "bundle" / "rootfs"
        unmount(rootfs)
        with open(layer, "rb") as stream:
            extract_layer(stream, cdir / "upper", f"the root filesystem changes {layer}")
        mount_overlay(list(self.images.resolve(container.spec.image).layers), cdir / "upper", cdir / "work", rootfs)

    def _bundle(self, container: PreparedContainer) -> str:
        if not (self._dir(container.container_id) / "meta.json").exists():
            raise InvalidRequest(f"container {container.container_id} was not prepared (or was removed)")
        return str(self._dir(container.container_id) / "bundle")

    def _launch(self, container: PreparedContainer, action: Sequence[str], *, confirm: bool = False) -> ContainerState:
        """Start the shim and wait until the container runs (or already ended).

        ``confirm`` asks the runtime itself rather than trusting the pid file: a restore writes the pid
        before it has loaded the image, and only the runtime knows when the restored container is running.
        """
        cid = container.container_id
        cdir = self._dir(cid)
        if not (cdir / shim.PID_FILE).exists():
            cgroups.own_memory_cgroup(cgroups_path(cid), container.spec.memory_mib * 1024 * 1024)
            argv = shim.command(
                runtime=self._argv(cid), action=action, container_id=cid, state_dir=cdir, cgroup=cgroups_path(cid)
            )
            self._spawn(argv)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            state = self.state(cid)
            if state.status is ContainerStatus.RUNNING and confirm and self._runtime_status(cid) != "running":
                state = state.model_copy(update={"status": ContainerStatus.CREATED})
            if state.status in (ContainerStatus.RUNNING, ContainerStatus.EXITED):
                break
            if time.monotonic() > deadline:
                self.remove(cid)
                raise Levers9Error(f"container {cid} did not start within {START_TIMEOUT_S:g} s")
            time.sleep(0.001)
        if state.status is ContainerStatus.RUNNING and container.spec.ports:
            self._forward(container.spec)
            state = self.state(cid)
        return state

    def _runtime_status(self, container_id: str) -> str | None:
        proc = self._run(container_id, "state", timeout=30)
        if proc.returncode != 0:
            return None
        try:
            status = json.loads(proc.stdout).get("status")
        except ValueError:
            return None
        return str(status) if status else None

    def _forward(self, spec: ContainerSpec) -> None:
        from levers9.engine.network import forwarder_command

        meta = self._meta(spec.container_id) or {}
        if meta.get("forwards"):
            return
        target = (meta.get("network") or {}).get("ip") or "127.0.0.1"
        forwards = []
        if spec.network == "bridge":
            for port in spec.ports:
                ready = self._dir(spec.container_id) / f"forward-{port}.port"
                pidfile = ready.with_suffix(".pid")
                argv = forwarder_command(target, port, "127.0.0.1", 0, ready)
                # the shell records its pid, then becomes the forwarder: removal needs the pid to stop it
                self._spawn(["sh", "-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *argv])
                deadline = time.monotonic() + 10
                while not ready.exists() or not ready.read_text().strip():
                    if time.monotonic() > deadline:
                        raise Levers9Error(f"the port forwarder for {spec.container_id}:{port} did not start")
                    time.sleep(0.01)
                forwards.append(
                    {"port": port, "host_port": int(ready.read_text().split()[0]), "pid": _pid(pidfile) or 0}
                )
        elif spec.network == "host":
            forwards = [{"port": p, "host_port": p, "pid": 0} for p in spec.ports]
        meta["forwards"] = forwards
        self._write_meta(spec.container_id, meta)

    # ------------------------------------------------------------------ observe and control

    def state(self, container_id: str) -> ContainerState:
        meta = self._meta(container_id)
        if meta is None:
            return ContainerState(container_id=container_id, status=ContainerStatus.UNKNOWN)
        forwards = meta.get("forwards") or []
        address = f"127.0.0.1:{forwards[0]['host_port']}" if forwards else None
        ip = (meta.get("network") or {}).get("ip") or None
        ended = self._exit(container_id)
        if ended is not None:
            return self._exited_state(container_id, ended)
        cdir = self._dir(container_id)
        pid = _pid(cdir / CONTAINER_PID)
        if pid is not None and _alive(pid):
            started = datetime.fromtimestamp((cdir / CONTAINER_PID).stat().st_mtime, UTC)
            return ContainerState(
                container_id=container_id,
                status=ContainerStatus.RUNNING,
                pid=pid,
                started_at=started,
                address=address,
                ip=ip,
            )
        if _alive(_pid(cdir / shim.PID_FILE)):
            # starting, or just ended and the shim is writing it down
            return ContainerState(container_id=container_id, status=ContainerStatus.CREATED, address=address, ip=ip)
        proc = self._run(container_id, "state", timeout=30)
        if proc.returncode == 0:
            info = json.loads(proc.stdout)
            status = {
                "created": ContainerStatus.CREATED,
                "running": ContainerStatus.RUNNING,
                "paused": ContainerStatus.RUNNING,
            }.get(info.get("status"), ContainerStatus.CREATED)
            return ContainerState(
                container_id=container_id,
                status=status,
                pid=info.get("pid") or None,
                started_at=_parse_created(info.get("created")),
                address=address,
                ip=ip,
            )
        return ContainerState(container_id=container_id, status=ContainerStatus.CREATED)

    def kill(self, container_id: str, sig: int) -> None:
        if self._exit(container_id) is not None or self._meta(container_id) is None:
            return
        proc = subprocess.run(
            [*self._argv(container_id), "kill", container_id, str(sig)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0 and self._exit(container_id) is None:
            out = (proc.stderr or proc.stdout).lower()
            if "not running" not in out and "does not exist" not in out and "not exist" not in out:
                raise Levers9Error(f"{self.flavor.name} kill {container_id} failed: {out.strip()}")

    def remove(self, container_id: str) -> None:
        cdir = self._dir(container_id)
        meta = self._meta(container_id) or {}
        if (cdir / shim.PID_FILE).exists() and self._exit(container_id) is None:
            with contextlib.suppress(Levers9Error, subprocess.TimeoutExpired):
                self.kill(container_id, signal.SIGKILL)
        self._wait_for_shim(container_id, until_gone=True)  # a removed container leaves no process, its shim neither
        self._run(container_id, "delete", "--force", timeout=60)
        # whatever the runtime no longer knows about but still runs (a crash half way) goes too
        for name in (CONTAINER_PID, shim.CHILD_FILE):
            pid = _pid(cdir / name)
            if pid and _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for forward in meta.get("forwards") or []:
            if forward.get("pid"):
                with contextlib.suppress(OSError):
                    os.kill(int(forward["pid"]), signal.SIGTERM)
        if self.bridge is not None:
            self.bridge.detach(container_id)
        unmount(cdir / "bundle" / "rootfs")
        self._unmount_userns_dir(container_id)
        unmount_all(cdir)  # anything a crash left; raises if any stays, so nothing is deleted through a mount
        cgroups.remove_cgroups(cgroups_path(container_id))
        shutil.rmtree(cdir, ignore_errors=True)

    # ------------------------------------------------------------------ what a container changed (the builder)

    def changes(self, container_id: str, dest: str) -> LayerDiff:
        """The container's changes as an OCI layer tar at ``dest`` (:func:`levers9.engine.changes.bundle_changes`).

        An exited container's are read as they are. A running one is paused (``pause``: runc freezes its
        cgroup, runsc stops its sandbox's tasks) while they are read, so the layer is one moment's view, and
        resumed after, whatever happened; a container that cannot be paused is refused (InvalidRequest
        naming the runtime's answer), never read while it writes.
        """
        meta = self._meta(container_id)
        if meta is None:
            raise InvalidRequest(
                f"container {container_id} is unknown to {self.flavor.name} (never prepared, or removed)"
            )
        cdir, mapping = self._dir(container_id), meta.get("user_namespace")
        if self._exit(container_id) is not None:
            written = bundle_changes(cdir, mapping, Path(dest))
            return LayerDiff(path=dest, diff_id=f"sha256:{written.sha256}", size_bytes=written.size)
        paused = self._run(container_id, "pause", timeout=PAUSE_TIMEOUT_S)
        if paused.returncode != 0:
            if self._exit(container_id) is not None:  # it ended meanwhile: its changes are final now
                return self.changes(container_id, dest)
            raise InvalidRequest(
                f"container {container_id} runs and {self.flavor.name} could not pause it to read its changes: "
                f"{(paused.stderr or paused.stdout).strip() or 'no output'}"
            )
        try:
            written = bundle_changes(cdir, mapping, Path(dest))
        finally:
            resumed = self._run(container_id, "resume", timeout=PAUSE_TIMEOUT_S)
            if resumed.returncode != 0 and self._exit(container_id) is None:
                log.error(
                    "%s could not resume container %s after reading its changes: %s",
                    self.flavor.name,
                    container_id,
                    (resumed.stderr or resumed.stdout).strip(),
                )
                raise Levers9Error(
                    f"container {container_id} was paused to read its changes and {self.flavor.name} could not "
                    f"resume it: {(resumed.stderr or resumed.stdout).strip() or 'no output'}"
                )
        return LayerDiff(path=dest, diff_id=f"sha256:{written.sha256}", size_bytes=written.size)

    # ------------------------------------------------------------------ checkpoint (runsc)

    def checkpoint(self, container_id: str, image_dir: str) -> CheckpointImage:
        """Checkpoint the container into ``image_dir`` and keep it running.

        runsc's own ``--leave-running`` tears the sandbox down on the builds
        Debian ships, so the engine checkpoints (which stops the sandbox) and at
        once restores the same container, from the image just taken, in place:
        same id, same root filesystem with its writes, same log. The container
        pauses for the restore and keeps its state.
        """
        meta = self._meta(container_id)
        if meta is None or self._exit(container_id) is not None:
            raise Levers9Error(f"container {container_id} is not running, so it cannot be checkpointed")
        if meta.get("user_namespace"):
            raise CheckpointUnavailable(
                f"container {container_id} runs in a user namespace, which CRIU cannot restore; containers the "
                "worker will checkpoint are marked checkpointable and get none"
            )
        Path(image_dir).mkdir(parents=True, exist_ok=True)
        native = ("--leave-running",) if self.flavor.leave_running else ()
        proc = self._run(container_id, "checkpoint", "--image-path", image_dir, *native, timeout=600)
        if proc.returncode != 0:
            raise Levers9Error(
                f"{self.flavor.name} checkpoint of {container_id} failed: {(proc.stderr or proc.stdout).strip()}"
            )
        # the root filesystem's changes, taken while runsc's sandbox is stopped (CRIU's keeps running); a failure
        # is raised only once the container runs again
        unsaved: ChangesError | None = None
        try:
            bundle_changes(self._dir(container_id), None, Path(image_dir) / ROOTFS_CHANGES)
        except ChangesError as exc:
            unsaved = exc
        size = sum(p.stat().st_size for p in Path(image_dir).rglob("*") if p.is_file())
        image = CheckpointImage(
            checkpoint_id=uuid.uuid4().hex,
            runtime=self.flavor.name,
            path=image_dir,
            size_bytes=size,
            created_at=datetime.now(UTC),
        )
        if not self.flavor.leave_running:
            self._restore_in_place(container_id, meta, image)
        if unsaved is not None:
            raise Levers9Error(f"the checkpoint of {container_id} lacks its root filesystem's changes: {unsaved}")
        return image

    def _restore_in_place(self, container_id: str, meta: dict[str, Any], image: CheckpointImage) -> None:
        """Start the container that runsc's checkpoint stopped again, from the image just taken."""
        self._wait_for_shim(container_id, until_gone=True)
        cdir = self._dir(container_id)
        for name in (shim.EXIT_FILE, shim.PID_FILE, shim.CHILD_FILE, CONTAINER_PID):
            (cdir / name).unlink(missing_ok=True)
        spec = ContainerSpec.model_validate(meta["spec"])
        container = PreparedContainer(
            container_id=container_id, runtime=self.flavor.name, spec=spec, bundle_dir=str(cdir / "bundle")
        )
        self._restore(container, image, changes=False)  # in place: its own upper directory is still there


#: when each bridge was last swept by this process (see :func:`_sweep`)
_swept: dict[str, float] = {}
SWEEP_EVERY_S = 60.0


def _sweep(bridge: Bridge) -> None:
    """Detach what killed workers left on the bridge, and remove those containers' cgroups: at this process's
    first attachment, then once a minute."""
    now = time.monotonic()
    if now - _swept.get(bridge.name, -SWEEP_EVERY_S) >= SWEEP_EVERY_S:
        _swept[bridge.name] = now
        for container_id in bridge.sweep():
            cgroups.remove_cgroups(cgroups_path(container_id))


def _time(value: object) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if isinstance(value, int | float) else None


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return None


def _parse_created(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value[:26].rstrip("Z") + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return None


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
