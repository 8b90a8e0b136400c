"""Where an agent's workers run: a machine's Docker, or Jobs in a namespace of a Kubernetes cluster.

:class:`~levers9.agent.daemon.Agent` drives one :class:`Backend`; each carries
out the same three orders (``provision``, ``terminate``, ``list``), reports
the same Inventory message and cleans up the same way when the controlplane
says the agent was removed. Invariants:

* :meth:`Backend.inventory` raises :class:`~levers9.agent.docker_workers.OrderRefused`
  when the workers' side cannot be read (Docker or the API server does not
  answer, RBAC refuses); the agent then sends no inventory, since an empty
  list would read as "every worker is gone".
* :meth:`Backend.change_key` is what tells an inventory worth sending from
  the last one: it keeps everything placement and reconciliation read and
  drops what changes while nothing does (Docker's free disk space; the text of
  a Kubernetes container state that flips between ``ErrImagePull`` and
  ``ImagePullBackOff`` as the kubelet retries). The agent still sends an
  unchanged inventory every ``inventory_every_s``, so no change is lost for
  long.
* Blocking calls (Docker, the Kubernetes API) run in threads; orders are the
  workers' own methods, called in a thread by the agent.

:class:`DockerBackend` is a joined machine's (:mod:`levers9.agent.docker_workers`,
GPUs from the GPU-discovery hook, asked again every ``gpus_every_s`` and at
once before a GPU order when none is known). :class:`K8sBackend` is an attached
cluster's (:mod:`levers9.agent.k8s_workers`; GPUs from the nodes' labels and
allocatable, typed by :func:`levers9.gpu.from_k8s_labels`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from levers9.agent.docker_workers import DockerWorkers
from levers9.agent.inventory import GpuSource, build_inventory
from levers9.agent.inventory import change_key as docker_change_key
from levers9.agent.k8s_credential import SECRET_NAME
from levers9.agent.k8s_workers import K8sWorkers, build_k8s_inventory
from levers9.gpu import from_k8s_labels
from levers9.hooks.types import GpuDevice
from levers9.proto.v1 import agent_pb2

__all__ = ["Action", "Backend", "DockerBackend", "K8sBackend", "k8s_change_key"]

log = logging.getLogger(__name__)

#: an order's action: its payload in, its result out (blocking; raises OrderRefused)
Action = Callable[[dict[str, Any]], dict[str, Any]]
#: waiting reasons the kubelet alternates with the failure they back off from
_BACKOFF_OF = {"ImagePullBackOff": "ErrImagePull", "CrashLoopBackOff": "Error"}


class Backend(Protocol):
    """What an agent's workers run on (see the module docstring)."""

    agent_id: str
    #: where the workers run, for the log: "Docker at unix:///...", "the Kubernetes API (namespace ns)"
    where: str
    #: what the operator does to join again after the controlplane refused the credential
    forget: str

    def actions(self) -> Mapping[str, Action]:
        """The orders this backend carries out, by kind."""

    async def before_order(self, kind: str, payload: Mapping[str, Any]) -> None:
        """Whatever must be known before the order runs (Docker: the GPUs, before a GPU order)."""

    async def inventory(self) -> agent_pb2.Inventory:
        """The Inventory now. :raises OrderRefused: the workers' side cannot be read."""

    def change_key(self, inventory: agent_pb2.Inventory) -> str:
        """What must differ between two inventories for the second to be sent before ``inventory_every_s``."""

    def remove_mine(self) -> list[str]:
        """Remove every worker of this agent (it was removed); their machine ids. :raises OrderRefused:."""

    def describe_removed(self, machine_ids: list[str]) -> str:
        """What :meth:`remove_mine` removed, a sentence for the log."""

    def close(self) -> None: ...


