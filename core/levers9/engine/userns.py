"""User namespaces for runc containers: the container's root is an unprivileged user on the host.

A container in a user namespace sees its own ids 0..65535, which the kernel maps to a range of host ids
starting at :attr:`IdMapping.host_id` (by default 1,000,000,000: far above any account a distribution
hands out). A process that breaks out of the container's other namespaces is that unprivileged host
user, owning nothing of the host.

The container's files must then look owned by its ids. Rather than copying and chowning every image
(seconds per image, a second copy on disk), the engine gives runc **idmapped mounts**: each image layer
and each bind-mount source is mounted again, privately in the container's directory, with the
container's mapping attached (``mount_setattr`` with ``MOUNT_ATTR_IDMAP``, Linux 5.12 or later, on file
systems that allow it: ext4, xfs, btrfs, tmpfs...). Through such a mount a file owned by uid 0 on disk
belongs to the container's root, and what the container's root writes through it is owned by uid 0 on
disk, so the shared layers and the worker's own directories stay exactly as they are. The overlay's
upper directory, private to the container, is plainly owned by the mapped root (overlayfs cannot use an
idmapped upper layer the mounter has no id in).

runc 1.1 cannot make idmapped mounts itself; it is given the mounts ready-made as the root's layers and
the binds' sources, and bind-mounting an idmapped mount keeps its mapping. runc's set-up inside the
container runs as the container's root, which must be able to walk to the root filesystem and to each
source it binds; the runtime's state directory is the worker's alone (mode 0700), so these mounts live
in a directory of their own per container, :data:`MOUNT_ROOT`/*key*, owned by the container's root with
mode 0700, below a parent other users may pass through but not list (0711).

Invariants: the namespace that carries a mapping is made once per process by a short-lived ``unshare``
process, its descriptor kept, and is released when the process has ended and the last mount using it is
unmounted; every mount this module makes is under the
directory the caller names, so removing a container finds them all; that directory names its owner (the
container's directory in the runtime's state), so one whose owner was deleted while it was still mounted
(a worker killed half way, then its state removed) is found and released by :func:`sweep`; :func:`support` asks the kernel
for real (a user namespace, an idmapped mount of the image cache's file system, an overlay on it) and
says why not in the kernel's words, once per file system and mapping.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.engine.rootfs import RootfsError, mount_overlay, unmount, unmount_all
from levers9.files import write_atomic
from levers9.hooks.errors import Levers9Error

__all__ = [
    "DEFAULT_HOST_ID",
    "MOUNT_ROOT",
    "IdMapping",
    "MappedMounts",
    "UsernsError",
    "clear_support",
    "idmapped_bind",
    "map_mounts",
    "mapping_namespace",
    "mounts_dir",
    "release_dir",
    "support",
    "sweep",
]

#: the first host id container ids are mapped to when a pool names none
DEFAULT_HOST_ID = 1_000_000_000
#: how many ids a container has: enough for every account an ordinary image creates (nobody is 65534)
DEFAULT_SIZE = 65536
#: where each container in a user namespace has its root filesystem and idmapped mounts (see above)
MOUNT_ROOT = Path("/run/levers9/userns")
#: how long ``unshare`` may take to make the namespace before the attempt is given up
UNSHARE_TIMEOUT_S = 10.0
_MAX_USER_NAMESPACES = Path("/proc/sys/user/max_user_namespaces")
_OWNER_SUFFIX = ".owner"

# System calls of the new mount API: one number on every architecture since Linux 5.1 (alpha aside).
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE = 0x1
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x00000001
_MOUNT_ATTR_IDMAP = 0x00100000

_libc: Any = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger(__name__)


class UsernsError(Levers9Error):
    """A user namespace or an idmapped mount could not be made; the message has the kernel's answer."""


@dataclass(frozen=True)
class IdMapping:
    """Container ids 0..size-1 are host ids host_id..host_id+size-1 (users and groups alike)."""

    host_id: int = DEFAULT_HOST_ID
    size: int = DEFAULT_SIZE

    def __post_init__(self) -> None:
        if self.host_id < 1 or self.size < 1 or self.host_id + self.size > 2**32 - 1:
            raise UsernsError(
                f"id mapping {self.host_id}+{self.size} is not accepted: host ids must be 1 or more and end "
                f"below 4294967295"
            )

    def oci(self) -> list[dict[str, int]]:
        """The mapping as OCI ``linux.uidMappings`` / ``gidMappings`` entries."""
        return [{"containerID": 0, "hostID": self.host_id, "size": self.size}]

    def line(self) -> str:
        """The mapping as ``/proc/PID/uid_map`` writes it."""
        return f"0 {self.host_id} {self.size}\n"


