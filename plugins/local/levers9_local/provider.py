"""The local provider's state: one record file per worker, and the hooks' logic on top of it.

Layout, under the pool's ``state_dir`` (default ``$XDG_STATE_HOME/levers9/local``)::

    .lock                       flock taken while records are created or removed and GPUs counted
    <pool>/<machine_id>.json    the record: pid, start time, boot id, GPUs, command, created_at
    <pool>/<machine_id>.log     the worker's stdout and stderr, appended

The records are the only memory the provider has, and they live on disk so that
a controlplane started after a crash (``levers9 up`` killed with SIGKILL, say)
finds the workers the previous one started. A record whose process is gone is
listed as ``failed``, with the last line of its log as the reason, until
``levers9_terminate`` (which the reconciler calls for a failed machine) deletes
it; its log is kept for :data:`LOG_RETENTION_S` after its last write, so a
worker that crashed can still be read about, and is then removed by a listing.
Directories are created 0700 and files 0600. The machine's join token is in
neither: it waits for the worker in ``<machine_id>.token`` (0600), which the
worker deletes once read.

GPUs are a property of the host, not of a pool, so which GPUs are taken is
counted over the records of every pool that shares the state directory (all of
them, unless pools set different ``state_dir`` values, which would let them hand
out the same GPU twice).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from levers9.bootstrap import worker_environment
from levers9.engine.rootfs import mounts_under
from levers9.files import write_atomic
from levers9.hooks.context import PluginContext
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest
from levers9.hooks.markers import hookimpl
from levers9.hooks.provider import ProviderPlugin
from levers9.hooks.spec import SPEC_VERSION
from levers9.hooks.types import (
    GpuDevice,
    GpuOffer,
    Machine,
    MachineState,
    Pool,
    ProviderCheck,
    ProvisionRequest,
    settings_of,
)
from levers9.token_file import TOKEN_FILE_ENV, write_token_file
from levers9.worker_variables import BOOTSTRAP_FIELD_VARIABLES, WORKER_VARIABLES
from levers9_local.gpus import CachedDiscovery, Discover, eligible, not_started, offer
from levers9_local.processes import (
    LaunchError,
    WorkerProcess,
    is_running,
    launch,
    read_stat,
    session_members,
    stop_session,
)
from levers9_local.settings import LocalSettings

__all__ = ["DISCONNECT_EXIT_S", "LOG_RETENTION_S", "LocalProvider", "Record", "default_state_dir"]

log = logging.getLogger(__name__)

#: seconds a worker goes on without its controlplane before exiting (LEVERS9_DISCONNECT_EXIT_S), so a
#: killed ``levers9 up`` that is not restarted leaves nothing running for long
DISCONNECT_EXIT_S = 120
#: how long the log of a worker that no longer has a record is kept
LOG_RETENTION_S = 7 * 24 * 3600.0

# Machine ids and pool names become file names: nothing that could climb out of the directory.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/levers9/local``, or ``~/.local/state/levers9/local`` (the XDG default)."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "levers9" / "local"


class Record(BaseModel):
    """What is kept on disk about one worker; enough to recognise, report and stop it from any process."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    machine_id: str
    pool: str
    pid: int
    #: equal to pid: the worker leads its own session and process group
    pgid: int
    #: /proc/<pid>/stat field 22, clock ticks after boot
    start_time: int
    boot_id: str
    created_at: datetime
    gpu: str | None = None
    gpu_indices: list[int] = []
    region: str | None = None
    command: list[str]
    log: str

    @property
    def process(self) -> WorkerProcess:
        return WorkerProcess(pid=self.pid, start_time=self.start_time, boot_id=self.boot_id)


