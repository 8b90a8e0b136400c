"""Base images from the Debian archive: Debian with the Python a blueprint names, as one OCI layer.

:func:`build_base` runs ``mmdebstrap`` against the Debian mirror this machine's
apt is configured with (or the one given) and writes the root filesystem as an
uncompressed tar that is a valid OCI layer; :func:`base_image` keeps one such
layer per recipe in a cache directory on the build machine. A Python version
maps to the Debian release that ships it (:data:`SUITES`); which of those the
mirror actually serves, :func:`python_versions` asks it (``dists/<suite>/Release``
over HTTP, once per process and mirror).

What a base holds, and why:

* ``--variant=minbase`` plus :data:`INCLUDES`: ``python3``, ``python3-pip`` and
  ``python3-venv`` (the builder installs Python packages with ``python3 -m pip``,
  and a user's own commands may make a venv), and ``ca-certificates``. Measured
  on bookworm: 124 MB of tar without pip and venv, 152 MB with them (pip pulls
  setuptools and wheel; venv itself is 34 kB).
* merged ``/usr`` made by mmdebstrap's own hook, not the ``usrmerge`` package,
  which would pull in Perl (50 MB);
* no manual pages, info pages, documentation (the copyright files stay) nor
  message translations: dpkg's ``path-exclude`` options, written into the image
  (``/etc/dpkg/dpkg.cfg.d/99mmdebstrap``), so packages a later step installs
  leave them out too;
* the apt sources of the same mirror (``/etc/apt/sources.list``): the suite, its
  ``-updates`` when the mirror serves it, and its ``-security`` suite from the
  security archive this machine's apt names, when the base is built from this
  machine's own mirror and that archive serves the suite; package lists are not
  kept (a step that installs packages runs ``apt-get update`` first);
* **pip may install into the system Python**: Debian 12 and later mark their
  Python ``EXTERNALLY-MANAGED`` (PEP 668) so that pip refuses to touch it; a
  base removes that marker, because an image is built for one program and pip
  inside it cannot break anything apt would later need. ``python3 -m pip
  install`` (a builder step or a user's command) then installs into
  ``/usr/local/lib/python3.X/dist-packages``, as Debian's pip does outside a
  venv, with no ``--break-system-packages`` needed;
* no ``/etc/resolv.conf`` and no ``/etc/hostname`` (mmdebstrap copies the build
  host's): they would differ between build machines; the container runtime
  gives containers their own. No device nodes: ``/dev`` is an empty directory
  (the runtime mounts its own ``/dev``; a layer extractor skips nodes anyway).

Invariants:

* **Reproducible for a mirror state.** ``SOURCE_DATE_EPOCH`` is the newest
  ``Date`` of the Release files of the suites used, so two builds from the same
  mirror contents give the same tar, byte for byte (the same
  :attr:`BaseLayer.diff_id`: seen on bookworm, four builds, one diff id), and
  the image config's ``created`` is that date, never the build's.
* **Built once per recipe.** :func:`base_image` keys a base by the suite, the
  mirror and security archive, the packages, the architecture, all of
  mmdebstrap's options and :data:`RECIPE_VERSION` (raise it when anything
  else about a base changes). It builds under an
  exclusive lock on ``<cache>/.<name>.lock`` (``flock``: other threads and
  processes of the machine wait for it, then reuse it) into a scratch
  directory, and renames the finished directory into place: a reader sees a
  whole base or none, and a build killed half way is cleared by the next one.
  A cached base is reused however old, without asking the mirror anything:
  the mirror's later updates are not picked up until the directory is removed
  or the recipe changes.

Failures: an unknown or unserved Python version raises
:class:`~levers9.blueprints.spec.BlueprintError` (field ``python_version``)
listing those the mirror offers; everything else raises :class:`BaseImageError`:
``mmdebstrap`` not on ``PATH`` (with the command that installs it), the mirror
unreachable or answering with an error (naming the mirror), a mirror that is
not an ``http(s)://`` URL or an extra package name that is not one, or
mmdebstrap failing (its exit status and the last lines it wrote).
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from levers9.blueprints.spec import BlueprintError, check_python_version
from levers9.hooks.errors import Levers9Error

__all__ = [
    "CMD",
    "DEFAULT_MIRROR",
    "ENV",
    "INCLUDES",
    "INSTALL",
    "RECIPE_VERSION",
    "SUITES",
    "BaseImageError",
    "BaseLayer",
    "base_image",
    "build_base",
    "configured_mirror",
    "configured_security",
    "python_versions",
    "suite_for",
]

log = logging.getLogger("levers9.builder.base")

#: the Python each Debian release ships, by version (what a blueprint's ``python_version`` may name)
SUITES: dict[str, str] = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
#: the packages every base has on top of minbase
INCLUDES: tuple[str, ...] = ("python3", "python3-pip", "python3-venv", "ca-certificates")
#: raise this when what a base holds changes: it is part of every cache key
RECIPE_VERSION = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"
INSTALL = "apt-get install -y mmdebstrap"
ENV: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
CMD: tuple[str, ...] = ("python3",)
#: mmdebstrap's hook that merges /usr without the usrmerge package (and does nothing where the release needs none)
MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/maybe-merged-usr")
#: what dpkg leaves out, in the base and in every package installed on it later
DPKG_OPTIONS: tuple[str, ...] = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
#: run in the finished root filesystem before it is packed (``$1`` is its directory)
CUSTOMIZE = 'rm -f "$1/etc/resolv.conf" "$1/etc/hostname" "$1"/usr/lib/python3*/EXTERNALLY-MANAGED'
#: an HTTP request to the mirror; mmdebstrap's whole run
HTTP_TIMEOUT_S = 20.0
BUILD_TIMEOUT_S = 1800.0
#: how many of mmdebstrap's last lines of output a failure quotes
TAIL_LINES = 25

_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(?:=[0-9][A-Za-z0-9.+~:-]*)?")
_URL = re.compile(r"https?://[^\s\x00-\x1f\x7f\"'\\]+")
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class BaseImageError(Levers9Error):
    """A base image could not be built; the message names the tool, the mirror or the package and what to do."""


@dataclass(frozen=True)
class BaseLayer:
    """A built base: one uncompressed tar, the OCI layer every image of this Python starts from."""

    #: the layer (an uncompressed tar)
    path: Path
    #: ``sha256:<hex>`` of the tar, the diff id an image config lists (and, uncompressed, its blob digest)
    diff_id: str
    #: bytes of the tar
    size: int
    python_version: str
    suite: str
    #: the apt sources inside the image, one ``deb`` line each
    sources: tuple[str, ...]
    #: the packages asked for on top of minbase
    packages: tuple[str, ...]
    #: RFC 3339: the mirror's newest Release date of those suites (the build's ``SOURCE_DATE_EPOCH``)
    created: str
    #: the OCI architecture (``amd64``, ``arm64``)
    architecture: str
    env: tuple[str, ...] = ENV
    cmd: tuple[str, ...] = CMD

    def config(self) -> dict[str, Any]:
        """The OCI image configuration of the base alone (one layer); an image built on it extends this."""
        return {
            "created": self.created,
            "architecture": self.architecture,
            "os": "linux",
            "config": {"Env": list(self.env), "Cmd": list(self.cmd), "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [self.diff_id]},
            "history": [
                {"created": self.created, "created_by": f"levers9 Debian {self.suite} base (recipe {RECIPE_VERSION})"}
            ],
        }

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        fields["path"] = str(self.path)
        return json.dumps(fields, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str, path: Path) -> BaseLayer:
        """A base as :meth:`to_json` wrote it, its tar at ``path`` (the directory may have been renamed since)."""
        fields = json.loads(text)
        fields["path"] = path
        for name in ("sources", "packages", "env", "cmd"):
            fields[name] = tuple(fields[name])
        return cls(**fields)


# ------------------------------------------------------------------ the machine's apt sources


def _sources_entries(apt_dir: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(URI, suites) of each enabled binary source: the deb822 files, then ``sources.list`` and its directory."""
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            yield from _deb822(path.read_text())
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in lists:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            yield from _one_line(path.read_text())


