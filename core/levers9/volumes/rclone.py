"""rclone mounts on a worker: a volume over WebDAV from the controlplane, or a cloud bucket over S3.

Each mount is one ``rclone mount`` child in a session of its own, serving a FUSE mount point until
:func:`unmount`; :func:`sweep` takes down what a killed worker left below its directory.

Consistency the user gets (``--vfs-cache-mode writes --vfs-write-back 5s --dir-cache-time 1s``, and the
kernel's attribute cache of 1 s):

* a file open for writing is written to a local copy under ``cache_dir``; it is uploaded whole, as one
  request, :data:`WRITE_BACK_S` after its last descriptor is closed (``close(2)`` does not wait for it),
  so a write-then-rename is uploaded under its final name. A WebDAV upload becomes visible only once
  complete (the server's atomic PUT), so nobody ever reads half of it; S3 objects are whole by nature.
  A rename made while the upload runs keeps the old name on the server (rclone renames only its cached
  copy then: seen with 1.60 and 1.75), which is why the upload waits;
* the same mount sees its own writes at once (it reads its local copy);
* another mount of the same volume sees a new file, whole, once the upload is done and its own caches
  (directory listing 1 s, attributes 1 s) expire: about :data:`WRITE_BACK_S` plus a second or two after
  it was closed, more for a big file. A file
  *replaced* under a name that mount listed in the last second or so can read there as the new content
  cut at the old length (rclone asks for the byte range of the size it listed; measured with rclone
  1.60): a reader that must see whole files should take new names (write, then rename to a fresh name)
  or read again after that second. There is no locking between mounts: of two writers of one file the
  last upload wins;
* :func:`unmount` detaches the mount point, then waits (``timeout_s``) for rclone to finish the uploads
  under way and exit (rclone handles the requests it has read before it ends, so a file closed just
  before the unmount is uploaded, short of a release the kernel had queued but rclone not yet read); only
  then is it stopped (SIGTERM, then SIGKILL), and what it had not uploaded is lost.

File modes are rclone's defaults (0644 files, 0755 directories) with every file owned by
``owner_uid:owner_gid``; the kernel does not enforce them (no ``--default-permissions``) and
``--allow-other`` lets every user reach the mount: the mount point's place is what confines it.

Credentials (the bearer token, the access keys) and the remote's settings reach rclone only through its
environment (``RCLONE_CONFIG_VOLUME_*``), readable by its own user alone, never through its command line,
which every user of the host can read in ``/proc``. rclone starts with no config file (``--config ""``)
and none of the worker's own environment, and logs at NOTICE (a DEBUG log would print the token).
Its log is ``cache_dir/rclone.log`` and its stderr ``cache_dir/rclone.stderr``; ``cache_dir`` is the
mount's own (two mounts sharing one would share their cached files).

Failures (:class:`RcloneError`, the message quoting the last lines rclone logged): rclone or fusermount3
missing (the message says ``apt-get install rclone fuse3``), no ``/dev/fuse``; rclone ending before the
mount appears (a bad flag, a non-empty or missing mount point); the mount not appearing within
``timeout_s`` (rclone is stopped); the first listing of the new mount failing or not answering within
``timeout_s``: the server refused the credentials (a wrong token: 401, wrong keys: 403), the bucket is
not there, or the server is unreachable. In each case nothing is left mounted or running. A WebDAV
volume the server answers 404 for mounts as an empty directory (rclone takes a missing directory for an
empty one) in which every write fails with EIO; the token the controlplane gives names a volume it has.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from levers9.volumes.juicefs import fuse_mounts_below

__all__ = [
    "INSTALL",
    "WRITE_BACK_S",
    "RcloneError",
    "RcloneMount",
    "mount_s3",
    "mount_webdav",
    "sweep",
    "unmount",
    "wait_uploaded",
]

log = logging.getLogger(__name__)

#: the command that installs what this module runs
INSTALL = "apt-get install rclone fuse3"
#: seconds a closed file waits before its upload starts (``--vfs-write-back``): a rename within that time
#: (write, then rename into place) is uploaded under the new name; one made while the upload runs is lost on
#: the server (rclone 1.60 and 1.75 rename only their cached copy then), so 0 would break that common pattern
WRITE_BACK_S = 5.0
#: the file system type of an rclone mount in /proc/self/mountinfo
FSTYPE = "fuse.rclone"
#: the remote's name, the ``<REMOTE>`` of its ``RCLONE_CONFIG_<REMOTE>_*`` variables
_REMOTE = "volume"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
#: lines of its log and stderr an error quotes
_TAIL = 8


class RcloneError(RuntimeError):
    """A mount that could not be made or taken down; the message says why and quotes rclone."""


@dataclass
class RcloneMount:
    """A running ``rclone mount``: its mount point, its process (a session of its own) and its log."""

    target: Path
    process: subprocess.Popen[bytes]
    cache_dir: Path
    #: what is mounted, for messages ("webdav https://.../vol/", "s3 bucket b")
    what: str

    @property
    def log_file(self) -> Path:
        return self.cache_dir / "rclone.log"

    @property
    def stderr_file(self) -> Path:
        return self.cache_dir / "rclone.stderr"

    def tail(self) -> str:
        """The last lines rclone logged and wrote to stderr."""
        return _tail(self.log_file, self.stderr_file)


def mount_webdav(
    url: str,
    bearer_token: str,
    target: str | os.PathLike[str],
    *,
    read_only: bool,
    cache_dir: str | os.PathLike[str],
    owner_uid: int,
    owner_gid: int,
    ca_file: str | os.PathLike[str] | None = None,
    timeout_s: float = 30,
    write_back_s: float = WRITE_BACK_S,
) -> RcloneMount:
    """Mount the WebDAV tree at ``url`` (a volume's, ``.../dav/<volume>/``) on ``target``, authenticated by
    ``bearer_token``; ``ca_file`` verifies the server's certificate where it has a CA of its own."""
    if not re.match(r"https?://[^/\s]+", url):
        raise RcloneError(f"url {url!r}: expected http(s)://host[:port]/path")
    if not bearer_token or any(c in bearer_token for c in "\r\n\0"):
        raise RcloneError("bearer_token: expected a non-empty token on one line")
    settings = {"TYPE": "webdav", "URL": url, "VENDOR": "other", "BEARER_TOKEN": bearer_token}
    extra = []
    if ca_file is not None:
        if not Path(ca_file).is_file():
            raise RcloneError(f"ca_file {os.fspath(ca_file)!r}: no such file (a PEM bundle of CA certificates)")
        extra = ["--ca-cert", os.fspath(ca_file)]
    return _mount(
        f"{_REMOTE}:",
        settings,
        extra,
        target,
        read_only,
        cache_dir,
        owner_uid,
        owner_gid,
        timeout_s,
        f"webdav {url}",
        write_back_s,
    )


def mount_s3(
    bucket: str,
    target: str | os.PathLike[str],
    *,
    access_key: str,
    secret_key: str,
    endpoint: str | None = None,
    region: str | None = None,
    force_path_style: bool = False,
    read_only: bool,
    cache_dir: str | os.PathLike[str],
    owner_uid: int,
    owner_gid: int,
    timeout_s: float = 30,
    write_back_s: float = WRITE_BACK_S,
) -> RcloneMount:
    """Mount S3 bucket ``bucket`` on ``target``: AWS, or any S3 service at ``endpoint``."""
    if not _BUCKET.fullmatch(bucket):
        raise RcloneError(f"bucket {bucket!r}: expected an S3 bucket name (3 to 63 of a-z, 0-9, '.', '-')")
    if not access_key or not secret_key:
        raise RcloneError("access_key and secret_key: both are needed (this mount never reads the host's own)")
    settings = {
        "TYPE": "s3",
        "PROVIDER": "Other" if endpoint else "AWS",
        "ENV_AUTH": "false",
        "ACCESS_KEY_ID": access_key,
        "SECRET_ACCESS_KEY": secret_key,
        "FORCE_PATH_STYLE": "true" if force_path_style else "false",
        "NO_CHECK_BUCKET": "true",  # never try to create it: keys of one bucket may not list or make others
    }
    if endpoint:
        if not re.match(r"https?://[^/\s]+", endpoint):
            raise RcloneError(f"endpoint {endpoint!r}: expected http(s)://host[:port]")
        settings["ENDPOINT"] = endpoint
    if region:
        settings["REGION"] = region
    return _mount(
        f"{_REMOTE}:{bucket}",
        settings,
        [],
        target,
        read_only,
        cache_dir,
        owner_uid,
        owner_gid,
        timeout_s,
        f"s3 bucket {bucket}",
        write_back_s,
    )


def unmount(mount: RcloneMount, timeout_s: float = 60) -> None:
    """Wait (up to ``timeout_s``) for what was closed to be uploaded, detach ``mount`` and stop its rclone;
    idempotent. rclone leaves a closed file whose upload has not started (:data:`WRITE_BACK_S`) in its cache
    when it ends: the upload would wait for the next mount with that cache."""
    target = os.fspath(mount.target)
    if mount.process.poll() is None and _is_mounted(target):
        _wait_uploaded(mount.cache_dir, timeout_s, target)
    if _is_mounted(target):
        _detach(target)
    process = mount.process
    if process.poll() is None:
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "rclone (pid %d) serving %s did not end %.0f s after the unmount; stopping it",
                process.pid,
                target,
                timeout_s,
            )
            _stop(process)
    if _is_mounted(target):
        raise RcloneError(f"{target} is still mounted after fusermount3 -u and umount -l: {mount.tail()}")


