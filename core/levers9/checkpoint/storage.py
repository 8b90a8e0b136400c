"""Where checkpoint images live for good: the workspace's durable storage, named by URL, and its keys.

A checkpoint is only worth taking if a task on *another* machine can restore
it, so every image is uploaded to the workspace's storage (a directory on a
single machine, S3 or an S3-compatible store otherwise). The node keeps its
own copy too (:mod:`levers9.checkpoint.node_cache`), and
:mod:`levers9.checkpoint.publish` moves images between the two.

Images are gigabytes of memory pages that hardly compress, so they travel as
one plain tar, streamed both ways: never held in memory, never copied whole to
a temporary file first.

The database records the *storage key* of each checkpoint (``CheckpointRecord.path``),
never a node's local path: the key means the same thing on every node, a local
path only on the one that wrote it. :func:`levers9.checkpoint.publish.fetch_for_start`
turns the key back into a local directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, Protocol

from levers9.checkpoint.record import CheckpointRecord
from levers9.checkpoint.untar import extract_all
from levers9.config.storage_url import parse_storage_url
from levers9.hooks.errors import Levers9Error

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

__all__ = [
    "CheckpointMissing",
    "CheckpointRecorder",
    "CheckpointStorage",
    "LocalStorage",
    "S3Storage",
    "StorageError",
    "storage_from_url",
    "storage_key",
]

log = logging.getLogger(__name__)

#: one name in a key or the cache: no separators, no leading dot (so never ``.``/``..`` nor a temporary name)
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
#: the key segment of a checkpoint that belongs to no stub
_NO_STUB = "_"
#: how much is read or written at a time while streaming a tar; big enough that Python's overhead disappears
_CHUNK = 1 << 20


class CheckpointMissing(Levers9Error):
    """The storage has no image under that key: the checkpoint cannot be restored, start cold."""


class StorageError(Levers9Error):
    """The storage failed for a reason other than a missing image (permissions, a missing bucket, the network).

    ``code`` is the store's own error code (``NoSuchBucket``, ``AccessDenied``...) when it gave one.
    """

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class CheckpointRecorder(Protocol):
    """Where checkpoints are recorded: the database itself (``CheckpointStore``), or, on a worker, the
    controlplane through its Worker service (``levers9.checkpoint.snapshot.RecordStore``)."""

    async def create(
        self,
        workspace_id: str,
        runtime: str,
        *,
        stub_id: str | None = None,
        task_id: str | None = None,
        gpu: str | None = None,
    ) -> CheckpointRecord: ...

    async def set_status(
        self,
        checkpoint_id: str,
        status: str,
        *,
        path: str | None = None,
        size_bytes: int | None = None,
        error: str | None = None,
    ) -> CheckpointRecord: ...


class CheckpointStorage(Protocol):
    """The workspace's durable storage for checkpoint images, one object per image."""

    def put_dir(self, key: str, source: Path) -> int:
        """Store the directory ``source`` under ``key``, replacing what was there; returns the bytes stored."""
        ...

    def get_dir(self, key: str, dest: Path) -> None:
        """Unpack the image under ``key`` into ``dest``, which must not exist; all of it appears at once, or nothing.

        Raises :class:`CheckpointMissing` when there is nothing under ``key``.
        """
        ...

    def delete(self, key: str) -> None:
        """Forget ``key``; deleting what is not there is not an error."""
        ...

    def describe(self) -> str:
        """Where the images go, for messages."""
        ...


# --------------------------------------------------------------------------- keys


def _check_segment(value: str, what: str) -> str:
    if not _SEGMENT.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} cannot name a checkpoint: use letters, digits, '_' and '-', starting with a letter or digit"
        )
    return value


def _check_key(key: str) -> str:
    """Keys become file paths and object names: refuse anything that could climb out of the storage's root."""
    for part in key.split("/"):
        if part != _NO_STUB and not _SEGMENT.fullmatch(part):
            raise ValueError(f"checkpoint storage key {key!r} must be '/'-separated names of letters, digits, '_', '-'")
    return key


