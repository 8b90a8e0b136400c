"""The Docker side of the agent: worker containers started, stopped and listed, one per levers9 machine.

It lives in the agent because only the agent uses it (:mod:`levers9.agent.daemon`
and its backends, on the joined machine); the controlplane's side of the same pools
is the ``agent_machine`` plugin and :mod:`levers9.services.agent_pools`, which
never import it (the orders between them are the wire's).

Each ``provision`` order runs one container named ``l9w-<machine_id>`` with the
labels ``levers9.machine-id``, ``levers9.pool``, ``levers9.agent-id``,
``levers9.workspace`` (empty for an operator's pool) and ``levers9.gpus`` (the
GPU uuids it holds, comma-separated), the resource limits of the order, GPU
device requests when it asks for GPUs, and the restart policy ``on-failure``
(3 tries). A worker of the ``process`` runtime gets nothing more (its
container is the isolation boundary, unprivileged); one of ``runc`` or
``gvisor`` gets what :mod:`levers9.agent.runtime_access` lists, with a state
volume ``l9w-<machine_id>-state`` removed with the container. Invariants:

* **Containers are the state.** Nothing is kept in memory or on disk about
  which workers run: every answer is read from Docker, so a restarted agent
  knows what the one before it started.
* **Idempotent.** A provision order for a machine whose container exists
  (whatever its state) answers with that container; a terminate order for a
  container that is not there succeeds (and removes the machine's volume if
  one is left). Orders are carried out one at a time,
  so two orders never pick the same GPUs.
* **Nothing is pulled.** The image must already be in the machine's Docker
  (``levers9 worker-image build`` puts it there); no registry is asked.
* **A container holds its GPUs, CPU and memory until it is removed**, whatever
  its state (a container that exited may be restarted by its policy).
* Secret environment values go into the container's environment and nowhere
  else: never into a log, a label or an error.
* **Workers reach the controlplane over TLS only.** A provision order whose
  worker would dial a plain-text controlplane (``LEVERS9_CONTROLPLANE_URL``
  not ``grpcs://``) is refused (``invalid_request``) unless the agent itself
  runs with ``--insecure`` (development only).

Failures are :class:`OrderRefused` with the provider error kind the
controlplane maps (docs/architecture.md §5.2): a missing image or a GPU order
on a machine without the NVIDIA Container Toolkit is ``invalid_request``, too
few free GPUs, CPU or memory is ``insufficient_capacity``, an unreachable
Docker is a plain provider error (kind ``""``). ``docker`` is imported inside
the functions that use it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from levers9.agent.runtime_access import check_access, worker_access
from levers9.hooks.types import GpuDevice
from levers9.worker_container import volume_name

if TYPE_CHECKING:
    import docker

__all__ = [
    "CONTAINER_PREFIX",
    "LABEL_AGENT",
    "LABEL_GPUS",
    "LABEL_MACHINE",
    "LABEL_POOL",
    "LABEL_WORKSPACE",
    "DockerFacts",
    "DockerWorkers",
    "OrderRefused",
    "ProvisionOrder",
    "WorkerContainer",
    "container_name",
]

log = logging.getLogger(__name__)

CONTAINER_PREFIX = "l9w-"
LABEL_MACHINE = "levers9.machine-id"
LABEL_POOL = "levers9.pool"
LABEL_AGENT = "levers9.agent-id"
LABEL_WORKSPACE = "levers9.workspace"
LABEL_GPUS = "levers9.gpus"
RESTART_POLICY = {"Name": "on-failure", "MaximumRetryCount": 3}
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
#: seconds a Docker API call may take (a stop waits its grace on top)
DOCKER_TIMEOUT_S = 60
_EXITED = ("exited", "dead")
_INVALID = "invalid_request"
_NO_ROOM = "insufficient_capacity"


class OrderRefused(Exception):
    """An order the agent will not or cannot carry out; ``kind`` is the provider error kind ("" = plain)."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


