"""A volume's files over WebDAV: the subset ``rclone mount`` (webdav backend, vendor ``other``) uses.

:class:`WebDav` is a plain ASGI app, mounted by the controlplane under a prefix (its ``root_path``); a
request's path below it is ``/<volume>/<path...>``, percent-decoded. For every request it asks its
``resolve(request, volume)`` for the volume's :class:`~levers9.volumes.paths.VolumeRoot`; the resolver
authenticates and refuses with :class:`DavRefused`. Every file is then reached through that root
(openat2 ``RESOLVE_BENEATH``), so a ``..`` or a symbolic link leading out of the volume is refused there.

Served (RFC 4918, class 1, no locks): ``OPTIONS``; ``PROPFIND`` of Depth 0 or 1 (an empty body or
``allprop`` answer every property below, ``prop`` the ones named, ``propname`` their names): displayname,
resourcetype, getcontentlength, getcontenttype, getlastmodified (RFC 1123), getetag; ``GET`` and ``HEAD``
with one byte range; ``PUT``; ``DELETE`` (recursive); ``MKCOL``; ``MOVE`` and ``COPY`` with ``Destination``
(an absolute URL or path; its host is not compared, a proxy may rewrite it) and ``Overwrite``. Listings
leave out links that lead out of the volume or nowhere; ``COPY`` copies what a file link names and skips
links to directories (so a link to an ancestor cannot make it endless).

Invariant, atomic PUT: a body is streamed (a bounded buffer, never the whole body in memory) into a new
temporary, ``.levers9-upload-<random>`` in the target's own directory, flushed to disk and renamed over
the target only once the body is complete. A reader sees the old file or the new one, never half of
one; a client that goes away, a short body or a failed write removes the temporary. Temporaries never
appear in listings and no request may name one. A process killed in the middle leaves its temporary
behind (invisible here, visible to containers mounting the volume's file system directly).

Statuses: 401 (with ``WWW-Authenticate: Bearer``), 403, 404 as the resolver says; 403 for a path leading
out of the volume, a reserved name, Depth infinity, the root deleted, moved or copied, or a MOVE/COPY
into itself or into another volume; 404 nothing at the path; 405 a method not served, or MKCOL where
something exists; 409 a missing or non-directory parent, or a file where a directory is needed (and the
reverse); 412 ``Overwrite: F`` with the destination present; 415 a MKCOL with a body; 416 a range outside
the file; 400 malformed headers or XML; 502 a Destination outside this WebDAV tree; 507 the volume's
storage full. Every error's body is the reason as text/plain.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import mimetypes
import os
import posixpath
import secrets
import shutil
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, BinaryIO, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from levers9.volumes.paths import (
    Entry,
    NotFoundInVolume,
    PathEscapes,
    VolumePathError,
    VolumeRoot,
    normalise,
)

__all__ = ["UPLOAD_PREFIX", "DavRefused", "Resolver", "WebDav"]

#: names an upload in progress; reserved: never listed, never named by a request
UPLOAD_PREFIX = ".levers9-upload-"
#: bytes read from disk, or buffered before a write to disk, at a time
CHUNK = 1024 * 1024
#: the largest PROPFIND body read
_MAX_XML = 64 * 1024
_METHODS = ("OPTIONS", "PROPFIND", "GET", "HEAD", "PUT", "DELETE", "MKCOL", "MOVE", "COPY")
_DAV = "DAV:"
_ALL_PROPS = ("displayname", "resourcetype", "getcontentlength", "getcontenttype", "getlastmodified", "getetag")

T = TypeVar("T")


class DavRefused(Exception):
    """The resolver's refusal: answered with ``status`` and ``message`` (401 adds ``WWW-Authenticate``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Resolver = Callable[[Request, str], Awaitable[VolumeRoot]]


