"""The container hooks, for a runtime plugin whose work an engine does.

runc, gVisor and the process runtime differ in how they drive a container,
not in how the hooks hand calls to them; a plugin builds its engine from the
runtime context and gets its hook implementations from :func:`container_hooks`
(assigning them to module names is still what registers them, as for any
plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from levers9.hooks.markers import hookimpl
from levers9.hooks.types import ContainerSpec, ContainerState, LayerDiff, LogChunk, PreparedContainer, RuntimeContext

__all__ = ["CapturingEngine", "ContainerHooks", "Engine", "changes_hook", "container_hooks"]


class Engine(Protocol):
    def prepare(self, spec: ContainerSpec) -> PreparedContainer: ...
    def start(self, container: PreparedContainer) -> ContainerState: ...
    def state(self, container_id: str) -> ContainerState: ...
    def kill(self, container_id: str, sig: int) -> None: ...
    def logs(self, container_id: str, offset: int) -> LogChunk: ...
    def remove(self, container_id: str) -> None: ...
    def container_ids(self) -> list[str]: ...


class CapturingEngine(Protocol):
    def changes(self, container_id: str, dest: str) -> LayerDiff: ...


@dataclass(frozen=True)
class ContainerHooks:
    prepare: Callable[..., Any]
    start: Callable[..., Any]
    state: Callable[..., Any]
    kill: Callable[..., Any]
    logs: Callable[..., Any]
    remove: Callable[..., Any]
    list: Callable[..., Any]


def container_hooks(
    engine: Callable[[RuntimeContext], Engine],
    *,
    check: Callable[[RuntimeContext, ContainerSpec], None] | None = None,
) -> ContainerHooks:
    """Hook implementations that hand each call to ``engine(runtime)``; ``check`` vets a spec before preparing."""

    @hookimpl
    def levers9_container_prepare(runtime: RuntimeContext, spec: ContainerSpec) -> PreparedContainer:
        if check is not None:
            check(runtime, spec)
        return engine(runtime).prepare(spec)

    @hookimpl
    def levers9_container_start(runtime: RuntimeContext, container: PreparedContainer) -> ContainerState:
        return engine(runtime).start(container)

    @hookimpl
    def levers9_container_state(runtime: RuntimeContext, container_id: str) -> ContainerState:
        return engine(runtime).state(container_id)

    @hookimpl
    def levers9_container_kill(runtime: RuntimeContext, container_id: str, signal: int) -> None:
        engine(runtime).kill(container_id, signal)

    @hookimpl
    def levers9_container_logs(runtime: RuntimeContext, container_id: str, offset: int) -> LogChunk:
        return engine(runtime).logs(container_id, offset)

    @hookimpl
    def levers9_container_remove(runtime: RuntimeContext, container_id: str) -> None:
        engine(runtime).remove(container_id)

    @hookimpl
    def levers9_container_list(runtime: RuntimeContext) -> list[str]:
        return engine(runtime).container_ids()

    return ContainerHooks(
        levers9_container_prepare,
        levers9_container_start,
        levers9_container_state,
        levers9_container_kill,
        levers9_container_logs,
        levers9_container_remove,
        levers9_container_list,
    )


def changes_hook(engine: Callable[[RuntimeContext], CapturingEngine]) -> Callable[..., Any]:
    """The ``levers9_container_changes`` implementation for an engine that can read a container's changes.

    Separate from :func:`container_hooks`: a runtime whose engine cannot (the process runtime) leaves it
    out, and the builder refuses to build on it.
    """

    @hookimpl
    def levers9_container_changes(runtime: RuntimeContext, container_id: str, dest: str) -> LayerDiff:
        return engine(runtime).changes(container_id, dest)

    return levers9_container_changes
