"""What a worker sets up for the runtime its registration names: the warm pool, builds, image pulls, checkpoints.

The controlplane says at each registration which runtime the pool uses and with which settings;
:func:`runtime_for` makes everything the worker runs on it: the :class:`~levers9.worker.warm.pool.WarmPool`
of call containers (with checkpoint storage and cache when the controlplane names a storage), the
:class:`~levers9.worker.builds.BuildTasks` that run blueprint builds on the same runtime, and the
:class:`~levers9.worker.images.ImagePulls` that bring a stub's registry image into its cache.

Failures: a runtime that is not available here raises RuntimeError with the runtime's own reason (the
worker cannot serve its pool); checkpoint storage that cannot be used is logged and left out (calls run,
without checkpoints).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from levers9.checkpoint.node_cache import NodeCache
from levers9.checkpoint.snapshot import Checkpointing, RecordStore
from levers9.checkpoint.storage import storage_from_url
from levers9.hooks.facade import Hooks
from levers9.hooks.types import GpuDevice, RuntimeContext
from levers9.payloads import DEFAULT_MAX_PAYLOAD_BYTES
from levers9.proto.v1 import worker_pb2
from levers9.registry.auth import RegistryAuth
from levers9.worker.builds import BuildTasks
from levers9.worker.images import ImagePulls
from levers9.worker.volumes import WorkerVolumes
from levers9.worker.warm.pool import WarmPool

if TYPE_CHECKING:
    from levers9.worker.session import WorkerOptions

__all__ = ["RuntimeSetup", "runtime_for"]

log = logging.getLogger(__name__)

Record = Callable[[worker_pb2.RecordCheckpointRequest], Awaitable[worker_pb2.CheckpointRef]]


@dataclass
class RuntimeSetup:
    context: RuntimeContext
    pool: WarmPool
    builds: BuildTasks
    images: ImagePulls
    #: the cap on one call's arguments or result, as the controlplane says
    max_payload: int


async def runtime_for(
    hooks: Hooks,
    options: WorkerOptions,
    response: worker_pb2.RegisterResponse,
    gpus: list[GpuDevice],
    record: Record,
    credentials: Callable[[], RegistryAuth],
    in_use: Callable[[], Iterable[str]] = tuple,
) -> RuntimeSetup:
    """Everything the worker runs on the runtime ``response`` names (see the module docstring)."""
    model = hooks.runtime_settings_model(response.runtime)
    settings = None
    if model is not None:
        settings = model.model_validate(json.loads(response.runtime_settings_json or "{}"))
    state = options.state_dir / "runtime" / response.runtime
    state.mkdir(parents=True, exist_ok=True)
    context = RuntimeContext(name=response.runtime, settings=settings, state_dir=str(state))
    capabilities = await hooks.runtime_capabilities(context)
    if not capabilities.available:
        raise RuntimeError(f"runtime {response.runtime} is not available here: {capabilities.unavailable_reason}")
    max_payload = response.max_payload_bytes or DEFAULT_MAX_PAYLOAD_BYTES
    ca_file = _ca_file(options)
    pool = WarmPool(
        hooks,
        context,
        capabilities,
        state_dir=options.state_dir / "containers",
        gpus=gpus,
        checkpointing=_checkpointing(options, response, record),
        max_result_bytes=max_payload,
        volumes=WorkerVolumes(
            options.state_dir,
            metadata_url=response.volumes_metadata_url,
            env=dict(response.volumes_env),
            owner=capabilities.root_host_uid,
            ca_file=ca_file,
        ),
    )
    builds = BuildTasks(hooks, context, state_dir=options.state_dir, credentials=credentials, ca_file=ca_file)
    images = ImagePulls(
        context,
        registry_url=response.registry_url,
        credentials=credentials,
        ca_file=ca_file,
        in_use=in_use,
        busy=lambda: builds.running > 0,
    )
    return RuntimeSetup(context=context, pool=pool, builds=builds, images=images, max_payload=max_payload)


def _ca_file(options: WorkerOptions) -> str | None:
    """The controlplane's CA as a file (what the registry client verifies with), when one was given."""
    if not options.controlplane_ca:
        return None
    path = options.state_dir / "controlplane-ca.pem"
    path.write_text(options.controlplane_ca)
    return str(path)


def _checkpointing(
    options: WorkerOptions, response: worker_pb2.RegisterResponse, record: Record
) -> Checkpointing | None:
    """Checkpoint storage as the controlplane says; the cache beside the state directory, kept across restarts."""
    if not response.checkpoint_storage_url:
        return None
    try:
        storage = storage_from_url(response.checkpoint_storage_url, default_root=options.state_dir)
    except Exception as exc:
        log.warning("checkpoint storage %s is unusable, no checkpoints: %s", response.checkpoint_storage_url, exc)
        return None
    where = Path(response.checkpoint_cache_dir) if response.checkpoint_cache_dir else None
    cache = NodeCache(where or options.state_dir.parent / "checkpoint-cache", response.checkpoint_cache_max_bytes)
    return Checkpointing(store=RecordStore(record), storage=storage, cache=cache)