def wait_uploaded(mount: RcloneMount, timeout_s: float = 600) -> bool:
    """Wait until every file closed on ``mount`` is uploaded (:data:`WRITE_BACK_S` after its close, then its
    transfer); False when some still were not after ``timeout_s`` (logged), or the mount is gone."""
    if mount.process.poll() is not None:
        return False
    return _wait_uploaded(mount.cache_dir, timeout_s, os.fspath(mount.target))


def sweep(directory: str | os.PathLike[str], timeout_s: float = 10) -> list[Path]:
    """Unmount every rclone mount at or below ``directory`` (what a killed worker left: a dead mount, or one
    its orphaned rclone still serves, which is then stopped); returns their mount points."""
    base = os.path.realpath(directory)
    found = [point for point, fstype in fuse_mounts_below(Path(base)) if fstype == FSTYPE]  # deepest first
    for point in found:
        serving = _serving(point)
        log.info("sweep: unmounting %s (rclone pids %s)", point, serving or "none")
        for pid in serving:  # an orphan still serving: what it was given is uploaded first
            cache = _cache_dir_of(pid)
            if cache is not None:
                _wait_uploaded(cache, timeout_s, point)
        _detach(point)
        for pid in serving:
            _end_foreign(pid, timeout_s)
        if _is_mounted(point):
            raise RcloneError(f"sweep: {point} is still mounted after fusermount3 -u and umount -l")
    return [Path(point) for point in found]


