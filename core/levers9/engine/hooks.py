"""The container hooks, for a runtime plugin whose work an engine does.

runc, gVisor and the process runtime differ in how they drive a container,
not in how the hooks hand calls to them. Such a plugin is one object whose
class derives from :class:`EngineRuntime` (or :class:`CapturingRuntime`,
when its engine can also say what a container changed): it builds its engine
from the runtime context in :meth:`EngineRuntime.engine`, may refuse a spec
in :meth:`EngineRuntime.check`, and inherits the container hooks, which the
plugin manager collects from the object like its own ``levers9_*`` methods.

Invariants: the hooks keep no state of their own (each call builds the engine
again from the runtime context; a container's state lives in its directory),
and :meth:`EngineRuntime.check` runs before anything is prepared, so a spec it
refuses leaves nothing behind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

from pydantic import BaseModel

from levers9.hooks.markers import hookimpl
from levers9.hooks.types import ContainerSpec, ContainerState, LayerDiff, LogChunk, PreparedContainer, RuntimeContext

__all__ = ["CapturingEngine", "CapturingRuntime", "Engine", "EngineRuntime"]


class Engine(Protocol):
    def prepare(self, spec: ContainerSpec) -> PreparedContainer: ...
    def start(self, container: PreparedContainer) -> ContainerState: ...
    def state(self, container_id: str) -> ContainerState: ...
    def kill(self, container_id: str, sig: int) -> None: ...
    def logs(self, container_id: str, offset: int) -> LogChunk: ...
    def remove(self, container_id: str) -> None: ...
    def container_ids(self) -> list[str]: ...


class CapturingEngine(Engine, Protocol):
    def changes(self, container_id: str, dest: str) -> LayerDiff: ...


class EngineRuntime(ABC):
    """A runtime plugin's settings hook and container hooks, each container hook handing its call to ``self.engine``."""

    #: the pydantic model of the runtime's ``runtime_settings`` (what ``levers9_runtime_settings`` declares)
    settings_model: ClassVar[type[BaseModel]]

    @abstractmethod
    def engine(self, runtime: RuntimeContext) -> Engine:
        """The engine that runs this runtime's containers with the pool's settings."""

    def check(self, runtime: RuntimeContext, spec: ContainerSpec) -> None:
        """Refuse a spec this runtime cannot run (raise ``InvalidRequest``) before anything is prepared."""
        return None  # every spec, unless the runtime says otherwise

    @hookimpl
    def levers9_runtime_settings(self) -> type[BaseModel]:
        return self.settings_model

    @hookimpl
    def levers9_container_prepare(self, runtime: RuntimeContext, spec: ContainerSpec) -> PreparedContainer:
        self.check(runtime, spec)
        return self.engine(runtime).prepare(spec)

    @hookimpl
    def levers9_container_start(self, runtime: RuntimeContext, container: PreparedContainer) -> ContainerState:
        return self.engine(runtime).start(container)

    @hookimpl
    def levers9_container_state(self, runtime: RuntimeContext, container_id: str) -> ContainerState:
        return self.engine(runtime).state(container_id)

    @hookimpl
    def levers9_container_kill(self, runtime: RuntimeContext, container_id: str, signal: int) -> None:
        self.engine(runtime).kill(container_id, signal)

    @hookimpl
    def levers9_container_logs(self, runtime: RuntimeContext, container_id: str, offset: int) -> LogChunk:
        return self.engine(runtime).logs(container_id, offset)

    @hookimpl
    def levers9_container_remove(self, runtime: RuntimeContext, container_id: str) -> None:
        self.engine(runtime).remove(container_id)

    @hookimpl
    def levers9_container_list(self, runtime: RuntimeContext) -> list[str]:
        return self.engine(runtime).container_ids()


class CapturingRuntime(EngineRuntime):
    """An :class:`EngineRuntime` whose engine can also write what a container changed (``levers9_container_changes``).

    A separate class: a runtime whose engine cannot (the process runtime) derives from :class:`EngineRuntime`
    alone, leaves the hook out, and the builder refuses to build on it.
    """

    @abstractmethod
    def engine(self, runtime: RuntimeContext) -> CapturingEngine:
        """The engine that runs this runtime's containers, and reads what they changed."""

    @hookimpl
    def levers9_container_changes(self, runtime: RuntimeContext, container_id: str, dest: str) -> LayerDiff:
        return self.engine(runtime).changes(container_id, dest)
