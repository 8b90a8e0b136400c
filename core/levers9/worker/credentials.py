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

A machine's token is a *join* token (see :mod:`levers9.services.fleet`): the
worker's first registration spends it and gets a session credential, which the
worker uses from then on, in memory. Where the runtime keeps calls out of the
worker's files (every runtime that does not report ``host_filesystem``: the
state directory is never mounted into a container), the worker also keeps it
in ``<state dir>/session-credential`` (0600, :func:`save_session_credential`),
so that the worker process restarted on the same machine (a crash, ``docker``'s
restart policy) registers again with it instead of the spent join token; the
file goes with the state directory when the worker exits, and a saved
credential wins over any token the environment names. Where calls share the
worker's filesystem (the ``process`` runtime) nothing is saved, since a call
could read the file: a restarted worker there cannot register, and its machine
is replaced. A join token file that cannot be deleted (a read-only mount) is
left with a warning: once spent it is worth nothing.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import sys
from pathlib import Path

from levers9.token_file import TOKEN_ENV, TOKEN_FILE_ENV, write_token_file

__all__ = [
    "SESSION_FILE",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "discard_token_file",
    "forbid_dumping",
    "read_session_credential",
    "save_session_credential",
    "scrub_environ",
    "take_token_file",
    "write_token_file",
]

log = logging.getLogger(__name__)

#: the session credential's file name in the worker's state directory
SESSION_FILE = "session-credential"

#: prctl option: whether the process may be dumped, read through /proc/<pid>/mem or ptraced by its own uid
_PR_SET_DUMPABLE = 4


def _read_private(path: str, where: str, what: str) -> str:
    """The stripped text of the owner-only regular file ``path``; ValueError starting with ``where`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise ValueError(
            f"{where}: cannot read {what}: {exc.strerror}; "
            f"it must name an existing regular file of mode 0600, or use {TOKEN_ENV} instead"
        ) from None
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise ValueError(
                f"{where}: the file holding {what} must be a regular file that only its owner may read "
                f"(mode 0600), not {stat.filemode(info.st_mode)}"
            )
        text = file.read().strip()
    if not text:
        raise ValueError(f"{where}: the file is empty; it must hold {what}")
    return text


def take_token_file(path: str) -> str:
    """The token in the file at ``path``, which is deleted once read.

    :raises ValueError: the file cannot be read, is empty, or others than its owner may read it.
    """
    token = _read_private(path, f"{TOKEN_FILE_ENV}={path}", "the worker's token")
    # Deleted before any call runs: a call that later finds the path finds nothing.
    discard_token_file(path)
    return token


def discard_token_file(path: str) -> None:
    """Delete a token file; one on a read-only mount is left, with a warning (a join token is spent once used)."""
    try:
        Path(path).unlink(missing_ok=True)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EBUSY, errno.EACCES, errno.EPERM):
            raise
        log.warning(
            "%s=%s cannot be deleted (%s); its join token is spent by registering", TOKEN_FILE_ENV, path, exc.strerror
        )


def save_session_credential(state_dir: Path, token: str, worker_id: str) -> Path:
    """Keep the session credential and the worker's id in ``state_dir`` for a restarted worker.

    One 0600 file, written whole or not at all: the token on its first line, the worker id on the second
    (a restarted worker registers again as the same worker, so its machine's record still matches).
    """
    path = state_dir / SESSION_FILE
    partial = write_token_file(state_dir / f".{SESSION_FILE}.partial", f"{token}\n{worker_id}\n")
    partial.replace(path)
    return path


def read_session_credential(state_dir: Path) -> tuple[str, str] | None:
    """The session credential and worker id an earlier worker process on this state directory saved, if any.

    :raises ValueError: the file exists but others than its owner may read it, or it is empty.
    """
    path = state_dir / SESSION_FILE
    if not path.exists():
        return None
    text = _read_private(str(path), f"session credential {path}", "the worker's session credential")
    token, _, worker_id = text.partition("\n")
    return token.strip(), worker_id.strip()


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
