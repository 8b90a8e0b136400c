"""Unpacking a tar stream that may have been tampered with: the rules of tarfile's ``data`` filter, on every Python.

A checkpoint image comes back from storage a node does not control, so its
members are checked before anything is written: an absolute name is taken
as relative to the destination, nothing that resolves outside the destination (``..``, a symbolic or hard link
pointing out), no device file; set-id, sticky and group/other write bits are
cleared, regular files stay readable and writable by their owner, and the
archive's owners are dropped, so everything belongs to whoever unpacks it.

Pythons from 3.11.4 (and 3.12) carry those rules as ``tarfile.data_filter``,
and they are used there. Debian 12's Python 3.11.2 has neither the filter nor
``extractall(filter=...)``: there the same rules are applied here, member by
member, and an offending member raises :class:`UnsafeMember` before it is
extracted. Directories keep their own permissions with full access for their
owner (the ``data`` filter would leave them to the umask), so the node can
clean the image up later.
"""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["UnsafeMember", "extract_all", "safe_member"]

#: this Python has tarfile's extraction filters (3.11.4 and later)
HAS_FILTERS = hasattr(tarfile, "data_filter")


class UnsafeMember(tarfile.TarError):
    """A member the ``data`` rules refuse: it would write outside the destination, or is a device."""


def _inside(dest: str, path: str, member: tarfile.TarInfo, what: str) -> None:
    resolved = os.path.realpath(path)
    if os.path.commonpath([resolved, dest]) != dest:
        raise UnsafeMember(f"{member.name!r}: {what} {resolved} is outside the destination {dest}")


def _data_rules(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """``member`` as the ``data`` filter would let it through, else UnsafeMember (for Pythons without it)."""
    dest = os.path.realpath(dest)
    member = copy.copy(member)
    member.name = member.name.lstrip("/" + os.sep)  # an absolute name lands inside, as with the filter
    _inside(dest, os.path.join(dest, member.name), member, "it")
    if member.ischr() or member.isblk():
        raise UnsafeMember(f"{member.name!r} is a device file")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise UnsafeMember(f"{member.name!r} links to the absolute path {member.linkname!r}")
        _inside(dest, os.path.join(dest, os.path.dirname(member.name), member.linkname), member, "its link")
    elif member.islnk():
        _inside(dest, os.path.join(dest, member.linkname), member, "its hard link")
    checked = copy.copy(member)
    if member.isreg() or member.islnk():
        mode = (member.mode & 0o755) | 0o600
        checked.mode = mode if mode & 0o100 else mode & ~0o111
    elif not member.issym():
        checked.mode = member.mode & 0o755
    # the unpacking user owns everything (chown to itself is all an extraction as root then does)
    checked.uid, checked.gid, checked.uname, checked.gname = os.getuid(), os.getgid(), "", ""
    return checked


def safe_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """The ``data`` rules, except that directories keep their permissions (the owner keeping full access)."""
    filtered = tarfile.data_filter(member, dest) if HAS_FILTERS else _data_rules(member, dest)
    if filtered is not None and filtered.isdir():
        kept = copy.copy(filtered)
        kept.mode = (member.mode & 0o755) | 0o700
        return kept
    return filtered


def _checked(tar: tarfile.TarFile, dest: str) -> Iterator[tarfile.TarInfo]:
    for member in tar:
        checked = safe_member(member, dest)
        if checked is not None:
            yield checked


def extract_all(stream: IO[bytes], dest: Path, *, bufsize: int) -> None:
    """Extract the tar ``stream`` (read once, front to back) into the existing directory ``dest``."""
    with tarfile.open(fileobj=stream, mode="r|", bufsize=bufsize) as tar:
        if HAS_FILTERS:
            tar.extractall(dest, filter=safe_member)
        else:
            tar.extractall(dest, members=_checked(tar, str(dest)))