def container_name(machine_id: str) -> str:
    return f"{CONTAINER_PREFIX}{machine_id}"


# ---------------------------------------------------------------------------------------------- values


@dataclass(frozen=True)
class ProvisionOrder:
    """A ``provision`` order's payload, checked."""

    machine_id: str
    pool: str
    workspace: str | None
    image: str
    command: list[str]
    env: dict[str, str]
    secret_env: dict[str, str]
    cpu_millicores: int
    memory_mib: int
    gpu: str | None
    gpu_count: int
    network_mode: str
    gpu_runtime: str | None
    #: the pool's runtime: ``runc`` and ``gvisor`` workers get what :mod:`levers9.agent.runtime_access` lists
    runtime: str = "process"

    @classmethod
    def parse(cls, payload: Mapping[str, Any]) -> ProvisionOrder:
        """:raises OrderRefused: (invalid_request) a field is missing or of the wrong type, named."""

        def text(key: str, *, optional: bool = False) -> Any:
            value = payload.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, str) or not value:
                raise OrderRefused(f"provision order: {key!r} must be a non-empty string, got {value!r}", _INVALID)
            return value

        def number(key: str) -> int:
            value = payload.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise OrderRefused(f"provision order: {key!r} must be an integer >= 0, got {value!r}", _INVALID)
            return value

        def strings(key: str) -> dict[str, str]:
            value = payload.get(key) or {}
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise OrderRefused(f"provision order: {key!r} must be an object of strings", _INVALID)
            return dict(value)

        command = payload.get("command") or []
        if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
            raise OrderRefused(f"provision order: 'command' must be a list of strings, got {command!r}", _INVALID)
        machine_id = text("machine_id")
        if not all(c.isalnum() or c in "_.-" for c in machine_id):
            raise OrderRefused(f"provision order: machine_id {machine_id!r} may hold letters, digits, '_.-'", _INVALID)
        gpu_runtime = text("gpu_runtime", optional=True)
        if gpu_runtime not in (None, "nvidia"):
            raise OrderRefused(f"provision order: gpu_runtime must be 'nvidia' or null, got {gpu_runtime!r}", _INVALID)
        runtime = text("runtime", optional=True) or "process"
        if not all(c.isalnum() or c in "_-" for c in runtime):
            raise OrderRefused(f"provision order: runtime {runtime!r} may hold letters, digits, '_-'", _INVALID)
        network_mode = text("network_mode", optional=True) or "bridge"
        try:
            check_access(runtime, network_mode)
        except ValueError as exc:
            raise OrderRefused(f"provision order: {exc}", _INVALID) from None
        return cls(
            machine_id=machine_id,
            pool=text("pool"),
            workspace=text("workspace", optional=True),
            image=text("image"),
            command=list(command),
            env=strings("env"),
            secret_env=strings("secret_env"),
            cpu_millicores=number("cpu_millicores"),
            memory_mib=number("memory_mib"),
            gpu=text("gpu", optional=True),
            gpu_count=number("gpu_count"),
            network_mode=network_mode,
            gpu_runtime=gpu_runtime,
            runtime=runtime,
        )


@dataclass(frozen=True)
class WorkerContainer:
    """One levers9 container as Docker reports it."""

    machine_id: str
    pool: str
    agent_id: str
    container_id: str
    state: str
    exit_code: int | None
    gpus: list[str]
    cpu_millicores: int
    memory_mib: int

    def info(self) -> dict[str, Any]:
        """The ContainerInfo shape of the ``list`` result and the inventory's details."""
        return {
            "machine_id": self.machine_id,
            "pool": self.pool,
            "container_id": self.container_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "gpus": list(self.gpus),
        }


@dataclass(frozen=True)
class DockerFacts:
    version: str
    runtimes: list[str]
    root_dir: str

    @property
    def nvidia(self) -> bool:
        return "nvidia" in self.runtimes