def _check_name(what: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise InvalidRequest(f"{what} {value!r} cannot name a file: use letters, digits, '_', '.' and '-'")
    return value


class LocalProvider(ProviderPlugin):
    """The ``local`` provider: the plugin object, its methods the hooks (the package's ``plugin`` is one).

    It holds no state of its own besides the GPU discovery cache: every answer
    is read from the record files, so any number of instances, in any number
    of processes, agree. GPUs are found through the plugin manager
    (``PluginContext.gpu_devices``, from ``levers9_startup``); ``discover``
    replaces that (tests, or a host whose GPUs another tool knows). Until it
    is started, a provider without ``discover`` has no way to list GPUs, and
    says so where a GPU pool needs them.
    """

    LEVERS9_SPEC_VERSION = SPEC_VERSION
    settings_model = LocalSettings

    def __init__(self, discover: Discover | None = None) -> None:
        super().__init__()
        self._given = discover
        self._discover: Discover = discover or not_started

    # ------------------------------------------------------------------ hooks

    @hookimpl
    def levers9_startup(self, ctx: PluginContext) -> None:
        """Take GPU discovery from the facade, with a fresh memory, unless ``discover`` was given."""
        super().levers9_startup(ctx)
        if self._given is None:
            self._discover = CachedDiscovery(ctx.gpu_devices)

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if pool.gpu is None:
            return []
        settings = settings_of(pool, LocalSettings)
        devices = eligible(self._discover(), settings.visible_gpus, pool.gpu)
        held = self._held_gpus(self._root(settings))
        free = sum(1 for device in devices if device.index not in held)
        found = offer(pool.gpu, max(pool.gpu_count, 1), devices, free, pool.region)
        return [] if found is None else [found]

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        pool = request.pool
        settings = settings_of(pool, LocalSettings)
        machine_id = _check_name("machine id", request.machine_id)
        root = self._root(settings)
        pool_dir = self._pool_dir(root, pool.name, create=True)
        wanted = request.resources.gpu_count
        devices = self._devices_for(settings, request.resources.gpu) if wanted else []
        with self._locked(root):
            existing = self._load(pool_dir / f"{machine_id}.json")
            if existing is not None:
                state = self._state(existing)
                if state is not None:
                    # A retried provision (the first call timed out in the core): one worker per machine id.
                    return self._machine(existing, state)
            live = self._live(root)
            gpus = self._assign(devices, wanted, live, request.resources.gpu) if wanted else []
            command = settings.worker_command or [sys.executable, "-m", "levers9", "worker"]
            log_path = pool_dir / f"{machine_id}.log"
            self._log_header(log_path, machine_id, pool.name, command)
            token_file = _token_file(pool_dir, machine_id)
            try:
                env = self._environment(request, gpus)
                env["LEVERS9_STOP_GRACE_S"] = str(settings.stop_grace_s)
                env["LEVERS9_WORKER_STATE_DIR"] = str(_worker_dir(pool_dir, machine_id))
                # The token goes in a file only the worker's user may read, which the worker deletes once read:
                # in its environment, the calls it runs could read it in /proc/<worker>/environ for its lifetime.
                write_token_file(token_file, request.bootstrap.token)
                env[TOKEN_FILE_ENV] = str(token_file)
                process = launch(command, env, log_path)
            except ValueError as exc:  # the bootstrap cannot be rendered (levers9.bootstrap says why)
                raise InvalidRequest(str(exc), code="bootstrap") from None
            except LaunchError as exc:
                token_file.unlink(missing_ok=True)
                if exc.transient:
                    raise InsufficientCapacity(
                        f"this host cannot start a worker now: {exc}", code="host-busy"
                    ) from None
                raise InvalidRequest(f"worker_command cannot be run: {exc}", code="worker-command") from None
            stat = read_stat(process.pid)
            record = Record(
                machine_id=machine_id,
                pool=pool.name,
                pid=process.pid,
                pgid=stat.pgrp if stat is not None else process.pid,
                start_time=process.start_time,
                boot_id=process.boot_id,
                created_at=datetime.now(UTC),
                gpu=request.resources.gpu if gpus else None,
                gpu_indices=[device.index for device in gpus],
                region=request.region or pool.region,
                command=list(command),
                log=str(log_path),
            )
            try:
                # whole or not at all (a crash leaves the old record or none), readable by its owner only
                write_atomic(pool_dir / f"{machine_id}.json", record.model_dump_json(indent=2), mode=0o600)
            except BaseException:
                # A worker without a record could never be listed, hence never terminated: stop it now.
                stop_session(process, 0)
                raise
        log.info("local worker %s of pool %r started as pid %d", machine_id, pool.name, process.pid)
        return self._machine(record, MachineState.RUNNING)

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        settings = settings_of(pool, LocalSettings)
        provider_id = machine.provider_id
        if not _NAME.fullmatch(provider_id):
            return  # no record can have that name: nothing of ours to stop
        path = self._pool_dir(self._root(settings), pool.name) / f"{provider_id}.json"
        record = self._load(path)
        if record is None or record.pool != pool.name:
            return
        # Not under the lock: stopping can take stop_grace_s, and provisioning must not wait for it.
        # The record stays until the whole session is gone, so its GPUs stay taken until then.
        if not stop_session(record.process, settings.stop_grace_s):
            log.warning(
                "local worker %s (pid %d) survived SIGKILL; its record is kept and terminate will be retried",
                record.machine_id,
                record.pid,
            )
            return
        _remove_worker_leftovers(_worker_dir(path.parent, record.machine_id))
        _token_file(path.parent, record.machine_id).unlink(missing_ok=True)  # a worker that never read it
        with self._locked(self._root(settings)):
            path.unlink(missing_ok=True)
        log.info("local worker %s of pool %r (pid %d) stopped", record.machine_id, pool.name, record.pid)

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        root = self._root(settings_of(pool, LocalSettings))
        pool_dir = self._pool_dir(root, pool.name)
        if not pool_dir.is_dir():
            return []
        machines: list[Machine] = []
        dead: list[str] = []
        with self._locked(root):
            for _, record in self._records(pool_dir):
                if record.pool != pool.name:
                    continue
                state = self._state(record)
                if state is None:
                    # The worker died by itself (or never started): failed, in its log's words, until terminated.
                    dead.append(record.machine_id)
                    machines.append(self._machine(record, MachineState.FAILED, reason=_last_line(Path(record.log))))
                else:
                    machines.append(self._machine(record, state))
            self._prune_logs(pool_dir)
        for machine_id in dead:  # a worker that died by itself may have left its containers running
            _remove_worker_leftovers(_worker_dir(pool_dir, machine_id))
            _token_file(pool_dir, machine_id).unlink(missing_ok=True)
        return machines

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        """Whether this host can start the pool's workers: state directory, worker command, GPUs."""
        settings = settings_of(pool, LocalSettings)
        root = self._root(settings)
        # Pools sharing a state_dir are checked at once, in threads of one process: each probe has its own
        # name (pid, pool, random suffix) and is created with O_EXCL, so no check removes another's file.
        probe = root / f".check-{os.getpid()}-{pool.name}-{secrets.token_hex(6)}"
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as exc:
            return ProviderCheck(
                ok=False,
                message=f"state_dir {root} is not writable: {exc.strerror}",
                hint="set the pool's state_dir to a directory this user may write, or fix its permissions",
            )
        command = settings.worker_command or [sys.executable, "-m", "levers9", "worker"]
        program = command[0] if "/" in command[0] else shutil.which(command[0])
        if program is None or not os.access(program, os.X_OK) or not Path(program).is_file():
            return ProviderCheck(
                ok=False,
                message=f"worker_command cannot be run: {command[0]} is not an executable file"
                + ("" if "/" in command[0] else " on PATH"),
                hint="set worker_command to the command that starts `levers9 worker` here, or leave it out",
            )
        found = ""
        if pool.gpu is not None:
            try:
                devices = eligible(self._discover(), settings.visible_gpus, pool.gpu)
            except Exception as exc:
                return ProviderCheck(
                    ok=False,
                    message=f"cannot list this host's GPUs: {exc}",
                    hint="check that nvidia-smi runs (or set LEVERS9_NVIDIA_SMI)",
                )
            wanted = max(pool.gpu_count, 1)
            if len(devices) < wanted:
                return ProviderCheck(
                    ok=False,
                    message=f"this host has {len(devices)} usable {pool.gpu} GPU(s); a worker needs {wanted}",
                    hint="lower the pool's gpu_count, or change visible_gpus" if devices else None,
                )
            found = f"; {len(devices)} {pool.gpu} GPU(s) usable"
        return ProviderCheck(ok=True, message=f"state_dir {root} is writable; worker_command {program} runs{found}")

    # ------------------------------------------------------------------ records

    def _root(self, settings: LocalSettings) -> Path:
        root = settings.state_dir.expanduser() if settings.state_dir is not None else default_state_dir()
        return root.absolute()

    def _pool_dir(self, root: Path, pool: str, *, create: bool = False) -> Path:
        path = root / _check_name("pool name", pool)
        if create:
            try:
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
                path.mkdir(mode=0o700, exist_ok=True)
            except OSError as exc:
                raise InvalidRequest(f"state_dir {root} cannot be used: {exc.strerror}", code="state-dir") from None
        return path

    @contextlib.contextmanager
    def _locked(self, root: Path) -> Iterator[None]:
        """Exclusive use of the records under ``root``, against other threads and other processes alike.

        flock conflicts between separate opens even within one process, so
        each call opens the lock file itself.
        """
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load(self, path: Path) -> Record | None:
        try:
            return Record.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            # Left in place for an operator to look at; it is not counted as a worker.
            log.warning("ignoring unreadable local worker record %s: %s", path, exc)
            return None

    def _records(self, pool_dir: Path) -> Iterator[tuple[Path, Record]]:
        for path in sorted(pool_dir.glob("*.json")):
            record = self._load(path)
            if record is not None:
                yield path, record

    def _state(self, record: Record) -> MachineState | None:
        """RUNNING while the worker lives, STOPPING while only processes it started remain, None when gone."""
        if is_running(record.process):
            return MachineState.RUNNING
        if session_members(record.process):
            return MachineState.STOPPING
        return None

    def _live(self, root: Path) -> list[Record]:
        """Records of every pool under ``root`` with something still running (the others hold no GPU). Call locked.

        A dead worker's record stays: it is listed ``failed`` until terminated.
        """
        return [
            record
            for pool_dir in sorted(path for path in root.iterdir() if path.is_dir())
            for _, record in self._records(pool_dir)
            if self._state(record) is not None
        ]

    def _held_gpus(self, root: Path) -> set[int]:
        if not root.is_dir():
            return set()
        with self._locked(root):
            return {index for record in self._live(root) for index in record.gpu_indices}

    def _prune_logs(self, pool_dir: Path) -> None:
        cutoff = time.time() - LOG_RETENTION_S
        for path in pool_dir.glob("*.log"):
            if path.with_suffix(".json").exists():
                continue
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()

    @staticmethod
    def _log_header(path: Path, machine_id: str, pool: str, command: list[str]) -> None:
        # Logs are appended to: a line per start tells one run from the previous one with the same id.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "a") as file:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            file.write(f"--- {stamp} levers9 local: worker {machine_id} of pool {pool}: {shlex.join(command)}\n")

    @staticmethod
    def _machine(record: Record, state: MachineState, *, reason: str | None = None) -> Machine:
        return Machine(
            provider_id=record.machine_id,
            machine_id=record.machine_id,
            pool=record.pool,
            state=state,
            gpu=record.gpu,
            gpu_count=len(record.gpu_indices),
            region=record.region,
            created_at=record.created_at,
            labels={"pid": str(record.pid)},
            reason=reason,
        )

    # ------------------------------------------------------------------ GPUs and environment

    def _devices_for(self, settings: LocalSettings, gpu: str | None) -> list[GpuDevice]:
        try:
            found = self._discover()
        except Exception as exc:
            # The GPUs are there but unusable right now (driver not loaded, nvidia-smi hung): no capacity here.
            raise InsufficientCapacity(f"cannot list this host's GPUs: {exc}", code="gpu-discovery") from None
        return eligible(found, settings.visible_gpus, gpu)

    @staticmethod
    def _assign(devices: list[GpuDevice], wanted: int, live: list[Record], gpu: str | None) -> list[GpuDevice]:
        kind = gpu or "GPU"
        if len(devices) < wanted:
            raise InsufficientCapacity(
                f"this host has {len(devices)} usable {kind} GPU(s); {wanted} were asked for", code="too-few-gpus"
            )
        held = {index for record in live for index in record.gpu_indices}
        free = [device for device in devices if device.index not in held]
        if len(free) < wanted:
            raise InsufficientCapacity(
                f"{len(free)} of this host's {len(devices)} {kind} GPU(s) are free; {wanted} were asked for",
                code="gpus-taken",
            )
        return free[:wanted]

    @staticmethod
    def _environment(request: ProvisionRequest, gpus: list[GpuDevice]) -> dict[str, str]:
        """The worker's environment: the host's, the bootstrap's, and what only this host knows (its GPUs).

        Everything goes here and nothing on the command line, which any user
        can read in ``ps``. The token is not here either (see ``provision``).
        Of the controlplane's own ``LEVERS9_*`` variables only the host-wide
        worker ones are inherited (plugin policy, nvidia-smi, log level): its
        token, secret key or config are not the worker's business.
        """
        inherited = set(WORKER_VARIABLES) - set(BOOTSTRAP_FIELD_VARIABLES)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_") or k in inherited}
        env.update(worker_environment(request.bootstrap))
        env.setdefault("LEVERS9_CPU_MILLICORES", str(request.resources.cpu_millicores))
        env.setdefault("LEVERS9_MEMORY_MIB", str(request.resources.memory_mib))
        env.setdefault("LEVERS9_DISCONNECT_EXIT_S", str(DISCONNECT_EXIT_S))
        env["LEVERS9_GPU_COUNT"] = str(len(gpus))
        # Empty for a CPU worker, so it cannot use (or take) a GPU another worker was given.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(device.index) for device in gpus)
        # CUDA numbers GPUs fastest-first unless told otherwise; nvidia-smi's indices are PCI order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env


def _last_line(log_path: Path) -> str:
    """The last line a worker wrote to its log: why it stopped, most often."""
    try:
        with log_path.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in file.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return f"the worker exited: {lines[-1][-500:]}" if lines else "the worker exited without writing to its log"


def _token_file(pool_dir: Path, machine_id: str) -> Path:
    """Where a worker's token waits for it to start; the pool directory is 0700, the file 0600."""
    return pool_dir / f"{machine_id}.token"


def _worker_dir(pool_dir: Path, machine_id: str) -> Path:
    """Where the worker prepares its containers; the provider knows it, so it can clean up after a kill."""
    return pool_dir / f"{machine_id}.worker"


def _remove_worker_leftovers(worker_dir: Path) -> None:
    """Remove the containers of a worker that did not live to remove them itself (they run detached)."""
    if not worker_dir.exists():
        return
    env = dict(os.environ, LEVERS9_WORKER_STATE_DIR=str(worker_dir))
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
        log.warning("removing the containers left in %s took over 120 s", worker_dir)
        return
    if done.returncode != 0:
        log.warning("removing the containers left in %s failed: %s", worker_dir, done.stderr.strip()[-2000:])
    left = mounts_under(worker_dir)
    if left:  # a volume mount (every workspace's files) or a container's root: never delete through one
        log.error("keeping %s: still mounted below it: %s", worker_dir, ", ".join(map(str, left)))
        return
    shutil.rmtree(worker_dir, ignore_errors=True)
