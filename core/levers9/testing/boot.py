"""An emulated boot: run a machine's user data on this host, the way a cloud's first boot would, and no further.

The contract kit's boot check hands :func:`emulated_boot` the user data a
provider passed to a machine. It understands the two forms levers9's
bootstrap (:mod:`levers9.bootstrap`) writes:

* a script starting with ``#!``: written out and run as it is;
* ``#cloud-config``: the subset levers9 uses, ``write_files`` (``path``,
  ``content``, ``permissions``, ``encoding`` text or ``b64``, ``append``;
  ``owner`` and ``defer`` are accepted and ignored) and ``runcmd`` (strings
  are shell lines, lists are argument vectors), run in that order as
  cloud-init does. Any other key is refused with :class:`BootError`, so a
  provider's user data cannot pass by relying on something never run.
  Files land under ``root``; a ``runcmd`` argument (or a word of a shell
  line) that is exactly the path of a file ``write_files`` wrote is replaced
  by that file's place under ``root``, as ``/`` would have held it.

The boot happens under a temporary root instead of ``/``: files land under
``root``, and the commands run with ``LEVERS9_BOOT_ROOT=<root>`` and
``HOME=<root>`` (the bootstrap puts every path it writes under
``${LEVERS9_BOOT_ROOT:-}``), a clean environment (nothing of the caller's but
a ``PATH`` whose first entry is this interpreter's ``bin`` directory, so the
``levers9`` of this very version is the one found and nothing is installed),
in a session and process group of their own, with output in
``<root>/boot.log``.

GPUs: a machine with GPUs is given ``gpus``, the lines its ``nvidia-smi
--query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits``
would print (recorded from a real machine of that type); an ``nvidia-smi``
that prints them is put at ``<root>/usr/bin/nvidia-smi``, on the boot's
``PATH`` after the interpreter's directory, so the worker's GPU discovery
finds the machine's GPUs as on the real machine. Without ``gpus`` the boot
has no ``nvidia-smi`` of its own (whatever the host's ``PATH`` holds is not
on the boot's).

Network: when running as root with ``unshare``, ``nsenter`` and ``ip``
available, the boot runs in a network namespace of its own in which only
loopback exists; each port of ``ports`` on the host's ``127.0.0.1`` (the
stand-in controlplane's) is forwarded into it, at the same address, by a
listener the kit creates inside the namespace. Elsewhere (not root, no
``unshare``) the boot runs in its own process group with the host's network,
and :attr:`EmulatedBoot.isolation` says so. Neither form stops a script that
ignores ``LEVERS9_BOOT_ROOT`` from writing outside ``root``: there is no
mount namespace.

Failing fast: :meth:`EmulatedBoot.failure` says why the boot failed the
moment its user data's command ends with a status other than 0 (the
bootstrap could not start a worker, or the worker exited on an error), naming
the renderer the user data came from (:func:`renderer_of`:
``levers9.bootstrap.cloud_init``, ``shell_script``, or text levers9 did not
render), so a caller waiting for the worker says why at once instead of
waiting out its timeout.

Invariants: :meth:`EmulatedBoot.stop` leaves nothing behind: it sends SIGTERM
to the process group and to every process started with this boot's
``LEVERS9_BOOT_ROOT`` (a script that ``setsid``\\ s its worker away from the
group is still found), SIGKILL to what is left after ``grace`` seconds; then, killed or not (the
SIGTERM reaches the containers' processes too, as a VM's shutdown does, so a
worker that exits in time may still leave some), removes what the worker left
of its containers on this shared kernel (``levers9 worker --cleanup`` on the boot's worker state
directory, :data:`levers9.bootstrap.STATE_DIR`: a terminated VM takes them
with it); closes the forwarders, ends the namespace and removes ``root``. A :class:`BootError`
means the user data is not something a first boot could run; a process that
runs and fails is not an error here (the kit sees it as no registration, and
shows ``boot.log``).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from levers9.bootstrap import STATE_DIR

__all__ = ["BootError", "EmulatedBoot", "emulated_boot", "install_nvidia_smi", "renderer_of"]

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
#: the cloud-config keys the emulation runs; anything else is refused
CLOUD_CONFIG_KEYS = frozenset({"write_files", "runcmd"})
_WRITE_FILE_KEYS = frozenset({"path", "content", "permissions", "encoding", "append", "owner", "defer"})
_STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BootError(ValueError):
    """The user data cannot be run by a first boot (an unknown format, a cloud-config key not emulated)."""


# --------------------------------------------------------------------------- user data → a command under root


def _write_files(root: Path, entries: Any) -> dict[str, str]:
    """Write the files under ``root``; their paths as written, mapped to where they are now."""
    written: dict[str, str] = {}
    if not isinstance(entries, list):
        raise BootError(f"cloud-config write_files must be a list of files, got {type(entries).__name__}")
    for position, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise BootError(f"cloud-config write_files entry {position} needs a 'path' (got {entry!r})")
        unknown = sorted(set(entry) - _WRITE_FILE_KEYS)
        if unknown:
            raise BootError(
                f"cloud-config write_files entry {position} ({entry['path']}) has {', '.join(unknown)}; "
                f"the emulated boot knows {', '.join(sorted(_WRITE_FILE_KEYS))}"
            )
        content = entry.get("content", "")
        encoding = entry.get("encoding", "text/plain")
        if encoding in ("b64", "base64"):
            data = base64.b64decode(content)
        elif encoding in ("text/plain", None):
            data = str(content).encode()
        else:
            raise BootError(f"cloud-config write_files {entry['path']}: encoding {encoding!r}; use text or b64")
        target = root / entry["path"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab" if entry.get("append") else "wb") as out:
            out.write(data)
        target.chmod(int(str(entry.get("permissions", "0644")), 8))
        written[entry["path"]] = str(target)
    return written


def _runcmd_script(commands: Any, written: dict[str, str]) -> str:
    if not isinstance(commands, list):
        raise BootError(f"cloud-config runcmd must be a list of commands, got {type(commands).__name__}")
    lines = ["#!/bin/sh"]
    for command in commands:
        if isinstance(command, str):
            lines.append(" ".join(shlex.quote(written[w]) if w in written else w for w in command.split(" ")))
        elif isinstance(command, list) and all(isinstance(part, str) for part in command):
            lines.append(shlex.join([written.get(str(part), str(part)) for part in command]))
        else:
            raise BootError(f"cloud-config runcmd entry {command!r} is neither a shell line nor a list of strings")
    return "\n".join(lines) + "\n"


#: the first lines of what levers9.bootstrap.shell_script renders (and cloud_init embeds as its script)
_BOOTSTRAP_HEADER = "#!/bin/sh\n# levers9 worker bootstrap: "


def renderer_of(user_data: str) -> str:
    """Which renderer the user data came from, in words: ``levers9.bootstrap.cloud_init`` or ``shell_script``
    when it is their text, else what it is (a boot failure names it, so the reader knows which text failed)."""
    if user_data.startswith(_BOOTSTRAP_HEADER):
        return "levers9.bootstrap.shell_script"
    if user_data.startswith("#cloud-config"):
        with contextlib.suppress(yaml.YAMLError):
            config = yaml.safe_load(user_data)
            files = config.get("write_files") if isinstance(config, dict) else None
            scripts = (
                [str(f.get("content", "")) for f in files if isinstance(f, dict)] if isinstance(files, list) else []
            )
            if any(script.startswith(_BOOTSTRAP_HEADER) for script in scripts):
                return "levers9.bootstrap.cloud_init"
        return "a #cloud-config not rendered by levers9.bootstrap"
    if user_data.startswith("#!"):
        return "a '#!' script not rendered by levers9.bootstrap"
    return "user data of no form a boot runs"


def prepare(user_data: str, root: Path) -> list[str]:
    """Lay the user data out under ``root`` as a first boot would; the command that runs it."""
    scripts = root / "var" / "lib" / "cloud" / "instance" / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    if user_data.startswith("#!"):
        script = scripts / "user-data"
        script.write_text(user_data)
        script.chmod(0o755)
        return [str(script)]
    if user_data.startswith("#cloud-config"):
        try:
            config = yaml.safe_load(user_data)
        except yaml.YAMLError as exc:
            raise BootError(f"the #cloud-config user data is not YAML: {exc}") from None
        if not isinstance(config, dict):
            raise BootError("the #cloud-config user data must be a mapping of cloud-config keys")
        unknown = sorted(set(config) - CLOUD_CONFIG_KEYS)
        if unknown:
            raise BootError(
                f"the #cloud-config user data uses {', '.join(unknown)}; the emulated boot runs only "
                f"{', '.join(sorted(CLOUD_CONFIG_KEYS))} (what levers9.bootstrap.cloud_init writes)"
            )
        written = _write_files(root, config.get("write_files", []))
        runcmd = scripts / "runcmd"
        runcmd.write_text(_runcmd_script(config.get("runcmd", []), written))
        runcmd.chmod(0o755)
        return ["/bin/sh", str(runcmd)]
    first = user_data.splitlines()[0][:40] if user_data else "(empty)"
    raise BootError(
        f"user data starting {first!r} is neither a '#!' script nor '#cloud-config'; "
        "pass levers9.bootstrap.cloud_init(request.bootstrap) or shell_script(request.bootstrap)"
    )


def install_nvidia_smi(root: Path, gpus: str) -> Path:
    """An ``nvidia-smi`` at ``root/usr/bin`` (returned) that prints ``gpus`` (:func:`levers9.testing.nvidia_smi`'s
    lines) for the query GPU discovery makes, and fails otherwise; put its directory first on a PATH."""
    table = root / "usr" / "share" / "levers9-boot" / "gpus.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(gpus if gpus.endswith("\n") else gpus + "\n")
    tool = root / "usr" / "bin" / "nvidia-smi"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text(
        "#!/bin/sh\n"
        "# the emulated machine's GPUs, as its real nvidia-smi printed them\n"
        'case "$*" in\n'
        f"  *--query-gpu=*) exec cat {shlex.quote(str(table))} ;;\n"
        "esac\n"
        'echo "emulated nvidia-smi: only --query-gpu is recorded" >&2\n'
        "exit 2\n"
    )
    tool.chmod(0o755)
    return tool


def boot_environment(root: Path) -> dict[str, str]:
    """The clean environment a boot starts with: the boot root, and this installation's ``levers9`` first."""
    return {
        "PATH": f"{Path(sys.executable).parent}:{root / 'usr' / 'bin'}:{_STANDARD_PATH}",
        "HOME": str(root),
        "LEVERS9_BOOT_ROOT": str(root),
        "LANG": "C.UTF-8",
        "TMPDIR": str(root / "tmp"),
    }