def _worker(container: Any) -> WorkerContainer:
    attrs = container.attrs
    labels = dict(container.labels or {})
    state = (attrs.get("State") or {}).get("Status") or container.status or "unknown"
    host = attrs.get("HostConfig") or {}
    exit_code = (attrs.get("State") or {}).get("ExitCode") if state in _EXITED else None
    gpus = [g for g in labels.get(LABEL_GPUS, "").split(",") if g]
    return WorkerContainer(
        machine_id=labels.get(LABEL_MACHINE, ""),
        pool=labels.get(LABEL_POOL, ""),
        agent_id=labels.get(LABEL_AGENT, ""),
        container_id=container.id,
        state=state,
        exit_code=int(exit_code) if exit_code is not None else None,
        gpus=gpus,
        cpu_millicores=int(host.get("NanoCpus") or 0) // 1_000_000,
        memory_mib=int(host.get("Memory") or 0) // (1024 * 1024),
    )


def _run(
    client: docker.DockerClient, image: str, command: list[str] | None, options: dict[str, Any], raw: dict[str, Any]
) -> Any:
    """``client.containers.run(image, command, **options)``, with the HostConfig fields of ``raw`` set as well.

    The SDK has no argument for some fields (``MaskedPaths`` and ``ReadonlyPaths``: what the CLI's
    ``--security-opt systempaths=unconfined`` sets), so with any such field the container is created with the
    low-level API: the host config built by the SDK from the same options, then completed.
    """
    if not raw:
        return client.containers.run(image, command, **options)
    own = {"name", "labels", "environment", "detach"}
    host = client.api.create_host_config(
        **{("binds" if key == "volumes" else key): value for key, value in options.items() if key not in own}
    )
    host.update(raw)
    made = client.api.create_container(
        image,
        command,
        name=options["name"],
        labels=options["labels"],
        environment=options["environment"],
        detach=True,
        host_config=host,
    )
    client.api.start(made["Id"])
    return client.containers.get(made["Id"])


def _absent_device(exc: BaseException, devices: list[str]) -> str | None:
    """The host device of ``devices`` (``/dev/fuse:/dev/fuse:rwm``) Docker refused as not there, or None."""
    said = str(getattr(exc, "explanation", None) or exc)
    for device in devices:
        host = device.split(":", 1)[0]
        if host in said and ("no such file" in said.lower() or "gathering device" in said.lower()):
            return host
    return None


# ---------------------------------------------------------------------------------------------- the manager


