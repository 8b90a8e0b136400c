"""``levers9.Sandbox``: a container driven from Python: run processes and code, read and write its files.

    sb = levers9.Sandbox(image=levers9.Blueprint().add_python_packages(["numpy"]), cpu=2, memory="2Gi").create()
    p = sb.process.exec("python", "-c", "print('hi')")
    for line in p.stdout:
        print(line, end="")
    sb.fs.write_text("/tmp/a.txt", "hello")
    sb.terminate()

:class:`Sandbox` holds the settings and checks each of them here, on the user's machine, raising
:class:`~levers9.sdk.sandbox_errors.SandboxRequestError` (a ``ValueError``) naming the option and what
would be accepted; ``create()`` starts one and returns a :class:`SandboxInstance`, ``connect(id)`` finds one
another program started. The instance's parts live in their own modules: ``sb.process``
(:mod:`levers9.sdk.sandbox_process`), ``sb.fs`` (:mod:`levers9.sdk.sandbox_files`); the transport is
:mod:`levers9.sdk.sandbox_http` and the errors :mod:`levers9.sdk.sandbox_errors`.

How the options reach the controlplane (``POST /api/v1/sandboxes``): ``cpu`` in cores (or ``"500m"``) and
``memory`` in MiB (or ``"1Gi"``) are parsed as ``@levers9.function`` parses them; ``keep_warm_seconds`` is
how long the sandbox lives (``-1``: until terminated); ``idle_timeout`` ends one nobody has used for that
long (0: never). ``image`` is an image ref, ``"host"`` (the worker's own root filesystem and Python, the
default, as for ``@levers9.function``), or a :class:`~levers9.Blueprint`, built first through the
controlplane as a function's is. ``volumes`` are the workspace's volumes (``levers9.Volume``, made when
new, as a function's) and ``levers9.CloudBucket`` objects. ``gpu`` is a function's GPU preference
(a type, a list in order of preference, ``"any"``, or a list ending in ``"cpu"`` to start without a GPU when
none can be had) and ``gpu_count`` how many (1 when left out): the sandbox starts on the first worker with
that many free GPUs of the first listed type it can have. ``snapshots=True`` boots the sandbox so that ``snapshot_memory()`` can take
it (the controlplane refuses a snapshot of one booted without); :func:`list_snapshots` and
:func:`delete_snapshot` manage the workspace's stored snapshots.

Invariants: a :class:`SandboxInstance` stands for one sandbox id and never retries an operation on
another; every request has a timeout (see :mod:`levers9.sdk.sandbox_http`); an operation on a sandbox that
ended raises :class:`~levers9.sdk.sandbox_errors.SandboxEnded` (``SandboxGone`` when it died), naming it.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from levers9 import stub_bounds as bounds
from levers9.quantities import NotAQuantity, parse_cpu_millicores, parse_memory_mib
from levers9.sdk.blueprint import DEFAULT_PYTHON, Blueprint
from levers9.sdk.sandbox_errors import SandboxEnded, SandboxRequestError
from levers9.sdk.sandbox_files import SandboxFileSystem
from levers9.sdk.sandbox_http import CREATE_TIMEOUT_S, SandboxHTTP, SandboxRef, transport_for
from levers9.sdk.sandbox_process import SandboxProcessManager

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxInstance",
    "Sandbox",
    "SandboxInstance",
    "delete_snapshot",
    "list_sandboxes",
    "list_snapshots",
]

#: the states of a sandbox that no longer runs
ENDED_STATES = frozenset({"ended", "gone"})


def _fail(option: str, message: str) -> SandboxRequestError:
    return SandboxRequestError(f"levers9.Sandbox: {option}: {message}")


def _volumes(volumes: object) -> list[dict[str, Any]]:
    """``volumes=``: the workspace's volumes (``levers9.Volume``, made when new) and cloud buckets
    (``levers9.CloudBucket``, their keys named as workspace secrets), each at its own path, as for a function."""
    from levers9.sdk.errors import InvalidFunction
    from levers9.sdk.volumes import volume_configs

    try:
        return volume_configs("levers9.Sandbox", volumes)
    except InvalidFunction as exc:
        raise _fail("volumes", str(exc).removeprefix("levers9.Sandbox: volumes: ")) from None


def _seconds(option: str, value: object, *, never: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise _fail(option, f"{value!r} is not a number of seconds; use seconds above 0, or {never}")
    return float(value)


class Sandbox:
    """The settings of a sandbox; ``create()`` starts one, ``connect(id)`` finds a running one."""

    def __init__(
        self,
        image: str | Blueprint = "host",
        cpu: float | str = 1.0,
        memory: int | str = 128,
        gpu: str | Sequence[str] | None = None,
        gpu_count: int | None = None,
        keep_warm_seconds: float = 600,
        idle_timeout: float = 0,
        name: str | None = None,
        volumes: Sequence[Any] | None = None,
        secrets: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        ports: Sequence[int] | None = None,
        block_network: bool = False,
        allow_list: Sequence[str] | None = None,
        pool: str | None = None,
        snapshots: bool = False,
        context: str | None = None,
    ) -> None:
        try:
            self.cpu_millicores = parse_cpu_millicores(
                cpu, field="cpu", minimum=bounds.CPU_MILLICORES_MIN, maximum=bounds.CPU_MILLICORES_MAX
            )
            self.memory_mib = parse_memory_mib(
                memory, field="memory", minimum=bounds.MEMORY_MIB_MIN, maximum=bounds.MEMORY_MIB_MAX
            )
        except NotAQuantity as exc:
            raise SandboxRequestError(f"levers9.Sandbox: {exc}") from None
        self.gpu, self.gpu_count = _gpu(gpu, gpu_count)
        if snapshots and self.gpu:
            raise _fail("snapshots", "a sandbox with GPUs takes no memory snapshot; leave gpu out or snapshots off")
        if not isinstance(image, str | Blueprint) or (isinstance(image, str) and not image.strip()):
            raise _fail("image", f"{image!r} is not an image; use an image ref, 'host', or a levers9.Blueprint")
        self.image = image
        keep = _seconds("keep_warm_seconds", keep_warm_seconds, never="-1 to keep it until terminated")
        if keep != -1 and keep <= 0:
            raise _fail("keep_warm_seconds", f"{keep_warm_seconds!r} is out of range; use seconds above 0, or -1")
        #: the REST ``timeout_s``: 0 is no deadline
        self.timeout_s = 0.0 if keep == -1 else keep
        idle = _seconds("idle_timeout", idle_timeout, never="0 for no idle timeout")
        if idle < 0:
            raise _fail("idle_timeout", f"{idle_timeout!r} is out of range; use seconds above 0, or 0 for none")
        self.idle_timeout_s = idle
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise _fail("name", f"{name!r} is not a name; use a non-empty string")
        self.name = name
        self.volumes = _volumes(volumes)
        if isinstance(secrets, str):
            secrets = [secrets]
        if secrets is not None and not all(isinstance(s, str) and s for s in secrets):
            raise _fail("secrets", f"{secrets!r}: expected the names of the workspace's secrets, as strings")
        self.secrets = list(secrets or [])
        env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise _fail("env", f"{env!r}: expected a mapping of str to str")
        self.env = env
        self.ports = [_port(p) for p in (ports or [])]
        if not isinstance(block_network, bool):
            raise _fail("block_network", f"{block_network!r}: expected True or False")
        if block_network and allow_list:
            raise _fail("allow_list", "cannot be used with block_network=True (which blocks every destination)")
        self.block_network = block_network
        self.allow_list = [_cidr(c) for c in allow_list] if allow_list is not None else None
        if pool is not None and (not isinstance(pool, str) or not pool.strip()):
            raise _fail("pool", f"{pool!r} is not a pool's name")
        self.pool = pool
        if not isinstance(snapshots, bool):
            raise _fail("snapshots", f"{snapshots!r}: expected True (boot it so that snapshot_memory works) or False")
        self.snapshots = snapshots
        self.context = context

    def __repr__(self) -> str:
        return f"<levers9.Sandbox image={self.image!r} pool={self.pool!r}>"

    # ------------------------------------------------------------------ starting

    def _image_ref(self) -> tuple[str, str]:
        """(image ref, python version) to send; a Blueprint is built first (gRPC, as for functions)."""
        if isinstance(self.image, Blueprint):
            from levers9.sdk.builds import build_image
            from levers9.sdk.client import client_for

            client = client_for(self.context)
            ref = client.run(build_image(client, self.image))
            return ref, self.image._python or DEFAULT_PYTHON
        return self.image, f"{sys.version_info.major}.{sys.version_info.minor}"

    def _body(self, image: str, python_version: str, snapshot: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "image": image,
            "python_version": python_version,
            "cpu_millicores": self.cpu_millicores,
            "memory_mib": self.memory_mib,
            "env": self.env,
            "secrets": self.secrets,
            "ports": self.ports,
            "block_network": self.block_network,
            "timeout_s": self.timeout_s,
            "idle_timeout_s": self.idle_timeout_s,
        }
        if self.gpu:
            body.update(gpu=self.gpu, gpu_count=self.gpu_count)
        if self.allow_list is not None:
            body["allow_list"] = self.allow_list
        if self.name is not None:
            body["name"] = self.name
        if self.pool is not None:
            body["pool"] = self.pool
        if self.snapshots:
            body["snapshots"] = True
        if self.volumes:
            body["volumes"] = self.volumes
        if snapshot is not None:
            body["snapshot"] = snapshot
        return body

    async def _create(self, http: SandboxHTTP, body: dict[str, Any]) -> SandboxInstance:
        what = "create a sandbox" + (f" from snapshot {body['snapshot']}" if "snapshot" in body else "")
        info = await http.request("POST", "/sandboxes", what=what, json=body, timeout=CREATE_TIMEOUT_S)
        return SandboxInstance(http, info)

    async def _connect(self, http: SandboxHTTP, sandbox_id: str) -> SandboxInstance:
        if not isinstance(sandbox_id, str) or not sandbox_id.strip() or "/" in sandbox_id:
            raise SandboxRequestError(f"connect: {sandbox_id!r} is not a sandbox id")
        ref = SandboxRef(http, sandbox_id)
        info = await ref.request("GET", "", what=f"connect to sandbox {sandbox_id}")
        _check_running(info)
        return SandboxInstance(http, info)

    def create(self) -> SandboxInstance:
        """Start a sandbox with these settings and return it once it runs."""
        http = transport_for(self.context)
        image, python_version = self._image_ref()
        return http.run(self._create(http, self._body(image, python_version, None)))

    def create_from_memory_snapshot(self, snapshot_id: str) -> SandboxInstance:
        """Start a sandbox from a snapshot taken with ``snapshot_memory()``, its processes running as they were."""
        if not isinstance(snapshot_id, str) or not snapshot_id.strip():
            raise _fail("snapshot_id", f"{snapshot_id!r} is not a snapshot id (snapshot_memory() returns one)")
        http = transport_for(self.context)
        image, python_version = self._image_ref()
        return http.run(self._create(http, self._body(image, python_version, snapshot_id)))

    def connect(self, id: str) -> SandboxInstance:
        """The running sandbox ``id`` (started by this or another program); SandboxEnded if it has ended."""
        http = transport_for(self.context)
        return http.run(self._connect(http, id))

    @property
    def aio(self) -> AsyncSandbox:
        """``create``, ``connect`` and ``create_from_memory_snapshot`` as coroutines."""
        return AsyncSandbox(self)


class AsyncSandbox:
    """:class:`Sandbox`'s starting methods for async code; they return :class:`AsyncSandboxInstance`."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox

    async def create(self) -> AsyncSandboxInstance:
        return (await self._start(None)).aio

    async def create_from_memory_snapshot(self, snapshot_id: str) -> AsyncSandboxInstance:
        if not isinstance(snapshot_id, str) or not snapshot_id.strip():
            raise _fail("snapshot_id", f"{snapshot_id!r} is not a snapshot id (snapshot_memory() returns one)")
        return (await self._start(snapshot_id)).aio

    async def _start(self, snapshot: str | None) -> SandboxInstance:
        import asyncio

        sandbox = self.sync
        http = transport_for(sandbox.context)
        # building a blueprint blocks on the SDK's gRPC loop: off this loop's thread
        image, python_version = await asyncio.to_thread(sandbox._image_ref)
        return await http.run_async(sandbox._create(http, sandbox._body(image, python_version, snapshot)))

    async def connect(self, id: str) -> AsyncSandboxInstance:
        http = transport_for(self.sync.context)
        return (await http.run_async(self.sync._connect(http, id))).aio


