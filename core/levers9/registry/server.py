"""The embedded registry: Debian's ``docker-registry`` (CNCF distribution) as a child process.

``levers9 up`` runs one beside its Redis so that build workers have somewhere
to push blueprint images and run workers somewhere to pull them from, with no
registry to set up. :class:`EmbeddedRegistry` writes a config under its data
directory (blobs and manifests in ``<data_dir>/storage``, deletes enabled, log
level warn, HTTP on ``host:port``, optional ``auth.htpasswd``), starts the
binary, and returns once ``GET /v2/`` answers. :mod:`levers9.registry.supervisor`
starts it again when it dies.

Invariants:

- It binds 127.0.0.1 unless told otherwise; with ``port=0`` a free port below
  the kernel's ephemeral range is picked (another one is tried when it is taken
  before the registry binds it) and kept: a restart reuses it, so refs that
  name the registry stay valid. A port that was asked for and is taken raises
  :class:`~levers9.registry.errors.RegistryError` saying so; nothing else is tried.
- The child dies with its parent (``setpriv --pdeathsig TERM``, as the embedded
  Redis does), so a controlplane killed with SIGKILL leaves no registry behind.
  :meth:`EmbeddedRegistry.stop` terminates it, waits, kills it if it must, and
  reaps it: no zombie.
- Its environment has no ``REGISTRY_*`` variables (distribution would let them
  override the config); its HTTP secret is kept in ``<data_dir>/http-secret``
  so an upload under way survives a restart.
- A missing binary, an unreadable htpasswd file, a child that exits or does
  not answer within the timeout raise ``RegistryError``, the last quoting the
  end of what the child wrote to ``<data_dir>/registry.log``.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from levers9 import ports
from levers9.files import write_atomic
from levers9.registry.errors import RegistryError

__all__ = ["INSTALL", "START_TIMEOUT_S", "EmbeddedRegistry"]

#: how to get the binary, named in every error about it
INSTALL = "apt-get install -y docker-registry"
#: how long a start may take before the child is killed and the start fails
START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_PORT_TRIES = 5


class EmbeddedRegistry:
    """One ``docker-registry`` child process serving ``data_dir`` (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        htpasswd: Path | None = None,
        binary: str | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"registry port {port} is not a TCP port; accepted: 0 (pick one) to 65535")
        self.data_dir = Path(data_dir)
        self.host = host
        #: the port it listens on (0 until the first start picked one)
        self.port = port
        self._fixed_port = port != 0
        self.htpasswd = htpasswd
        self._binary = binary
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "registry.log"
        self._log_from = 0

    @property
    def address(self) -> str:
        """``host:port``, the registry part of refs that name it (``127.0.0.1:5000/repo:tag``)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL a :class:`~levers9.registry.client.RegistryClient` takes."""
        return f"http://{self.address}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, *, timeout: float = START_TIMEOUT_S) -> None:
        """Start the registry and return once it answers; on the port it had before when it ran already."""
        if self.alive():
            raise self._failure(f"it already runs (pid {self.process.pid if self.process else '?'})")
        binary = self._binary or shutil.which("docker-registry")
        if binary is None or not os.access(binary, os.X_OK):
            raise self._failure(f"the docker-registry binary is not installed: {INSTALL}")
        if self.htpasswd is not None and not self.htpasswd.is_file():
            raise self._failure(f"its htpasswd file {self.htpasswd} does not exist (make one with `htpasswd -Bbn`)")
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.port and (self._fixed_port or self.process is not None):
            self._start_on(binary, self.port, timeout, may_move=False)  # asked for, or kept from the last start
            return
        for attempt in range(1, _PORT_TRIES + 1):
            port = _pick_port(self.host)
            try:
                self._start_on(binary, port, timeout, may_move=True)
                return
            except _PortTaken:
                if attempt == _PORT_TRIES:
                    raise self._failure(f"{_PORT_TRIES} free ports were each taken before it bound them") from None

    def restart(self, *, timeout: float = START_TIMEOUT_S) -> None:
        """Start it again on the same port once it has exited (and been reaped)."""
        if self.alive():
            raise self._failure("it still runs; it is not restarted")
        self.start(timeout=timeout)

    def stop(self) -> None:
        """Terminate it (kill it after 10 s) and reap it; nothing is left running. Stopping a stopped one is a no-op."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> EmbeddedRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ starting

    def _start_on(self, binary: str, port: int, timeout: float, *, may_move: bool) -> None:
        """Start on ``port``; :class:`_PortTaken` when it is taken and ``may_move`` (another may be picked)."""
        if not _bindable(self.host, port):
            if may_move:
                raise _PortTaken
            raise self._failure(f"port {port} on {self.host} is taken by another process; free it or choose another")
        self.port = port
        # one file per port: replicas sharing a data directory each run a registry, and one's config written
        # while the other's process is still reading its own sent both to the same port
        config = self.data_dir / f"config-{port}.yml"
        write_atomic(config, yaml.safe_dump(self._config(port), sort_keys=False), mode=0o600)
        environment = {key: value for key, value in os.environ.items() if not key.startswith("REGISTRY_")}
        command = [binary, "serve", str(config)]
        # util-linux's setpriv sets the death signal and execs the registry: no Python runs between fork and exec
        setpriv = shutil.which("setpriv")
        with open(self.log_path, "ab") as log:
            self._log_from = log.tell()
            self.process = subprocess.Popen(
                [setpriv, "--pdeathsig", "TERM", *command] if setpriv is not None else command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=environment,
                start_new_session=True,  # Ctrl-C reaches the controlplane, which stops the registry in its turn
            )
        self._wait_ready(timeout, may_move=may_move)

    def _wait_ready(self, timeout: float, *, may_move: bool) -> None:
        process = self.process
        assert process is not None
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0) as http:
            while True:
                if process.poll() is not None:
                    tail = self._log_tail()
                    if "address already in use" in tail:
                        if may_move:
                            raise _PortTaken
                        raise self._failure(f"port {self.port} on {self.host} is taken by another process; {tail}")
                    raise self._failure(f"it exited with status {process.returncode}; it wrote: {tail or '(nothing)'}")
                try:
                    if http.get(f"{self.url}/v2/").status_code in (200, 401):
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise self._failure(f"it did not answer within {timeout:g} s; it wrote: {self._log_tail()}")
                time.sleep(0.05)

    def _config(self, port: int) -> dict[str, object]:
        bind = f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
        config: dict[str, object] = {
            "version": 0.1,
            "log": {"level": "warn", "formatter": "text", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.data_dir / "storage")},
                "delete": {"enabled": True},
            },
            "http": {"addr": bind, "secret": self._secret(), "headers": {"X-Content-Type-Options": ["nosniff"]}},
        }
        if self.htpasswd is not None:
            config["auth"] = {"htpasswd": {"realm": "levers9", "path": str(self.htpasswd)}}
        return config

    def _secret(self) -> str:
        path = self.data_dir / "http-secret"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            secret = secrets.token_hex(32)
            write_atomic(path, secret, mode=0o600)
            return secret

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_from)
                return log.read().decode(errors="replace")[-1500:].strip()
        except OSError:
            return ""

    def _failure(self, why: str) -> RegistryError:
        return RegistryError(
            why,
            registry=self.address if self.port else f"{self.host} (embedded)",
            operation="start the embedded registry",
        )


class _PortTaken(Exception):
    """A picked port was taken before the registry bound it: pick another."""


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listener does: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _pick_port(host: str) -> int:
    """A port free a moment ago, in the range levers9's servers pick from (:mod:`levers9.ports`)."""
    candidates = ports.picked_range()
    for _ in range(200):
        port = random.choice(candidates)
        if _bindable(host, port):
            return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:  # the kernel's pick, as a last resort
        probe.bind((host, 0))
        picked: int = probe.getsockname()[1]
        return picked
