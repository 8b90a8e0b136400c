"""A toy cloud provider for levers9, kept in a directory.

It exists to show plugin authors the whole provider contract in one page and
to give the contract suite something real to run against. The "cloud" is
:mod:`levers9_toycloud.cloud` (its API: records in a directory, two calls to
start an instance, faults a test can inject); this module is the plugin, its
client:

* regions are the pool's (``pool.regions``; ``toy-1`` when it names none),
  each with the zones of the ``zones`` setting (``toy-1`` + ``a`` = ``toy-1a``);
* every zone has ``capacity[gpu]`` machines of each GPU type (``cpu`` for CPU
  machines); a full zone raises ``InsufficientCapacity`` for that zone only, so
  the scheduler tries the next offer (zone) before the next pool;
* provisioning starts the instance in the offer's zone (the first zone with
  room without an offer), then tags it; when tagging fails it terminates what
  it created before raising, so a failed start leaves nothing running that no
  listing would find;
* provisioning is idempotent per machine id: a retry finds the instance tagged
  with it and returns that one;
* like a zonal cloud API, finding an instance needs its zone, which is why
  provisioning returns it in ``provider_data`` and terminate reads it back
  from there;
* the cloud's states map onto levers9's (:data:`STATES`): an interrupted spot
  instance is ``preempted``, an instance with a host fault ``failed``;
* each record keeps the user data the machine was given (``cloud_init`` of the
  request's bootstrap), which :func:`user_data_of` reads back the way a cloud's
  instance metadata would; the join token is in it and nowhere else (not in
  ``provider_data``, not in the log);
* a terminated machine stays listed as ``terminated`` for
  :data:`TERMINATED_VISIBLE_S`, as real clouds keep them for a while.

The plugin is one object, :data:`plugin`, an instance of
:class:`ToyCloudProvider` whose methods named after the hooks carry
``@hookimpl``; it declares the spec edition it is written to
(``LEVERS9_SPEC_VERSION``), and reads its pools' settings with ``settings_of``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from levers9 import hookimpl
from levers9.bootstrap import cloud_init
from levers9.gpu.catalog import CATALOG
from levers9.hooks.errors import AuthenticationFailed, InsufficientCapacity, InvalidRequest, ProviderError
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
from levers9_toycloud import cloud
from levers9_toycloud.cloud import ToyApiError

log = logging.getLogger("levers9_toycloud")

#: the GPU types this toy cloud sells; each offer gives one GPU's memory as the catalog has it
GPUS = ("T4", "L4", "A100-80", "H100")
#: the region of a pool that names none
DEFAULT_REGION = "toy-1"
#: how long a terminated machine stays in the listing (as ``terminated``)
TERMINATED_VISIBLE_S = 300.0
#: the cloud's instance states in levers9's words
STATES = {
    "pending": MachineState.PENDING,
    "running": MachineState.RUNNING,
    "interrupted": MachineState.PREEMPTED,
    "error": MachineState.FAILED,
    "terminated": MachineState.TERMINATED,
}
#: why an instance in that state ended, for ``Machine.reason``
REASONS = {"interrupted": "spot instance interrupted", "error": "host fault"}


class ToyCloudSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: str = Field(description="Directory holding the toy cloud's machines.")
    capacity: dict[str, int] = Field(
        default_factory=lambda: {"cpu": 4},
        description="Machines available per GPU type in each zone ('cpu' for CPU machines).",
    )
    zones: list[str] = Field(
        default_factory=lambda: ["a"],
        min_length=1,
        description="Zones of every region, as suffixes of the region's name: ['a', 'b'] gives toy-1a, toy-1b.",
    )
    api_key_env: str | None = Field(
        None, description="If set, provisioning fails with AuthenticationFailed unless this env var is 'valid'."
    )
    price_per_hour: dict[str, float] = Field(default_factory=dict)


def _settings(pool: Pool) -> ToyCloudSettings:
    return settings_of(pool, ToyCloudSettings)  # the model levers9_provider_settings declared, typed


def _zones(pool: Pool, region: str) -> list[str]:
    return [f"{region}{suffix}" for suffix in _settings(pool).zones]


def _in_use(machines: Path, zone: str, kind: str) -> int:
    alive = ("pending", "running")
    return sum(1 for _, r in cloud.records(machines, zone) if r["kind"] == kind and r["state"] in alive)


def _machine(record: dict[str, Any]) -> Machine:
    return Machine(
        provider_id=record["id"],
        machine_id=record["tags"].get("levers9:machine-id"),
        pool=record["tags"]["levers9:pool"],
        state=STATES[record["state"]],
        gpu=record["gpu"],
        gpu_count=record["gpu_count"],
        region=record["region"],
        zone=record["zone"],
        instance_type=record["instance_type"],
        created_at=datetime.fromtimestamp(record["created"], UTC),
        reason=REASONS.get(record["state"]),
        provider_data={"zone": record["zone"]},
    )


def _authenticate(settings: ToyCloudSettings) -> None:
    if settings.api_key_env is not None and os.environ.get(settings.api_key_env) != "valid":
        raise AuthenticationFailed(f"API key in ${settings.api_key_env} was rejected", code="invalid-api-key")


def user_data_of(state_dir: str | Path, machine: Machine) -> str:
    """The user data ``machine`` was started with, as the toy cloud's instance metadata serves it."""
    return cloud.user_data_of(state_dir, machine.provider_id)