def list_sandboxes(context: str | None = None, *, include_ended: bool = False) -> list[dict[str, Any]]:
    """The workspace's sandboxes (their SandboxInfo), the ended ones too with ``include_ended``."""
    http = transport_for(context)
    params = {"all": "true"} if include_ended else None
    answer = http.run(http.request("GET", "/sandboxes", what="list sandboxes", params=params))
    return list(answer.get("sandboxes", []))


def list_snapshots(context: str | None = None) -> list[dict[str, Any]]:
    """The workspace's stored sandbox snapshots (``snapshot_memory``'s), oldest first."""
    http = transport_for(context)
    answer = http.run(
        http.request("GET", "/sandbox-snapshots", what="list sandbox snapshots", unsupported="keep sandbox snapshots")
    )
    return list(answer.get("snapshots", []))


def delete_snapshot(snapshot_id: str, context: str | None = None) -> None:
    """Delete a stored snapshot: its object in the workspace's storage, then its record."""
    if not isinstance(snapshot_id, str) or not snapshot_id.strip() or "/" in snapshot_id:
        raise SandboxRequestError(f"delete_snapshot: {snapshot_id!r} is not a snapshot id")
    http = transport_for(context)
    http.run(http.request("DELETE", f"/sandbox-snapshots/{snapshot_id}", what=f"delete snapshot {snapshot_id}"))


