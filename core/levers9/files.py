"""Writing a file whole or not at all, written once.

:func:`write_atomic` writes to a temporary file in the same directory, then
renames it over the target: a reader (another process, the next start after a
crash) sees the old file or the new one, never half of one. The file has its
final mode from its creation, so a secret is never readable by others even for
an instant. Standard library only: the engine, the SDK and plugins import it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path | str, data: bytes | str, *, mode: int = 0o644, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` in one rename; ``mode`` from the start; ``durable`` fsyncs before the rename.

    Raises ``OSError`` when the directory is missing or not writable; the temporary file is removed then.
    """
    target = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data.encode() if isinstance(data, str) else data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