# --------------------------------------------------------------------------- network namespace and forwarding


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns({path}): {os.strerror(error)}")
    finally:
        os.close(fd)


def _listen_inside(netns: str, port: int) -> socket.socket:
    """A listener on ``127.0.0.1:port`` inside the namespace: a thread enters it, opens the socket and ends."""
    result: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            _setns(netns)  # this thread only; it ends right after, the socket stays in the namespace
            # IPPROTO_TCP named, so asyncio sets TCP_NODELAY on the connections it accepts
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(64)
            result.append(listener)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=enter, name="levers9-boot-netns")
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


class _Forwarder:
    """Connections to ``127.0.0.1:port`` inside the namespace, carried to ``127.0.0.1:port`` of the host."""

    def __init__(self, netns: str, port: int) -> None:
        self.port = port
        self.listener = _listen_inside(netns, port)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"levers9-boot-forward-{port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                outside = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                outside.settimeout(None)
            except OSError:
                inside.close()
                continue
            with self._lock:
                self._open.update((inside, outside))
            for source, sink in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._open.clear()


def _namespace_holder() -> tuple[subprocess.Popen[bytes], str]:
    """A process holding a new network namespace with loopback up; its ``/proc/<pid>/ns/net`` path."""
    own = os.readlink("/proc/self/ns/net")
    holder = subprocess.Popen(
        ["unshare", "--net", "--", "sleep", "infinity"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    path = f"/proc/{holder.pid}/ns/net"
    deadline = time.monotonic() + 10
    try:
        while True:
            if holder.poll() is not None:
                error = holder.stderr.read().decode(errors="replace").strip() if holder.stderr else ""
                raise OSError(f"unshare --net failed: {error or f'exit {holder.returncode}'}")
            with contextlib.suppress(OSError):
                if os.readlink(path) != own:
                    break
            if time.monotonic() > deadline:
                raise OSError("unshare --net did not enter a new network namespace within 10 s")
            time.sleep(0.01)
        subprocess.run(
            ["nsenter", f"--net={path}", "--", "ip", "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
            timeout=10,
        )
    except BaseException:
        holder.kill()
        holder.wait()
        raise
    return holder, path


# --------------------------------------------------------------------------- the boot


class EmulatedBoot:
    """A running emulated boot; :meth:`stop` ends it and removes its root."""

    def __init__(
        self,
        root: Path,
        command: list[str],
        ports: Sequence[int],
        isolate: bool | None,
        gpus: str | None = None,
        environment: Mapping[str, str] | None = None,
        renderer: str = "",
    ) -> None:
        self.root = root
        self.log_path = root / "boot.log"
        #: where the user data came from (:func:`renderer_of`), for messages about this boot
        self.renderer = renderer
        self._holder: subprocess.Popen[bytes] | None = None
        self._netns: str | None = None
        self._forwarders: list[_Forwarder] = []
        #: how the boot is kept apart: ``network namespace (loopback only)`` or ``process group only: <why>``
        self.isolation = self._isolate(ports, isolate)
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        if gpus is not None:
            install_nvidia_smi(root, gpus)
        prefix: list[str] = ["nsenter", f"--net={self._netns}", "--"] if self._netns else []
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                prefix + command,
                cwd=root,
                env={**(environment or {}), **boot_environment(root)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _isolate(self, ports: Sequence[int], isolate: bool | None) -> str:
        missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
        why = "not running as root" if os.geteuid() != 0 else f"{', '.join(missing)} not found" if missing else None
        if isolate is False or (why is not None and isolate is None):
            return f"process group only: {why or 'isolation turned off'}"
        if why is not None:
            raise OSError(f"network isolation asked for, but {why}")
        try:
            self._holder, self._netns = _namespace_holder()
            self._forwarders = [_Forwarder(self._netns, port) for port in ports]
        except (OSError, subprocess.SubprocessError) as exc:
            self._end_namespace()
            if isolate:
                raise
            return f"process group only: no network namespace ({exc})"
        return "network namespace (loopback only, the controlplane's port forwarded)"

    # ------------------------------------------------------------------ looking at it

    def _marker(self) -> bytes:
        return f"LEVERS9_BOOT_ROOT={self.root}\0".encode()

    def pids(self) -> list[int]:
        """Live processes of this boot: its process group, and anything started with its boot root."""
        found: list[int] = []
        marker = self._marker()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
                if stat[0] in (b"Z", b"X"):
                    continue
                if int(stat[2]) == self.process.pid or marker in Path(f"/proc/{pid}/environ").read_bytes():
                    found.append(pid)
            except (OSError, IndexError, ValueError):
                continue
        return found

    def alive(self) -> bool:
        self.process.poll()  # reap the first process, so a finished boot shows as finished
        return bool(self.pids())

    def failure(self) -> str | None:
        """Why the boot failed, once its user data's command ended with a status other than 0 (a bootstrap that
        could not start its worker, or a worker that exited on an error); None while it runs or after a clean end.

        It is read the moment the command ends, so a caller waiting for a worker need not wait out its timeout.
        """
        status = self.process.poll()
        if status is None or status == 0:
            return None
        ended = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return f"the boot of {self.renderer or 'its user data'} {ended}"

    def output(self, limit: int = 4000) -> str:
        """The tail of what the boot printed, and of each log it wrote under ``<root>/var/log``."""
        logs = [self.log_path, *sorted((self.root / "var" / "log").glob("*.log"))]
        parts: list[str] = []
        for path in logs:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if data.strip():
                parts.append(f"--- {path.relative_to(self.root)}\n{data[-limit:].decode(errors='replace')}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ ending it

    def _signal(self, pids: Iterable[int], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM everything of this boot, SIGKILL what is left after ``grace``, end the namespace, remove root."""
        try:
            self._signal(self.pids(), signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(50):
                left = self.pids()
                if not left:
                    break
                self._signal(left, signal.SIGKILL)
                time.sleep(0.02)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            # whether its worker was killed or exited in time: a worker that exits on SIGTERM while the same
            # SIGTERM ends its containers' processes (a VM's shutdown signals everything) may leave their mounts,
            # cgroups and namespaces, which a real VM's end takes with it
            self._remove_worker_leftovers()
        finally:
            self._end_namespace()
            shutil.rmtree(self.root, ignore_errors=True)

    def _remove_worker_leftovers(self) -> None:
        """What the boot's worker left on this shared kernel (its containers' processes, mounts,
        cgroups, network namespaces and address records), removed as a terminated VM takes them with it:
        ``levers9 worker --cleanup`` on the boot's worker state directory."""
        state = self.root / STATE_DIR.lstrip("/")
        if not state.is_dir():
            return
        env = {**os.environ, "LEVERS9_WORKER_STATE_DIR": str(state)}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "levers9", "worker", "--cleanup"],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except subprocess.TimeoutExpired:
            log.warning("removing what the killed worker of %s left took over 120 s", self.root)
            return
        if done.returncode != 0:
            log.warning("removing what the killed worker of %s left failed: %s", self.root, done.stderr[-2000:])

    def _end_namespace(self) -> None:
        for forwarder in self._forwarders:
            forwarder.close()
        self._forwarders = []
        if self._holder is not None:
            self._holder.kill()
            self._holder.wait()
            if self._holder.stderr is not None:
                self._holder.stderr.close()
            self._holder = None

    def __enter__(self) -> EmulatedBoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def emulated_boot(
    user_data: str,
    root: Path | str,
    *,
    ports: Sequence[int] = (),
    isolate: bool | None = None,
    gpus: str | None = None,
    environment: Mapping[str, str] | None = None,
) -> EmulatedBoot:
    """Boot ``user_data`` under ``root`` (see the module docstring); ``ports``: host loopback ports it may reach.

    ``environment``: what the machine's platform gives every process beside the clean environment (a fake
    cloud's metadata service, say ``AWS_EC2_METADATA_SERVICE_ENDPOINT``; its port must be among ``ports``).

    ``isolate``: None isolates the network where this host allows it, True insists (raises OSError where it
    cannot), False runs in a process group only. ``gpus``: the machine's GPUs as ``nvidia-smi --query-gpu``
    CSV lines (None: a machine without GPUs). Raises :class:`BootError` for user data a boot cannot run.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    command = prepare(user_data, root)
    return EmulatedBoot(root, command, ports, isolate, gpus, environment, renderer_of(user_data))
