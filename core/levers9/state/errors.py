"""The errors the state layer raises on purpose.

Callers (the API, the scheduler) map these to their own answers (not found,
conflict, bad request) without catching SQLAlchemy's errors, which name tables
and constraints rather than what the user asked for.
"""

from __future__ import annotations

from levers9.hooks.errors import Levers9Error


class StateError(Levers9Error):
    """Base of every error the state layer raises on purpose."""


class DatabaseUrlError(StateError):
    """The configured database URL names a database levers9 cannot use."""


class SecretKeyError(StateError):
    """The key that encrypts secrets at rest is missing or malformed; the message names where it was read."""


class DecryptionError(StateError):
    """Stored ciphertext could not be decrypted with the configured keys.

    The message never contains the ciphertext or the keys: it only says the
    keys do not match, which after a rotation usually means the old key was
    dropped from the list too early.
    """


class DataDirectoryFull(StateError):
    """The data directory (where SQLite, logs and checkpoints live) has no room: new work is refused until it has.

    Nothing is latched: the first request after space returns works. The message names the directory and
    what is free there, which is what an operator acts on.
    """

    def __init__(self, path: str, free_bytes: int, needed_bytes: int) -> None:
        super().__init__(
            f"data directory full: {path} has {free_bytes} bytes free (levers9 takes new work with at least "
            f"{needed_bytes} free); free space there"
        )
        self.path = path
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes


class NotFound(StateError):
    """The record a caller named does not exist."""

    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} does not exist")
        self.kind = kind
        self.ident = ident


class AlreadyExists(StateError):
    """A record with the same unique name already exists."""


class Conflict(StateError):
    """The request contradicts what is stored (a deployment name taken by another app, for instance)."""


class InvalidTransition(StateError):
    """A task, machine or checkpoint was asked to move to a state it cannot reach from its current one."""


__all__ = [
    "AlreadyExists",
    "Conflict",
    "DataDirectoryFull",
    "DatabaseUrlError",
    "DecryptionError",
    "InvalidTransition",
    "NotFound",
    "SecretKeyError",
    "StateError",
]