class DockerWorkers:
    """The agent's worker containers on one Docker daemon (blocking calls: run them in a thread)."""

    def __init__(
        self,
        agent_id: str,
        *,
        docker_host: str | None = None,
        resources: tuple[int, int] = (0, 0),
        gpus: Callable[[], Sequence[GpuDevice]] = list,
        stop_grace_s: float = 10.0,
        insecure: bool = False,
    ) -> None:
        self.agent_id = agent_id
        #: the agent runs with --insecure: workers may dial a plain-text controlplane too
        self.insecure = insecure
        self.docker_host = docker_host or DEFAULT_DOCKER_HOST
        #: (CPU millicores, memory MiB) of the machine
        self.resources = resources
        #: the machine's GPUs as last discovered (the agent replaces this with its cached discovery)
        self.gpu_devices = gpus
        self.stop_grace_s = stop_grace_s
        self._orders = threading.Lock()
        self._clients: dict[str, docker.DockerClient] = {}
        self._clients_lock = threading.Lock()

    def close(self) -> None:
        with self._clients_lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    def _client(self, role: str) -> docker.DockerClient:
        """One client per role ("orders", "inventory"), so a slow stop never holds up an inventory."""
        try:
            import docker
        except ImportError as exc:
            raise OrderRefused(
                f"the Docker SDK is not installed where this agent runs ({exc}): pip install 'docker>=7'"
            ) from None

        with self._clients_lock:
            client = self._clients.get(role)
            if client is None:
                try:
                    client = docker.DockerClient(base_url=self.docker_host, timeout=DOCKER_TIMEOUT_S)
                except docker.errors.DockerException as exc:
                    raise OrderRefused(self._unreachable(exc)) from None
                self._clients[role] = client
            return client

    def _unreachable(self, exc: BaseException) -> str:
        return f"cannot reach Docker at {self.docker_host}: {exc}"

    # -------------------------------------------------------------------------- reading

    def facts(self, role: str = "inventory") -> DockerFacts:
        """Docker's version and runtimes. :raises OrderRefused: Docker is unreachable."""
        client = self._client(role)  # first: it says so when the Docker SDK is missing
        import docker

        try:
            info = client.info()
            version = client.version()
        except (docker.errors.DockerException, OSError) as exc:
            raise OrderRefused(self._unreachable(exc)) from None
        return DockerFacts(
            version=str(version.get("Version", "")),
            runtimes=sorted((info.get("Runtimes") or {}).keys()),
            root_dir=str(info.get("DockerRootDir") or "/"),
        )

    def containers(self, role: str = "inventory") -> list[WorkerContainer]:
        """Every levers9 worker container on this Docker (any agent's), by machine id.

        :raises OrderRefused: Docker is unreachable.
        """
        client = self._client(role)  # first: it says so when the Docker SDK is missing
        import docker

        try:
            found = client.containers.list(all=True, filters={"label": LABEL_MACHINE})
        except docker.errors.NotFound:  # a container removed while listing: list again
            found = client.containers.list(all=True, filters={"label": LABEL_MACHINE})
        except (docker.errors.DockerException, OSError) as exc:
            raise OrderRefused(self._unreachable(exc)) from None
        return sorted((_worker(c) for c in found), key=lambda w: w.machine_id)

    def mine(self, containers: Sequence[WorkerContainer]) -> list[WorkerContainer]:
        return [c for c in containers if c.agent_id == self.agent_id]

    def list_containers(self) -> dict[str, Any]:
        """The ``list`` order's result: this agent's containers."""
        return {"containers": [c.info() for c in self.mine(self.containers("orders"))]}

    # -------------------------------------------------------------------------- orders

    def provision(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Start the order's worker container, or answer with the one that exists. :raises OrderRefused:."""
        order = ProvisionOrder.parse(payload)
        self._check_tls(order)
        with self._orders:
            return self._provision(order)

    def _check_tls(self, order: ProvisionOrder) -> None:
        from levers9.proto.target import TargetError, parse_targets

        url = order.env.get("LEVERS9_CONTROLPLANE_URL", "")
        if not url:  # nothing to dial: the worker says so itself when it starts
            return
        try:
            _, tls = parse_targets(url)
        except TargetError as exc:
            raise OrderRefused(f"provision order: LEVERS9_CONTROLPLANE_URL: {exc}", _INVALID) from None
        if not tls and not self.insecure:
            raise OrderRefused(
                f"the worker of machine {order.machine_id} would reach the controlplane in plain text ({url}): "
                "workers reach it over TLS only; serve the controlplane with listen.tls (grpcs://), or run this "
                "agent with --insecure on a development machine",
                _INVALID,
            )

    def _provision(self, order: ProvisionOrder) -> dict[str, Any]:
        import docker

        name = container_name(order.machine_id)
        existing = {c.machine_id: c for c in self.containers("orders")}
        if order.machine_id in existing:
            return self._result(existing[order.machine_id])
        client = self._client("orders")
        try:
            client.images.get(order.image)
        except docker.errors.ImageNotFound:
            raise OrderRefused(
                f"image {order.image!r} is not in this machine's Docker ({self.docker_host}); levers9 pulls from no "
                f"registry: build and load it on this machine with `levers9 worker-image build --tag {order.image}`",
                _INVALID,
            ) from None
        except (docker.errors.DockerException, OSError) as exc:
            raise OrderRefused(self._unreachable(exc)) from None
        gpus = self._pick_gpus(order, existing.values()) if order.gpu_count > 0 else []
        self._check_room(order, existing.values())
        labels = {
            LABEL_MACHINE: order.machine_id,
            LABEL_POOL: order.pool,
            LABEL_AGENT: self.agent_id,
            LABEL_WORKSPACE: order.workspace or "",
            LABEL_GPUS: ",".join(gpus),
        }
        access = worker_access(order.runtime, order.machine_id)
        options: dict[str, Any] = {
            **access.options,
            "name": name,
            "labels": labels,
            "environment": {**order.env, **access.env, **order.secret_env},
            "detach": True,
            "restart_policy": dict(RESTART_POLICY),
            "network_mode": order.network_mode,
        }
        if order.cpu_millicores:
            options["nano_cpus"] = order.cpu_millicores * 1_000_000
        if order.memory_mib:
            options["mem_limit"] = f"{order.memory_mib}m"
        if gpus:
            options["device_requests"] = [
                docker.types.DeviceRequest(driver="nvidia", device_ids=gpus, capabilities=[["gpu"]])
            ]
        try:
            if access.volume is not None:
                client.volumes.create(
                    access.volume, labels={LABEL_MACHINE: order.machine_id, LABEL_AGENT: self.agent_id}
                )
            try:
                container = _run(client, order.image, order.command or None, options, access.host_config)
            except docker.errors.APIError as exc:
                absent = _absent_device(exc, options.get("devices") or [])
                if absent is None:
                    raise
                # FUSE only mounts volumes: the worker starts without it and refuses those calls, saying why
                log.warning("this machine has no %s (modprobe fuse): %s starts without it", absent, name)
                self._remove_quietly(client, name)
                options["devices"] = [d for d in options["devices"] if not d.startswith(f"{absent}:")]
                container = _run(client, order.image, order.command or None, options, access.host_config)
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # the name is taken: by a worker created meanwhile, or by something else
                again = {c.machine_id: c for c in self.containers("orders")}
                if order.machine_id in again:
                    return self._result(again[order.machine_id])
                with contextlib.suppress(docker.errors.DockerException, OSError):
                    self._remove_volume(client, order.machine_id)  # made for this order, held by no container
                raise OrderRefused(
                    f"a container named {name} that levers9 did not start exists; remove it", _INVALID
                ) from None
            self._remove_quietly(client, name)
            raise OrderRefused(f"Docker could not start {name}: {exc.explanation or exc}") from None
        except (docker.errors.DockerException, OSError) as exc:
            self._remove_quietly(client, name)
            raise OrderRefused(f"Docker could not start {name}: {exc}") from None
        log.info("started worker container %s (%s) for pool %s", name, container.id[:12], order.pool)
        return {"container_id": container.id, "name": name, "machine_id": order.machine_id, "gpus": gpus}

    def _result(self, container: WorkerContainer) -> dict[str, Any]:
        return {
            "container_id": container.container_id,
            "name": container_name(container.machine_id),
            "machine_id": container.machine_id,
            "gpus": list(container.gpus),
        }

    def _pick_gpus(self, order: ProvisionOrder, existing: Any) -> list[str]:
        if order.gpu_runtime is None:
            raise OrderRefused(
                f"the order asks for {order.gpu_count} GPU(s) but pool {order.pool!r} sets gpu_runtime: none "
                "(CPU-only machines); set gpu_runtime: nvidia",
                _INVALID,
            )
        facts = self.facts("orders")
        if not facts.nvidia:
            raise OrderRefused(
                f"the order asks for {order.gpu_count} GPU(s) but this machine's Docker ({self.docker_host}) has no "
                f"'nvidia' runtime (runtimes: {', '.join(facts.runtimes) or 'none'}): install the NVIDIA Container "
                "Toolkit (nvidia-container-toolkit), run `nvidia-ctk runtime configure --runtime=docker` and "
                "restart Docker",
                _INVALID,
            )
        held = {uuid for container in existing for uuid in container.gpus}
        devices = list(self.gpu_devices())
        fitting = [d for d in devices if order.gpu is None or d.gpu == order.gpu]
        free = [d.uuid for d in fitting if d.uuid not in held]
        if len(free) < order.gpu_count:
            raise OrderRefused(
                f"the order asks for {order.gpu_count} {order.gpu or 'GPU'}(s); this machine has {len(fitting)}, "
                f"{len(free)} of them free",
                _NO_ROOM,
            )
        return free[: order.gpu_count]

    def _check_room(self, order: ProvisionOrder, existing: Any) -> None:
        cpu, memory = self.resources
        reserved = list(existing)
        free_cpu = cpu - sum(c.cpu_millicores for c in reserved)
        free_memory = memory - sum(c.memory_mib for c in reserved)
        if cpu and order.cpu_millicores > free_cpu:
            raise OrderRefused(
                f"the order asks for {order.cpu_millicores} CPU millicores; {max(free_cpu, 0)} of {cpu} are free",
                _NO_ROOM,
            )
        if memory and order.memory_mib > free_memory:
            raise OrderRefused(
                f"the order asks for {order.memory_mib} MiB of memory; {max(free_memory, 0)} of {memory} are free",
                _NO_ROOM,
            )

    def terminate(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Stop (with the grace period) and remove the machine's container; done when it is not there."""
        machine_id = payload.get("machine_id")
        if not isinstance(machine_id, str) or not machine_id:
            raise OrderRefused(
                f"terminate order: 'machine_id' must be a non-empty string, got {machine_id!r}", _INVALID
            )
        with self._orders:
            return self._terminate(machine_id)

    def _terminate(self, machine_id: str) -> dict[str, Any]:
        import docker

        client = self._client("orders")
        try:
            found = client.containers.list(all=True, filters={"label": f"{LABEL_MACHINE}={machine_id}"})
            names = {c.name for c in found}
            if container_name(machine_id) not in names:
                with contextlib.suppress(docker.errors.NotFound):
                    found.append(client.containers.get(container_name(machine_id)))
            for container in found:
                try:
                    container.stop(timeout=max(0, round(self.stop_grace_s)))
                    container.remove(force=True)
                except docker.errors.NotFound:
                    continue
                log.info("removed worker container %s (%s)", container.name, container.id[:12])
            self._remove_volume(client, machine_id)
        except docker.errors.APIError as exc:
            raise OrderRefused(
                f"Docker could not remove {container_name(machine_id)}: {exc.explanation or exc}"
            ) from None
        except (docker.errors.DockerException, OSError) as exc:
            raise OrderRefused(self._unreachable(exc)) from None
        return {"machine_id": machine_id, "removed": len(found)}

    def remove_mine(self) -> list[str]:
        """Stop and remove every worker container of this agent (its machine was removed); their machine ids."""
        removed = []
        for container in self.mine(self.containers("orders")):
            with self._orders:
                self._terminate(container.machine_id)
            removed.append(container.machine_id)
        return removed

    @staticmethod
    def _remove_volume(client: docker.DockerClient, machine_id: str) -> None:
        """Remove the machine's state volume (an OCI runtime's worker has one), once no container holds it."""
        import docker

        try:
            client.volumes.get(volume_name(machine_id)).remove(force=True)
        except docker.errors.NotFound:
            return
        log.info("removed worker volume %s", volume_name(machine_id))

    def _remove_quietly(self, client: docker.DockerClient, name: str) -> None:
        import docker

        with contextlib.suppress(docker.errors.DockerException, OSError):
            client.containers.get(name).remove(force=True)
        with contextlib.suppress(docker.errors.DockerException, OSError):
            self._remove_volume(client, name.removeprefix(CONTAINER_PREFIX))
