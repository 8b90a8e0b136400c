"""What the sandbox SDK raises: one exception per kind of refusal a user acts on, built from the REST error.

The controlplane answers a refused sandbox request with ``{"error": {"type", "message"}}`` (the worker's own
API says ``code`` for ``type``; both are read). :func:`error_for` turns that, with the HTTP status, into the
exception below that says what to do; the controlplane's ``message`` (written for people) is kept in the
text and the ``type`` in :attr:`SandboxError.type`.

Every class derives from :class:`SandboxError`, itself a :class:`~levers9.sdk.errors.ControlPlaneError`, so
code that catches the SDK's errors catches these too. File errors also derive from the builtin ``OSError``
of their kind (``FileNotFoundError`` for ENOENT, ``FileExistsError``, ``PermissionError``...), so
``except FileNotFoundError`` works on a sandbox's file as on a local one.

Invariant: an answer that is not a JSON error body (a proxy's HTML page, an empty body) still becomes a
:class:`SandboxError` naming the HTTP status and the request, never a ``KeyError`` or a JSON error.
"""

from __future__ import annotations

import errno
import json
from typing import Any

from levers9.sdk.errors import ControlPlaneError

__all__ = [
    "ProcessTimeout",
    "SandboxConnectionError",
    "SandboxEnded",
    "SandboxError",
    "SandboxFileExists",
    "SandboxFileNotFound",
    "SandboxFileSystemError",
    "SandboxGone",
    "SandboxNotFound",
    "SandboxNotSupported",
    "SandboxPermissionError",
    "SandboxProcessError",
    "SandboxRequestError",
    "SandboxUnavailable",
    "error_for",
    "is_type",
]


class SandboxError(ControlPlaneError):
    """The controlplane refused a sandbox request, or could not be reached; the message says why."""

    def __init__(self, message: str, *, type: str = "", status: int = 0, sandbox_id: str = "") -> None:
        super().__init__(message)
        #: the REST error's ``type`` (``SandboxNotFound``, ``ENOENT``...), empty when there was none
        self.type = type
        #: the HTTP status, 0 when no answer came
        self.status = status
        self.sandbox_id = sandbox_id


class SandboxNotFound(SandboxError):
    """No sandbox of this id in the token's workspace (it never existed, or it is another workspace's)."""


class SandboxEnded(SandboxError):
    """The sandbox has ended (terminated, timed out, idle too long): nothing more runs in it."""


class SandboxGone(SandboxEnded):
    """The sandbox died under its processes: its container or its worker is gone."""


class SandboxUnavailable(SandboxError):
    """No sandbox could be started: the pool's workers are full, no pool serves sandboxes, or the start failed."""


class SandboxConnectionError(SandboxError):
    """The controlplane (or the worker behind it) could not be reached, or broke a stream off."""


class SandboxRequestError(SandboxError, ValueError):
    """A request's field was refused (``BadRequest``, a validation error); the message names the field."""


class SandboxNotSupported(SandboxError):
    """This controlplane does not offer the operation (yet): its route answered 404, 405 or 501."""


class SandboxProcessError(SandboxError):
    """A process request failed: no such process, its output read elsewhere, too many processes."""


class ProcessTimeout(SandboxProcessError, TimeoutError):
    """A process did not end within the time ``wait(timeout=...)`` gave it; it is still running."""


class SandboxFileSystemError(SandboxError, OSError):
    """A file request failed in the sandbox: a bad path (``BadPath``) or an errno (``type`` names it)."""

    def __init__(self, message: str, *, type: str = "", status: int = 0, sandbox_id: str = "") -> None:
        SandboxError.__init__(self, message, type=type, status=status, sandbox_id=sandbox_id)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SandboxFileNotFound(SandboxFileSystemError, FileNotFoundError):
    """No such file or directory in the sandbox (ENOENT)."""


class SandboxFileExists(SandboxFileSystemError, FileExistsError):
    """The path exists already in the sandbox (EEXIST)."""


class SandboxPermissionError(SandboxFileSystemError, PermissionError):
    """The sandbox's process may not do that to the path (EACCES, EPERM)."""