# ---------------------------------------------------------------------- starting


def _tools() -> str:
    rclone = shutil.which("rclone")
    if rclone is None or shutil.which("fusermount3") is None:
        missing = "rclone" if rclone is None else "fusermount3"
        raise RcloneError(f"{missing} is not installed on this machine: {INSTALL}")
    if not os.path.exists("/dev/fuse"):
        raise RcloneError("no /dev/fuse here: load the fuse module (modprobe fuse) or give the container the device")
    return rclone


def _mount(
    remote: str,
    settings: dict[str, str],
    extra: list[str],
    target_path: str | os.PathLike[str],
    read_only: bool,
    cache_path: str | os.PathLike[str],
    uid: int,
    gid: int,
    timeout_s: float,
    what: str,
    write_back_s: float,
) -> RcloneMount:
    rclone = _tools()
    for name, value in (("owner_uid", uid), ("owner_gid", gid)):
        if not isinstance(value, int) or value < 0:
            raise RcloneError(f"{name} {value!r}: expected a user or group id (an integer, 0 or more)")
    target = Path(os.path.realpath(target_path))
    if _is_mounted(os.fspath(target)):
        raise RcloneError(f"{target} is a mount point already; unmount it (or sweep its directory) first")
    target.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_path)
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    env.update({f"RCLONE_CONFIG_{_REMOTE.upper()}_{key}": value for key, value in settings.items()})
    argv = [
        rclone,
        "mount",
        remote,
        os.fspath(target),
        "--config",
        "",
        "--allow-other",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--vfs-cache-mode",
        "writes",
        "--vfs-write-back",
        f"{write_back_s:g}s",
        "--cache-dir",
        os.fspath(cache_dir),
        "--dir-cache-time",
        "1s",
        "--attr-timeout",
        "1s",
        "--poll-interval",
        "0",
        "--log-file",
        os.fspath(cache_dir / "rclone.log"),
        "--log-level",
        "NOTICE",
        *extra,
        *(["--read-only"] if read_only else []),
    ]
    (cache_dir / "rclone.log").unlink(missing_ok=True)
    with open(cache_dir / "rclone.stderr", "wb") as stderr:
        process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True
        )
    mount = RcloneMount(target, process, cache_dir, what)
    deadline = time.monotonic() + timeout_s
    while not _is_mounted(os.fspath(target)):
        if process.poll() is not None:
            raise RcloneError(
                f"rclone mount of {what} on {target} ended (exit {process.returncode}) before the mount "
                f"appeared: {mount.tail()}"
            )
        if time.monotonic() > deadline:
            _stop(process)
            raise RcloneError(
                f"rclone mount of {what} on {target} did not appear within {timeout_s:.0f} s; stopped: {mount.tail()}"
            )
        time.sleep(0.05)
    failure = _first_listing(target, max(1.0, deadline - time.monotonic()))
    if failure is not None:
        with contextlib.suppress(RcloneError):
            unmount(mount, timeout_s=5)
        raise RcloneError(
            f"rclone mounted {what} on {target} but listing it failed ({failure}); "
            f"unmounted. rclone said: {mount.tail()}"
        )
    log.info("rclone (pid %d) mounted %s on %s", process.pid, what, target)
    return mount