class _Answer(Exception):
    """An error answer decided deep in a handler."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _text(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(message + "\n", status, headers=headers, media_type="text/plain; charset=utf-8")


def _path_error(exc: VolumePathError) -> Response:
    status = 403 if isinstance(exc, PathEscapes) else 404 if isinstance(exc, NotFoundInVolume) else 409
    return _text(status, str(exc))


async def _run(fn: Callable[..., T], *args: Any) -> T:
    return await anyio.to_thread.run_sync(fn, *args)


class WebDav:
    """The ASGI app: ``/<volume>/<path>`` below where it is mounted, each volume given by ``resolve``."""

    def __init__(self, resolve: Resolver) -> None:
        self.resolve = resolve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        request = Request(scope, receive)
        try:
            response = await self._handle(request)
        except _Answer as answer:
            response = _text(answer.status, answer.message, answer.headers)
        except DavRefused as refused:
            headers = {"WWW-Authenticate": 'Bearer realm="levers9 volumes"'} if refused.status == 401 else None
            response = _text(refused.status, refused.message, headers)
        except VolumePathError as exc:
            response = _path_error(exc)
        except OSError as exc:  # the disk's, not the user's: a full volume, an I/O error
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                response = _text(507, f"the volume's storage is full ({exc.strerror})")
            else:
                response = _text(500, f"the volume's storage failed: {exc.strerror}")
        await response(scope, receive, send)

    # ------------------------------------------------------------------ routing

    async def _handle(self, request: Request) -> Response:
        volume, path = _split(request.scope)
        method = request.method.upper()
        if not volume:
            raise _Answer(404, "name a volume: <this tree>/<volume>/<path>")
        if "\0" in path or "\0" in volume:
            raise _Answer(400, "the path holds a NUL character")
        root = await self.resolve(request, volume)
        if method not in _METHODS:
            raise _Answer(405, f"method {method} is not served here", {"Allow": ", ".join(_METHODS)})
        rel = normalise(path)
        _not_reserved(rel)
        if method == "OPTIONS":
            headers = {"DAV": "1", "Allow": ", ".join(_METHODS), "MS-Author-Via": "DAV"}
            return Response(b"", 200, headers=headers)
        if method == "PROPFIND":
            return await self._propfind(request, root, volume, rel)
        if method in ("GET", "HEAD"):
            return await self._get(request, root, rel, head=method == "HEAD")
        if method == "PUT":
            return await self._put(request, root, rel)
        if method == "DELETE":
            if not rel:
                raise _Answer(403, "the volume's root cannot be deleted")
            await _run(lambda: root.remove(rel, recursive=True))
            return Response(b"", 204)
        if method == "MKCOL":
            return await self._mkcol(request, root, rel)
        return await self._move_or_copy(request, root, volume, rel, copy=method == "COPY")

    # ------------------------------------------------------------------ PROPFIND

    async def _propfind(self, request: Request, root: VolumeRoot, volume: str, rel: str) -> Response:
        depth = request.headers.get("depth", "infinity").strip().lower()
        if depth == "infinity":
            raise _Answer(403, "Depth: infinity is not served; list one level at a time (Depth: 0 or 1)")
        if depth not in ("0", "1"):
            raise _Answer(400, f"Depth {depth!r}: expected 0 or 1")
        wanted = _wanted(await _small_body(request))
        entries = await _run(_listing, root, rel, depth == "1")
        base = f"{request.scope.get('root_path', '')}/{volume}"
        body = "".join(_response(base, entry, wanted) for entry in entries)
        xml = f'<?xml version="1.0" encoding="utf-8"?>\n<D:multistatus xmlns:D="DAV:">{body}</D:multistatus>\n'
        return Response(xml.encode(), 207, media_type='application/xml; charset="utf-8"')

    # ------------------------------------------------------------------ GET, HEAD

    async def _get(self, request: Request, root: VolumeRoot, rel: str, *, head: bool) -> Response:
        file = await _run(root.open_read, rel)
        try:
            st = os.fstat(file.fileno())  # the opened file's: a PUT may rename another over the name meanwhile
            size = st.st_size
            headers = {
                "Accept-Ranges": "bytes",
                "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
                "ETag": _etag(size, st.st_mtime),
            }
            start, end = 0, size - 1
            status = 200
            wanted = _range(request.headers.get("range"), size)
            if wanted is not None:
                start, end = wanted
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            headers["Content-Length"] = str(end - start + 1)
            media = mimetypes.guess_type(rel)[0] or "application/octet-stream"
            if head:
                file.close()
                return Response(b"", status, headers=headers, media_type=media)
        except BaseException:
            file.close()
            raise
        return StreamingResponse(_chunks(file, start, end - start + 1), status, headers=headers, media_type=media)

    # ------------------------------------------------------------------ PUT

    async def _put(self, request: Request, root: VolumeRoot, rel: str) -> Response:
        if not rel:
            raise _Answer(409, "the volume's root is a collection; PUT names a file")
        existed = await _run(_kind, root, rel)
        if existed == "dir":
            raise _Answer(409, f"path {rel!r} is a collection; PUT names a file")
        temp = posixpath.join(posixpath.dirname(rel), UPLOAD_PREFIX + secrets.token_hex(8))
        try:
            out = await _run(root.open_new, temp)
        except NotFoundInVolume:
            raise _Answer(409, f"the parent collection of {rel!r} does not exist; MKCOL it first") from None
        except VolumePathError as exc:
            if isinstance(exc, PathEscapes):
                raise
            raise _Answer(409, f"the parent of {rel!r} is not a collection: {exc}") from None
        done = False
        try:
            received = await _receive(request, out)
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) != received:
                raise _Answer(400, f"the body had {received} bytes, Content-Length said {declared}")
            await _run(_finish, out)
            await _run(root.move, temp, rel)
            done = True
        except ClientDisconnect:
            return _text(400, "the client went away before the whole body came")
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _Answer(507, f"path {rel!r}: the volume's storage is full") from None
            raise _Answer(500, f"path {rel!r}: writing failed: {exc.strerror}") from None
        finally:
            if not done:
                with anyio.CancelScope(shield=True):
                    await _run(_discard, root, out, temp)
        return Response(b"", 204 if existed else 201)

    # ------------------------------------------------------------------ MKCOL

    async def _mkcol(self, request: Request, root: VolumeRoot, rel: str) -> Response:
        if await _small_body(request):
            raise _Answer(415, "MKCOL with a body is not served")
        there = await _run(_kind, root, rel) if rel else "dir"
        if there:
            raise _Answer(405, f"path {rel!r} exists already")
        try:
            await _run(lambda: root.mkdir(rel, parents=False))
        except PathEscapes:
            raise
        except VolumePathError as exc:
            raise _Answer(409, f"the parent of {rel!r} is missing or not a collection: {exc}") from None
        return Response(b"", 201)

    # ------------------------------------------------------------------ MOVE, COPY

    async def _move_or_copy(self, request: Request, root: VolumeRoot, volume: str, rel: str, *, copy: bool) -> Response:
        what = "COPY" if copy else "MOVE"
        target = normalise(_destination(request, volume))
        _not_reserved(target)
        overwrite = request.headers.get("overwrite", "T").strip().upper()
        if overwrite not in ("T", "F"):
            raise _Answer(400, f"Overwrite {overwrite!r}: expected T or F")
        if not rel or not target:
            raise _Answer(403, f"the volume's root cannot be the source or the destination of {what}")
        if target == rel or target.startswith(rel + "/"):
            raise _Answer(403, f"{what} of {rel!r} to {target!r}: the destination is the source or inside it")
        depth = request.headers.get("depth", "infinity").strip().lower()
        if depth not in ("0", "infinity") or (depth == "0" and not copy):
            raise _Answer(400, f"Depth {depth!r}: {what} takes {'0 or ' if copy else ''}infinity")
        await _run(root.stat, rel)  # 404, 403 first
        parent = posixpath.dirname(target)
        if parent and await _run(_kind, root, parent) != "dir":
            raise _Answer(409, f"the parent collection of the destination {target!r} does not exist")
        existed = await _run(_kind, root, target)
        if existed and overwrite == "F":
            raise _Answer(412, f"the destination {target!r} exists and Overwrite is F")
        if existed:
            await _run(lambda: root.remove(target, recursive=True))
        if copy:
            await _run(_copy, root, rel, target, depth == "infinity")
        else:
            await _run(root.move, rel, target)
        return Response(b"", 204 if existed else 201)


# ---------------------------------------------------------------------- request parts


def _split(scope: Mapping[str, Any]) -> tuple[str, str]:
    """(volume, path) of the request, below where the app is mounted."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if root_path and path.startswith(root_path):
        path = path[len(root_path) :]
    volume, _, rest = path.lstrip("/").partition("/")
    return volume, rest