_namespaces_lock = threading.Lock()
#: one user namespace per mapping, for the life of the process (see :func:`mapping_namespace`)
_namespaces: dict[IdMapping, int] = {}


@contextlib.contextmanager
def mapping_namespace(mapping: IdMapping) -> Iterator[int]:
    """A file descriptor of a user namespace carrying ``mapping``, for idmapped mounts.

    The namespace is made once per mapping and its descriptor kept (close-on-exec) for the life of
    the process: an idmapped mount takes only the namespace's mapping, so every container of a
    mapping may share one, and making it costs a process (``unshare``), 1-3 ms on every container's
    start-up path. Each idmapped mount holds a reference of its own, so the namespace outlives the
    descriptor in the mounts made with it either way.
    """
    with _namespaces_lock:
        fd = _namespaces.get(mapping)
        if fd is None:
            fd = _namespaces[mapping] = _new_namespace(mapping)
    yield fd


def _new_namespace(mapping: IdMapping) -> int:
    """A fresh user namespace carrying ``mapping``, as an open descriptor; made by a short-lived ``unshare``."""
    unshare = shutil.which("unshare") or next(
        (p for p in ("/usr/bin/unshare", "/bin/unshare") if os.path.exists(p)), None
    )
    if unshare is None:
        raise UsernsError("the `unshare` command (util-linux) is not installed: apt-get install -y util-linux")
    mine = os.readlink("/proc/self/ns/user")
    try:
        holder = subprocess.Popen(
            [unshare, "--user", "--", "cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise UsernsError(f"`unshare --user` could not be started: {exc}") from exc
    fd = -1
    try:
        deadline = time.monotonic() + UNSHARE_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{holder.pid}/ns/user") != mine:
                    break
            if holder.poll() is not None:
                said = holder.stderr.read().decode(errors="replace").strip() if holder.stderr else ""
                raise UsernsError(f"`unshare --user` could not make a user namespace: {said or 'no output'}")
            if time.monotonic() > deadline:
                raise UsernsError(f"`unshare --user` made no user namespace within {UNSHARE_TIMEOUT_S:g} s")
            time.sleep(0.001)
        try:
            Path(f"/proc/{holder.pid}/uid_map").write_text(mapping.line())
            Path(f"/proc/{holder.pid}/gid_map").write_text(mapping.line())
            fd = os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsernsError(f"mapping ids {mapping.line().strip()!r} in a new user namespace failed: {exc}") from exc
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        if holder.stdin is not None:
            holder.stdin.close()  # cat sees end of file and exits
        try:
            holder.wait(timeout=UNSHARE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        if holder.stderr is not None:
            holder.stderr.close()


def _syscall(number: int, *args: int | bytes | ctypes.Array[ctypes.c_char], what: str) -> int:
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = int(_libc.syscall(ctypes.c_long(number), *converted))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def idmapped_bind(source: Path, target: Path, userns_fd: int | None, *, read_only: bool = True) -> None:
    """Mount ``source`` (with what is mounted below it) at ``target``, its ids seen through the namespace's mapping.

    ``userns_fd`` None: a plain bind, its ids as they are (a volume, whose mount gives every file one owner
    and cannot be idmapped).

    ``target`` is made (a directory, or an empty file for a file) when missing. Raises :class:`UsernsError`
    naming the source and the kernel's reason: ``EINVAL`` from ``mount_setattr`` means the source's file
    system does not allow idmapped mounts, ``ENOSYS`` a kernel older than 5.12.
    """
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    tree = -1
    try:
        tree = _syscall(
            _SYS_OPEN_TREE, -100, os.fsencode(source), _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE, what="open_tree"
        )
        flags = (_MOUNT_ATTR_IDMAP if userns_fd is not None else 0) | (_MOUNT_ATTR_RDONLY if read_only else 0)
        if flags:
            attr = ctypes.create_string_buffer(struct.pack("=QQQQ", flags, 0, 0, userns_fd or 0), 32)
            _syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, attr, 32, what="mount_setattr")
        _syscall(_SYS_MOVE_MOUNT, tree, b"", -100, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH, what="move_mount")
    except OSError as exc:
        hint = ""
        if exc.errno == errno.EINVAL:
            hint = " (its file system does not allow idmapped mounts)"
        elif exc.errno == errno.ENOSYS:
            hint = " (idmapped mounts need Linux 5.12 or later)"
        raise UsernsError(f"an idmapped mount of {source} failed: {exc.strerror}{hint}") from exc
    finally:
        if tree >= 0:
            os.close(tree)


def mounts_dir(key: str, mapping: IdMapping, owner: Path, root: Path = MOUNT_ROOT) -> Path:
    """The container's own directory below ``root``, made when missing: the container's root owns it, mode 0700.

    ``root`` and every directory above it are made passable (search permission) for other users. ``owner``
    (the container's directory in the runtime's state) is written beside it first, in ``<key>.owner``: a
    directory whose owner is gone is an orphan :func:`sweep` removes.
    """
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)
    for parent in root.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod((mode & 0o7777) | 0o001)
    write_atomic(root / f"{key}{_OWNER_SUFFIX}", f"{owner}\n", mode=0o600)
    directory = root / key
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chown(directory, mapping.host_id, mapping.host_id)
    return directory


def release_dir(key: str, root: Path = MOUNT_ROOT) -> None:
    """Unmount everything in the container's directory, then delete it and its owner file; nothing there is fine.

    Raises :class:`~levers9.engine.rootfs.RootfsError` when a mount stays: nothing is deleted through one.
    """
    directory = root / key
    unmount_all(directory)
    shutil.rmtree(directory, ignore_errors=True)
    (root / f"{key}{_OWNER_SUFFIX}").unlink(missing_ok=True)


def sweep(root: Path = MOUNT_ROOT) -> list[str]:
    """Release every directory whose owner no longer exists (its runtime state was deleted while it was mounted,
    a worker killed half way through); the keys released. Failures are logged, not raised."""
    if not root.is_dir():
        return []
    released = []
    for entry in sorted(root.iterdir()):
        if entry.name.endswith(_OWNER_SUFFIX):
            continue
        try:
            owner = (root / f"{entry.name}{_OWNER_SUFFIX}").read_text().strip()
        except FileNotFoundError:
            owner = ""  # the owner file is written before the directory: without one, nothing owns it
        except OSError as exc:
            log.warning("cannot read the owner of %s: %s", entry, exc)
            continue
        if owner and Path(owner).exists():
            continue
        try:
            release_dir(entry.name, root)
        except (RootfsError, OSError) as exc:
            log.warning("could not remove %s, which no container owns any more: %s", entry, exc)
            continue
        released.append(entry.name)
    for stale in root.glob(f"*{_OWNER_SUFFIX}"):
        if not (root / stale.name.removesuffix(_OWNER_SUFFIX)).exists():
            stale.unlink(missing_ok=True)
    return released


@dataclass(frozen=True)
class MappedMounts:
    """What a container in a user namespace is given instead of the originals, all below one directory."""

    #: the directory they are all below (:func:`mounts_dir`); the root filesystem goes at ``rootfs`` in it
    directory: Path
    #: the image's layers, lowest first, each idmapped and read-only
    layers: tuple[Path, ...]
    #: each bind source (a path on the host) to its idmapped stand-in
    sources: dict[str, str]
    #: a read-only sysfs of the container's network namespace, to bind at /sys; None when runc can mount its own
    sysfs: Path | None


def map_mounts(
    directory: Path,
    mapping: IdMapping,
    layers: Sequence[Path],
    sources: Sequence[tuple[str, bool]],
    *,
    netns: str | None,
    host_network: bool,
    plain: Sequence[tuple[str, bool]] = (),
) -> MappedMounts:
    """Idmapped mounts of ``layers`` and of each (source, read_only) in ``sources``, below ``directory``.

    Each (source, read_only) in ``plain`` is bound there too, not idmapped (volumes): the container's root
    can reach it below ``directory``, where it could not reach the source's own path.

    ``netns`` (a namespace's path) or ``host_network`` also mounts that namespace's sysfs; a container with
    a network namespace of its own making needs none. On any failure the caller unmounts ``directory``
    (:func:`levers9.engine.rootfs.unmount_all`); raises :class:`UsernsError`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    mapped_layers = []
    mapped_sources: dict[str, str] = {}
    with mapping_namespace(mapping) as fd:
        for i, layer in enumerate(layers):
            target = directory / f"layer-{i}"
            idmapped_bind(layer, target, fd)
            mapped_layers.append(target)
        for i, (source, read_only) in enumerate(sources):
            if source in mapped_sources:
                continue
            target = directory / f"bind-{i}"
            idmapped_bind(Path(source), target, fd, read_only=read_only)
            mapped_sources[source] = str(target)
    for i, (source, read_only) in enumerate(plain):
        if source not in mapped_sources:
            target = directory / f"plain-{i}"
            idmapped_bind(Path(source), target, None, read_only=read_only)
            mapped_sources[source] = str(target)
    sysfs = None
    if netns is not None or host_network:
        sysfs = directory / "sys"
        sysfs.mkdir(exist_ok=True)
        mount = ["mount", "-t", "sysfs", "-o", "ro,nosuid,nodev,noexec", "sysfs", str(sysfs)]
        argv = ["nsenter", f"--net={netns}", *mount] if netns is not None else mount
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=UNSHARE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsernsError(f"mounting sysfs for the container failed: {exc}") from exc
        if done.returncode != 0:
            raise UsernsError(f"mounting sysfs for the container failed: {(done.stderr or done.stdout).strip()}")
    return MappedMounts(directory=directory, layers=tuple(mapped_layers), sources=mapped_sources, sysfs=sysfs)


_support_lock = threading.Lock()
_support: dict[tuple[int, IdMapping], tuple[bool, str]] = {}


def support(directory: Path, mapping: IdMapping) -> tuple[bool, str]:
    """Whether containers whose layers live on ``directory``'s file system can have a user namespace, and why not.

    Tries it: a user namespace with ``mapping``, an idmapped mount of a scratch directory there, and an
    overlay on top of that mount, as a container's root would be made. Asked once per file system and
    mapping in a process.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = (directory.stat().st_dev, mapping)
    with _support_lock:
        if key not in _support:
            _support[key] = _try(directory, mapping)
        return _support[key]


def clear_support() -> None:
    """Forget what :func:`support` found (tests, or after the host changed)."""
    with _support_lock:
        _support.clear()


def _try(directory: Path, mapping: IdMapping) -> tuple[bool, str]:
    try:
        allowed = int(_MAX_USER_NAMESPACES.read_text().strip())
    except (OSError, ValueError):
        return False, f"this kernel has no user namespaces ({_MAX_USER_NAMESPACES} is unreadable)"
    if allowed < 1:
        return False, f"user namespaces are turned off on this host ({_MAX_USER_NAMESPACES} is {allowed})"
    scratch = Path(tempfile.mkdtemp(prefix="userns-probe-", dir=directory))
    try:
        (scratch / "layer").mkdir()
        (scratch / "layer" / "file").write_text("probe\n")
        (scratch / "upper").mkdir()
        os.chown(scratch / "upper", mapping.host_id, mapping.host_id)
        try:
            with mapping_namespace(mapping) as fd:
                idmapped_bind(scratch / "layer", scratch / "mapped", fd)
            owner = (scratch / "mapped" / "file").stat().st_uid
            if owner != mapping.host_id:
                return False, f"an idmapped mount showed uid 0 as {owner}, not {mapping.host_id}"
            mount_overlay([scratch / "mapped"], scratch / "upper", scratch / "work", scratch / "root")
            (scratch / "root" / "written").write_text("probe\n")
        except (UsernsError, RootfsError, OSError) as exc:
            return False, str(exc)
        return (
            True,
            f"container ids 0-{mapping.size - 1} are host ids {mapping.host_id}-{mapping.host_id + mapping.size - 1}",
        )
    finally:
        unmount(scratch / "root")
        unmount_all(scratch)  # raises if anything stays mounted, rather than delete through it
        shutil.rmtree(scratch, ignore_errors=True)
