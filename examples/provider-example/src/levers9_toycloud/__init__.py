"""A toy cloud provider for levers9, kept in a directory.

It exists to show plugin authors the whole provider contract in one page and
to give the contract suite something real to run against. Machines are JSON
files under ``state_dir``; a file lock makes concurrent provisioning from
several processes safe, like a real cloud API would be.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from levers9 import hookimpl
from levers9.hooks.errors import AuthenticationFailed, InsufficientCapacity, InvalidRequest
from levers9.hooks.types import Availability, GpuOffer, Machine, MachineState, Pool, ProvisionRequest

#: GPU memory per type this toy cloud sells, in MiB
GPU_MEMORY = {"T4": 15360, "L4": 23034, "A100-80": 81920, "H100": 81559}


class ToyCloudSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: str = Field(description="Directory holding the toy cloud's machines.")
    capacity: dict[str, int] = Field(
        default_factory=lambda: {"cpu": 4},
        description="Machines available per GPU type ('cpu' for CPU machines).",
    )
    api_key_env: str | None = Field(
        None, description="If set, provisioning fails with AuthenticationFailed unless this env var is 'valid'."
    )
    price_per_hour: dict[str, float] = Field(default_factory=dict)


def _settings(pool: Pool) -> ToyCloudSettings:
    assert isinstance(pool.settings, ToyCloudSettings)
    return pool.settings


@contextmanager
def _locked(state_dir: str) -> Iterator[Path]:
    root = Path(state_dir)
    (root / "machines").mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield root / "machines"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _records(machines: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(machines.glob("*.json")):
        yield json.loads(path.read_text())


def _machine(record: dict[str, Any]) -> Machine:
    return Machine(
        provider_id=record["id"],
        machine_id=record["tags"].get("levers9:machine-id"),
        pool=record["tags"]["levers9:pool"],
        state=MachineState(record["state"]),
        gpu=record["gpu"],
        gpu_count=record["gpu_count"],
        created_at=datetime.fromtimestamp(record["created"], UTC),
    )


@hookimpl
def levers9_provider_settings() -> type[BaseModel]:
    return ToyCloudSettings


@hookimpl
def levers9_gpu_offers(pool: Pool) -> list[GpuOffer]:
    settings = _settings(pool)
    return [
        GpuOffer(
            gpu=gpu,
            gpu_count=max(pool.gpu_count, 1),
            gpu_memory_mib=GPU_MEMORY[gpu],
            instance_type=f"toy.{gpu.lower()}",
            availability=Availability.AVAILABLE if count > 0 else Availability.UNAVAILABLE,
            price_per_hour=settings.price_per_hour.get(gpu),
        )
        for gpu, count in settings.capacity.items()
        if gpu in GPU_MEMORY and (pool.gpu is None or gpu == pool.gpu)
    ]


@hookimpl
def levers9_provision(request: ProvisionRequest) -> Machine:
    settings = _settings(request.pool)
    if settings.api_key_env is not None and os.environ.get(settings.api_key_env) != "valid":
        raise AuthenticationFailed(f"API key in ${settings.api_key_env} was rejected", code="invalid-api-key")
    kind = request.resources.gpu or "cpu"
    if kind != "cpu" and kind not in GPU_MEMORY:
        raise InvalidRequest(f"toycloud sells no {kind}; it sells {', '.join(GPU_MEMORY)}")
    with _locked(settings.state_dir) as machines:
        in_use = sum(1 for r in _records(machines) if r["kind"] == kind and r["state"] != "terminated")
        if in_use >= settings.capacity.get(kind, 0):
            raise InsufficientCapacity(f"no {kind} machine free ({in_use} in use)", code="out-of-capacity")
        record = {
            "id": f"toy-{uuid.uuid4().hex[:10]}",
            "kind": kind,
            "gpu": request.resources.gpu,
            "gpu_count": request.resources.gpu_count,
            "state": "running",
            "created": time.time(),
            "tags": {"levers9:pool": request.pool.name, "levers9:machine-id": request.machine_id},
        }
        (machines / f"{record['id']}.json").write_text(json.dumps(record))
    return _machine(record)


@hookimpl
def levers9_terminate(pool: Pool, provider_id: str) -> None:
    with _locked(_settings(pool).state_dir) as machines:
        (machines / f"{provider_id}.json").unlink(missing_ok=True)


@hookimpl
def levers9_list_machines(pool: Pool) -> list[Machine]:
    with _locked(_settings(pool).state_dir) as machines:
        return [_machine(r) for r in _records(machines) if r["tags"].get("levers9:pool") == pool.name]
