"""How a worker receives its credential, and how it keeps it away from the code it runs.

A worker's token lets whoever holds it register as that machine and receive
other workspaces' calls, so the calls it runs must never be able to read it.
Invariants:

* **Never in the worker's environment.** ``/proc/<pid>/environ`` shows the
  environment a process was *started* with, whatever it later removes from
  ``os.environ``. Built-in providers therefore write the token to a ``0600``
  file and pass only its path, ``LEVERS9_TOKEN_FILE``; the worker reads the
  file and deletes it before it runs anything (:func:`take_token_file`).
  ``LEVERS9_TOKEN`` still works for operators who start a worker by hand; it
  is removed from ``os.environ`` at once (:func:`scrub_environ`), so nothing
  the worker starts inherits it.
* **Never readable through /proc or ptrace.** The worker makes itself
  non-dumpable (:func:`forbid_dumping`): then a process of the same uid can
  neither read its ``environ`` or ``mem`` nor attach to it. Only root can.
* **Never in a call's environment.** Runtimes build a container's
  environment from the call's spec alone (plus ``PATH`` and ``HOME``), never
  from the worker's own.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from pathlib import Path

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "forbid_dumping", "scrub_environ", "take_token_file", "write_token_file"]

TOKEN_ENV = "LEVERS9_TOKEN"
TOKEN_FILE_ENV = "LEVERS9_TOKEN_FILE"

#: prctl option: whether the process may be dumped, read through /proc/<pid>/mem or ptraced by its own uid
_PR_SET_DUMPABLE = 4


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to a new ``0600`` file at ``path`` (a leftover from an earlier start is replaced)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)
    return path


def take_token_file(path: str) -> str:
    """The token in the file at ``path``, which is deleted once read.

    :raises ValueError: the file cannot be read, is empty, or others than its owner may read it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise ValueError(
            f"{TOKEN_FILE_ENV}={path}: cannot read the worker's token: {exc.strerror}; "
            f"it must name an existing regular file of mode 0600, or use {TOKEN_ENV} instead"
        ) from None
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise ValueError(
                f"{TOKEN_FILE_ENV}={path}: the token file must be a regular file that only its owner may read "
                f"(mode 0600), not {stat.filemode(info.st_mode)}"
            )
        token = file.read().strip()
    # Deleted before any call runs: a call that later finds the path finds nothing.
    Path(path).unlink(missing_ok=True)
    if not token:
        raise ValueError(f"{TOKEN_FILE_ENV}={path}: the token file is empty; it must hold the worker's token")
    return token


def scrub_environ() -> None:
    """Remove the token variables from ``os.environ``, so no process the worker starts inherits them."""
    os.environ.pop(TOKEN_ENV, None)
    os.environ.pop(TOKEN_FILE_ENV, None)


def forbid_dumping() -> bool:
    """Make this process non-dumpable (Linux): its uid can no longer read its /proc files or ptrace it.

    Returns False where that is not possible (not Linux, or prctl refused). A
    child that execs a program becomes dumpable again, which is what it should:
    only this process holds the token.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
