"""The process runtime's engine: a container's command as a plain host process, supervised like the others.

It keeps the same records and shim as the OCI engine, so the worker treats
it the same way (state, logs, kill, remove, exit codes), but there is no
boundary: the command sees the host's filesystem, network and users. What
cannot be honoured without isolation (another image, mounts, another user, a
private network) is refused with a reason instead of being silently ignored.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time

from levers9.containers import shim
from levers9.containers.oci import START_TIMEOUT_S, ContainerRecords, _alive, _pid
from levers9.hooks.errors import InvalidRequest, Levers9Error
from levers9.hooks.types import ContainerSpec, ContainerState, ContainerStatus, PreparedContainer

__all__ = ["ProcessEngine"]


class ProcessEngine(ContainerRecords):
    name = "process"

    def prepare(self, spec: ContainerSpec) -> PreparedContainer:
        problems = []
        if spec.image != "host":
            problems.append(f"image {spec.image!r} (it runs on the host's own filesystem: use image 'host')")
        if spec.mounts:
            problems.append("mounts (there is no container filesystem to mount into)")
        if spec.user not in (None, "", "root", "0") and os.geteuid() == 0:
            problems.append(f"user {spec.user!r} (it runs as the worker's own user)")
        if spec.network == "none":
            problems.append("network 'none' (it shares the host's network)")
        if problems:
            raise InvalidRequest("the process runtime cannot honour: " + "; ".join(problems))
        if not os.path.isdir(spec.workdir):
            raise InvalidRequest(f"workdir {spec.workdir!r} does not exist on this host")
        cdir = self._dir(spec.container_id)
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / shim.LOG_FILE).touch()
        forwards = [{"port": p, "host_port": p, "pid": 0} for p in spec.ports]
        self._write_meta(spec.container_id, {"spec": spec.model_dump(mode="json"), "forwards": forwards})
        return PreparedContainer(container_id=spec.container_id, runtime=self.name, spec=spec)

    def start(self, container: PreparedContainer) -> ContainerState:
        spec = container.spec
        cdir = self._dir(spec.container_id)
        if not (cdir / "meta.json").exists():
            raise InvalidRequest(f"container {spec.container_id} was not prepared (or was removed)")
        if not (cdir / shim.PID_FILE).exists():
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"), **spec.env}
            # The environment goes to the shim as its environment, which the command inherits: on the
            # command line, secrets and the runner's token would be readable by anyone through ps.
            action = ["env", "-C", spec.workdir, *spec.command]
            argv = shim.command(runtime=[], action=action, container_id=spec.container_id, state_dir=cdir,
                                cgroup="", delete=False)  # fmt: skip
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
        self._wait_for_shim(container_id)
        shutil.rmtree(cdir, ignore_errors=True)