class ToyCloudProvider:
    """The plugin: one object whose ``levers9_*`` methods are the hooks (the entry point names :data:`plugin`).

    It keeps no state of its own: the "cloud" is the state directory, so any
    number of instances, in any number of processes, agree.
    """

    #: the edition of the hook spec this plugin is written to (docs/plugins.md, "The spec version")
    LEVERS9_SPEC_VERSION = 2

    @hookimpl
    def levers9_provider_settings(self) -> type[BaseModel]:
        return ToyCloudSettings

    @hookimpl
    def levers9_check(self, pool: Pool) -> ProviderCheck:
        settings = _settings(pool)
        try:
            with cloud.locked(settings.state_dir) as machines, tempfile.NamedTemporaryFile(dir=machines):
                pass
        except OSError as exc:
            return ProviderCheck(
                ok=False, message=f"state_dir {settings.state_dir} is not writable: {exc}", hint="fix state_dir"
            )
        try:
            _authenticate(settings)
        except AuthenticationFailed as exc:
            return ProviderCheck(ok=False, message=exc.message, hint=f"export {settings.api_key_env}=valid")
        return ProviderCheck(ok=True, message=f"state_dir {settings.state_dir} is writable; API key accepted")

    @hookimpl
    def levers9_gpu_offers(self, pool: Pool) -> list[GpuOffer]:
        settings = _settings(pool)
        offers: list[GpuOffer] = []
        with cloud.locked(settings.state_dir) as machines:
            for region in pool.regions or [DEFAULT_REGION]:
                for zone in _zones(pool, region):
                    for gpu, count in settings.capacity.items():
                        if gpu not in GPUS or pool.gpu not in (None, gpu):
                            continue
                        free = count - _in_use(machines, zone, gpu)
                        offers.append(
                            GpuOffer(
                                gpu=gpu,
                                gpu_count=max(pool.gpu_count, 1),
                                gpu_memory_mib=CATALOG[gpu].memory_mib,
                                region=region,
                                zone=zone,
                                instance_type=f"toy.{gpu.lower()}",
                                availability=Availability.AVAILABLE if free > 0 else Availability.UNAVAILABLE,
                                price_per_hour=settings.price_per_hour.get(gpu),
                            )
                        )
        return offers

    @hookimpl
    def levers9_provision(self, request: ProvisionRequest) -> Machine:
        pool, offer, settings = request.pool, request.offer, _settings(request.pool)
        _authenticate(settings)
        kind = request.resources.gpu or "cpu"
        if kind != "cpu" and kind not in GPUS:
            raise InvalidRequest(f"toycloud sells no {kind}; it sells {', '.join(GPUS)}")
        region = (offer.region if offer else None) or request.region or (pool.regions or [DEFAULT_REGION])[0]
        zones = _zones(pool, region)
        if offer is not None and offer.zone is not None and offer.zone not in zones:
            raise InvalidRequest(f"offer names zone {offer.zone!r}; region {region} has {', '.join(zones)}")
        user_data = cloud_init(request.bootstrap)  # what a VM would be given, rendered by levers9 for every provider
        tags = {"levers9:pool": pool.name, "levers9:machine-id": request.machine_id}
        with cloud.locked(settings.state_dir) as machines:
            for _, record in cloud.records(machines):  # idempotent per machine id: a retry gets the same machine
                if record["tags"].get("levers9:machine-id") == request.machine_id and record["state"] != "terminated":
                    return _machine(record)
            capacity = settings.capacity.get(kind, 0)
            if offer is not None and offer.zone is not None:
                zone = offer.zone
            else:  # no offer (a CPU pool): the first zone with room
                zone = next((z for z in zones if _in_use(machines, z, kind) < capacity), zones[0])
            in_use = _in_use(machines, zone, kind)
            if in_use >= capacity:
                raise InsufficientCapacity(
                    f"zone {zone} has no {kind} machine free ({in_use} in use)", code="zone-full"
                )
            fields = {
                "kind": kind,
                "gpu": request.resources.gpu,
                "gpu_count": request.resources.gpu_count,
                "region": region,
                "instance_type": f"toy.{kind.lower()}",
                "user_data": user_data,
            }
            try:
                created = cloud.create(machines, zone, fields)
            except ToyApiError as exc:
                raise ProviderError(
                    f"starting a {kind} machine in {zone} failed: {exc.message}", code=exc.code
                ) from exc
            try:
                record = cloud.tag(machines, created, tags)
            except ToyApiError as exc:  # untagged, no listing would find it: terminate it before giving up
                cloud.terminate(machines, zone, created["id"])
                raise ProviderError(
                    f"tagging {created['id']} failed ({exc.message}); it was terminated", code=exc.code
                ) from exc
        log.info("started %s in %s for machine %s", record["id"], zone, request.machine_id)
        return _machine(record)

    @hookimpl
    def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
        # A zonal API: the zone comes from provider_data; a machine levers9 has no zone for is looked for everywhere.
        zone = machine.provider_data.get("zone") or machine.zone or "*"
        with cloud.locked(_settings(pool).state_dir) as machines:
            try:
                cloud.terminate(machines, zone, machine.provider_id)
            except ToyApiError as exc:
                raise ProviderError(f"terminating {machine.provider_id} failed: {exc.message}", code=exc.code) from exc

    @hookimpl
    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        listed: list[Machine] = []
        with cloud.locked(_settings(pool).state_dir) as machines:
            for path, record in cloud.records(machines):
                if record["state"] == "terminated" and time.time() - record["ended"] > TERMINATED_VISIBLE_S:
                    path.unlink()  # the cloud forgets it at last
                elif record["tags"].get("levers9:pool") == pool.name:
                    listed.append(_machine(record))
        return listed


#: what the entry point ``toycloud = "levers9_toycloud:plugin"`` names
plugin = ToyCloudProvider()
