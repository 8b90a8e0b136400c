"""Room in the data directory: how much is free, whether that is too little, and which errors a full disk raises.

The data directory holds SQLite's files (its write-ahead log grows with every
write), the embedded Redis's socket and log, and checkpoints by default. When
its file system fills, SQLite fails with "database or disk is full" and file
writes with ``ENOSPC``, halfway through whatever was being done. Hence:

* :func:`require_room` refuses new work up front with
  :class:`~levers9.state.errors.DataDirectoryFull` while fewer than
  :data:`MIN_FREE_BYTES` are free, and health reports the same
  (:func:`room`), so a full disk is a clear refusal and a failing health
  check, not a call that fails somewhere inside;
* :func:`is_full` recognises the errors a full disk raises anyway (a write let
  in just before the space ran out), so the database can raise
  ``DataDirectoryFull`` instead of an internal error.

Free space is what unprivileged users may use (``f_bavail``): the reserve a
file system keeps for root is not counted. Nothing is cached or latched:
``statvfs`` is one system call (about a microsecond), so the first request
after space returns is served.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from levers9.state.errors import DataDirectoryFull

__all__ = ["MIN_FREE_BYTES", "free_bytes", "full_error", "is_full", "require_room", "room"]

#: below this many free bytes the data directory counts as full (SQLite's log alone may grow by a few MiB)
MIN_FREE_BYTES = 64 * 1024 * 1024

_SQLITE_FULL = 13  # the primary result code of "database or disk is full"
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged user may still write on the file system holding ``path``."""
    stat = os.statvfs(Path(path).expanduser())
    return stat.f_bavail * stat.f_frsize


def full_error(path: str | Path) -> DataDirectoryFull:
    """The error that says ``path`` is full, with what is free there now."""
    shown = Path(path).expanduser()
    try:
        free = free_bytes(shown)
    except OSError:
        free = 0
    return DataDirectoryFull(str(shown), free, MIN_FREE_BYTES)


def require_room(path: str | Path) -> None:
    """Raise :class:`DataDirectoryFull` when fewer than :data:`MIN_FREE_BYTES` are free in ``path``."""
    shown = Path(path).expanduser()
    free = free_bytes(shown)
    if free < MIN_FREE_BYTES:
        raise DataDirectoryFull(str(shown), free, MIN_FREE_BYTES)


def room(path: str | Path) -> str:
    """``"ok"``, or why ``path`` cannot take new work (full, or its file system cannot be read): for health."""
    try:
        require_room(path)
    except DataDirectoryFull as exc:
        return str(exc)
    except OSError as exc:
        return f"the data directory {path} cannot be examined: {exc.strerror or exc}"
    return "ok"


def is_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it wraps (SQLAlchemy keeps the driver's as ``orig``), is a full disk's."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.Error):
            code = getattr(current, "sqlite_errorcode", None)
            if (code is not None and code & 0xFF == _SQLITE_FULL) or "database or disk is full" in str(current):
                return True
        elif isinstance(current, OSError) and current.errno in _NO_SPACE:
            return True
        wrapped = getattr(current, "orig", None)
        current = wrapped if isinstance(wrapped, BaseException) else current.__cause__
    return False
