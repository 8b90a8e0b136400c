"""A container's root filesystem: the image's layers read-only, with a private writable layer on top.

Overlayfs lets every container of an image share one unpacked copy of its
layers (see :mod:`levers9.engine.images`) while writing only to its own
upper directory, which is thrown away with the container.

The overlay is mounted with mount(2) itself rather than the ``mount`` command: it is on every
container's start-up path, and a process costs 1-3 ms there. Unmounting stays with ``umount``
(its lazy fallback), off that path.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from levers9.hooks.errors import Levers9Error

__all__ = ["RootfsError", "is_mounted", "mount_overlay", "mounts_under", "unmount", "unmount_all"]


class RootfsError(Levers9Error):
    """The root filesystem could not be set up or taken down; the message has the kernel's answer."""


def _mount_points() -> list[str]:
    # mountinfo writes a space, tab, newline or backslash in a path as an octal escape (\040 and so on)
    with open("/proc/self/mountinfo") as info:
        return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in info]


def is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    return target in _mount_points()


def mounts_under(directory: Path) -> list[Path]:
    """Every mount point strictly below ``directory``, deepest first (the order to unmount them in)."""
    prefix = str(directory.resolve()).rstrip("/") + "/"
    found = {p for p in _mount_points() if p.startswith(prefix)}
    return [Path(p) for p in sorted(found, key=lambda p: (-p.count("/"), p))]


def unmount_all(directory: Path) -> None:
    """Unmount everything mounted below ``directory``; raises RootfsError when anything is still mounted after.

    Callers delete ``directory`` afterwards, and a delete that went through a mount still in place would
    delete what the mount shows (a shared image layer, a directory of the host), hence the check.
    """
    if not directory.exists():
        return
    for point in mounts_under(directory):
        unmount(point)
    left = mounts_under(directory)
    if left:
        raise RootfsError(f"still mounted below {directory} after unmounting: {', '.join(map(str, left))}")


def mount_overlay(layers: Sequence[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount ``layers`` (lowest first) under a fresh ``upper`` at ``target``; idempotent."""
    if not layers:
        raise RootfsError("an image needs at least one layer")
    for path in (upper, work, target):
        path.mkdir(parents=True, exist_ok=True)
    if is_mounted(target):
        return
    lower = ":".join(str(p) for p in reversed(layers))  # overlayfs lists the topmost lower layer first
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if len(options) > 4000:
        raise RootfsError(f"{len(layers)} layers make an overlay option string too long for the kernel")
    if _libc().mount(b"overlay", os.fsencode(target), b"overlay", 0, options.encode()) != 0:
        code = ctypes.get_errno()
        raise RootfsError(f"mounting the root filesystem at {target} failed: {os.strerror(code)} (overlay, {options})")


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
        _LIBC.mount.restype = ctypes.c_int
    return _LIBC


_LIBC: ctypes.CDLL | None = None


def unmount(target: Path) -> None:
    """Unmount ``target`` if mounted; lazily when still busy, so removal never hangs on a stray process.

    Whether it is mounted comes from mountinfo, never from the path itself: a mount point may not answer a
    stat (a bind of a FUSE directory deleted since: ENOENT; a FUSE mount whose server is gone: ENOTCONN)
    and must be unmounted all the same.
    """
    if not is_mounted(target):
        return
    proc = subprocess.run(["umount", str(target)], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0 and is_mounted(target):
        lazy = subprocess.run(["umount", "-l", str(target)], capture_output=True, text=True, timeout=60, check=False)
        if lazy.returncode != 0 and is_mounted(target):
            raise RootfsError(f"could not unmount {target}: {(lazy.stderr or proc.stderr).strip()}")
