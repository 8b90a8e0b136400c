"""How a join token is handed to a worker in a file: the variable that names the file, and writing it.

Shared by whoever starts a worker on this host (the ``local`` provider writes
the file) and the worker that reads it (:mod:`levers9.worker.credentials`
takes and deletes it), so neither imports the other. The invariant both keep:
the token is never in a worker's environment or argv, only in a ``0600`` file
created afresh (``O_EXCL``, never through a symlink) whose path the
environment names as :data:`TOKEN_FILE_ENV`.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "write_token_file"]

#: the variable an operator may set to a worker's token by hand (removed from the environment at once)
TOKEN_ENV = "LEVERS9_TOKEN"
#: the variable naming the ``0600`` file that holds a worker's token (the worker deletes it once read)
TOKEN_FILE_ENV = "LEVERS9_TOKEN_FILE"


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to a new ``0600`` file at ``path`` (a leftover from an earlier start is replaced)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)
    return path
