"""The ``host`` image: a function runs on a bare machine from the host's own /usr and Python.

The image is one small skeleton layer (``/etc/passwd``, ``/tmp``, the mount
points, the links of a usr-merged root) plus read-only binds of the host's
``/usr``, its unmerged ``/bin``-style directories and the running Python's
prefixes outside ``/usr`` (a virtualenv, a pyenv build).

Invariants: the skeleton is keyed by the sha256 of its own content and built
in a private temporary directory renamed into place, so processes sharing a
cache build it at most once each and never see half of one; a mount point is
never created through a link into ``/usr``; nothing of the host is copied
except ``/etc/resolv.conf``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from levers9.engine.image_types import HOST_REF, HostBind, ImageConfig, ResolvedImage

__all__ = ["host_layout", "resolve_host"]

_HOST_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def resolve_host(cache_dir: Callable[[str], Path]) -> ResolvedImage:
    """The host image; ``cache_dir(name)`` gives (and creates) a directory of the image cache."""
    links, binds = host_layout(Path("/"))
    for prefix in _python_prefixes():
        if any(prefix == b.target or prefix.startswith(b.target.rstrip("/") + "/") for b in binds):
            continue
        binds = [b for b in binds if not b.target.startswith(prefix + "/")]
        binds.append(HostBind(source=prefix, target=prefix))
    skeleton = _host_skeleton(cache_dir, links, [b.target for b in binds])
    config = ImageConfig(env=(_HOST_PATH,), workdir="/")
    return ResolvedImage(ref=HOST_REF, layers=(skeleton,), config=config, binds=tuple(binds))


def _host_skeleton(cache_dir: Callable[[str], Path], links: dict[str, str], mountpoints: Sequence[str]) -> Path:
    """The small root the host's binds are mounted on, keyed by its content so it is built once."""
    entries: list[tuple[str, str, int | str]] = [
        ("dir", name, 0o755) for name in ("proc", "sys", "dev", "etc", "run", "var", "home", "usr")
    ]
    entries += [("dir", "root", 0o700), ("dir", "tmp", 0o1777), ("dir", "var/tmp", 0o1777)]
    entries += [
        (
            "file",
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        ),
        ("file", "etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        ("file", "etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
    ]
    with contextlib.suppress(OSError):
        entries.append(("file", "etc/resolv.conf", Path("/etc/resolv.conf").read_text()))
    entries += [("link", name, target) for name, target in sorted(links.items())]
    # Mount points exist in the layer so a read-only root (no upper layer) can still take the binds.
    known = {name for _, name, _ in entries}
    for target in mountpoints:
        parts = Path(target).relative_to("/").parts
        if parts and parts[0] in links:
            continue  # reached through a link into /usr, which is bound already; never mkdir through a link
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if rel not in known:
                known.add(rel)
                entries.append(("dir", rel, 0o755))
    key = hashlib.sha256(json.dumps(entries).encode()).hexdigest()
    target_dir = cache_dir("host") / key
    if target_dir.is_dir():
        return target_dir
    scratch = Path(tempfile.mkdtemp(prefix="host-", dir=cache_dir("tmp")))
    try:
        scratch.chmod(0o755)
        for kind, rel, value in entries:
            path = scratch / rel
            if kind == "dir":
                path.mkdir()
                path.chmod(int(value))
            elif kind == "file":
                path.write_text(str(value))
                path.chmod(0o644)
            else:
                path.symlink_to(str(value))
        try:
            os.rename(scratch, target_dir)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target_dir.is_dir():
                raise
        return target_dir
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def host_layout(root: Path) -> tuple[dict[str, str], list[HostBind]]:
    """What of ``root``'s top level the host image mirrors: links to recreate and directories to bind.

    On a usr-merged host ``/bin`` and friends are links into ``/usr``, which the
    skeleton copies; on an older host they are real directories, bound as they are.
    """
    links: dict[str, str] = {}
    binds = [HostBind(source=str(root / "usr"), target="/usr")]
    for name in ("bin", "lib", "lib64", "sbin"):
        path = root / name
        if path.is_symlink():
            links[name] = os.readlink(path)
        elif path.is_dir():
            binds.append(HostBind(source=str(path), target=f"/{name}"))
    return links, binds


def _python_prefixes() -> list[str]:
    """The running Python's (and its venv's) install directories that /usr does not already hold."""
    prefixes: list[str] = []
    for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):
        path = os.path.abspath(prefix)
        real = os.path.realpath(path)
        if path == "/" or real == "/" or any(p == "/usr" or p.startswith("/usr/") for p in (path, real)):
            continue
        prefixes.append(path)
    return prefixes