def storage_key(workspace_id: str, stub_id: str | None, checkpoint_id: str) -> str:
    """The key of a checkpoint in its workspace's storage.

    The workspace comes first so that two workspaces sharing one bucket never
    read each other's images, and an operator can delete a workspace's prefix.
    ``_`` stands for "no stub" and cannot collide with a real id (ids start
    with a letter or digit).
    """
    stub = _NO_STUB if stub_id is None else _check_segment(stub_id, "stub id")
    return f"{_check_segment(workspace_id, 'workspace id')}/{stub}/{_check_segment(checkpoint_id, 'checkpoint id')}"


# --------------------------------------------------------------------------- tar streaming


def _write_tar(source: Path, out: IO[bytes]) -> None:
    """The directory's contents (not the directory itself, whose name is the sender's business) as a tar stream."""
    if not source.is_dir():
        raise NotADirectoryError(f"checkpoint image {source} is not a directory")
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_CHUNK) as tar:
        for child in sorted(source.iterdir()):
            tar.add(child, arcname=child.name)


def _unpack(stream: IO[bytes], dest: Path) -> None:
    """Unpack a tar stream into ``dest`` all at once: a reader never sees half an image, even after a crash.

    :mod:`levers9.checkpoint.untar` refuses members and links that would reach outside
    ``dest`` (a tampered object must not write anywhere else on the node), device files
    and set-id bits, and drops the archive's owners, so files belong to whoever
    restores them.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        extract_all(stream, staging, bufsize=_CHUNK)
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class _PipeReader:
    """The reading end of a pipe fed by another thread, counting bytes and passing on the feeder's failure.

    Without the failure check, a feeder that died half-way would look like a
    short but complete stream, and half an image would be stored as a whole one.
    """

    def __init__(self, raw: IO[bytes], failure: list[BaseException]) -> None:
        self._raw = raw
        self._failure = failure
        self.count = 0

    def read(self, size: int | None = -1) -> bytes:
        data = self._raw.read(-1 if size is None else size)
        self.count += len(data)
        at_end = size is None or size < 0 or len(data) < size
        if at_end and self._failure:
            raise self._failure[0]
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    def close(self) -> None:
        self._raw.close()


def _pump(produce: Callable[[IO[bytes]], None], consume: Callable[[Any], None], *, name: str) -> int:
    """Run ``produce`` in a thread writing into a pipe that ``consume`` reads here; returns the bytes that passed.

    This is how a tar is streamed into an upload, or a download into tar
    extraction, with only the pipe's buffers in memory. Either side failing stops
    the other: a dead producer ends the stream with its error, a dead consumer
    closes the pipe under the producer. The producer's error wins, since the
    consumer's is then only a consequence of it.
    """
    read_fd, write_fd = os.pipe()
    writer = os.fdopen(write_fd, "wb", buffering=_CHUNK)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            produce(writer)
        except BaseException as exc:
            failure.append(exc)  # before closing: the reader looks for it when the stream ends
        finally:
            with contextlib.suppress(OSError):  # the reader already gave up
                writer.close()

    reader = _PipeReader(os.fdopen(read_fd, "rb", buffering=_CHUNK), failure)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    consumer_error: BaseException | None = None
    try:
        consume(reader)
        reader.drain()  # a tar reader stops at the end marker; let the producer finish its padding
    except BaseException as exc:
        consumer_error = exc
    finally:
        reader.close()
        thread.join()
    if failure and not (isinstance(failure[0], BrokenPipeError) and consumer_error is not None):
        raise failure[0]
    if consumer_error is not None:
        raise consumer_error
    return reader.count


# --------------------------------------------------------------------------- local directory


class LocalStorage:
    """Images as tar files in a directory: the storage of a single machine, or of a shared filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{_check_key(key)}.tar"

    def put_dir(self, key: str, source: Path) -> int:
        """Written under a temporary name then renamed, so a crash never leaves a truncated image under ``key``."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        try:
            with os.fdopen(fd, "wb", buffering=_CHUNK) as out:
                _write_tar(source, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        return target.stat().st_size

    def get_dir(self, key: str, dest: Path) -> None:
        path = self._path(key)
        try:
            stream = open(path, "rb", buffering=_CHUNK)  # noqa: SIM115 - closed below, after the missing case
        except FileNotFoundError:
            raise CheckpointMissing(f"no checkpoint image at {path}") from None
        with stream:
            _unpack(stream, dest)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def describe(self) -> str:
        return str(self.root)


# --------------------------------------------------------------------------- S3


_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class S3Storage:
    """Images as objects in an S3 bucket (or an S3-compatible store: MinIO, Ceph, R2...).

    Credentials come from boto3's default chain (environment, shared files,
    instance profile), never from the URL, so no secret ends up in config or
    in the database. With a custom ``endpoint_url``, path-style addressing is
    used: most S3-compatible stores do not serve bucket names as host names.
    """

    def __init__(
        self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, region: str | None = None
    ) -> None:
        if not bucket:
            raise ValueError("an S3 checkpoint storage needs a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self._client: Any = None
        self._client_lock = threading.Lock()

    def _s3(self) -> Any:
        """The client, made on first use: boto3 is slow to import and only S3 users need it."""
        with self._client_lock:
            if self._client is None:
                import boto3.session
                from botocore.config import Config

                config = Config(s3={"addressing_style": "path"}) if self.endpoint_url else None
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config
                )
            return self._client

    def _object(self, key: str) -> str:
        name = f"{_check_key(key)}.tar"
        return f"{self.prefix}/{name}" if self.prefix else name

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object(key)}"

    def _fail(self, action: str, key: str, exc: Exception) -> NoReturn:
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "") or None
            message = error.get("Message") or str(exc)
            raise StorageError(
                f"{action} {self._where(key)} failed: {code or 'error'}: {message} (bucket {self.bucket!r}, key {self._object(key)!r})",
                code=code,
            ) from exc
        raise StorageError(
            f"{action} {self._where(key)} failed: {exc} (bucket {self.bucket!r}, key {self._object(key)!r})"
        ) from exc

    def put_dir(self, key: str, source: Path) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        client, name = self._s3(), self._object(key)

        def upload(stream: Any) -> None:
            try:
                client.upload_fileobj(stream, self.bucket, name)
            except (BotoCoreError, ClientError) as exc:
                self._fail("uploading", key, exc)

        return _pump(lambda out: _write_tar(source, out), upload, name=f"tar {source.name}")

    def get_dir(self, key: str, dest: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client, name = self._s3(), self._object(key)

        def download(out: IO[bytes]) -> None:
            try:
                client.download_fileobj(self.bucket, name, out)
            except ClientError as exc:
                if _code(exc) in _MISSING_CODES:
                    self._missing_or_no_bucket(key)
                self._fail("downloading", key, exc)
            except BotoCoreError as exc:
                self._fail("downloading", key, exc)

        _pump(download, lambda stream: _unpack(stream, dest), name=f"download {name}")

    def _missing_or_no_bucket(self, key: str) -> NoReturn:
        """A HEAD of a missing object and one in a missing bucket both answer a bare 404: tell them apart.

        A missing bucket is a misconfiguration that an operator must hear about,
        not a missing checkpoint to silently start cold for, forever.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._s3().head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise StorageError(
                    f"the checkpoint bucket {self.bucket!r} does not exist (key {self._object(key)!r})",
                    code="NoSuchBucket",
                ) from None
        except BotoCoreError:
            pass
        raise CheckpointMissing(f"no checkpoint image at {self._where(key)}")

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._s3().delete_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if _code(exc) not in _MISSING_CODES:
                self._fail("deleting", key, exc)
        except BotoCoreError as exc:
            self._fail("deleting", key, exc)

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


# --------------------------------------------------------------------------- choosing the storage


def storage_from_url(url: str | None, *, default_root: Path) -> CheckpointStorage:
    """The storage an operator named (see :func:`levers9.config.storage_url.parse_storage_url` for the forms).

    :raises ValueError: the URL is not one of the accepted forms; the message lists them.
    """
    parsed = parse_storage_url(url)
    if parsed is None:
        return LocalStorage(default_root)
    if parsed.bucket is None:
        return LocalStorage(Path(parsed.path))
    return S3Storage(parsed.bucket, parsed.path, endpoint_url=parsed.endpoint_url, region=parsed.region)