def _gpu(gpu: str | Sequence[str] | None, gpu_count: int | None) -> tuple[list[str], int]:
    """(the GPU preference as sent, how many): checked against the catalog here, as a function's is."""
    from levers9.gpu.preference import parse_gpu_or_count

    try:
        request = parse_gpu_or_count(gpu, gpu_count)  # a count alone: GPUs of any type
    except ValueError as exc:
        raise SandboxRequestError(f"levers9.Sandbox: {exc}") from None
    if not request.wants_gpu:
        return [], 0
    preference = list(request.types) or ["any"]
    if request.fallback_cpu:
        preference.append("cpu")
    return preference, request.count


def _port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not bounds.PORT_MIN <= port <= bounds.PORT_MAX:
        raise _fail("ports", f"{port!r} is not a port; use ints from {bounds.PORT_MIN} to {bounds.PORT_MAX}")
    return port


def _cidr(value: object) -> str:
    if not isinstance(value, str):
        raise _fail("allow_list", f"{value!r} is not a CIDR range; use strings such as '10.0.0.0/8' or '8.8.8.8/32'")
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError as exc:
        raise _fail("allow_list", f"{value!r} is not a CIDR range ({exc}); use '10.0.0.0/8' or '8.8.8.8/32'") from None


def _check_running(info: Mapping[str, Any]) -> None:
    from levers9.sdk.sandbox_errors import SandboxGone

    state, sandbox_id = info.get("state"), str(info.get("id", ""))
    reason = info.get("reason") or "no reason given"
    if state == "gone":
        raise SandboxGone(f"sandbox {sandbox_id} is gone: {reason}", type="SandboxGone", sandbox_id=sandbox_id)
    if state == "ended":
        raise SandboxEnded(f"sandbox {sandbox_id} has ended: {reason}", type="SandboxEnded", sandbox_id=sandbox_id)


