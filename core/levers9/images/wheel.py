"""levers9's own wheel, built offline from what is installed here: what a box installs the agent (or a worker) from.

The name ``levers9`` on the public package index belongs to another project,
so nothing of ours is ever installed from an index by that name: the
controlplane serves this wheel (``GET /api/v1/wheels``) with its sha256, and
the join command, ``machine create --ssh`` and the boot script fetch it from
there, check the hash and ``pip install`` that file (the third-party
distributions it requires still come from the index, by their own names).

:func:`build` writes one pure-Python wheel, ``levers9-<version>-py3-none-any.whl``,
holding levers9's own packages: ``levers9`` and every package a ``levers9``
entry point of the distribution names (the plugins and runtimes), taken from
the directories they are imported from (a checkout or an installed wheel
alike), without byte code; and a ``.dist-info`` with this installation's
``METADATA`` (this version, its ``Requires-Dist`` lines), its entry points,
``WHEEL`` and ``RECORD``. Invariants:

* the same installation gives the same bytes, so the same sha256: entries are
  sorted and every one has the same timestamp and mode;
* ``METADATA`` requires no distribution named ``levers9`` (a self-reference of
  an extra would make pip look the name up on the index): such lines are
  dropped;
* nothing is downloaded and no build backend runs.

Failures raise :class:`~levers9.images.rootfs.ImageError` naming what cannot
be read (a package that cannot be imported, a file that went away).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from levers9.__about__ import __version__
from levers9.images.rootfs import ImageError, own_packages

__all__ = ["DISTRIBUTION", "Wheel", "build", "wheel_name"]

#: the distribution every wheel here is of
DISTRIBUTION = "levers9"
#: every entry's time in the archive (the earliest a zip file can hold): the bytes do not depend on mtimes
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SELF_REQUIREMENT = re.compile(r"^Requires-Dist:\s*levers9\b", re.IGNORECASE)


@dataclass(frozen=True)
class Wheel:
    """One built wheel: its file name, contents and their sha256 (hex)."""

    filename: str
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


def wheel_name(version: str = __version__) -> str:
    """``levers9-<version>-py3-none-any.whl`` (a local version's ``+`` kept: pip accepts it in a file name)."""
    return f"{DISTRIBUTION}-{version.replace('-', '_')}-py3-none-any.whl"


def _metadata_text(own: metadata.Distribution) -> str:
    text = own.read_text("METADATA") or f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {__version__}\n"
    head, _, body = text.partition("\n\n")
    lines = []
    for line in head.splitlines():
        if line.startswith("Version:"):
            line = f"Version: {__version__}"
        elif _SELF_REQUIREMENT.match(line) or line.startswith("License-File:"):
            continue  # a self-reference would send pip to the index by our name; license files are not carried
        lines.append(line)
    return "\n".join(lines) + "\n" + (f"\n{body}" if body else "")


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _files() -> list[tuple[str, Path]]:
    """(path in the wheel, source file) for each file of levers9's own packages, sorted by path."""
    found: dict[str, Path] = {}
    for package in own_packages(metadata.distribution(DISTRIBUTION)):
        for root, dirs, names in os.walk(package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            rel = Path(root).relative_to(package.parent).as_posix()
            for name in names:
                if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                    found[f"{rel}/{name}"] = Path(root) / name
    return sorted(found.items())


def build() -> Wheel:
    """levers9's own wheel from this installation (see the module docstring)."""
    own = metadata.distribution(DISTRIBUTION)
    info = f"{DISTRIBUTION}-{__version__.replace('-', '_')}.dist-info"
    entries: list[tuple[str, bytes]] = []
    for path, source in _files():
        try:
            entries.append((path, source.read_bytes()))
        except OSError as exc:
            raise ImageError(f"cannot read {source} for levers9's wheel: {exc.strerror}") from None
    entries.append((f"{info}/METADATA", _metadata_text(own).encode()))
    entries.append((f"{info}/entry_points.txt", (own.read_text("entry_points.txt") or "").encode()))
    wheel_text = (
        f"Wheel-Version: 1.0\nGenerator: levers9 {__version__} (levers9.images.wheel)\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    entries.append((f"{info}/WHEEL", wheel_text.encode()))
    record = [_record_line(path, data) for path, data in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for path, data in entries:
            item = zipfile.ZipInfo(path, date_time=_EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(item, data)
    data = buffer.getvalue()
    return Wheel(wheel_name(), data, hashlib.sha256(data).hexdigest())