def _deb822(text: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    for stanza in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        last = ""
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and last:
                fields[last] += " " + line.strip()
                continue
            key, sep, value = line.partition(":")
            if sep:
                last = key.strip().lower()
                fields[last] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(fields.get("suites", "").split())
        for uri in fields.get("uris", "").split():
            yield uri.rstrip("/"), suites


def _one_line(text: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    for raw in text.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", raw.split("#", 1)[0]).split()
        if len(line) >= 3 and line[0] == "deb":
            yield line[1].rstrip("/"), (line[2],)


def configured_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive this machine's apt installs from (a source with a release suite), else :data:`DEFAULT_MIRROR`."""
    for uri, suites in _sources_entries(apt_dir):
        if uri.startswith(("http://", "https://")) and any("-" not in s and "/" not in s for s in suites):
            return uri
    return DEFAULT_MIRROR


def configured_security(apt_dir: Path = Path("/etc/apt")) -> str | None:
    """The security archive this machine's apt names (a source with a ``-security`` suite), or None."""
    for uri, suites in _sources_entries(apt_dir):
        if uri.startswith(("http://", "https://")) and any(s.endswith(("-security", "/updates")) for s in suites):
            return uri
    return None


def _mirror(mirror: str | None) -> str:
    if mirror is None:
        return configured_mirror()
    if not isinstance(mirror, str) or not _URL.fullmatch(mirror):
        raise BaseImageError(f"mirror: {mirror!r} is not a Debian mirror's URL; write it as http(s)://host/debian")
    return mirror.rstrip("/")


# ------------------------------------------------------------------ what the mirror serves


def _release_date(archive: str, suite: str) -> datetime | None:
    """The ``Date`` of the suite's Release file on ``archive``; None when the archive does not serve the suite."""
    for name in ("Release", "InRelease"):
        url = f"{archive}/dists/{suite}/{name}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                head = response.read(16384).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code in (403, 404, 410):
                continue
            raise BaseImageError(f"the Debian mirror {archive} answered {exc.code} ({exc.reason}) for {url}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BaseImageError(f"the Debian mirror {archive} cannot be reached ({url}): {reason}") from None
        found = re.search(r"^Date:\s*(.+)$", head, re.M)
        if found is None:
            raise BaseImageError(f"the Debian mirror {archive} served {url} without a Date: field")
        try:
            return email.utils.parsedate_to_datetime(found.group(1).strip()).astimezone(UTC)
        except (TypeError, ValueError):
            raise BaseImageError(
                f"the Debian mirror {archive} served {url} with a bad Date: {found.group(1)!r}"
            ) from None
    return None


_served: dict[tuple[str, str], datetime | None] = {}
_served_lock = threading.Lock()


def _served_date(archive: str, suite: str) -> datetime | None:
    """:func:`_release_date`, asked once per process (answers are kept; failures are not)."""
    with _served_lock:
        if (archive, suite) in _served:
            return _served[(archive, suite)]
    date = _release_date(archive, suite)
    with _served_lock:
        _served[(archive, suite)] = date
    return date


def python_versions(mirror: str | None = None) -> dict[str, str]:
    """The Python versions the mirror (default: this machine's) has a Debian release for, each to its suite."""
    archive = _mirror(mirror)
    found = {version: suite for version, suite in SUITES.items() if _served_date(archive, suite) is not None}
    if not found:
        raise BaseImageError(f"the Debian mirror {archive} serves none of {', '.join(SUITES.values())}")
    return found


def suite_for(python_version: str, mirror: str | None = None) -> str:
    """The Debian suite of ``python_version`` on the mirror, or :class:`BlueprintError` listing the versions there."""
    version = check_python_version("python_version", python_version)
    offered = python_versions(mirror)
    if version not in offered:
        listing = ", ".join(f"{v} (Debian {s})" for v, s in offered.items())
        raise BlueprintError(
            "python_version", f"no Debian release on {_mirror(mirror)} ships Python {version}; it offers {listing}"
        )
    return offered[version]


def _sources(suite: str, archive: str, security: str | None) -> tuple[list[str], int]:
    """The image's ``deb`` lines and the newest Release date among them (seconds since the epoch)."""
    main = _served_date(archive, suite)
    assert main is not None  # suite_for checked it
    lines, dates = [f"deb {archive} {suite} main"], [main]
    updates = _served_date(archive, f"{suite}-updates")
    if updates is not None:
        lines.append(f"deb {archive} {suite}-updates main")
        dates.append(updates)
    if security is not None:
        fixes = _served_date(security, f"{suite}-security")
        if fixes is not None:
            lines.append(f"deb {security} {suite}-security main")
            dates.append(fixes)
    return lines, int(max(dates).timestamp())


def _security_for(archive: str) -> str | None:
    """The security archive to add: this machine's, when the base comes from this machine's own mirror."""
    return configured_security() if archive == configured_mirror() else None


def _packages(packages: Sequence[str]) -> tuple[str, ...]:
    if isinstance(packages, str):
        raise BaseImageError(f"packages: expected a list of Debian package names, got the string {packages!r}")
    for index, name in enumerate(packages):
        if not isinstance(name, str) or not _PACKAGE.fullmatch(name):
            raise BaseImageError(
                f"packages[{index}]: {name!r} is not a Debian package name (like 'jq' or 'jq=1.6-2.1')"
            )
    return tuple(dict.fromkeys([*INCLUDES, *packages]))


def _architecture() -> str:
    machine = platform.machine().lower()
    return _ARCHITECTURES.get(machine, machine)


# ------------------------------------------------------------------ building


def _options() -> list[str]:
    """mmdebstrap's options every base is built with (the packages, suite, output and sources follow them)."""
    return [
        "--variant=minbase",
        "--format=tar",
        "--skip=output/dev",
        f"--hook-dir={MERGED_USR_HOOKS}",
        *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
        f"--customize-hook={CUSTOMIZE}",
    ]


def _dev_entry(epoch: int) -> bytes:
    """The tar header of an empty ``./dev`` (mmdebstrap's own has device nodes, which a layer should not carry)."""
    info = tarfile.TarInfo("./dev")
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join(lines[-TAIL_LINES:]) or "(no output)"


def build_base(
    python_version: str, dest: Path, *, mirror: str | None = None, packages: Sequence[str] = ()
) -> BaseLayer:
    """Build the base of ``python_version`` with mmdebstrap into the tar ``dest`` (written whole or not at all).

    ``mirror``: the Debian archive (default: this machine's apt's); ``packages``: more Debian packages to include.
    """
    archive = _mirror(mirror)
    includes = _packages(packages)
    binary = shutil.which("mmdebstrap")
    if binary is None:
        raise BaseImageError(f"building a Debian base image needs mmdebstrap, which is not on PATH: {INSTALL}")
    if not MERGED_USR_HOOKS.is_dir():
        raise BaseImageError(f"mmdebstrap's hooks are missing ({MERGED_USR_HOOKS}): {INSTALL} (1.3 or later)")
    suite = suite_for(python_version, archive)
    lines, epoch = _sources(suite, archive, _security_for(archive))
    argv = [
        binary,
        *_options(),
        f"--include={','.join(includes)}",
        suite,
        "-",
        *lines,
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "LC_ALL": "C.UTF-8"}
    env["PATH"] = os.pathsep.join(dict.fromkeys([*env.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"]))
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    log_fd, log_name = tempfile.mkstemp(prefix="levers9-mmdebstrap-", suffix=".log")
    log_path = Path(log_name)
    started = time.monotonic()
    log.info("building the Debian %s base (Python %s) from %s into %s", suite, python_version, archive, dest)
    try:
        digest, size = _run(argv, env, partial, (log_fd, log_path), epoch)
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        os.close(log_fd)
        log_path.unlink(missing_ok=True)
    log.info("built the Debian %s base in %.0f s: %d MiB, %s", suite, time.monotonic() - started, size >> 20, digest)
    return BaseLayer(
        path=dest,
        diff_id=digest,
        size=size,
        python_version=python_version,
        suite=suite,
        sources=tuple(lines),
        packages=includes,
        created=datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        architecture=_architecture(),
    )


def _run(argv: list[str], env: dict[str, str], out_path: Path, log: tuple[int, Path], epoch: int) -> tuple[str, int]:
    """Run mmdebstrap writing its tar (after an empty ``./dev``) to ``out_path``; answers its sha256 and size.

    ``log``: the descriptor its standard error goes to, and that file's path (quoted when it fails).
    """
    log_fd, log_path = log
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_fd, env=env, start_new_session=True
        )
    except OSError as exc:
        raise BaseImageError(f"mmdebstrap could not be started ({argv[0]}): {exc}; {INSTALL}") from None
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()  # mmdebstrap unmounts and removes its temporary root on SIGTERM

    watchdog = threading.Timer(BUILD_TIMEOUT_S, stop)
    watchdog.start()
    sha, size = hashlib.sha256(), 0
    try:
        assert proc.stdout is not None
        with open(out_path, "wb") as out, proc.stdout:
            chunk = _dev_entry(epoch)
            while chunk:
                out.write(chunk)
                sha.update(chunk)
                size += len(chunk)
                chunk = proc.stdout.read(1 << 20)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc = None
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if timed_out.is_set():
        raise BaseImageError(f"mmdebstrap did not finish within {BUILD_TIMEOUT_S:.0f} s; it wrote:\n{_tail(log_path)}")
    if rc != 0:
        raise BaseImageError(f"mmdebstrap failed with exit status {rc}; it wrote:\n{_tail(log_path)}")
    if size <= len(_dev_entry(epoch)):
        raise BaseImageError(f"mmdebstrap wrote no tar; it wrote:\n{_tail(log_path)}")
    return f"sha256:{sha.hexdigest()}", size


# ------------------------------------------------------------------ the cache


def _recipe_key(suite: str, archive: str, security: str | None, includes: Sequence[str]) -> str:
    recipe = {
        "recipe": RECIPE_VERSION,
        "suite": suite,
        "mirror": archive,
        "security": security,
        "includes": list(includes),
        "architecture": _architecture(),
        # mmdebstrap's options: editing one builds anew without anyone remembering RECIPE_VERSION
        "options": _options(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _cached(entry: Path) -> BaseLayer | None:
    try:
        layer = BaseLayer.from_json((entry / "base.json").read_text(), entry / "layer.tar")
        return layer if (entry / "layer.tar").stat().st_size == layer.size else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def base_image(
    python_version: str, cache_dir: Path, *, mirror: str | None = None, packages: Sequence[str] = ()
) -> BaseLayer:
    """The base of ``python_version`` from ``cache_dir``, built there first if no caller has built it yet.

    Concurrent callers (threads or processes) of the same recipe wait for one build and share it. A cached base
    is answered without asking the mirror anything.
    """
    archive = _mirror(mirror)
    includes = _packages(packages)
    version = check_python_version("python_version", python_version)
    suite = SUITES.get(version) or suite_for(version, archive)  # suite_for raises, listing what the mirror has
    name = f"{suite}-{_recipe_key(suite, archive, _security_for(archive), includes)[:24]}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    entry = cache_dir / name
    found = _cached(entry)
    if found is not None:
        return found
    with _locked(cache_dir / f".{name}.lock"):
        found = _cached(entry)
        if found is not None:
            return found
        for stale in cache_dir.glob(f".{name}.*.build"):
            shutil.rmtree(stale, ignore_errors=True)  # a build killed half way (we hold the lock: nobody else's)
        if entry.exists():
            shutil.rmtree(entry)  # half of one, or one of an older format
        scratch = cache_dir / f".{name}.{os.getpid()}.build"
        scratch.mkdir()
        try:
            built = build_base(version, scratch / "layer.tar", mirror=archive, packages=packages)
            (scratch / "base.json").write_text(dataclasses.replace(built, path=Path("layer.tar")).to_json())
            os.rename(scratch, entry)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return dataclasses.replace(built, path=entry / "layer.tar")