def _not_reserved(rel: str) -> None:
    if any(part.startswith(UPLOAD_PREFIX) for part in rel.split("/")):
        raise _Answer(403, f"path {rel!r}: names beginning with {UPLOAD_PREFIX!r} are reserved for uploads")


def _destination(request: Request, volume: str) -> str:
    """The path in ``volume`` that the Destination header names."""
    header = request.headers.get("destination")
    if not header:
        raise _Answer(400, "a Destination header is needed (an absolute URL or path)")
    path = urllib.parse.unquote(urllib.parse.urlsplit(header).path)
    prefix = request.scope.get("root_path", "") + "/"
    if not path.startswith(prefix):
        raise _Answer(502, f"the Destination {header!r} is not on this WebDAV tree ({prefix}<volume>/...)")
    other, _, rest = path[len(prefix) :].partition("/")
    if other != volume:
        raise _Answer(403, f"the Destination {header!r} is in another volume; MOVE and COPY stay in {volume!r}")
    if "\0" in rest:
        raise _Answer(400, "the Destination holds a NUL character")
    return rest


async def _small_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_XML:
            raise _Answer(400, f"the request body is larger than {_MAX_XML} bytes")
    return body


def _wanted(body: bytes) -> list[tuple[str, str]] | str | None:
    """A PROPFIND body's ask: None for every property, "propname", or the (namespace, name) pairs named."""
    if not body.strip():
        return None
    if b"<!DOCTYPE" in body.upper():
        raise _Answer(400, "a PROPFIND body may not hold a DOCTYPE")
    try:
        tree = ET.fromstring(body)
    except ET.ParseError as exc:
        raise _Answer(400, f"the PROPFIND body is not XML: {exc}") from None
    if tree.tag != "{DAV:}propfind":
        raise _Answer(400, "the PROPFIND body's root must be DAV:propfind")
    for child in tree:
        if child.tag == "{DAV:}allprop":
            return None
        if child.tag == "{DAV:}propname":
            return "propname"
        if child.tag == "{DAV:}prop":
            return [_qname(prop.tag) for prop in child]
    raise _Answer(400, "the PROPFIND body names none of allprop, propname, prop")


