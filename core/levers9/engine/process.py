"""The process runtime's engine: a container's command as a plain host process, supervised like the others.

It keeps the same records and shim as the OCI engine, so the worker treats
it the same way (state, logs, kill, remove, exit codes), but there is no
boundary: the command sees the host's filesystem, network and users. What
cannot be honoured without isolation (another image, mounts, another user, a
private network) is refused with a reason instead of being silently ignored.

One thing it does keep: when the engine is given a :class:`RunAs` (the
process runtime gives ``nobody`` to a worker running as root), commands run
as that user, never as root, so they cannot read the worker's state, its
records or other calls' files, nor signal or trace the worker. Such a
command gets a private home directory of its own (``$HOME``, mode 0700,
removed with the container) and a copy there of its handler file, which the
worker keeps where only root may read. The switch is done by
:mod:`levers9.engine.as_user` between the shim and the command, so the
command keeps the shim's pid, process group and output descriptors.

It fails closed: a command the user cannot reach (its program or workdir
below a directory only root may enter, such as an interpreter under
``/root``), or any command of an engine with no :class:`RunAs` (a worker that
is not root), is refused at prepare with the reason and the fix. Only an
engine built with ``as_worker`` (the operator's opt-in for a single-user
machine) runs such a command as the worker's own user, with a warning naming
the path the first time.

The environment of a command is its spec's ``env`` plus ``PATH`` and
``HOME``: never the worker's own, which may hold what the worker must keep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.engine import shim
from levers9.engine.oci import START_TIMEOUT_S, ContainerRecords, _alive, _pid
from levers9.hooks.errors import InvalidRequest, Levers9Error
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, PreparedContainer

__all__ = ["AS_USER", "HANDLER_ENV", "ProcessEngine", "RunAs", "unreachable"]

log = logging.getLogger("levers9.runtime.process")
#: (what, path) pairs already warned about: commands that run as the worker because nobody cannot reach them
_warned: set[tuple[str, str]] = set()

#: the script that switches to the unprivileged user and execs the command
AS_USER = Path(__file__).resolve().with_name("as_user.py")
#: the runner's variable naming its handler file (levers9.runner.main.ENV_HANDLER): copied for the user
HANDLER_ENV = "LEVERS9_HANDLER_FILE"


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user commands run as."""

    uid: int
    gid: int
    name: str


def _allows(info: os.stat_result, run_as: RunAs, bits: int) -> bool:
    """Whether ``run_as`` (with no supplementary groups) has ``bits`` (of rwx as 4, 2, 1) on the file."""
    if info.st_uid == run_as.uid:
        granted = info.st_mode >> 6
    elif info.st_gid == run_as.gid:
        granted = info.st_mode >> 3
    else:
        granted = info.st_mode
    return granted & bits == bits


def unreachable(path: str, run_as: RunAs, *, bits: int) -> str | None:
    """The first directory on the way to ``path`` (or ``path`` itself) that ``run_as`` may not use, or None.

    ``bits`` is what the user needs on ``path`` itself (1: execute or enter, 4: read). The directories on
    the way to ``path`` as written and to what it resolves to are both looked at, as the kernel walks both
    (a link in a private directory is out of reach whatever it points to); ACLs are not looked at.
    """
    real = os.path.realpath(path)
    for walked in dict.fromkeys([os.path.abspath(path), real]):
        parts = Path(walked).parts
        for depth in range(1, len(parts)):
            parent = os.path.join(*parts[:depth])
            try:
                if not _allows(os.stat(parent), run_as, 1):
                    return parent
            except OSError:
                return parent
    try:
        return None if _allows(os.stat(real), run_as, bits) else real
    except OSError:
        return real


