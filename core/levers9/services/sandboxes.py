"""Sandboxes, as the controlplane serves them: where one starts, who may reach it, and what its worker answered.

A sandbox lives on one worker of a pool whose ``sandboxes`` is above 0
(:mod:`levers9.worker.sandboxes` runs it there). This module decides:

* **where a new one goes** (:meth:`SandboxService.create`): the pool named, or
  else every pool with sandboxes that serves the caller's workspace (by
  ``priority``); among a pool's running workers that announced a sandbox
  server (:mod:`levers9.services.sandbox_hosts`), in random order, the first
  that takes it. A worker at its most sandboxes answers ``SandboxesFull`` and
  the next is asked; a worker that cannot be reached is passed over. None
  taking it is :class:`SandboxProblem` ``no_sandbox_worker`` (503: room may
  free), naming the workers asked and what each answered; no pool with
  sandboxes for the workspace at all is ``no_sandbox_pool`` (400: asking again
  cannot help). A pool's workers are not started for a
  sandbox: a pool meant for sandboxes keeps ``min_workers`` up.
* **who reaches it**: only its workspace. A sandbox of another workspace, or
  one never made, is ``sandbox_not_found`` (404) alike, so ids cannot be
  probed; the worker checks the workspace again (the ``Levers9-Workspace``
  header), so a wrong record could not hand one workspace's sandbox to another.
* **what a worker's answer means to the caller**: the worker's error codes
  become the REST API's error types (:data:`ERROR_TYPES`), and a worker that
  has left (its keepalive lapsed, it was drained or its machine went) makes
  its sandboxes ``gone``: their info says so and every other request is
  ``sandbox_gone`` (409) naming the worker, at once, never a wait.

The volumes a sandbox names are its workspace's (made when new, as a function's); each goes to the worker
as it mounts it: the file system itself for a pool with direct access, else the volume's WebDAV URL on this
controlplane and a token for that worker and volume alone (:mod:`levers9.services.volume_access`). A cloud
bucket goes with its settings and the values of the secrets its keys name, which the worker hands to its
mount of the bucket alone, never to the sandbox's processes (as for a function's bucket).

The secrets a sandbox names are read from its workspace's secrets here and
travel to the worker in the create request, over the worker's tunnel; they are
never stored with the sandbox or logged.

GPUs: ``gpu`` is the preference a function's is (:mod:`levers9.gpu.preference`: a type, a list of them
in order, ``any``, ending in ``cpu`` for a CPU fallback) and ``gpu_count`` how many (1 when left out).
The workers asked go best first: every worker of the first listed type (in every pool, by priority),
then the next type's, then (with the fallback) workers without a GPU for it; a CPU sandbox goes to
workers without GPUs before any with, which it would keep from GPU work. The GPUs are held on the
worker's room like its CPU and memory, so the scheduler places no GPU call on them, and the worker gives
the sandbox exactly those devices (:mod:`levers9.worker.gpu_ledger`). No worker of an acceptable type at
all is ``no_sandbox_worker`` naming what each worker has. A sandbox with GPUs takes no memory
snapshot (``snapshots`` with a GPU is ``invalid_request``), so none is ever restored with GPUs.

Failures are :class:`SandboxProblem` (status, type, message), which the
transports answer as they are; bad input is ``invalid_request`` naming the
field.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from levers9.checkpoint.storage import storage_from_url
from levers9.gpu.preference import GpuRequest, parse_gpu_or_count
from levers9.services.access import own_workspace
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.services.fleet import checkpoint_storage_url, mounts_volumes_directly
from levers9.services.image_refs import check_image
from levers9.services.sandbox_hosts import SandboxHost, SandboxHosts, SandboxRecord
from levers9.services.sandbox_relay import (
    CONNECT_TIMEOUT_S,
    BodyBroken,
    Connect,
    WorkerAnswer,
    WorkerLink,
    WorkerUnreachable,
)
from levers9.services.stubs import BucketSetting, InvalidStub
from levers9.services.tunnels import tunnel_address
from levers9.services.volume_access import DAV_PREFIX, VolumeToken, mint_token
from levers9.state.errors import DecryptionError, NotFound
from levers9.state.redis.workers import WorkerState
from levers9.state.sql.records import SandboxSnapshotRecord, root_workspace

__all__ = ["ERROR_TYPES", "Relayed", "SandboxProblem", "SandboxService"]

log = logging.getLogger(__name__)

#: a worker's error code -> the REST API's (status, type); an errno name not listed becomes its lower-cased name
ERROR_TYPES: dict[str, tuple[int, str]] = {
    "SandboxNotFound": (404, "sandbox_not_found"),
    "NoSuchProcess": (404, "process_not_found"),
    "ENOENT": (404, "file_not_found"),
    "SandboxEnded": (409, "sandbox_ended"),
    "SandboxGone": (409, "sandbox_gone"),
    "OutputBusy": (409, "output_busy"),
    "EEXIST": (409, "file_exists"),
    "ENOTEMPTY": (409, "directory_not_empty"),
    "BadPath": (400, "bad_path"),
    "BadRequest": (400, "invalid_request"),
    "ENOTDIR": (400, "not_a_directory"),
    "EISDIR": (400, "is_a_directory"),
    "EACCES": (403, "permission_denied"),
    "EPERM": (403, "permission_denied"),
    "TooManyProcesses": (429, "too_many_processes"),
    "SandboxesFull": (503, "sandboxes_full"),
    "StartFailed": (502, "start_failed"),
    "SandboxBusy": (409, "sandbox_busy"),
    "SnapshotUnavailable": (409, "snapshot_unavailable"),
    "SnapshotMissing": (404, "snapshot_missing"),
    "SnapshotFailed": (502, "snapshot_failed"),
    "CommitUnavailable": (409, "image_unavailable"),
    "CommitFailed": (502, "image_failed"),
}

#: what each of a create's volumes takes
_VOLUME_KEYS = frozenset({"name", "mount_path", "read_only", "bucket"})
#: how long a create waits for a pool's registered workers to announce their sandbox servers
ANNOUNCE_WAIT_S = 5.0

#: the body fields a create passes to the worker as they are (the worker checks each, naming it)
_PASSED = frozenset(
    {
        "image",
        "python_version",
        "cpu_millicores",
        "memory_mib",
        "env",
        "ports",
        "block_network",
        "allow_list",
        "timeout_s",
        "idle_timeout_s",
        "workdir",
        "name",
        "snapshots",
    }
)
#: what a create takes besides: the pool, the secrets' names, a snapshot to restore (its id)
_OWN = frozenset({"pool", "secrets", "snapshot", "volumes", "gpu", "gpu_count"})


class SandboxProblem(Exception):
    """What the caller is answered: an HTTP status, the error's type and a message for people."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _bad(message: str) -> SandboxProblem:
    return SandboxProblem(400, "invalid_request", message)


