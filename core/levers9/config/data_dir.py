"""The data directory is private: 0700, and the files in it that hold secrets 0600.

The data directory holds the SQLite database (token hashes, encrypted
secrets), the key that decrypts those secrets, and the embedded Redis's socket
directory. Each is created private; because a directory made by an older
version, by hand or under a loose umask may be readable by others, every start
also tightens what it finds (never loosens: a mode already stricter is kept).

Only the data directory itself and the known secret-holding entries are
changed, not everything below it: with the directory at 0700 no other user can
reach anything inside, and a checkpoint tree can be large.

This module imports only the standard library, like the rest of levers9.config
that plugins and the CLI load.
"""

from __future__ import annotations

import logging
from pathlib import Path

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "secure_data_dir", "tighten"]

log = logging.getLogger(__name__)

#: modes of what holds state: readable and writable by the user running levers9 only
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
#: entries of the data directory that hold secrets, with the mode each must have
SECRET_ENTRIES = {"secret.key": PRIVATE_FILE, "redis": PRIVATE_DIR}
#: entries of the embedded Redis's directory (its socket, lock and log)
REDIS_ENTRIES = {"redis.sock": PRIVATE_FILE, "lock": PRIVATE_FILE, "redis.log": PRIVATE_FILE}


def tighten(path: Path, mode: int) -> bool:
    """Set ``path``'s permissions to ``mode`` when it grants more (to the group or others); True if changed.

    A path that does not exist is left alone; one this user may not change is
    logged, since it means others may read what it holds.
    """
    try:
        current = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return False
    if current & ~mode == 0:
        return False
    try:
        path.chmod(mode)
    except PermissionError:
        log.warning("%s has mode %o and cannot be made %o by this user; others may read it", path, current, mode)
        return False
    log.info("tightened %s from mode %o to %o", path, current, mode)
    return True


def secure_data_dir(data_dir: str | Path) -> Path:
    """Create the data directory 0700, or tighten it and its secret-holding entries; returns its path."""
    path = Path(data_dir).expanduser()
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    tighten(path, PRIVATE_DIR)
    for name, mode in SECRET_ENTRIES.items():
        tighten(path / name, mode)
    for name, mode in REDIS_ENTRIES.items():
        tighten(path / "redis" / name, mode)
    return path