def _qname(tag: str) -> tuple[str, str]:
    if tag.startswith("{"):
        namespace, _, name = tag[1:].partition("}")
        return namespace, name
    return "", tag


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range asked (inclusive), or None for the whole file (no range, several ranges or a
    malformed one, which RFC 9110 lets a server ignore); 416 for a range outside the file."""
    unsatisfiable = _Answer(
        416, f"the range {header!r} is outside the file ({size} bytes)", {"Content-Range": f"bytes */{size}"}
    )
    if not header or not header.strip().lower().startswith("bytes=") or "," in header:
        return None
    first, dash, last = header.strip()[6:].strip().partition("-")
    if not dash or not (first.isdigit() or last.isdigit()) or (first and not first.isdigit()):
        return None
    if last and not last.isdigit():
        return None
    if not first:  # the last N bytes
        count = int(last)
        if count == 0 or size == 0:
            raise unsatisfiable
        return max(0, size - count), size - 1
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise unsatisfiable
    return start, min(int(last), size - 1) if last else size - 1


# ---------------------------------------------------------------------- file work (in threads)


def _kind(root: VolumeRoot, rel: str) -> str | None:
    """ "dir", "file" or None (nothing there) for ``rel``; a link leading out raises PathEscapes."""
    try:
        return "dir" if root.stat(rel).is_dir else "file"
    except NotFoundInVolume:
        return None


def _visible(root: VolumeRoot, entry: Entry) -> Entry | None:
    """What a listing shows for ``entry``: a link resolved inside the volume, else nothing."""
    if entry.name.startswith(UPLOAD_PREFIX):
        return None
    if not entry.is_link:
        return entry
    try:
        return root.stat(entry.path)
    except VolumePathError:
        return None


def _listing(root: VolumeRoot, rel: str, children: bool) -> list[Entry]:
    entry = root.stat(rel)
    if not (children and entry.is_dir):
        return [entry]
    shown = (_visible(root, child) for child in root.list(rel))
    return [entry, *(child for child in shown if child is not None)]


async def _chunks(file: BinaryIO, start: int, length: int) -> AsyncIterator[bytes]:
    try:
        await _run(file.seek, start)
        while length > 0:
            data = await _run(file.read, min(CHUNK, length))
            if not data:
                break
            length -= len(data)
            yield data
    finally:
        file.close()


async def _receive(request: Request, out: BinaryIO) -> int:
    """Stream the request's body into ``out`` through a bounded buffer; returns how many bytes came."""
    received = 0
    buffer = bytearray()
    async for chunk in request.stream():
        received += len(chunk)
        buffer += chunk
        if len(buffer) >= CHUNK:
            await _run(out.write, buffer)
            buffer = bytearray()
    if buffer:
        await _run(out.write, buffer)
    return received