def problem_of(answer_body: Any, status: int) -> SandboxProblem:
    """The problem a worker's error answer (``{"error": {"code", "message"}}``) means to the caller."""
    error = answer_body.get("error") if isinstance(answer_body, dict) else None
    if not isinstance(error, dict):
        return SandboxProblem(502, "worker_unreachable", f"the worker answered {status} without an error body")
    code = str(error.get("code", ""))
    message = str(error.get("message", "")) or code
    mapped = ERROR_TYPES.get(code)
    if mapped is not None:
        return SandboxProblem(mapped[0], mapped[1], message)
    return SandboxProblem(status if 400 <= status < 600 else 502, code.lower() or "worker_error", message)


@dataclass
class Relayed:
    """A worker's answer to relay as it comes: its status and type, and the body (closed when iterated to the end)."""

    status: int
    content_type: str
    body: AsyncIterator[bytes]


class SandboxService:
    """Sandboxes over the workers that serve them (see the module); one per replica, closed with it."""

    def __init__(
        self,
        services: Services,
        connect: Connect,
        *,
        registry_host: Callable[[], str | None] = lambda: None,
        http_url: str = "",
    ) -> None:
        self.services = services
        #: the controlplane's advertised HTTP URL: its WebDAV, for workers that reach volumes through it
        self.http_url = http_url.rstrip("/")
        #: the host the controlplane's registry names the workspaces' built images by (None: it has none)
        self.registry_host = registry_host
        self.hosts = SandboxHosts(services.redis, services.box, prefix=services.scheduler.workers.prefix)
        self.link = WorkerLink(connect)
        self._connect = connect

    async def close(self) -> None:
        await self.link.close()

    # ----------------------------------------------------------------- create

    async def create(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        workspace_id = own_workspace(principal, "create sandboxes")
        unknown = sorted(set(body) - _PASSED - _OWN)
        if unknown:
            raise _bad(f"unknown fields {unknown}; a sandbox takes {sorted(_PASSED | _OWN)}")
        gpus = _gpu_request(body)
        if gpus.wants_gpu and body.get("snapshots"):
            raise _bad(
                "snapshots: a sandbox with GPUs takes no memory snapshot (it cannot hold a GPU's memory); "
                "leave gpu out or snapshots off"
            )
        request = {key: value for key, value in body.items() if key in _PASSED}
        self._check_image(workspace_id, request.get("image", "host"))
        request["secrets"] = await self._secrets(workspace_id, body.get("secrets", []))
        pools = self._pools(workspace_id, body.get("pool"))
        snapshot, restored = body.get("snapshot"), None
        if snapshot is not None:
            stored = await self._snapshot(workspace_id, snapshot)
            if stored.pool not in pools:
                raise _bad(
                    f"snapshot {stored.id} restores on pool {stored.pool!r}, whose workers took it; "
                    f"leave pool out, or name {stored.pool!r}"
                )
            if gpus.wants_gpu:
                raise _bad("gpu: a sandbox restored from a snapshot gets no GPU (a snapshot holds no GPU's memory)")
            pools, request["snapshot"] = [stored.pool], stored.info
            restored = stored.info
        room = _room(request, restored)
        request.update(cpu_millicores=room[0], memory_mib=room[1])
        volumes = await self._volumes(workspace_id, body.get("volumes", []))
        asked: list[str] = []
        for place in await self._places(pools, gpus, asked):
            mounts = self._mounts(place.worker_id, place.pool, workspace_id, volumes)
            encoded = json.dumps({**request, "gpu_count": place.gpus, "volumes": mounts})
            info = await self._start_on(place, workspace_id, room, encoded.encode(), asked)
            if info is not None:
                return info
        wanted = f" ({_wanted(gpus)})" if gpus.wants_gpu else ""
        raise SandboxProblem(503, "no_sandbox_worker", f"no worker took the sandbox{wanted}: " + "; ".join(asked))

    async def _places(
        self, pools: builtins.list[str], gpus: GpuRequest, asked: builtins.list[str]
    ) -> builtins.list[_Place]:
        """The workers to ask, best first (see the module docstring); why each other one is not asked is appended
        to ``asked``."""
        ranked: builtins.list[tuple[int, int, float, _Place]] = []
        for order, pool in enumerate(pools):
            serving = await self._serving(pool)
            if not serving:
                asked.append(f"pool {pool}: no running worker serves sandboxes")
            for state in serving:
                info = state.info
                gpu = info.gpu if info.gpu and info.gpu_count > 0 else None
                fits = _fits(gpus, gpu)
                if not fits:
                    has = f"{info.gpu_count} {gpu}" if gpu else "no GPU"
                    asked.append(f"worker {info.id} of pool {pool}: has {has}; the sandbox takes {_wanted(gpus)}")
                for rank, given in fits:
                    if given > info.gpu_count:
                        asked.append(f"worker {info.id} of pool {pool}: has {info.gpu_count} {gpu}, not {given}")
                        continue
                    place = _Place(info.id, pool, given, (gpu or "") if given else "")
                    ranked.append((rank, order, random.random(), place))
        return [place for *_, place in sorted(ranked, key=lambda entry: entry[:3])]

    async def _start_on(
        self, place: _Place, workspace_id: str, room: tuple[int, int], encoded: bytes, asked: builtins.list[str]
    ) -> dict[str, Any] | None:
        """The sandbox's info once ``place`` started it; None (why appended to ``asked``) when it has no room
        or cannot be reached; a refusal of the sandbox itself raises."""
        worker_id, pool = place.worker_id, place.pool
        workers, now = self.services.scheduler.workers, self.services.scheduler.ctx.now_ms
        hold = f"sbh_{secrets.token_hex(8)}"
        held = await workers.hold_sandbox(
            hold, worker_id, cpu=room[0], mem=room[1], gpus=place.gpus, now_ms=now(), workspace=workspace_id
        )
        if not held:
            wanted = f"{room[0]} millicores, {room[1]} MiB and {place.gpus} {place.gpu}" if place.gpus else ""
            wanted = wanted or f"{room[0]} millicores and {room[1]} MiB"
            asked.append(f"worker {worker_id} of pool {pool}: no room for {wanted}")
            return None
        try:
            host = await self._host(worker_id)
            answer = await self.link.request(
                worker_id, host.port, host.secret, workspace_id, "POST", "/sandboxes", body=encoded
            )
            answered = await answer.json()
            if answer.status == 201:
                record = SandboxRecord(
                    id=str(answered["id"]),
                    workspace_id=workspace_id,
                    worker_id=worker_id,
                    pool=pool,
                    created_at=float(answered.get("created_at") or time.time()),
                    hold=hold,
                    gpu=place.gpu,
                )
                await self.hosts.record(record)
                hold = ""  # the sandbox's now: released when it ends
                log.info("sandbox %s of workspace %s started on worker %s", record.id, workspace_id, worker_id)
                return _info(answered, record)
            problem = problem_of(answered, answer.status)
            if problem.kind != "sandboxes_full":
                raise problem
            asked.append(f"worker {worker_id} of pool {pool}: already runs its most sandboxes")
        except (WorkerUnreachable, SandboxProblem) as exc:
            if isinstance(exc, SandboxProblem) and exc.kind != "worker_unreachable":
                raise
            asked.append(f"worker {worker_id} of pool {pool}: {exc}")
        finally:
            if hold:
                await workers.release_sandbox(hold, now_ms=now())
        return None

    async def _volumes(self, workspace_id: str, given: object) -> builtins.list[dict[str, Any]]:
        """Each volume a create names, as every worker mounts it: a volume of the workspace (made when new, as a
        function's) by id, or a cloud bucket with its keys read from the workspace's secrets it names."""
        if not isinstance(given, list):
            raise _bad("volumes must be a list of {name, mount_path[, read_only][, bucket]}")
        found: builtins.list[dict[str, Any]] = []
        for volume in given:
            if not isinstance(volume, dict) or not {"name", "mount_path"} <= set(volume) <= _VOLUME_KEYS:
                raise _bad(f"volumes holds {volume!r}; each is {{name, mount_path[, read_only][, bucket]}}")
            name, where, read_only = volume["name"], volume["mount_path"], volume.get("read_only", False)
            if not isinstance(name, str) or not isinstance(where, str) or not isinstance(read_only, bool):
                raise _bad(f"volumes holds {volume!r}; name and mount_path are text, read_only true or false")
            if volume.get("bucket") is not None:
                found.append(await self._bucket(workspace_id, name, where, read_only, volume["bucket"]))
                continue
            record, _ = await self.services.volumes.get_or_create(workspace_id, name)
            found.append(
                {"mount_path": where, "volume_id": record.id, "volume_name": record.name, "read_only": read_only}
            )
        return found

    async def _bucket(self, workspace_id: str, name: str, where: str, read_only: bool, given: object) -> dict[str, Any]:
        """A cloud bucket's mount: its settings checked as a function's are, its keys the values of the secrets
        they name (sent to the worker, which gives them to its mount alone, never to the sandbox)."""
        try:
            bucket = BucketSetting.model_validate(given)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise _bad(f"volumes: cloud bucket {name!r}: {problems}") from None
        keys: dict[str, str] = {}
        for field, secret in (("access_key_id", bucket.access_key), ("secret_access_key", bucket.secret_key)):
            if not secret:
                continue
            value = await self.services.secrets.get(workspace_id, secret)
            if value is None:
                raise _bad(
                    f"volumes: cloud bucket {name!r} names secret {secret!r}, which this workspace does not have; "
                    "create it first (levers9 secret create)"
                )
            keys[field] = value
        return {
            "mount_path": where,
            "bucket": name,
            "read_only": read_only or bucket.read_only,
            "endpoint": bucket.endpoint,
            "region": bucket.region,
            "force_path_style": bucket.force_path_style,
            **keys,
        }

    def _mounts(
        self, worker_id: str, pool: str, workspace_id: str, volumes: builtins.list[dict[str, Any]]
    ) -> builtins.list[dict[str, Any]]:
        """The volumes as ``worker_id`` mounts them: the file system itself (a pool with direct access), or each
        volume over the controlplane's WebDAV with a token for this worker and volume alone; buckets as given."""
        spec = self.services.pools[pool]
        direct = mounts_volumes_directly(spec) or not self.http_url
        mounts = []
        for volume in volumes:
            mount = dict(volume)
            if not direct and "volume_id" in volume:
                token = VolumeToken(worker_id, workspace_id, volume["volume_id"], volume["read_only"])
                mount.update(
                    webdav_url=f"{self.http_url}{DAV_PREFIX}/{volume['volume_id']}/",
                    webdav_token=mint_token(self.services, token),
                )
            mounts.append(mount)
        return mounts

    def _check_image(self, workspace_id: str, image: object) -> None:
        """The rule every stub's image is held to: a sandbox's image is resolved on its worker, with the worker's
        privileges, so a path (``/``: the worker's own root filesystem) or another workspace's image is refused."""
        if not isinstance(image, str):
            raise _bad(f"image is {image!r}; give 'host', or an image reference")
        config = self.services.config
        try:
            check_image(
                image,
                workspace_id,
                registry_host=self.registry_host(),
                repository_prefix=config.registry.repository_prefix,
                local_dirs=config.images.local_dirs,
            )
        except InvalidStub as exc:
            raise _bad(str(exc)) from None

    async def _serving(self, pool: str) -> builtins.list[WorkerState]:
        """The pool's running workers that serve sandboxes. A worker announces its server in the first message
        of its session, a moment after it registered: one registered that has not yet is waited for a little."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANNOUNCE_WAIT_S
        while True:
            workers = [w for w in await self.services.scheduler.workers.in_pool(pool) if w.status == "running"]
            serving = await self.hosts.serving([w.info.id for w in workers])
            if len(serving) == len(workers) or loop.time() >= deadline:
                return [w for w in workers if w.info.id in serving]
            await asyncio.sleep(0.1)

    def _pools(self, workspace_id: str, named: object) -> list[str]:
        pools = self.services.pools
        usable = sorted(
            (
                spec
                for spec in pools.values()
                if spec.sandboxes > 0 and spec.workspace in (None, root_workspace(workspace_id))
            ),
            key=lambda spec: (-spec.priority, spec.name),
        )
        names = [spec.name for spec in usable]
        if named is None or named == "":
            if not names:
                raise SandboxProblem(
                    400,
                    "no_sandbox_pool",
                    "no pool of this controlplane serves sandboxes to this workspace; an operator turns them on with "
                    "pools.NAME.sandboxes in the controlplane's config",
                )
            return names
        if not isinstance(named, str):
            raise _bad(f"pool is {named!r}; give a pool's name")
        if named not in names:
            offered = ", ".join(names) or "none"
            why = "has no pool of that name" if named not in pools else "serves no sandboxes on it for this workspace"
            raise _bad(f"pool {named!r}: this controlplane {why}; pools with sandboxes: {offered}")
        return [named]

    async def _secrets(self, workspace_id: str, names: object) -> dict[str, str]:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _bad("secrets must be a list of the names of the workspace's secrets")
        values: dict[str, str] = {}
        for name in names:
            value = await self.services.secrets.get(workspace_id, name)
            if value is None:
                known = ", ".join(await self.services.secrets.names(workspace_id)) or "none"
                raise _bad(f"secrets names {name!r}, which this workspace has no secret of; its secrets: {known}")
            values[name] = value
        return values

    # ------------------------------------------------------------ look and act

    async def list(self, principal: Principal, *, include_ended: bool = False) -> builtins.list[dict[str, Any]]:
        workspace_id = own_workspace(principal, "list sandboxes")
        listed: list[dict[str, Any]] = []
        for record in await self.hosts.of_workspace(workspace_id):
            info = await self._info(record)
            if include_ended or info["state"] in ("starting", "running"):
                listed.append(info)
        return listed

    async def get(self, principal: Principal, sandbox_id: str) -> dict[str, Any]:
        return await self._info(await self._record(principal, sandbox_id))

    async def _info(self, record: SandboxRecord) -> dict[str, Any]:
        """Its info as its worker reports it; ``gone`` when the worker has left or cannot be reached."""
        try:
            answer = await self._ask(record, "GET", f"/sandboxes/{record.id}")
        except SandboxProblem as exc:
            if exc.kind not in ("sandbox_gone", "worker_unreachable"):
                raise
            return _gone_info(record, str(exc))
        answered = await answer.json()
        if answer.status != 200:
            problem = problem_of(answered, answer.status)
            if problem.kind == "sandbox_not_found":  # its worker restarted: what it ran went with it
                await self._ended(record)
                return _gone_info(record, f"its worker {record.worker_id} no longer runs it (the worker restarted)")
            raise problem
        info = _info(answered, record)
        if info["state"] in ("ended", "gone"):
            await self._ended(record)
        return info

    async def relay(
        self,
        principal: Principal,
        sandbox_id: str,
        method: str,
        path: str,
        *,
        body: bytes | AsyncIterator[bytes] = b"",
        content_type: str = "application/json",
        streamed: bool = False,
    ) -> Relayed:
        """``method`` on the sandbox's ``path`` (below ``/sandboxes/<id>``, with its query) at its worker.

        A success is relayed as it comes; an error answer is :class:`SandboxProblem`. A streamed answer
        (NDJSON) whose worker breaks off ends with an error line naming the worker instead of a cut.
        """
        record = await self._record(principal, sandbox_id)
        answer = await self._ask(
            record, method, f"/sandboxes/{sandbox_id}{path}", body=body, content_type=content_type, streamed=streamed
        )
        if answer.status >= 400:
            problem = problem_of(await answer.json(), answer.status)
            if problem.kind in ("sandbox_ended", "sandbox_gone"):
                await self._ended(record)
            raise problem
        ndjson = answer.content_type.startswith("application/x-ndjson")
        return Relayed(answer.status, answer.content_type, self._relayed(record, answer, ndjson))

    async def terminate(self, principal: Principal, sandbox_id: str) -> dict[str, Any]:
        record = await self._record(principal, sandbox_id)
        answer = await self._ask(record, "DELETE", f"/sandboxes/{sandbox_id}")
        answered = await answer.json()
        if answer.status != 200:
            raise problem_of(answered, answer.status)
        await self._ended(record)
        return _info(answered, record)

    async def expose(self, principal: Principal, sandbox_id: str, port: int) -> dict[str, Any]:
        """Serve one of the sandbox's ``ports`` through the gateway, at ``/sandbox/<id>/<port>/``.

        Refused (``port_not_listening``, 409) when nothing in the sandbox accepts a connection on it now, so a
        URL handed out answers; a port not declared at create is ``invalid_request`` naming those that were.
        """
        record = await self._record(principal, sandbox_id)
        info = await self._info(record)
        if info["state"] not in ("starting", "running"):
            raise SandboxProblem(409, f"sandbox_{info['state']}", f"sandbox {sandbox_id} {info['reason']}")
        ports: dict[str, str] = info.get("ports") or {}
        address = ports.get(str(port))
        if not address:
            declared = ", ".join(sorted(ports, key=int)) or "none"
            raise _bad(f"port {port} was not declared when sandbox {sandbox_id} was created (ports: {declared})")
        host, _, number = address.rpartition(":")
        try:
            _, writer = await self._connect(record.worker_id, host.strip("[]"), int(number), CONNECT_TIMEOUT_S)
        except Exception as exc:  # refused, or the worker's side could not connect at all
            raise SandboxProblem(
                409,
                "port_not_listening",
                f"nothing in sandbox {sandbox_id} listens on port {port} (connecting to it: {exc}); start its server "
                "first, then expose the port",
            ) from None
        writer.close()
        await self.hosts.expose(sandbox_id, port, address)
        return {"port": port, "path": f"/sandbox/{sandbox_id}/{port}/"}

    async def exposed_address(self, principal: Principal, sandbox_id: str, port: int) -> str:
        """Where the gateway forwards a request to the sandbox's exposed ``port``: a ``tunnel://`` address."""
        record = await self._record(principal, sandbox_id)
        address = (await self.hosts.exposed(sandbox_id)).get(port)
        if address is None:
            raise SandboxProblem(
                404, "port_not_exposed", f"port {port} of sandbox {sandbox_id} is not exposed; expose it first"
            )
        gone = await self._worker_gone(record)
        if gone:
            raise SandboxProblem(409, "sandbox_gone", gone)
        return tunnel_address(record.worker_id, address)

    # ------------------------------------------------------------------ images

    async def make_image(self, principal: Principal, sandbox_id: str) -> dict[str, Any]:
        """The sandbox's filesystem as it is now, an image in its workspace's repository ``<prefix>/<workspace>/
        sandboxes`` of the controlplane's registry (it runs on): ``{"image": ref@digest, "size_bytes", "layers"}``,
        a reference a sandbox's or a function's ``image`` takes."""
        record = await self._record(principal, sandbox_id)
        prefix = self.services.config.registry.repository_prefix
        body = json.dumps({"repository": f"{prefix}/{record.workspace_id.lower()}/sandboxes"}).encode()
        answer = await self._ask(record, "POST", f"/sandboxes/{sandbox_id}/image", body=body)
        answered = await answer.json()
        if answer.status != 201:
            raise problem_of(answered, answer.status)
        log.info("sandbox %s of workspace %s: image %s made", sandbox_id, record.workspace_id, answered.get("image"))
        return {key: answered[key] for key in ("image", "size_bytes", "layers") if key in answered}

    # -------------------------------------------------------------- snapshots

    async def snapshot(self, principal: Principal, sandbox_id: str) -> dict[str, Any]:
        """Snapshot the sandbox's memory and files (it runs on); recorded as one of its workspace's snapshots."""
        record = await self._record(principal, sandbox_id)
        answer = await self._ask(record, "POST", f"/sandboxes/{sandbox_id}/snapshots")
        answered = await answer.json()
        if answer.status != 201:
            raise problem_of(answered, answer.status)
        info = answered["snapshot"]
        stored = await self.services.sandbox_snapshots.add(
            record.workspace_id,
            str(info["id"]),
            sandbox_id=sandbox_id,
            pool=record.pool,
            runtime=str(info["runtime"]),
            key=str(info["key"]),
            size_bytes=int(info["size_bytes"]),
            info=info,
        )
        log.info("sandbox %s of workspace %s: snapshot %s stored", sandbox_id, record.workspace_id, stored.id)
        return _snapshot_out(stored)

    async def snapshots(self, principal: Principal) -> builtins.list[dict[str, Any]]:
        workspace_id = own_workspace(principal, "list sandbox snapshots")
        return [_snapshot_out(s) for s in await self.services.sandbox_snapshots.list(workspace_id)]

    async def delete_snapshot(self, principal: Principal, snapshot_id: str) -> None:
        """Delete the stored object, then the record (a failure keeps the record, so it can be tried again)."""
        workspace_id = own_workspace(principal, "delete sandbox snapshots")
        stored = await self._snapshot(workspace_id, snapshot_id)
        root = Path(self.services.config.data_dir).expanduser().resolve() / "checkpoints"
        try:
            storage = storage_from_url(checkpoint_storage_url(self.services), default_root=root)
            await asyncio.to_thread(storage.delete, stored.key)
        except Exception as exc:
            raise SandboxProblem(
                502,
                "storage_error",
                f"snapshot {snapshot_id}: its object in the checkpoint storage could not be deleted ({exc}); "
                "it is still listed, so it can be deleted again",
            ) from None
        await self.services.sandbox_snapshots.delete(workspace_id, snapshot_id)

    async def _snapshot(self, workspace_id: str, snapshot_id: object) -> SandboxSnapshotRecord:
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise _bad(f"snapshot is {snapshot_id!r}; give a snapshot's id (sbs_...)")
        try:
            return await self.services.sandbox_snapshots.get(workspace_id, snapshot_id)
        except NotFound:
            raise SandboxProblem(
                404, "snapshot_not_found", f"no sandbox snapshot {snapshot_id} in this workspace"
            ) from None

    async def _relayed(self, record: SandboxRecord, answer: WorkerAnswer, lines: bool) -> AsyncIterator[bytes]:
        try:
            if not lines:
                async for piece in answer.body:
                    yield piece
                return
            async for line in _lines(answer.body):
                yield _translated(line)
        except BodyBroken as exc:
            if not lines:
                raise
            gone = await self._worker_gone(record)
            message = gone or f"the connection to sandbox {record.id}'s worker {record.worker_id} broke: {exc}"
            yield _line({"error": {"type": "sandbox_gone", "message": message}})
        finally:
            await answer.close()

    # ---------------------------------------------------------------- helpers

    async def _record(self, principal: Principal, sandbox_id: str) -> SandboxRecord:
        workspace_id = own_workspace(principal, "reach sandboxes")
        record = await self.hosts.find(sandbox_id)
        if record is None or record.workspace_id != workspace_id:
            raise SandboxProblem(404, "sandbox_not_found", f"no sandbox {sandbox_id} in this workspace")
        return record

    async def _host(self, worker_id: str) -> SandboxHost:
        try:
            host = await self.hosts.host(worker_id)
        except DecryptionError as exc:
            raise SandboxProblem(502, "worker_unreachable", f"worker {worker_id}'s sandbox secret: {exc}") from None
        if host is None:
            raise SandboxProblem(
                502, "worker_unreachable", f"worker {worker_id} has not announced its sandbox server (yet)"
            )
        return host

    async def _ended(self, record: SandboxRecord) -> None:
        """It ended: its record is kept a while, and the room it held on its worker goes back (once)."""
        await self.hosts.ended(record)
        if record.hold:
            await self.services.scheduler.workers.release_sandbox(
                record.hold, now_ms=self.services.scheduler.ctx.now_ms()
            )

    async def _worker_gone(self, record: SandboxRecord) -> str:
        """Why the sandbox's worker is gone ("" while it is registered)."""
        state = await self.services.scheduler.workers.get(record.worker_id)
        if state is not None:
            return ""
        await self._ended(record)
        return (
            f"sandbox {record.id} ran on worker {record.worker_id} of pool {record.pool}, which has left the "
            "controlplane (it stopped, or its keepalive lapsed): its sandboxes ended with it"
        )

    async def _ask(
        self,
        record: SandboxRecord,
        method: str,
        path: str,
        *,
        body: bytes | AsyncIterator[bytes] = b"",
        content_type: str = "application/json",
        streamed: bool = False,
    ) -> WorkerAnswer:
        # two Redis reads at once (each a round trip); a worker that left wins over its host's problem
        gone, host = await asyncio.gather(
            self._worker_gone(record), self._host(record.worker_id), return_exceptions=True
        )
        if isinstance(gone, BaseException):
            raise gone
        if gone:
            raise SandboxProblem(409, "sandbox_gone", gone)
        if isinstance(host, BaseException):
            raise host
        try:
            return await self.link.request(
                record.worker_id,
                host.port,
                host.secret,
                record.workspace_id,
                method,
                path,
                body=body,
                content_type=content_type,
                streamed=streamed,
            )
        except WorkerUnreachable as exc:
            gone = await self._worker_gone(record)
            if gone:
                raise SandboxProblem(409, "sandbox_gone", gone) from None
            raise SandboxProblem(502, "worker_unreachable", f"sandbox {record.id}: {exc}") from None


@dataclass(frozen=True)
class _Place:
    """A worker to ask for a sandbox, and the GPUs it would give it."""

    worker_id: str
    pool: str
    #: GPUs the sandbox takes there (0: none, on a worker without GPUs or as the CPU fallback)
    gpus: int
    #: their canonical type ("" for none)
    gpu: str


def _gpu_request(body: dict[str, Any]) -> GpuRequest:
    """A create's ``gpu`` and ``gpu_count`` read as a function's are; ``gpu_count`` alone asks for any GPU."""
    try:
        return parse_gpu_or_count(body.get("gpu"), body.get("gpu_count"))
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _fits(gpus: GpuRequest, worker_gpu: str | None) -> builtins.list[tuple[int, int]]:
    """(rank, GPUs given) of each way a worker with ``worker_gpu`` can take the request, best first; none
    when it cannot. A CPU sandbox ranks workers without GPUs first; with the CPU fallback, any worker may
    take it GPU-less after every acceptable GPU worker was asked for GPUs."""
    if gpus.cpu_only:
        return [(0 if worker_gpu is None else 1, 0)]
    fits = []
    rank = gpus.rank(worker_gpu)
    if rank is not None and worker_gpu is not None:
        fits.append((rank, gpus.count))
    if gpus.fallback_cpu:
        fits.append((len(gpus.types) + 1 + (worker_gpu is not None), 0))
    return fits


def _wanted(gpus: GpuRequest) -> str:
    """The GPUs a create asks for, for its errors (a sandbox never waits, so no fallback delay is named)."""
    text = f"{gpus.count}x " + ("any GPU" if gpus.any_gpu else ", else ".join(gpus.types))
    return text + (", else no GPU" if gpus.fallback_cpu else "")


def _room(request: dict[str, Any], snapshot: dict[str, Any] | None) -> tuple[int, int]:
    """(millicores, MiB) the sandbox holds on its worker: a snapshot's own, else the request's (1000 and 1024 by
    default, the worker's defaults too); sent to the worker explicitly, so both count the same."""
    source = snapshot if snapshot is not None else request
    room = (source.get("cpu_millicores", 1000), source.get("memory_mib", 1024))
    for name, value, low in (("cpu_millicores", room[0], 1), ("memory_mib", room[1], 16)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise _bad(f"{name} is {value!r}; give a whole number, at least {low}")
    return room


def _info(answered: dict[str, Any], record: SandboxRecord) -> dict[str, Any]:
    info = {key: value for key, value in answered.items() if key != "container_id"}
    info.update(pool=record.pool, worker_id=record.worker_id, workspace_id=record.workspace_id, gpu=record.gpu or None)
    return info


def _snapshot_out(stored: SandboxSnapshotRecord) -> dict[str, Any]:
    """A snapshot as users see it: what it was taken of and with, never where it is stored."""
    shown = {key: value for key, value in stored.info.items() if key not in ("key", "workspace_id")}
    shown.update(id=stored.id, sandbox_id=stored.sandbox_id, pool=stored.pool, size_bytes=stored.size_bytes)
    return shown


def _gone_info(record: SandboxRecord, reason: str) -> dict[str, Any]:
    return {
        "id": record.id,
        "workspace_id": record.workspace_id,
        "pool": record.pool,
        "worker_id": record.worker_id,
        "state": "gone",
        "reason": reason,
        "created_at": record.created_at,
        "ended_at": None,
    }


async def _lines(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Whole NDJSON lines (each with its newline) out of pieces cut anywhere."""
    pending = b""
    async for piece in pieces:
        pending += piece
        while (end := pending.find(b"\n")) >= 0:
            yield pending[: end + 1]
            pending = pending[end + 1 :]
    if pending:
        yield pending + b"\n"


def _translated(line: bytes) -> bytes:
    """An output line as the REST API words it: a worker's error line gets the API's error type."""
    if not line.startswith(b'{"error"'):
        return line
    try:
        error = json.loads(line)
    except ValueError:
        return line
    problem = problem_of(error, 409)
    return _line({"error": {"type": problem.kind, "message": str(problem)}})


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
