"""When each cached layer was last used, how big it is, and evicting the least recently used ones.

The image store (:mod:`levers9.engine.images`) keeps layers unpacked under
``<cache>/layers/sha256/<diff id>/``. Images pulled from a registry make that
cache grow without end, so :func:`prune` removes layers, least recently used
first, until the cache holds at most ``max_bytes``.

- Last use: every resolve that hands out a layer touches ``<cache>/used/<diff
  id>`` (:func:`mark_used`); its mtime is the layer's last use. A layer with no
  stamp (unpacked before stamps existed) counts as used at the epoch: first out.
  The layer directory itself is never touched: its times are the image's.
- Size: the disk a layer takes, ``st_blocks`` of everything in it with hard
  links counted once; measured on first need and kept in the stamp file (whose
  mtime is put back), since a layer never changes once in place.
- Eviction: a layer named in ``in_use`` (the layers of containers that run or
  are being made: the caller knows them, the cache does not) is never removed,
  even when the cache stays over ``max_bytes`` without it (the report says how
  far over). A removed layer is renamed out of ``layers/`` under its lock first
  (no one sees half a layer, and an unpack of the same layer waits), then
  deleted; records that named it are deleted too, so the next resolve of their
  image reads (or pulls) it again.

A resolve in another process that found a layer just before a prune removed it
will find its container unable to mount it; a caller must hold the layers of
containers it is about to start in ``in_use`` (a worker prunes between
container starts, from the one place that starts them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PruneReport", "layer_size", "mark_used", "prune"]

_DIFF_ID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune` did: the diff ids it removed (least recently used first) and the bytes before and after."""

    removed: tuple[str, ...]
    bytes_before: int
    bytes_after: int
    #: bytes held by in-use layers that could not go although the cache is over ``max_bytes``
    bytes_in_use: int

    @property
    def freed(self) -> int:
        return self.bytes_before - self.bytes_after


def mark_used(cache_dir: Path, layers: Collection[Path]) -> None:
    """Touch the stamps of those of ``layers`` that live in this cache (a root filesystem directory does not)."""
    home = cache_dir / "layers" / "sha256"
    stamps = cache_dir / "used"
    for layer in layers:
        if layer.parent != home or not _DIFF_ID.fullmatch(layer.name):
            continue
        stamps.mkdir(exist_ok=True)
        stamp = stamps / layer.name
        try:
            os.utime(stamp)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                stamp.touch(exist_ok=False)


def layer_size(path: Path) -> int:
    """Bytes of disk ``path`` takes (allocated blocks of it and everything under it, hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, dirs, files in os.walk(path):
        for name in [*dirs, *files, ""]:
            entry = os.path.join(top, name) if name else top
            try:
                st = os.lstat(entry)
            except FileNotFoundError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_blocks * 512
    return total


def prune(
    cache_dir: Path,
    max_bytes: int,
    in_use: Collection[Path],
    lock: Callable[[str], contextlib.AbstractContextManager[None]],
) -> PruneReport:
    """Remove least recently used layers not in ``in_use`` until the cache holds ``max_bytes`` or less."""
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be 0 or more, got {max_bytes}")
    home = cache_dir / "layers" / "sha256"
    keep = {Path(p).name for p in in_use}
    layers = []
    for entry in sorted(home.iterdir()) if home.is_dir() else []:
        if _DIFF_ID.fullmatch(entry.name) and entry.is_dir():
            used, size = _stamp(cache_dir, entry)
            layers.append((used, entry.name, size))
    before = total = sum(size for _, _, size in layers)
    removed: list[str] = []
    held = 0
    for _, diff_id, size in sorted(layers):
        if total <= max_bytes:
            break
        if diff_id in keep:
            held += size
            continue
        with lock(diff_id):
            target = home / diff_id
            if not target.is_dir():
                continue
            scratch = Path(tempfile.mkdtemp(prefix="evict-", dir=cache_dir / "tmp"))
            os.rename(target, scratch / diff_id)  # out of sight at once; deleting may take a while
        shutil.rmtree(scratch, ignore_errors=True)
        (cache_dir / "used" / diff_id).unlink(missing_ok=True)
        total -= size
        removed.append(diff_id)
    if removed:
        _drop_records(cache_dir / "refs", set(removed))
    return PruneReport(
        removed=tuple(removed), bytes_before=before, bytes_after=total, bytes_in_use=held if total > max_bytes else 0
    )


def _stamp(cache_dir: Path, layer: Path) -> tuple[float, int]:
    """A layer's last use (its stamp's mtime; 0 without one) and size (kept in the stamp once measured)."""
    stamp = cache_dir / "used" / layer.name
    try:
        st = stamp.stat()
        text = stamp.read_text().strip()
    except FileNotFoundError:
        (cache_dir / "used").mkdir(exist_ok=True)
        st, text = None, ""
    if text.isdigit():
        return (st.st_mtime if st is not None else 0.0), int(text)
    size = layer_size(layer)
    stamp.write_text(str(size))
    used = st.st_mtime if st is not None else 0.0
    os.utime(stamp, (used, used))  # writing the size is not a use
    return used, size


def _drop_records(refs: Path, removed: set[str]) -> None:
    """Delete the resolution records that name a removed layer (they would only be found stale)."""
    for record in refs.glob("*.json") if refs.is_dir() else []:
        try:
            layers = json.loads(record.read_text()).get("layers") or []
        except (OSError, ValueError, AttributeError):
            continue
        if removed.intersection(layers):
            record.unlink(missing_ok=True)
