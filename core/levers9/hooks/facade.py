"""The typed facade: the only way the core calls plugins.

Each method has a typed signature (so mypy checks every call site in the core),
runs the plugin's synchronous hook on that plugin's own threads with a
deadline (so a plugin blocking on its SDK never stalls the event loop, nor
another plugin), checks what the plugin returned against the spec, and turns
untyped exceptions into :class:`~levers9.hooks.errors.PluginError` naming the
plugin and the hook.

Dispatch follows the spec: provider hooks go to the plugin a pool names,
runtime hooks to the plugin a runtime context names, ``levers9_gpu_devices`` to
every plugin (each isolated), checkpoint hooks through pluggy's firstresult
caller (the first plugin that answers wins).

Isolation, deadlines, provider health and the plugins' startup and shutdown
are the same for every hook and live in :mod:`levers9.hooks.calls`, the base
class; what is here is each hook's signature and the rules of its answer
(a machine of the asked pool, canonical GPU names, small ``provider_data``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from levers9.hooks.calls import DEFAULT_TIMEOUT, PluginCalls
from levers9.hooks.context import PluginContext
from levers9.hooks.errors import CheckpointUnavailable, PluginError, RestoreFailed
from levers9.hooks.types import (
    PROVIDER_DATA_MAX_BYTES,
    CheckpointImage,
    CheckpointSupport,
    ContainerSpec,
    ContainerState,
    GpuDevice,
    GpuOffer,
    LayerDiff,
    LogChunk,
    Machine,
    MachineIdentity,
    Pool,
    PreparedContainer,
    ProviderCheck,
    ProvisionRequest,
    RuntimeCapabilities,
    RuntimeContext,
)

log = logging.getLogger("levers9.plugins")

T = TypeVar("T")

#: provisioning calls may legitimately take longer (image lookups, launch)
PROVISION_TIMEOUT = 120.0


@dataclass(frozen=True)
class PluginFailure:
    """One plugin's failure in a hook asked of every plugin; the others' answers are kept."""

    plugin: str
    hook: str
    error: str


@dataclass(frozen=True)
class GpuDiscovery:
    devices: list[GpuDevice]
    failures: list[PluginFailure]


@dataclass(frozen=True)
class PoolAnswers(Generic[T]):
    """Answers of a hook asked for many pools at once; a failing pool is in ``failures``, not an exception."""

    answers: dict[str, T]
    failures: list[PluginFailure]


class Hooks(PluginCalls):
    """Typed, isolated access to every loaded plugin's hooks."""

    # ----------------------------------------------------------------- names

    def providers(self) -> list[str]:
        return self.plugins.implementers("levers9_provider_settings")

    def runtimes(self) -> list[str]:
        names = self.plugins.implementers("levers9_runtime_settings")
        names += [n for n in self.plugins.implementers("levers9_runtime_capabilities") if n not in names]
        return names

    # ----------------------------------------------------------------- settings (sync: used while loading config)

    def provider_settings_model(self, provider: str) -> type[BaseModel]:
        self._require("provider", provider, self.providers())
        return self._settings_model(provider, "levers9_provider_settings")

    def runtime_settings_model(self, runtime: str) -> type[BaseModel] | None:
        self._require("runtime", runtime, self.runtimes())
        if self.plugins.impl(runtime, "levers9_runtime_settings") is None:
            return None
        return self._settings_model(runtime, "levers9_runtime_settings")

    def _settings_model(self, plugin: str, hook: str) -> type[BaseModel]:
        impl = self.plugins.impl(plugin, hook)
        assert impl is not None
        try:
            model = impl.function()
        except Exception as exc:
            raise PluginError(plugin, hook, f"raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise PluginError(plugin, hook, f"returned {model!r}, expected a pydantic BaseModel subclass")
        return model

    # ----------------------------------------------------------------- provider hooks

    def makes_offers(self, provider: str) -> bool:
        """Whether ``provider`` implements ``levers9_gpu_offers`` (a pool of a provider without it has none)."""
        return self.plugins.impl(provider, "levers9_gpu_offers") is not None

    async def gpu_offers(self, pool: Pool, *, timeout: float | None = None) -> list[GpuOffer]:
        _expect(pool, Pool, "pool")
        offers: list[GpuOffer] = await self._one(
            pool.provider, "levers9_gpu_offers", list[GpuOffer], timeout, pool=pool
        )
        from levers9.gpu.catalog import CATALOG

        for offer in offers:
            if offer.gpu not in CATALOG:
                raise PluginError(
                    pool.provider,
                    "levers9_gpu_offers",
                    f"offered GPU type {offer.gpu!r}, which is not canonical; normalise it with levers9.gpu.normalize",
                )
        return offers

    async def provision(self, request: ProvisionRequest, *, timeout: float | None = None) -> Machine:
        _expect(request, ProvisionRequest, "request")
        machine: Machine = await self._one(
            request.pool.provider,
            "levers9_provision",
            Machine,
            timeout or PROVISION_TIMEOUT,
            request=request,
        )
        if machine.pool != request.pool.name:
            raise PluginError(
                request.pool.provider,
                "levers9_provision",
                f"returned a machine of pool {machine.pool!r} for pool {request.pool.name!r}",
            )
        _check_provider_data(request.pool.provider, "levers9_provision", machine)
        return machine

    async def terminate(self, pool: Pool, machine: Machine, *, timeout: float | None = None) -> None:
        _expect(pool, Pool, "pool")
        _expect(machine, Machine, "machine")
        await self._one(pool.provider, "levers9_terminate", None, timeout, pool=pool, machine=machine)

    async def check(self, pool: Pool, *, timeout: float | None = None) -> ProviderCheck | None:
        """The provider's own check of ``pool`` (credentials, settings); None when it has no ``levers9_check``."""
        _expect(pool, Pool, "pool")
        if self.plugins.impl(pool.provider, "levers9_check") is None:
            self._require("provider", pool.provider, self.providers())
            return None
        result: ProviderCheck = await self._one(pool.provider, "levers9_check", ProviderCheck, timeout, pool=pool)
        return result

    def binds_identity(self, provider: str) -> bool:
        """Whether ``provider`` checks a registering worker's machine identity (has ``levers9_verify_identity``)."""
        return self.plugins.impl(provider, "levers9_verify_identity") is not None

    async def verify_identity(
        self, pool: Pool, machine: Machine, identity: MachineIdentity | None, *, timeout: float | None = None
    ) -> bool:
        """Check ``identity`` against ``machine`` with the pool's provider; False when it binds no identity.

        :raises IdentityRejected: the provider says the identity does not prove the worker runs on ``machine``.
        """
        _expect(pool, Pool, "pool")
        _expect(machine, Machine, "machine")
        if identity is not None:
            _expect(identity, MachineIdentity, "identity")
        if not self.binds_identity(pool.provider):
            self._require("provider", pool.provider, self.providers())
            return False
        await self._one(
            pool.provider, "levers9_verify_identity", None, timeout, pool=pool, machine=machine, identity=identity
        )
        return True

    async def list_machines(self, pool: Pool, *, timeout: float | None = None) -> list[Machine]:
        _expect(pool, Pool, "pool")
        machines: list[Machine] = await self._one(
            pool.provider, "levers9_list_machines", list[Machine], timeout, pool=pool
        )
        strays = [m.provider_id for m in machines if m.pool != pool.name]
        if strays:
            # Reporting another pool's machines would get them terminated by this pool's reconciler.
            raise PluginError(
                pool.provider,
                "levers9_list_machines",
                f"reported machines of other pools for pool {pool.name!r}: {', '.join(strays)}",
            )
        return machines

    async def gpu_offers_for(self, pools: list[Pool], *, timeout: float | None = None) -> PoolAnswers[list[GpuOffer]]:
        """Offers of every pool at once; a provider that fails or hangs costs only its own pools."""
        return await self._per_pool(pools, "levers9_gpu_offers", self.gpu_offers, timeout)

    async def list_machines_for(self, pools: list[Pool], *, timeout: float | None = None) -> PoolAnswers[list[Machine]]:
        """Machines of every pool at once, for the reconciler; a failing pool is skipped this round, never
        treated as empty (which would look like every machine had vanished)."""
        return await self._per_pool(pools, "levers9_list_machines", self.list_machines, timeout)

    async def _per_pool(
        self,
        pools: list[Pool],
        hook: str,
        call: Callable[..., Awaitable[T]],
        timeout: float | None,
    ) -> PoolAnswers[T]:
        results = await asyncio.gather(*(call(pool, timeout=timeout) for pool in pools), return_exceptions=True)
        answers: dict[str, T] = {}
        failures: list[PluginFailure] = []
        for pool, result in zip(pools, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.warning("%s for pool %r (provider %r) failed: %s", hook, pool.name, pool.provider, result)
                failures.append(PluginFailure(pool.provider, hook, f"pool {pool.name!r}: {result}"))
            else:
                answers[pool.name] = result
        return PoolAnswers(answers, failures)

    # ----------------------------------------------------------------- GPU discovery on this machine

    async def gpu_devices(self, *, timeout: float | None = None) -> GpuDiscovery:
        """Ask every plugin; merge by uuid; a plugin that fails or hangs is logged and left out."""
        hook = "levers9_gpu_devices"
        names = self.plugins.implementers(hook)
        results = await asyncio.gather(
            *(self._one(name, hook, list[GpuDevice], timeout) for name in names), return_exceptions=True
        )
        devices: dict[str, GpuDevice] = {}
        failures: list[PluginFailure] = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.warning("GPU discovery by plugin %r failed: %s", name, result)
                failures.append(PluginFailure(name, hook, str(result)))
                continue
            for device in result:
                devices.setdefault(device.uuid, device)
        return GpuDiscovery(sorted(devices.values(), key=lambda d: d.index), failures)

    def _new_context(self, name: str) -> PluginContext:
        context = super()._new_context(name)
        context.discover_gpus = self._gpu_devices_for_hook
        return context

    def _gpu_devices_for_hook(self, timeout: float) -> list[GpuDevice]:
        """:meth:`gpu_devices` for a hook on a plugin's thread (``PluginContext.gpu_devices``).

        Runs on the loop :meth:`startup` ran on while it runs (the controlplane),
        else on a loop of its own in this thread (a tool that started the hooks
        with ``asyncio.run`` and calls them later). Discovery that failed and
        found nothing raises ``RuntimeError`` with the failures; partial
        failures are logged by :meth:`gpu_devices` and the devices found kept.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("GPU discovery for a hook must be asked from the hook's thread, not an event loop")
        loop = self._loop
        if loop is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self.gpu_devices(timeout=timeout), loop)
            found = future.result(timeout + 5.0)  # the deadline ends the call; the margin covers the hop back
        else:
            found = asyncio.run(self.gpu_devices(timeout=timeout))
        if found.failures and not found.devices:
            raise RuntimeError("; ".join(failure.error for failure in found.failures))
        return found.devices

    async def machine_identity(self, plugin: str, *, timeout: float | None = None) -> MachineIdentity:
        """This machine's identity as ``plugin`` proves it (``LEVERS9_MACHINE_IDENTITY`` names the plugin)."""
        self._require("plugin", plugin, self.plugins.implementers("levers9_machine_identity"))
        identity: MachineIdentity = await self._one(plugin, "levers9_machine_identity", MachineIdentity, timeout)
        return identity

    # ----------------------------------------------------------------- runtime hooks

    async def runtime_capabilities(
        self, runtime: RuntimeContext, *, timeout: float | None = None
    ) -> RuntimeCapabilities:
        self._require("runtime", runtime.name, self.runtimes())
        result: RuntimeCapabilities = await self._one(
            runtime.name, "levers9_runtime_capabilities", RuntimeCapabilities, timeout, runtime=runtime
        )
        return result

    async def container_prepare(
        self, runtime: RuntimeContext, spec: ContainerSpec, *, timeout: float | None = None
    ) -> PreparedContainer:
        _expect(spec, ContainerSpec, "spec")
        result: PreparedContainer = await self._one(
            runtime.name, "levers9_container_prepare", PreparedContainer, timeout, runtime=runtime, spec=spec
        )
        return result

    async def container_start(
        self, runtime: RuntimeContext, container: PreparedContainer, *, timeout: float | None = None
    ) -> ContainerState:
        _expect(container, PreparedContainer, "container")
        result: ContainerState = await self._one(
            runtime.name, "levers9_container_start", ContainerState, timeout, runtime=runtime, container=container
        )
        return result

    async def container_state(
        self, runtime: RuntimeContext, container_id: str, *, timeout: float | None = None
    ) -> ContainerState:
        result: ContainerState = await self._one(
            runtime.name,
            "levers9_container_state",
            ContainerState,
            timeout,
            runtime=runtime,
            container_id=container_id,
        )
        return result

    async def container_kill(
        self, runtime: RuntimeContext, container_id: str, signal: int, *, timeout: float | None = None
    ) -> None:
        await self._one(
            runtime.name,
            "levers9_container_kill",
            None,
            timeout,
            runtime=runtime,
            container_id=container_id,
            signal=signal,
        )

    async def container_logs(
        self, runtime: RuntimeContext, container_id: str, offset: int, *, timeout: float | None = None
    ) -> LogChunk:
        result: LogChunk = await self._one(
            runtime.name,
            "levers9_container_logs",
            LogChunk,
            timeout,
            runtime=runtime,
            container_id=container_id,
            offset=offset,
        )
        return result

    async def container_remove(
        self, runtime: RuntimeContext, container_id: str, *, timeout: float | None = None
    ) -> None:
        await self._one(
            runtime.name, "levers9_container_remove", None, timeout, runtime=runtime, container_id=container_id
        )

    async def container_list(self, runtime: RuntimeContext, *, timeout: float | None = None) -> list[str]:
        result: list[str] = await self._one(runtime.name, "levers9_container_list", list[str], timeout, runtime=runtime)
        return result

    def captures_changes(self, runtime: RuntimeContext) -> bool:
        """Whether ``runtime``'s plugin implements ``levers9_container_changes`` (the builder needs it)."""
        self._require("runtime", runtime.name, self.runtimes())
        return self.plugins.impl(runtime.name, "levers9_container_changes") is not None

    async def container_changes(
        self, runtime: RuntimeContext, container_id: str, dest: str, *, timeout: float | None = None
    ) -> LayerDiff | None:
        """A container's changes as a layer tar at ``dest`` (a running one paused meanwhile); None when the
        runtime cannot tell them."""
        if not self.captures_changes(runtime):
            return None
        result: LayerDiff | None = await self._one(
            runtime.name,
            "levers9_container_changes",
            LayerDiff | None,
            timeout,
            runtime=runtime,
            container_id=container_id,
            dest=dest,
        )
        return result

    # ----------------------------------------------------------------- checkpoint hooks (first answer wins)

    async def checkpoint_support(self, runtime: RuntimeContext, *, timeout: float | None = None) -> CheckpointSupport:
        answer: CheckpointSupport | None = await self._first(
            "levers9_checkpoint_support", CheckpointSupport, timeout, runtime=runtime
        )
        if answer is None:
            return CheckpointSupport(
                available=False,
                reason=f"no installed plugin checkpoints containers of runtime {runtime.name!r}",
                mechanism="none",
            )
        return answer

    async def checkpoint(
        self, runtime: RuntimeContext, container_id: str, image_dir: str, *, timeout: float | None = None
    ) -> CheckpointImage:
        image: CheckpointImage | None = await self._first(
            "levers9_checkpoint",
            CheckpointImage,
            timeout,
            runtime=runtime,
            container_id=container_id,
            image_dir=image_dir,
        )
        if image is None:
            raise CheckpointUnavailable(f"no installed plugin checkpoints containers of runtime {runtime.name!r}")
        return image

    async def restore(
        self,
        runtime: RuntimeContext,
        container: PreparedContainer,
        image: CheckpointImage,
        *,
        timeout: float | None = None,
    ) -> ContainerState:
        _expect(container, PreparedContainer, "container")
        _expect(image, CheckpointImage, "image")
        state: ContainerState | None = await self._first(
            "levers9_restore", ContainerState, timeout, runtime=runtime, container=container, image=image
        )
        if state is None:
            raise RestoreFailed(f"no installed plugin restores containers of runtime {runtime.name!r}")
        return state


def _check_provider_data(plugin: str, hook: str, machine: Machine) -> None:
    """``provider_data`` is stored with the machine's record: JSON, and small."""
    try:
        size = len(json.dumps(machine.provider_data, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise PluginError(plugin, hook, f"machine {machine.provider_id}: provider_data is not JSON: {exc}") from None
    if size > PROVIDER_DATA_MAX_BYTES:
        raise PluginError(
            plugin,
            hook,
            f"machine {machine.provider_id}: provider_data takes {size} bytes as JSON, at most "
            f"{PROVIDER_DATA_MAX_BYTES} are stored; keep ids and zones there, not whole API answers",
        )


def _expect(value: Any, tp: type, name: str) -> None:
    """Argument checks at the facade boundary: cheap, and they catch core bugs before a plugin sees them."""
    if not isinstance(value, tp):
        raise TypeError(f"{name} must be {tp.__name__}, got {type(value).__name__}")


__all__ = ["DEFAULT_TIMEOUT", "PROVISION_TIMEOUT", "GpuDiscovery", "Hooks", "PluginFailure", "PoolAnswers"]