class DockerBackend:
    """A joined machine: worker containers on its Docker (see the module docstring)."""

    def __init__(self, workers: DockerWorkers, gpus: GpuSource, *, gpus_every_s: float = 300.0) -> None:
        self.workers = workers
        self.agent_id = workers.agent_id
        self.where = f"Docker at {workers.docker_host}"
        self.forget = "remove its state directory and join again with a new token"
        self._gpu_source = gpus
        self._gpus: list[GpuDevice] = []
        self._gpus_at = -float("inf")
        self.gpus_every_s = gpus_every_s
        workers.gpu_devices = lambda: list(self._gpus)

    def actions(self) -> Mapping[str, Action]:
        return {
            "provision": self.workers.provision,
            "terminate": self.workers.terminate,
            "list": lambda _payload: self.workers.list_containers(),
        }

    async def before_order(self, kind: str, payload: Mapping[str, Any]) -> None:
        if kind == "provision" and int(payload.get("gpu_count") or 0) > 0:
            await self._refresh_gpus(force=not self._gpus)

    async def _refresh_gpus(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._gpus_at < self.gpus_every_s:
            return
        self._gpus_at = time.monotonic()
        try:
            self._gpus = await self._gpu_source()
        except Exception as exc:  # the facade logs a failing plugin; anything else: keep what was known
            log.warning("GPU discovery failed: %s", exc)

    async def inventory(self) -> agent_pb2.Inventory:
        await self._refresh_gpus()
        facts, containers = await asyncio.to_thread(lambda: (self.workers.facts(), self.workers.containers()))
        return build_inventory(self.agent_id, self.workers.resources, self._gpus, facts, containers)

    def change_key(self, inventory: agent_pb2.Inventory) -> str:
        return docker_change_key(inventory)

    def remove_mine(self) -> list[str]:
        return self.workers.remove_mine()

    def describe_removed(self, machine_ids: list[str]) -> str:
        names = ", ".join(f"l9w-{m}" for m in machine_ids)
        return f"this machine was removed: stopped and removed its worker containers {names}"

    def close(self) -> None:
        self.workers.close()


def k8s_change_key(inventory: agent_pb2.Inventory) -> str:
    """A Kubernetes inventory's change key: all of it, but each worker's container state (and why it cannot
    start) by its reason only, a back-off read as the failure it backs off from (the kubelet alternates them,
    with new words each time)."""
    details = json.loads(inventory.details_json or "{}")
    for worker in details.get("workers") or []:
        for key in ("container", "cannot_start"):
            said = worker.get(key) if isinstance(worker, dict) else None
            if isinstance(said, str):
                reason = said.split(":", 1)[0].strip()
                worker[key] = _BACKOFF_OF.get(reason, reason)
    copy = agent_pb2.Inventory()
    copy.CopyFrom(inventory)
    copy.details_json = json.dumps(details, sort_keys=True)
    return copy.SerializeToString(deterministic=True).hex()


class K8sBackend:
    """An attached cluster: worker Jobs in the agent's namespace (see the module docstring)."""

    def __init__(self, workers: K8sWorkers) -> None:
        self.workers = workers
        self.agent_id = workers.agent_id
        self.where = f"the Kubernetes API (namespace {workers.namespace})"
        self.forget = (
            f"delete Secret {workers.namespace}/{SECRET_NAME} and join again with a new token (`levers9 cluster "
            "join` prints one)"
        )

    def actions(self) -> Mapping[str, Action]:
        return {
            "provision": self.workers.provision,
            "terminate": self.workers.terminate,
            "list": lambda _payload: self.workers.list_containers(),
        }

    async def before_order(self, kind: str, payload: Mapping[str, Any]) -> None:
        return None

    async def inventory(self) -> agent_pb2.Inventory:
        details = await asyncio.to_thread(self.workers.inventory_details)
        return build_k8s_inventory(self.agent_id, details, gpu_type=from_k8s_labels)

    def change_key(self, inventory: agent_pb2.Inventory) -> str:
        return k8s_change_key(inventory)

    def remove_mine(self) -> list[str]:
        return self.workers.remove_mine()

    def describe_removed(self, machine_ids: list[str]) -> str:
        return (
            f"this agent was removed: deleted its worker Jobs and Secrets in namespace {self.workers.namespace} "
            f"(machines {', '.join(machine_ids)})"
        )

    def close(self) -> None:
        self.workers.close()
