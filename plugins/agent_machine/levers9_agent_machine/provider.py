"""The ``agent_machine`` provider's hooks: offers from the joined machines' inventories, orders to their agents.

A pool is served by the agents that joined for it: agents of this provider,
of the pool's own workspace (``pool.workspace``; None: the operator's), whose
join token's ``pool`` label is the pool's name. So one workspace's pool never
sees, and never orders, another workspace's machine. An agent *serves* (gets
offers and new workers) while connected and heard from within the pool's
``heartbeat_timeout_s``.

* offers: for a GPU pool, one :class:`GpuOffer` per serving agent with enough
  free GPUs of the pool's type and fewer than ``max_workers_per_machine`` of
  the pool's containers alive; ``zone`` is the agent id. A CPU pool gets none,
  and provision picks among the agents that fit, the most free CPU first: one
  that refuses (its Docker failed, it lost its room meanwhile) is followed by
  the next in the same call, and is tried last for :data:`REFUSED_LAST_S`;
  only when every one refused is the pool refused (and so marked unavailable
  by the scheduler, which for a pool without offers means the whole pool: one
  box's refusal stalled a CPU pool for three minutes before).
* provision: a ``provision`` order (payload as the design of issue 17 says,
  plus the pool's ``runtime``) to the offer's agent, acknowledged within the provision deadline; the
  machine is ``l9w-<machine_id>`` on that agent. A runc or gvisor pool whose
  ``docker_network_mode`` is not ``host`` is :class:`InvalidRequest`. An agent that is not
  connected is :class:`InsufficientCapacity` (the hub says so), a refusal is
  the typed error its ``error_kind`` names.
* terminate: a ``terminate`` order to ``provider_data["agent_id"]``. An agent
  not connected is :class:`AgentOffline`, retryable: the reconciler tries
  again and the order is never forgotten. An agent no longer known (removed
  with ``levers9 machine remove``) has nothing left to stop: success.
* list: the containers of the pool in each agent's last inventory; running
  -> RUNNING, created/restarting -> PENDING, exited/dead -> FAILED with the
  exit code. An agent silent past ``heartbeat_timeout_s`` has every machine
  reported FAILED ("agent <name> silent for N s"), so its calls are requeued.

Nothing heavy is imported here: the hub comes from ``levers9_startup``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from levers9.bootstrap import container_spec
from levers9.gpu.catalog import CATALOG
from levers9.hooks.agent_providers import AGENT_MACHINE, AgentBackedProvider, AgentOffline
from levers9.hooks.context import AgentInventory, AgentOrder
from levers9.hooks.errors import InsufficientCapacity, InvalidRequest, ProviderError
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    Availability,
    GpuOffer,
    Machine,
    MachineState,
    Pool,
    ProviderCheck,
    ProvisionRequest,
    settings_of,
)
from levers9.worker_container import OCI_RUNTIMES
from levers9_agent_machine.settings import AgentMachineSettings

__all__ = ["PROVIDER", "AgentMachineProvider", "AgentOffline", "container_name"]

#: the provider these hooks serve (its name is shared with the controlplane's services: levers9.hooks.agent_providers)
PROVIDER = AGENT_MACHINE
#: the longest a provision order waits for its acknowledgement (the hook's own deadline is 120 s)
PROVISION_ORDER_S = 110.0
#: the longest a terminate order waits (the hook's deadline is 30 s; the agent stops with 10 s grace)
TERMINATE_ORDER_S = 20.0
#: how long an agent that refused a CPU pool's worker is tried after the others
REFUSED_LAST_S = 60.0
_STATES = {
    "running": MachineState.RUNNING,
    "created": MachineState.PENDING,
    "restarting": MachineState.PENDING,
    "paused": MachineState.PENDING,
    "removing": MachineState.STOPPING,
    "exited": MachineState.FAILED,
    "dead": MachineState.FAILED,
}
#: a container in these states still holds its place on the machine
_ALIVE = frozenset({"running", "created", "restarting", "paused"})


def container_name(machine_id: str) -> str:
    return f"l9w-{machine_id}"


def _settings(pool: Pool) -> AgentMachineSettings:
    return settings_of(pool, AgentMachineSettings)


def _containers(agent: AgentInventory, pool: str) -> list[dict[str, Any]]:
    details = agent.capacity.get("details")
    found = details.get("containers") if isinstance(details, dict) else None
    if not isinstance(found, list):
        return []
    return [c for c in found if isinstance(c, dict) and c.get("pool") == pool and c.get("machine_id")]


def _free(agent: AgentInventory) -> dict[str, Any]:
    free = agent.capacity.get("free")
    return free if isinstance(free, dict) else {}


def _num(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 0


def _name(agent: AgentInventory) -> str:
    return agent.labels.get("name") or agent.labels.get("hostname") or agent.agent_id


class AgentMachineProvider(AgentBackedProvider):
    """The plugin: its ``levers9_*`` methods are the hooks; its state is the plugin context (its agent hub) and a clock."""

    #: the edition of the hook spec these methods are written to
    LEVERS9_SPEC_VERSION = 2
    settings_model = AgentMachineSettings
    provider_name = PROVIDER
    agents_of = "the joined machines'"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        #: agent id -> until when it is tried last (it refused a worker of a pool without offers)
        self._refused: dict[str, float] = {}

    # -------------------------------------------------------------------------- the pool's agents

    def agents(self, pool: Pool) -> list[AgentInventory]:
        """Every agent that joined for ``pool`` (connected or not), of the pool's workspace only."""
        hub = self.hub_context().agents
        assert hub is not None
        found = hub.inventories(PROVIDER, workspace=pool.workspace)
        return [a for a in found if a.labels.get("pool") == pool.name and a.workspace == pool.workspace]

    def serving(self, pool: Pool) -> list[AgentInventory]:
        """The pool's agents that are connected and were heard from within ``heartbeat_timeout_s``."""
        timeout = _settings(pool).heartbeat_timeout_s
        return [a for a in self.agents(pool) if a.connected and self.silent_for(a) <= timeout]

    def _fits(self, pool: Pool, agent: AgentInventory, cpu_millicores: int = 0, memory_mib: int = 0) -> bool:
        settings = _settings(pool)
        alive = [c for c in _containers(agent, pool.name) if c.get("state") in _ALIVE]
        if len(alive) >= settings.max_workers_per_machine:
            return False
        free = _free(agent)
        if pool.gpu and pool.gpu_count > 0:
            gpus = free.get("gpus")
            if not isinstance(gpus, dict) or _num(gpus.get(pool.gpu)) < pool.gpu_count:
                return False
        return _num(free.get("cpu_millicores")) >= cpu_millicores and _num(free.get("memory_mib")) >= memory_mib

    # -------------------------------------------------------------------------- hooks

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        if not pool.gpu or pool.gpu_count <= 0:
            return []
        if self.ctx is None or self.ctx.agents is None:
            # outside a controlplane (``levers9 offers`` from a config file) no agent connects: none to offer,
            # which is no failure of the pool's (provisioning still says where the agents are)
            return []
        gpu_type = CATALOG.get(pool.gpu)
        memory = gpu_type.memory_mib if gpu_type is not None else 1
        offers = []
        for agent in self.serving(pool):
            if not self._fits(pool, agent):
                continue
            free = _free(agent)
            offers.append(
                GpuOffer(
                    gpu=pool.gpu,
                    gpu_count=pool.gpu_count,
                    gpu_memory_mib=max(1, memory),
                    zone=agent.agent_id,
                    instance_type=_name(agent),
                    cpu_millicores=_num(free.get("cpu_millicores")) or None,
                    memory_mib=_num(free.get("memory_mib")) or None,
                    availability=Availability.AVAILABLE,
                )
            )
        return offers

    def _pick(self, request: ProvisionRequest) -> list[AgentInventory]:
        """The agents to order the worker from, in turn: the offer's, else every one that fits, best first."""
        pool, resources = request.pool, request.resources
        serving = self.serving(pool)
        if request.offer is not None and request.offer.zone:
            chosen = next((a for a in serving if a.agent_id == request.offer.zone), None)
            if chosen is None:
                raise InsufficientCapacity(
                    f"agent {request.offer.zone} no longer serves pool {pool.name!r} (disconnected, silent past "
                    f"{_settings(pool).heartbeat_timeout_s:g} s, or removed)"
                )
            return [chosen]
        fitting = [a for a in serving if self._fits(pool, a, resources.cpu_millicores, resources.memory_mib)]
        if not fitting:
            raise InsufficientCapacity(
                f"no joined machine of pool {pool.name!r} can take a worker of {resources.cpu_millicores} "
                f"millicores and {resources.memory_mib} MiB now ({len(serving)} connected; each runs at most "
                f"{_settings(pool).max_workers_per_machine} of this pool's workers)"
            )
        now = self._clock()
        self._refused = {agent_id: until for agent_id, until in self._refused.items() if until > now}
        return sorted(
            fitting,
            key=lambda a: (a.agent_id in self._refused, -_num(_free(a).get("cpu_millicores")), a.agent_id),
        )

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        ctx = self.hub_context()
        pool, resources = request.pool, request.resources
        settings = _settings(pool)
        agents = self._pick(request)
        gpu_count = resources.gpu_count if resources.gpu else 0
        if gpu_count and settings.gpu_runtime is None:
            raise InvalidRequest(
                f"pool {pool.name!r} asks for {gpu_count} GPU(s) but its gpu_runtime is none: set gpu_runtime: "
                "nvidia (the NVIDIA Container Toolkit on the machine)"
            )
        if pool.runtime in OCI_RUNTIMES and settings.docker_network_mode != "host":
            raise InvalidRequest(
                f"pool {pool.name!r}: runtime {pool.runtime!r} needs docker_network_mode: host (got "
                f"{settings.docker_network_mode!r}); its workers' bridge and host guard belong on the machine's network"
            )
        try:
            spec = container_spec(request.bootstrap.model_copy(update={"worker_image": settings.worker_image}))
        except ValueError as exc:
            raise InvalidRequest(f"pool {pool.name!r}: {exc}") from None
        payload: dict[str, Any] = {
            "machine_id": request.machine_id,
            "pool": pool.name,
            "workspace": pool.workspace,
            "image": settings.worker_image,
            "command": list(spec.command),
            "env": dict(spec.env),
            "secret_env": dict(spec.secret_env),
            "cpu_millicores": resources.cpu_millicores,
            "memory_mib": resources.memory_mib,
            "gpu": resources.gpu if gpu_count else None,
            "gpu_count": gpu_count,
            "network_mode": settings.docker_network_mode,
            "gpu_runtime": settings.gpu_runtime if gpu_count else None,
            "runtime": pool.runtime,
        }
        refusals: list[tuple[AgentInventory, ProviderError]] = []
        for agent in agents:
            order = AgentOrder(
                agent_id=agent.agent_id, kind="provision", payload=payload, order_id=f"prov-{request.machine_id}"
            )
            try:
                ack = ctx.send_order(order, timeout=PROVISION_ORDER_S)
            except TimeoutError as exc:  # it may still start the worker: no other agent may be asked for it
                raise ProviderError(f"pool {pool.name!r}: {exc}") from None
            except ProviderError as exc:
                if len(agents) == 1:
                    raise
                self._refused[agent.agent_id] = self._clock() + REFUSED_LAST_S
                refusals.append((agent, exc))
                continue
            break
        else:
            raise _every_refusal(pool, refusals)
        container_id = ack.result.get("container_id")
        return Machine(
            provider_id=container_name(request.machine_id),
            machine_id=request.machine_id,
            pool=pool.name,
            state=MachineState.PENDING,
            gpu=resources.gpu if gpu_count else None,
            gpu_count=gpu_count,
            zone=agent.agent_id,
            instance_type=_name(agent),
            labels={"agent": agent.agent_id},
            provider_data={"agent_id": agent.agent_id, "container_id": str(container_id or "")},
        )

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        ctx = self.hub_context()
        agent_id = str(machine.provider_data.get("agent_id") or machine.zone or "")
        machine_id = machine.machine_id or machine.provider_id.removeprefix("l9w-")
        assert ctx.agents is not None
        known = {a.agent_id: a for a in ctx.agents.inventories(PROVIDER)}
        if not agent_id:  # the provisioning answer was lost: the agents' own reports say who runs it
            agent_id = next((a.agent_id for a in known.values() if machine_id in _reported_ids(a)), "")
            if not agent_id:  # no agent runs it for levers9: nothing to stop
                return
        if agent_id not in known:  # removed (or never joined): nothing of it can run for levers9 any more
            return
        order = AgentOrder(
            agent_id=agent_id, kind="terminate", payload={"machine_id": machine_id}, order_id=f"term-{machine_id}"
        )
        try:
            ctx.send_order(order, timeout=TERMINATE_ORDER_S)
        except InsufficientCapacity as exc:  # the hub's "not connected"
            raise AgentOffline(
                f"cannot stop {machine.provider_id} now: {exc}; it is stopped once the agent reconnects"
            ) from None
        except TimeoutError as exc:
            raise AgentOffline(str(exc)) from None

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        timeout = _settings(pool).heartbeat_timeout_s
        machines = []
        for agent in self.agents(pool):
            silent = self.silent_for(agent)
            gone = silent > timeout
            for container in _containers(agent, pool.name):
                machine_id = str(container["machine_id"])
                docker_state = str(container.get("state") or "")
                state = _STATES.get(docker_state, MachineState.UNKNOWN)
                reason = None
                if gone:
                    state = MachineState.FAILED
                    reason = f"agent {_name(agent)} silent for {silent:.0f} s"
                elif state is MachineState.FAILED:
                    reason = f"worker container exited with code {container.get('exit_code')}"
                gpus = container.get("gpus")
                machines.append(
                    Machine(
                        provider_id=container_name(machine_id),
                        machine_id=machine_id,
                        pool=pool.name,
                        state=state,
                        gpu_count=len(gpus) if isinstance(gpus, list) else 0,
                        zone=agent.agent_id,
                        instance_type=_name(agent),
                        provider_data={
                            "agent_id": agent.agent_id,
                            "container_id": str(container.get("container_id") or ""),
                        },
                        reason=reason,
                    )
                )
        return machines

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        if self.ctx is None or self.ctx.agents is None:
            return ProviderCheck(
                ok=True,
                message="no agent hub here: joined machines are seen by a running controlplane only",
                hint="run 'levers9 machines' against the controlplane to see them",
            )
        joined = self.agents(pool)
        serving = self.serving(pool)
        if not serving:
            return ProviderCheck(
                ok=False,
                message=f"no joined machine serves pool {pool.name!r} now ({len(joined)} joined, none connected)",
                hint=f"join one with 'levers9 machine create --pool {pool.name}'",
            )
        gpus = sum(_num((_free(a).get("gpus") or {}).get(pool.gpu or "")) for a in serving) if pool.gpu else 0
        what = f", {gpus} free {pool.gpu}" if pool.gpu else ""
        return ProviderCheck(ok=True, message=f"{len(serving)} of {len(joined)} joined machines connected{what}")


def _reported_ids(agent: AgentInventory) -> set[str]:
    """The machine ids of every levers9 container ``agent`` last reported, in any state."""
    details = agent.capacity.get("details")
    found = details.get("containers") if isinstance(details, dict) else None
    ids = {str(c.get("machine_id")) for c in found if isinstance(c, dict)} if isinstance(found, list) else set()
    return ids | set(agent.machines)


def _every_refusal(pool: Pool, refusals: list[tuple[AgentInventory, ProviderError]]) -> ProviderError:
    """One error for a pool whose every fitting agent refused: of their kind when they agree, else capacity."""
    said = "; ".join(f"{_name(agent)} ({exc.message})" for agent, exc in refusals)
    message = f"every joined machine of pool {pool.name!r} that fits refused the worker ({said})"
    kinds = {type(exc) for _, exc in refusals}
    kind = kinds.pop() if len(kinds) == 1 else InsufficientCapacity
    return kind(message, code=refusals[0][1].code)