_BY_TYPE: dict[str, type[SandboxError]] = {
    "SandboxNotFound": SandboxNotFound,
    "SandboxEnded": SandboxEnded,
    "SandboxGone": SandboxGone,
    "SandboxesFull": SandboxUnavailable,
    "NoSandboxWorker": SandboxUnavailable,
    "StartFailed": SandboxUnavailable,
    "WorkerUnreachable": SandboxConnectionError,
    "NoSuchProcess": SandboxProcessError,
    "OutputBusy": SandboxProcessError,
    "TooManyProcesses": SandboxProcessError,
    "BadRequest": SandboxRequestError,
    "BadPath": SandboxFileSystemError,
    "ENOENT": SandboxFileNotFound,
    "EEXIST": SandboxFileExists,
    "EACCES": SandboxPermissionError,
    "EPERM": SandboxPermissionError,
    # the controlplane's own names for them (its ERROR_TYPES), and its validation errors
    "sandbox_not_found": SandboxNotFound,
    "sandbox_ended": SandboxEnded,
    "sandbox_gone": SandboxGone,
    "sandboxes_full": SandboxUnavailable,
    "no_sandbox_worker": SandboxUnavailable,
    "no_sandbox_pool": SandboxUnavailable,
    "start_failed": SandboxUnavailable,
    "worker_unreachable": SandboxConnectionError,
    "process_not_found": SandboxProcessError,
    "output_busy": SandboxProcessError,
    "too_many_processes": SandboxProcessError,
    "invalid_request": SandboxRequestError,
    "validation_error": SandboxRequestError,
    "not_supported": SandboxNotSupported,
    "bad_path": SandboxFileSystemError,
    "file_not_found": SandboxFileNotFound,
    "file_exists": SandboxFileExists,
    "permission_denied": SandboxPermissionError,
    "directory_not_empty": SandboxFileSystemError,
    "not_a_directory": SandboxFileSystemError,
    "is_a_directory": SandboxFileSystemError,
}

#: every errno name (ENOENT, EISDIR...): a type that is one, in either case, is a file error
_ERRNO_NAMES = frozenset(errno.errorcode.values())


def is_type(error: SandboxError, *names: str) -> bool:
    """Whether ``error``'s type is one of ``names``, in the worker's spelling (``OutputBusy``) or the API's."""
    return any(error.type in (name, _snake(name)) for name in names)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def parse_error(body: bytes) -> tuple[str, str]:
    """(type, message) of a REST error body; ("", "") when it is not one."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "", ""
    detail = document.get("error") if isinstance(document, dict) else None
    if not isinstance(detail, dict):
        return "", ""
    kind = detail.get("type") or detail.get("code") or ""
    message = detail.get("message") or ""
    return str(kind), str(message)


def error_for(status: int, body: bytes, *, what: str, sandbox_id: str = "", unsupported: str = "") -> SandboxError:
    """The exception for a refused request: ``what`` names it (``"exec in sb-1"``), ``body`` is the answer's.

    ``unsupported``, given for the operations a controlplane may not offer yet, is what the operation is
    called in the message when the route itself is missing (404 without a sandbox error type, 405, 501).
    """
    kind, message = parse_error(body)
    known = kind in _BY_TYPE or kind.upper() in _ERRNO_NAMES
    if unsupported and (status in (405, 501) or (status == 404 and not known)):
        return SandboxNotSupported(
            f"{what}: this controlplane does not {unsupported} yet (it answered {status}"
            f"{': ' + message if message else ''})",
            type=kind,
            status=status,
            sandbox_id=sandbox_id,
        )
    if not kind:
        text = body[:200].decode(errors="replace").strip()
        return SandboxError(
            f"{what}: the controlplane answered {status} without an error body{': ' + text if text else ''}",
            status=status,
            sandbox_id=sandbox_id,
        )
    cls = _BY_TYPE.get(kind)
    if cls is None:
        if kind.upper() in _ERRNO_NAMES:  # another errno name: ELOOP, ENAMETOOLONG, or the API's eloop...
            cls = SandboxFileSystemError
        elif status == 401:
            message = f"{message or 'unauthenticated'} (check the context's token)"
            cls = SandboxError
        else:
            cls = SandboxError
    return cls(f"{what}: {message or kind} ({kind})", type=kind, status=status, sandbox_id=sandbox_id)


def stream_error(detail: Any, *, what: str, sandbox_id: str) -> SandboxError:
    """The exception for an ``{"error": {...}}`` line in an output stream (the sandbox went first)."""
    body = json.dumps({"error": detail if isinstance(detail, dict) else {"message": str(detail)}}).encode()
    kind, _ = parse_error(body)
    return error_for(409 if kind else 502, body, what=what, sandbox_id=sandbox_id)
