"""A sandbox's files: ``sb.fs.upload_file``, ``download_file``, ``read_bytes``, ``write_text``, ``list_files``...

Paths are absolute paths inside the sandbox; one with ``..`` that would leave the sandbox's root, a NUL,
or a relative one is refused by the controlplane (``BadPath``), and a local path is checked here before
anything is sent. Large files are streamed both ways, :data:`CHUNK_BYTES` at a time: ``upload_file``
never holds the file in memory, and ``download_file`` writes to a temporary file beside the target and
renames it once the whole file came, so the target is the new file whole or left as it was.
``read_bytes`` and ``read_text`` return the whole file, so they are for files that fit in memory.

Errors are the builtin ones where they exist (``FileNotFoundError`` for a path the sandbox lacks,
``FileExistsError``, ``PermissionError``), each also a
:class:`~levers9.sdk.sandbox_errors.SandboxFileSystemError` naming the sandbox and the path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.sdk.sandbox_errors import SandboxRequestError
from levers9.sdk.sandbox_http import SandboxRef

__all__ = ["CHUNK_BYTES", "AsyncSandboxFileSystem", "SandboxFileInfo", "SandboxFileSystem"]

#: the size of the pieces a file is sent and written in
CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class SandboxFileInfo:
    """A file or directory in the sandbox (``stat_file``, ``list_files``)."""

    name: str
    #: its absolute path in the sandbox
    path: str
    is_dir: bool
    size: int
    #: the file's mode: its type and permission bits
    mode: int
    #: when it was last changed, in whole seconds since the epoch
    mod_time: int
    #: the permission bits of ``mode`` (``0o644``)
    permissions: int

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> SandboxFileInfo:
        mode = int(entry.get("mode") or 0)
        return cls(
            name=str(entry.get("name", "")),
            path=str(entry.get("path", "")),
            is_dir=bool(entry.get("is_dir")),
            size=int(entry.get("size") or 0),
            mode=mode,
            mod_time=int(entry.get("mtime") or 0),
            permissions=mode & 0o7777,
        )


def _remote(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise SandboxRequestError(f"sandbox_path: expected an absolute path in the sandbox, got {path!r}")
    return path


async def _chunks(local: Path) -> AsyncIterator[bytes]:
    with local.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            yield chunk


class SandboxFileSystem:
    """``sb.fs``: the sandbox's files, read and written from here."""

    def __init__(self, sandbox: SandboxRef) -> None:
        self._sandbox = sandbox

    def _what(self, verb: str, path: str) -> str:
        return f"{verb} {path} in sandbox {self._sandbox.id}"

    # ------------------------------------------------------------------ coroutines (run on the sandbox loop)

    async def _put(self, sandbox_path: str, content: Any, verb: str) -> int:
        answer = await self._sandbox.request(
            "PUT", "/files", what=self._what(verb, sandbox_path), params={"path": sandbox_path}, content=content
        )
        return int(answer.get("size", 0))

    async def _upload(self, local_path: str | os.PathLike[str], sandbox_path: str) -> int:
        local = Path(local_path)
        if not local.is_file():
            raise FileNotFoundError(f"upload_file: {local}: no such file here (or not a regular file)")
        return await self._put(sandbox_path, _chunks(local), "upload to")

    async def _download(self, sandbox_path: str, local_path: str | os.PathLike[str]) -> int:
        target = Path(local_path)
        if target.is_dir():
            target = target / Path(sandbox_path).name
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        size = 0
        try:
            with os.fdopen(handle, "wb") as sink:
                async with self._sandbox.http.stream(
                    "GET",
                    self._sandbox.path("/files"),
                    what=self._what("download", sandbox_path),
                    params={"path": sandbox_path},
                    sandbox_id=self._sandbox.id,
                ) as response:
                    async for chunk in response.aiter_bytes(CHUNK_BYTES):
                        sink.write(chunk)
                        size += len(chunk)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return size

    async def _read(self, sandbox_path: str) -> bytes:
        parts = []
        async with self._sandbox.http.stream(
            "GET",
            self._sandbox.path("/files"),
            what=self._what("read", sandbox_path),
            params={"path": sandbox_path},
            sandbox_id=self._sandbox.id,
        ) as response:
            async for chunk in response.aiter_bytes(CHUNK_BYTES):
                parts.append(chunk)
        return b"".join(parts)

    async def _stat(self, sandbox_path: str) -> SandboxFileInfo:
        answer = await self._sandbox.request(
            "GET", "/files/stat", what=self._what("stat", sandbox_path), params={"path": sandbox_path}
        )
        return SandboxFileInfo.from_entry(answer["entry"])

    async def _list(self, sandbox_path: str) -> list[SandboxFileInfo]:
        answer = await self._sandbox.request(
            "GET", "/files/list", what=self._what("list", sandbox_path), params={"path": sandbox_path}
        )
        return [SandboxFileInfo.from_entry(entry) for entry in answer.get("entries", [])]

    async def _mkdir(self, sandbox_path: str, parents: bool) -> None:
        params = {"path": sandbox_path, "parents": "true" if parents else "false"}
        await self._sandbox.request("POST", "/files/mkdir", what=self._what("mkdir", sandbox_path), params=params)

    async def _delete(self, sandbox_path: str, recursive: bool) -> None:
        params = {"path": sandbox_path}
        if recursive:
            params["recursive"] = "true"
        await self._sandbox.request("DELETE", "/files", what=self._what("delete", sandbox_path), params=params)

    # ------------------------------------------------------------------ the user's methods

    def upload_file(self, local_path: str | os.PathLike[str], sandbox_path: str) -> int:
        """Copy a local file into the sandbox (created or replaced), streamed; returns its size."""
        return self._sandbox.http.run(self._upload(local_path, _remote(sandbox_path)))

    def download_file(self, sandbox_path: str, local_path: str | os.PathLike[str]) -> int:
        """Copy a file of the sandbox here (into ``local_path``, or under its name in that directory); its size."""
        return self._sandbox.http.run(self._download(_remote(sandbox_path), local_path))

    def read_bytes(self, sandbox_path: str) -> bytes:
        """The whole file."""
        return self._sandbox.http.run(self._read(_remote(sandbox_path)))

    def read_text(self, sandbox_path: str, encoding: str = "utf-8") -> str:
        """The whole file, decoded."""
        return self.read_bytes(sandbox_path).decode(encoding)

    def write_bytes(self, sandbox_path: str, data: bytes) -> int:
        """Create or replace the file with ``data``; returns its size."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise SandboxRequestError(f"write_bytes: data must be bytes, got {type(data).__name__}")
        return self._sandbox.http.run(self._put(_remote(sandbox_path), bytes(data), "write"))

    def write_text(self, sandbox_path: str, text: str, encoding: str = "utf-8") -> int:
        """Create or replace the file with ``text``, encoded; returns its size in bytes."""
        return self.write_bytes(sandbox_path, text.encode(encoding))

    def stat_file(self, sandbox_path: str) -> SandboxFileInfo:
        """What the path is: a file's size, mode and time, or a directory."""
        return self._sandbox.http.run(self._stat(_remote(sandbox_path)))

    def list_files(self, sandbox_path: str) -> list[SandboxFileInfo]:
        """The entries of a directory."""
        return self._sandbox.http.run(self._list(_remote(sandbox_path)))

    def create_directory(self, sandbox_path: str, parents: bool = True) -> None:
        """Make a directory and its missing parents (one that exists is fine); ``parents=False``: only it, and
        FileExistsError when it exists, FileNotFoundError without its parent."""
        self._sandbox.http.run(self._mkdir(_remote(sandbox_path), parents))

    def delete_file(self, sandbox_path: str) -> None:
        """Remove a file (a directory is refused: ``delete_directory``)."""
        self._sandbox.http.run(self._delete(_remote(sandbox_path), False))

    def delete_directory(self, sandbox_path: str) -> None:
        """Remove a directory and everything in it."""
        self._sandbox.http.run(self._delete(_remote(sandbox_path), True))

    @property
    def aio(self) -> AsyncSandboxFileSystem:
        """The same operations as coroutines: ``await sb.fs.aio.read_text(...)``."""
        return AsyncSandboxFileSystem(self)