def _first_listing(target: Path, timeout_s: float) -> str | None:
    """Why listing the new mount failed (credentials, a missing volume or bucket, no server), or None."""
    outcome: list[str | None] = []

    def list_it() -> None:
        try:
            os.listdir(target)
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{exc.strerror}")

    thread = threading.Thread(target=list_it, name="rclone-first-listing", daemon=True)
    thread.start()
    thread.join(timeout_s)  # a server that never answers leaves it blocked until the mount goes
    return outcome[0] if outcome else f"no answer within {timeout_s:.0f} s"


# ---------------------------------------------------------------------- stopping


def _detach(target: str) -> None:
    """fusermount3 -u, or umount -l where that fails (a busy mount); the mount point is gone after."""
    done = subprocess.run(["fusermount3", "-u", target], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 and _is_mounted(target):
        log.warning("fusermount3 -u %s failed (%s); detaching it lazily", target, done.stderr.strip())
        lazy = subprocess.run(["umount", "-l", target], capture_output=True, text=True, timeout=30)
        if lazy.returncode != 0 and _is_mounted(target):
            raise RcloneError(
                f"cannot unmount {target}: fusermount3 -u said {done.stderr.strip()!r}, "
                f"umount -l said {lazy.stderr.strip()!r}"
            )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's session, SIGKILL 5 s later; waited for."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 30.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    if process.poll() is None:
        raise RcloneError(f"rclone (pid {process.pid}) did not end on SIGKILL")


def _serving(point: str) -> list[int]:
    """Pids of rclone mount processes whose command line names ``point``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"rclone" and b"mount" in argv and os.fsencode(point) in argv:
            pids.append(int(entry.name))
    return pids


def _cache_dir_of(pid: int) -> Path | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for flag, value in itertools.pairwise(argv):
        if flag == b"--cache-dir":
            return Path(os.fsdecode(value))
    return None


def _dirty(cache_dir: Path) -> list[str]:
    """The files of a mount's cache not uploaded yet: rclone's metadata of each says ``"Dirty": true``, or is
    being written this moment. rclone rewrites a file's metadata in place (truncated, then encoded), so a read
    can find it empty or cut short; such a file counts as not uploaded, and the next look reads it whole.
    Taking it for uploaded let an unmount end rclone before a file closed just before it was sent."""
    found = []
    for meta in (cache_dir / "vfsMeta").rglob("*"):
        try:
            if not meta.is_file():
                continue
            text = meta.read_text(errors="replace")
        except OSError:
            continue  # uploaded and dropped meanwhile
        try:
            info = json.loads(text)
        except ValueError:
            found.append(meta.name)  # being written
            continue
        if not isinstance(info, dict) or info.get("Dirty") is True:
            found.append(meta.name)
    return found


def _wait_uploaded(cache_dir: Path, timeout_s: float, target: str) -> bool:
    """True once nothing in ``cache_dir`` waits to be uploaded; False (logged) if something still does after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while dirty := _dirty(cache_dir):
        if time.monotonic() > deadline:
            log.warning(
                "%s: %d file(s) not uploaded after %.0f s: %s", target, len(dirty), timeout_s, ", ".join(dirty[:5])
            )
            return False
        time.sleep(0.1)
    return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _end_foreign(pid: int, timeout_s: float) -> None:
    """End an rclone this process did not start: it gets ``timeout_s`` to finish its uploads and exit."""
    for sig, grace in ((None, timeout_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(pid):
            return


# ---------------------------------------------------------------------- reading the host


def _is_mounted(target: str) -> bool:
    return any(point == target and fstype == FSTYPE for point, fstype in fuse_mounts_below(Path(target)))


def _tail(*files: Path) -> str:
    parts = []
    for file in files:
        try:
            lines = file.read_text(errors="replace").splitlines()[-_TAIL:]
        except OSError:
            continue
        if lines:
            parts.append(f"{file.name}: " + " | ".join(line.strip() for line in lines))
    return "; ".join(parts) or "(rclone logged nothing)"