def _finish(out: BinaryIO) -> None:
    out.flush()
    os.fsync(out.fileno())
    out.close()


def _discard(root: VolumeRoot, out: BinaryIO, temp: str) -> None:
    with contextlib.suppress(OSError):  # flushing what is buffered fails again on a full disk; the fd is closed
        out.close()
    with contextlib.suppress(VolumePathError):
        root.remove(temp)


def _copy(root: VolumeRoot, source: str, target: str, deep: bool) -> None:
    if root.stat(source).is_dir:
        root.mkdir(target, parents=False)
        for child in root.list(source) if deep else []:
            shown = _visible(root, child)
            if shown is None or (child.is_link and shown.is_dir):
                continue
            _copy(root, child.path, posixpath.join(target, child.name), deep)
        return
    temp = posixpath.join(posixpath.dirname(target), UPLOAD_PREFIX + secrets.token_hex(8))
    with root.open_read(source) as src:
        out = root.open_new(temp)
        try:
            shutil.copyfileobj(src, out, CHUNK)
            _finish(out)
            root.move(temp, target)
        except BaseException:
            _discard(root, out, temp)
            raise


# ---------------------------------------------------------------------- XML


def _etag(size: int, mtime: float) -> str:
    return f'"{int(mtime * 1_000_000):x}-{size:x}"'


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _value(entry: Entry, name: str) -> str | None:
    """The XML of DAV property ``name`` of ``entry``; None where it has none (a directory's length)."""
    if name == "displayname":
        return _xml(entry.name)
    if name == "resourcetype":
        return "<D:collection/>" if entry.is_dir else ""
    if name == "getlastmodified":
        return email.utils.formatdate(entry.mtime, usegmt=True)
    if entry.is_dir:
        return None
    if name == "getcontentlength":
        return str(entry.size)
    if name == "getcontenttype":
        return _xml(mimetypes.guess_type(entry.name)[0] or "application/octet-stream")
    if name == "getetag":
        return _xml(_etag(entry.size, entry.mtime))
    return None


def _element(namespace: str, name: str, inner: str) -> str:
    if namespace == _DAV:
        return f"<D:{name}>{inner}</D:{name}>" if inner else f"<D:{name}/>"
    return f'<X:{name} xmlns:X="{_xml(namespace)}"/>' if namespace else f'<{name} xmlns=""/>'


def _propstat(props: str, status: str) -> str:
    return f"<D:propstat><D:prop>{props}</D:prop><D:status>HTTP/1.1 {status}</D:status></D:propstat>"


def _response(base: str, entry: Entry, wanted: list[tuple[str, str]] | str | None) -> str:
    href = urllib.parse.quote(f"{base}/{entry.path}" + ("/" if entry.is_dir and entry.path else ""))
    if not entry.path:
        href = urllib.parse.quote(base + "/")
    found, missing = [], []
    named = isinstance(wanted, list)
    names = wanted if isinstance(wanted, list) else [(_DAV, name) for name in _ALL_PROPS]
    for namespace, name in names:
        value = _value(entry, name) if namespace == _DAV else None
        if value is None:
            if named:
                missing.append(_element(namespace, name, ""))
            continue
        found.append(_element(namespace, name, "" if wanted == "propname" else value))
    stats = _propstat("".join(found), "200 OK")
    if missing:
        stats += _propstat("".join(missing), "404 Not Found")
    return f"<D:response><D:href>{href}</D:href>{stats}</D:response>"