class SandboxInstance:
    """One running sandbox: ``process``, ``fs``, and its lifecycle (``terminate``, ``update_ttl``, ...)."""

    def __init__(self, http: SandboxHTTP, info: Mapping[str, Any]) -> None:
        self.id = str(info["id"])
        #: what the controlplane said of the sandbox last (SandboxInfo: state, pool, worker_id, ...)
        self.info: dict[str, Any] = dict(info)
        self._ref = SandboxRef(http, self.id)
        self.process = SandboxProcessManager(self._ref)
        self.fs = SandboxFileSystem(self._ref)

    def __repr__(self) -> str:
        return f"<levers9.SandboxInstance {self.id}>"

    def __enter__(self) -> SandboxInstance:
        return self

    def __exit__(self, *_: object) -> None:
        self.terminate()

    def sandbox_id(self) -> str:
        return self.id

    # ------------------------------------------------------------------ coroutines (run on the sandbox loop)

    async def _terminate(self) -> bool:
        # asked first: the controlplane answers a DELETE of an ended sandbox with its info, as for a running one
        self.info = await self._ref.request("GET", "", what=f"terminate sandbox {self.id}")
        if self.info.get("state") in ENDED_STATES:
            return False
        try:
            self.info = await self._ref.request("DELETE", "", what=f"terminate sandbox {self.id}")
        except SandboxEnded:
            return False
        return True

    async def _update_ttl(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or (seconds != -1 and seconds <= 0):
            raise SandboxRequestError(f"update_ttl: {seconds!r}: use seconds above 0, or -1 for no deadline")
        body = {"seconds": 0 if seconds == -1 else float(seconds)}
        self.info = await self._ref.request("POST", "/ttl", what=f"update_ttl of sandbox {self.id}", json=body)

    async def _status(self) -> tuple[int, str]:
        self.info = await self._ref.request("GET", "", what=f"status of sandbox {self.id}")
        state = str(self.info.get("state", ""))
        return (-1 if state not in ENDED_STATES else 0 if state == "ended" else 1), state

    async def _expose_port(self, port: int) -> str:
        answer = await self._ref.request(
            "POST",
            f"/ports/{_port(port)}",
            what=f"expose port {port} of sandbox {self.id}",
            unsupported="expose sandbox ports",
        )
        return str(answer["url"])

    async def _snapshot_memory(self) -> str:
        answer = await self._ref.request(
            "POST",
            "/snapshots",
            what=f"snapshot sandbox {self.id}",
            unsupported="snapshot sandboxes",
            timeout=CREATE_TIMEOUT_S,
        )
        snapshot = answer.get("snapshot", answer)
        return str(snapshot["id"] if isinstance(snapshot, dict) else snapshot)

    async def _image_from_filesystem(self) -> str:
        answer = await self._ref.request(
            "POST",
            "/image",
            what=f"image of sandbox {self.id}'s filesystem",
            unsupported="make images of sandboxes' filesystems",
            timeout=CREATE_TIMEOUT_S,
        )
        return str(answer["image"])

    # ------------------------------------------------------------------ the user's methods

    def terminate(self) -> bool:
        """End the sandbox and everything in it; False when it had ended already."""
        return self._ref.http.run(self._terminate())

    def update_ttl(self, seconds: float) -> None:
        """The sandbox now ends ``seconds`` from now (-1: only when terminated)."""
        self._ref.http.run(self._update_ttl(seconds))

    def status(self) -> tuple[int, str]:
        """(-1, state) while it starts or runs; (0, "ended") once it ended as asked or timed out; (1, "gone") if it died.

        A sandbox has no exit status of its own, so the number only says which; ``info["reason"]`` says why.
        """
        return self._ref.http.run(self._status())

    def expose_port(self, port: int) -> str:
        """Reach ``port`` of the sandbox from outside, through the gateway; its URL."""
        return self._ref.http.run(self._expose_port(port))

    def snapshot_memory(self) -> str:
        """Snapshot the sandbox's memory and filesystem, processes and all (it runs on); the snapshot's id.

        The sandbox must have been created with ``snapshots=True``.
        """
        return self._ref.http.run(self._snapshot_memory())

    def create_image_from_filesystem(self) -> str:
        """Make an image of the sandbox's filesystem as it is now; its ref (a blueprint's image)."""
        return self._ref.http.run(self._image_from_filesystem())

    @property
    def aio(self) -> AsyncSandboxInstance:
        """The same sandbox with coroutines: ``await sb.aio.process.exec(...)``."""
        return AsyncSandboxInstance(self)


class AsyncSandboxInstance:
    """:class:`SandboxInstance` for async code: ``process`` and ``fs`` are their async variants."""

    def __init__(self, instance: SandboxInstance) -> None:
        self.sync = instance
        self.id = instance.id
        self.process = instance.process.aio
        self.fs = instance.fs.aio
        self._run = instance._ref.http.run_async

    def sandbox_id(self) -> str:
        return self.id

    async def terminate(self) -> bool:
        return await self._run(self.sync._terminate())

    async def update_ttl(self, seconds: float) -> None:
        await self._run(self.sync._update_ttl(seconds))

    async def status(self) -> tuple[int, str]:
        return await self._run(self.sync._status())

    async def expose_port(self, port: int) -> str:
        return await self._run(self.sync._expose_port(port))

    async def snapshot_memory(self) -> str:
        return await self._run(self.sync._snapshot_memory())

    async def create_image_from_filesystem(self) -> str:
        return await self._run(self.sync._image_from_filesystem())
