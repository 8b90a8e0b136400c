"""The memory cgroup of an OCI container, made before the runtime starts it and removed after it.

The shim reads the cgroup's OOM count once the container has ended, so the cgroup must outlive the
container: :func:`own_memory_cgroup` makes it first (runsc, which deletes the cgroups it made itself
the moment the sandbox ends, then joins it and leaves it alone), and :func:`remove_cgroups` removes
whatever is left of a container's cgroups at removal, in every hierarchy (runc deletes its own; a
crash or runsc leaves some). Both swallow what the kernel refuses: a cgroup that cannot be made costs
the OOM count only, one that cannot be removed yet is removed by the next removal.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["own_memory_cgroup", "remove_cgroups"]


def own_memory_cgroup(path: str, limit_bytes: int, root: Path = Path("/sys/fs/cgroup")) -> None:
    """Create the container's memory cgroup, with its limit, before the runtime does.

    runsc deletes the cgroups it created the moment the sandbox ends, taking the
    OOM counter with it before the shim can read it. A cgroup that already
    exists is joined and left alone (its limit too, hence setting it here), and
    :func:`remove_cgroups` removes it at the end.
    """
    memory = root / "memory"
    if not memory.is_dir():
        return  # cgroup v2: the shim's polling reads memory.events while the cgroup lives
    directory = memory / path.lstrip("/")
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "memory.limit_in_bytes").write_text(str(limit_bytes))
        if (directory / "memory.memsw.limit_in_bytes").exists():
            (directory / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))


def remove_cgroups(path: str, root: Path = Path("/sys/fs/cgroup")) -> None:
    """runc removes its cgroups on delete; this catches what a crash or runsc leaves."""
    rel = path.lstrip("/")
    candidates = [root / rel] + [c / rel for c in root.iterdir() if c.is_dir()] if root.exists() else []
    for directory in candidates:
        if directory.is_dir():
            with contextlib.suppress(OSError):
                directory.rmdir()