class ProcessEngine(ContainerRecords):
    name = "process"

    def __init__(self, state_dir: Path, *, run_as: RunAs | None = None, as_worker: bool = True, fix: str = "") -> None:
        super().__init__(state_dir)
        self.run_as = run_as
        #: a command that cannot run as ``run_as`` (or any, without one) runs as the worker: else it is refused
        self.as_worker = as_worker
        #: what the refusal tells the operator to do
        self.fix = fix

    def prepare(self, spec: ContainerSpec) -> PreparedContainer:
        problems = []
        if spec.image != "host":
            problems.append(f"image {spec.image!r} (it runs on the host's own filesystem: use image 'host')")
        if spec.mounts:
            problems.append("mounts (there is no container filesystem to mount into)")
        if spec.user not in (None, "", "root", "0") and os.geteuid() == 0:
            who = f"as {self.run_as.name} (uid {self.run_as.uid})" if self.run_as else "as the worker's own user"
            problems.append(f"user {spec.user!r} (it runs {who})")
        if spec.network == "none":
            problems.append("network 'none' (it shares the host's network)")
        if problems:
            raise InvalidRequest("the process runtime cannot honour: " + "; ".join(problems))
        if not os.path.isdir(spec.workdir):
            raise InvalidRequest(f"workdir {spec.workdir!r} does not exist on this host")
        run_as = self._user_for(spec)  # before anything is made: a refused call leaves nothing
        if run_as is not None:
            _sweep_once(run_as)  # once per process: what a killed worker left behind
        cdir = self._dir(spec.container_id)
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / shim.LOG_FILE).touch()
        forwards = [{"port": p, "host_port": p, "pid": 0} for p in spec.ports]
        meta: dict[str, Any] = {"spec": spec.model_dump(mode="json"), "forwards": forwards}
        if run_as is not None:
            # Recorded before it exists, so that remove() finds it even if what follows fails half way.
            home = tempfile.mkdtemp(prefix=f"levers9-{spec.container_id}-", dir=_shared_tmp())
            meta.update(user={"uid": run_as.uid, "gid": run_as.gid, "name": run_as.name}, home=home)
            self._write_meta(spec.container_id, meta)
            spec = self._give_home(spec, run_as, home)
            meta["spec"] = spec.model_dump(mode="json")
        self._write_meta(spec.container_id, meta)
        return PreparedContainer(container_id=spec.container_id, runtime=self.name, spec=spec)

    def _user_for(self, spec: ContainerSpec) -> RunAs | None:
        """Who runs ``spec``'s command: the unprivileged user when it can reach the command; else the worker
        (``as_worker``) or nobody: InvalidRequest, naming the path and the fix."""
        run_as = self.run_as
        if run_as is None:
            if self.as_worker:
                return None
            raise InvalidRequest(
                f"the process runtime runs no call as the worker's own user (uid {os.geteuid()}, not root, so it "
                f"cannot switch to another); {self.fix or 'run the worker as root'}"
            )
        path = spec.env.get("PATH", os.environ.get("PATH", os.defpath))
        program = shutil.which(spec.command[0], path=path) or spec.command[0]
        for what, target, bits in (("the program", program, 1), ("the workdir", spec.workdir, 1)):
            blocked = unreachable(target, run_as, bits=bits)
            if blocked is None:
                continue
            if not self.as_worker:
                raise InvalidRequest(
                    f"{run_as.name} (uid {run_as.uid}) cannot reach {what} {target} (blocked at {blocked}), and the "
                    f"process runtime runs no call as the worker's own user; {self.fix or 'install it where every user may read it'}"
                )
            # a warning the first time, so that a pool of such calls does not flood the worker's log
            level = logging.DEBUG if (what, target) in _warned else logging.WARNING
            _warned.add((what, target))
            log.log(
                level,
                "%s runs as the worker's own user, not as %s (uid %d): %s cannot reach %s %s (blocked at %s); "
                "the pool allows it (allow_calls_as_worker_user), and such a call can read the worker's files",
                spec.container_id,
                run_as.name,
                run_as.uid,
                run_as.name,
                what,
                target,
                blocked,
            )
            return None
        return run_as

    @staticmethod
    def _give_home(spec: ContainerSpec, run_as: RunAs, home: str) -> ContainerSpec:
        """Hand ``home`` to the user, with a copy of the handler file if the user could not read the original."""
        os.chown(home, run_as.uid, run_as.gid)
        handler = spec.env.get(HANDLER_ENV)
        if not handler or not os.path.isfile(handler) or unreachable(handler, run_as, bits=4) is None:
            return spec
        copy = os.path.join(home, os.path.basename(handler))
        shutil.copyfile(handler, copy)
        os.chown(copy, run_as.uid, run_as.gid)
        os.chmod(copy, stat.S_IRUSR)
        return spec.model_copy(update={"env": {**spec.env, HANDLER_ENV: copy}})

    def start(self, container: PreparedContainer) -> ContainerState:
        spec = container.spec
        cdir = self._dir(spec.container_id)
        if not (cdir / "meta.json").exists():
            raise InvalidRequest(f"container {spec.container_id} was not prepared (or was removed)")
        if not (cdir / shim.PID_FILE).exists():
            meta = self._meta(spec.container_id) or {}
            user, home = meta.get("user"), meta.get("home")
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home or os.environ.get("HOME", "/")}
            if user:
                env.update(USER=user["name"], LOGNAME=user["name"], TMPDIR=home)
            env.update(spec.env)
            # The environment goes to the shim as its environment, which the command inherits: on the
            # command line, secrets and the runner's token would be readable by anyone through ps.
            if user:
                # -I -S: nothing the call chose (PYTHONPATH, PYTHONSTARTUP...) may run as root before the switch
                uid, gid = str(user["uid"]), str(user["gid"])
                action = [sys.executable, "-I", "-S", str(AS_USER), uid, gid, spec.workdir, "--", *spec.command]
            else:
                action = ["env", "-C", spec.workdir, *spec.command]
            argv = shim.command(
                runtime=[], action=action, container_id=spec.container_id, state_dir=cdir, cgroup="", delete=False
            )
            self._spawn(argv, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while (state := self.state(spec.container_id)).status is ContainerStatus.CREATED:
            if time.monotonic() > deadline:
                self.remove(spec.container_id)
                raise Levers9Error(f"process {spec.container_id} did not start within {START_TIMEOUT_S:g} s")
            time.sleep(0.01)
        return state

    def state(self, container_id: str) -> ContainerState:
        meta = self._meta(container_id)
        if meta is None:
            return ContainerState(container_id=container_id, status=ContainerStatus.UNKNOWN)
        ended = self._exit(container_id)
        if ended is not None:
            return self._exited_state(container_id, ended)
        child = _pid(self._dir(container_id) / shim.CHILD_FILE)
        if child and _alive(child):
            forwards = meta.get("forwards") or []
            address = f"127.0.0.1:{forwards[0]['host_port']}" if forwards else None
            return ContainerState(container_id=container_id, status=ContainerStatus.RUNNING, pid=child, address=address)
        return ContainerState(container_id=container_id, status=ContainerStatus.CREATED)

    def kill(self, container_id: str, sig: int) -> None:
        if self._exit(container_id) is not None:
            return
        child = _pid(self._dir(container_id) / shim.CHILD_FILE)
        if not child or not _alive(child):
            return
        # The shim starts the command in its own session, so the group is the command and everything it
        # forked. Just after start the child may not have become its group's leader yet (setsid is its
        # first act): then there is no such group for a moment, and the signal must not be lost.
        deadline = time.monotonic() + 2.0
        while True:
            try:
                os.killpg(child, sig)
                return
            except ProcessLookupError:
                if not _alive(child):
                    return
                if time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, sig)
                    return
                time.sleep(0.005)

    def remove(self, container_id: str) -> None:
        cdir = self._dir(container_id)
        if (cdir / shim.PID_FILE).exists() and self._exit(container_id) is None:
            self.kill(container_id, signal.SIGKILL)
        # until the shim is gone, not just until it wrote how the container ended: a removed container leaves no
        # process (run 9 beside a CPU hog found a shim still finishing after remove had returned)
        self._wait_for_shim(container_id, until_gone=True)
        # what the command started and left behind lives on in its process group after it exits
        child = _pid(cdir / shim.CHILD_FILE)
        if child:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child, signal.SIGKILL)
        home = (self._meta(container_id) or {}).get("home")
        # only a directory this engine made: the record is root's, but never trust a path blindly
        if isinstance(home, str) and Path(home).name.startswith(f"levers9-{container_id}-"):
            shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(cdir, ignore_errors=True)