class AsyncSandboxFileSystem:
    """:class:`SandboxFileSystem` for async code."""

    def __init__(self, files: SandboxFileSystem) -> None:
        self.sync = files
        self._run = files._sandbox.http.run_async

    async def upload_file(self, local_path: str | os.PathLike[str], sandbox_path: str) -> int:
        return await self._run(self.sync._upload(local_path, _remote(sandbox_path)))

    async def download_file(self, sandbox_path: str, local_path: str | os.PathLike[str]) -> int:
        return await self._run(self.sync._download(_remote(sandbox_path), local_path))

    async def read_bytes(self, sandbox_path: str) -> bytes:
        return await self._run(self.sync._read(_remote(sandbox_path)))

    async def read_text(self, sandbox_path: str, encoding: str = "utf-8") -> str:
        return (await self.read_bytes(sandbox_path)).decode(encoding)

    async def write_bytes(self, sandbox_path: str, data: bytes) -> int:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise SandboxRequestError(f"write_bytes: data must be bytes, got {type(data).__name__}")
        return await self._run(self.sync._put(_remote(sandbox_path), bytes(data), "write"))

    async def write_text(self, sandbox_path: str, text: str, encoding: str = "utf-8") -> int:
        return await self.write_bytes(sandbox_path, text.encode(encoding))

    async def stat_file(self, sandbox_path: str) -> SandboxFileInfo:
        return await self._run(self.sync._stat(_remote(sandbox_path)))

    async def list_files(self, sandbox_path: str) -> list[SandboxFileInfo]:
        return await self._run(self.sync._list(_remote(sandbox_path)))

    async def create_directory(self, sandbox_path: str, parents: bool = True) -> None:
        await self._run(self.sync._mkdir(_remote(sandbox_path), parents))

    async def delete_file(self, sandbox_path: str) -> None:
        await self._run(self.sync._delete(_remote(sandbox_path), False))

    async def delete_directory(self, sandbox_path: str) -> None:
        await self._run(self.sync._delete(_remote(sandbox_path), True))
