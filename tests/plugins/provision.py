"""The provision request the planner would send a provider plugin, for the cloud plugins' own tests."""

from __future__ import annotations

import uuid
from typing import Any

from levers9.__about__ import __version__
from levers9.hooks.types import GpuOffer, Pool, ProvisionRequest, Resources, WorkerBootstrap

__all__ = ["provision_request"]


def provision_request(
    pool: Pool, offer: GpuOffer | None, machine_id: str | None = None, **bootstrap: Any
) -> ProvisionRequest:
    """A request for one machine of ``pool`` from ``offer`` (None: the pool's own shape), with a fresh machine id
    and join token unless given; ``bootstrap`` overrides fields of the worker bootstrap."""
    machine_id = machine_id or f"m-{uuid.uuid4().hex[:12]}"
    fields: dict[str, Any] = {
        "controlplane_url": "grpc://127.0.0.1:1993",
        "token": f"tok-{uuid.uuid4().hex}",
        "machine_id": machine_id,
        "pool": pool.name,
        "levers9_version": __version__,
    }
    return ProvisionRequest(
        pool=pool,
        resources=Resources(gpu=pool.gpu, gpu_count=pool.gpu_count),
        machine_id=machine_id,
        bootstrap=WorkerBootstrap(**(fields | bootstrap)),
        region=offer.region if offer else pool.region,
        offer=offer,
    )