#: a call's home left behind is removed once it is this old and no shim of its container runs
STALE_HOME_S = 60.0
_swept = False
_sweep_lock = threading.Lock()


def sweep_homes(run_as: RunAs, *, older_than_s: float = STALE_HOME_S) -> list[str]:
    """Remove the homes of calls whose container is gone but whose home stayed (its worker was killed).

    A home is removed with its container; a worker killed with SIGKILL, whose state directory went with it,
    leaves it in the shared temporary directory. One owned by ``run_as``, named as this engine names them,
    older than ``older_than_s`` and whose container id no running process names (each container's shim has it
    in its argv) is removed. Returns what was removed.
    """
    base = _shared_tmp()
    try:
        names = [n for n in os.listdir(base) if n.startswith("levers9-")]
    except OSError:
        return []
    if not names:
        return []
    live = _live_argv()
    now = time.time()
    removed = []
    for name in names:
        container_id = name.removeprefix("levers9-").rpartition("-")[0]
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        stale = now - info.st_mtime > older_than_s
        if stat.S_ISDIR(info.st_mode) and info.st_uid == run_as.uid and stale and container_id not in live:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _live_argv() -> str:
    """Every running process's argv, joined (to look a container id up in)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
    return "\n".join(found)


def _sweep_once(run_as: RunAs) -> None:
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    for path in sweep_homes(run_as):
        log.info("removed %s: the home of a call whose container is gone (its worker was killed)", path)


def _shared_tmp() -> str:
    """A temporary directory every user may use (the worker's own $TMPDIR may be private)."""
    return "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
