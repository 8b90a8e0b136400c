"""One pod of a rendered Deployment, run on this host the way a kubelet runs it, as far as levers9 can tell.

There is no kubelet or container runtime here, so :class:`Pod` plays the part
for the one thing the tests need: the pod template's containers, run with
what the template gives them and nothing else.

* **Volumes.** Each volume of the template is a directory under ``root``:
  ``emptyDir`` empty (group ``fsGroup``, setgid, group-writable, as the
  kubelet makes it; ``medium: Memory`` is not emulated), ``configMap`` and
  ``secret`` filled from the ConfigMaps and Secrets the test gives, files with
  the volume's ``defaultMode`` and group ``fsGroup``. A missing ConfigMap,
  Secret or key is an error, as it keeps a real pod from starting.
* **Mounts.** Each container runs in a mount namespace of its own
  (``unshare --mount``) where every ``volumeMount`` is bind-mounted at its
  ``mountPath`` (read-only when it says so). A ``mountPath`` whose parent
  directory is a host system directory (``/etc``, ``/run``, ``/var/lib``) gets
  that parent shadowed in the namespace by a tmpfs holding links to the host's
  entries, so the mount point is made there and the host's directory is never
  written. The pod's own directories are seen there under ``/mnt`` (a tmpfs
  hides the host's ``/mnt`` in the namespace), so a volume mounted at ``/tmp``
  hides nothing the others need. Nothing is visible outside the namespace.
* **Identity and environment.** The command runs as the pod's ``runAsUser``,
  ``runAsGroup`` and ``fsGroup`` (``setpriv``), with the container's ``env``
  (``secretKeyRef`` resolved from the Secrets), ``PATH`` (this interpreter's
  ``bin`` first, so this checkout's ``levers9`` is the image's) and ``HOME``
  of the user, in a session of its own; its output goes to a log file. An
  interpreter installed under a directory only root may enter (pyenv's under
  ``/root``) is made reachable in the namespace, as an image's Python is for
  every user.

Containers share the host's network: the server's ports must be free ones.
:meth:`Pod.stop` sends SIGTERM to the main container's process group, SIGKILL
after the grace period, and :meth:`Pod.close` removes ``root``; nothing of the
pod is left after it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Pod", "PodError"]

#: host directories a mount point may be made in, by shadowing them in the container's namespace
_SHADOWED = ("/etc", "/run", "/var/lib")
#: where the pod's directories are seen in a container's namespace (a tmpfs over the host's /mnt there)
_STAGE = "/mnt"
#: this checkout (the levers9 the pod's containers run, installed editable in its virtualenv)
_REPO = Path(__file__).resolve().parents[2]


class PodError(RuntimeError):
    """The pod could not start as Kubernetes would start it (a missing Secret or key, a container that failed)."""


class Pod:
    """The pod template of ``deployment``, with ``config_maps`` and ``secrets`` (name -> key -> value)."""

    def __init__(
        self,
        deployment: Mapping[str, Any],
        *,
        config_maps: Mapping[str, Mapping[str, str]],
        secrets: Mapping[str, Mapping[str, str]],
        root: Path,
    ) -> None:
        self.spec: Mapping[str, Any] = deployment["spec"]["template"]["spec"]
        self.secrets = secrets
        self.root = root
        security = self.spec.get("securityContext", {})
        self.uid: int = security.get("runAsUser", 0)
        self.gid: int = security.get("runAsGroup", self.uid)
        self.fs_group: int | None = security.get("fsGroup")
        self.volumes: dict[str, Path] = {}
        self.logs: dict[str, Path] = {}
        self.main: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        for volume in self.spec.get("volumes", []):
            self.volumes[volume["name"]] = self._volume(volume, config_maps)

    def _volume(self, volume: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, str]]) -> Path:
        path = self.root / "volumes" / volume["name"]
        path.mkdir(parents=True)
        group = self.fs_group if self.fs_group is not None else 0
        if "emptyDir" in volume:
            os.chown(path, 0, group)
            path.chmod(0o2777 if self.fs_group is not None else 0o777)  # the kubelet's 0777, setgid with fsGroup
            return path
        if "configMap" in volume:
            source, name, mode = config_maps, volume["configMap"]["name"], volume["configMap"].get("defaultMode", 0o644)
        elif "secret" in volume:
            source, name, mode = (
                self.secrets,
                volume["secret"]["secretName"],
                volume["secret"].get("defaultMode", 0o644),
            )
        else:
            raise PodError(f"volume {volume['name']!r}: only emptyDir, configMap and secret are emulated")
        if name not in source:
            raise PodError(f"volume {volume['name']!r}: no such object {name!r}")
        for key, value in source[name].items():
            file = path / key
            file.write_text(value)
            os.chown(file, 0, group)
            file.chmod(mode)
        path.chmod(0o755)
        return path

    def _env(self, container: Mapping[str, Any]) -> dict[str, str]:
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/nonexistent" if self.uid else "/root",
        }
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            ref = item["valueFrom"]["secretKeyRef"]
            if ref["key"] not in self.secrets.get(ref["name"], {}):
                raise PodError(
                    f"container {container['name']!r}: env {item['name']}: no key {ref['key']!r} in "
                    f"Secret {ref['name']!r}"
                )
            env[item["name"]] = self.secrets[ref["name"]][ref["key"]]
        return env

    def _script(self, container: Mapping[str, Any]) -> str:
        """The shell lines that set up the container's mounts in its namespace, then exec its command."""
        # the pod's directories, reachable at _STAGE whatever the mounts hide (a volume may be mounted at /tmp)
        lines = [
            "set -e",
            "mount --make-rprivate /",
            f"mount -t tmpfs -o mode=755 tmpfs {_STAGE}",
            f"mkdir {_STAGE}/pod",
            f"mount --rbind {self.root} {_STAGE}/pod",
        ]
        keep_before, keep_after = self._keep_checkout(container.get("volumeMounts", []))
        lines += keep_before
        shadowed: list[str] = []
        for mount in container.get("volumeMounts", []):
            target = mount["mountPath"]
            if target == _STAGE or target.startswith(f"{_STAGE}/"):
                raise PodError(f"mountPath {target}: the emulation keeps the pod's directories at {_STAGE}")
            source = f"{_STAGE}/pod/volumes/{mount['name']}"
            parent = os.path.dirname(target)
            if parent in _SHADOWED:
                # always shadowed, so the pod never depends on the host's entry of that name (another test's
                # /var/lib/levers9, removed while the pod runs, would take the bind mount with it)
                if parent not in shadowed:
                    name = parent.strip("/").replace("/", "-")
                    (self.root / "host" / name).mkdir(parents=True, exist_ok=True)
                    keep = f"{_STAGE}/pod/host/{name}"
                    lines += [
                        f"mount --bind {parent} {keep}",
                        f"mount -t tmpfs -o mode=755 tmpfs {parent}",
                        f'for f in {keep}/* {keep}/.[!.]*; do [ -e "$f" ] || [ -L "$f" ] || continue; '
                        f'ln -s "$f" "{parent}/${{f##*/}}"; done',
                    ]
                    shadowed.append(parent)
                lines += [f"rm -f {shlex.quote(target)}", f"mkdir {shlex.quote(target)}"]  # not the host's, linked
            elif not os.path.isdir(target):
                raise PodError(f"mountPath {target}: its parent {parent} is not a directory the emulation shadows")
            lines.append(f"mount --bind {source} {shlex.quote(target)}")
            if mount.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        lines += keep_after
        lines += self._open_interpreter()
        groups = f"--groups={self.fs_group}" if self.fs_group is not None else "--clear-groups"
        lines.append(f'exec setpriv --reuid={self.uid} --regid={self.gid} {groups} -- "$@"')
        return "\n".join(lines)

    def _keep_checkout(self, mounts: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        """Lines before and after the volume mounts that keep this checkout and its virtualenv where they are when
        a volume is mounted over a directory holding them (a checkout under ``/tmp``, where the Deployment mounts an
        ``emptyDir``), as an image keeps levers9 outside its volumes. The path is made inside the volume and the
        checkout bound there, so the server is the same ``levers9`` either way."""
        targets = [str(m["mountPath"]).rstrip("/") or "/" for m in mounts]
        before: list[str] = []
        after: list[str] = []
        kept: list[str] = []
        for path in dict.fromkeys([str(_REPO), os.path.realpath(sys.prefix)]):
            if any(path == k or path.startswith(k + "/") for k in kept):
                continue  # inside a path already kept (the virtualenv inside the checkout)
            if not any(path == t or path.startswith(t + "/") for t in targets):
                continue
            name = f"checkout-{len(kept)}"
            (self.root / "host" / name).mkdir(parents=True, exist_ok=True)
            keep = f"{_STAGE}/pod/host/{name}"
            before.append(f"mount --bind {shlex.quote(path)} {keep}")
            after += [f"mkdir -p {shlex.quote(path)}", f"mount --bind {keep} {shlex.quote(path)}"]
            kept.append(path)
        return before, after

    def _open_interpreter(self) -> list[str]:
        """Lines that let the pod's user reach this interpreter, as every user of an image reaches its Python.

        An interpreter under a directory only root may enter (pyenv's under ``/root``) gets that directory
        shadowed in the namespace by a tmpfs holding only the path down to the interpreter.
        """
        prefix = Path(os.path.realpath(sys.base_prefix))
        chain = [*reversed(prefix.parents), prefix]
        closed = [p for p in chain if not os.stat(p).st_mode & stat.S_IXOTH]
        if not closed:
            return []
        top = closed[0]
        if top == prefix or closed[1:]:
            raise PodError(f"{prefix}: the interpreter's directories are closed to other users below {top}")
        child = chain[chain.index(top) + 1].name
        keep = f"{_STAGE}/pod/host/open{str(top).replace('/', '-')}"
        (self.root / "host" / keep.rsplit("/", 1)[1]).mkdir(parents=True, exist_ok=True)
        return [
            f"mount --bind {top} {keep}",
            f"mount -t tmpfs -o mode=755 tmpfs {top}",
            f"mkdir {top}/{child}",
            f"mount --bind {keep}/{child} {top}/{child}",
        ]

    def _start(self, container: Mapping[str, Any]) -> subprocess.Popen[bytes]:
        command = [*container.get("command", []), *container.get("args", [])]
        log = self.logs[container["name"]] = self.root / f"{container['name']}.log"
        with log.open("wb") as out:
            return subprocess.Popen(
                ["unshare", "--mount", "--fork", "--", "/bin/sh", "-c", self._script(container), "sh", *command],
                env=self._env(container),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",
            )

    def log(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path is not None and path.exists() else ""

    def run_init_containers(self, timeout: float = 120) -> None:
        """Each init container in order, to completion; PodError with its log when one fails."""
        for container in self.spec.get("initContainers", []):
            proc = self._start(container)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise PodError(f"init container {container['name']!r} ran over {timeout} s") from None
            if code != 0:
                raise PodError(f"init container {container['name']!r} exited {code}:\n{self.log(container['name'])}")

    def start(self) -> subprocess.Popen[bytes]:
        """The (one) main container, in the background."""
        (container,) = self.spec["containers"]
        self.main = self._start(container)
        return self.main

    def stop(self) -> int:
        """SIGTERM to the main container, SIGKILL after ``terminationGracePeriodSeconds``; its exit status."""
        if self.main is None:
            return 0
        proc, self.main = self.main, None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(self.spec.get("terminationGracePeriodSeconds", 30))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return -signal.SIGKILL
        return proc.returncode

    def close(self) -> None:
        if self.main is not None:
            proc, self.main = self.main, None
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
