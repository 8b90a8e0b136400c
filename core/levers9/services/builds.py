"""Building blueprints into images: which steps a workspace already built, where a build runs, what it recorded.

:meth:`Builds.build` takes a blueprint's build spec (:mod:`levers9.blueprints.spec`) and the local
files its copy steps add, and answers with a stream of :class:`BuildEvent`: the build's output as it
runs, then the image to run (``done``) or why there is none (``failed``). A build is a task of an
internal stub of kind ``build`` (:data:`~levers9.services.stubs.BUILD_KIND`), placed, like any call,
by the scheduler, but only on pools that set ``builds: true``; the worker that takes it runs the steps
in containers of its runtime (runc or gVisor), pushes the image to the registry, and answers with the
layers it made. So a build runs on a worker of a build pool, never in the controlplane, and is retried,
cancelled, logged and reaped as every task is.

Invariants:

- The cache is per workspace: the steps and images looked up and recorded are the caller's workspace's
  only (:class:`~levers9.state.sql.blueprints.BlueprintStore`). A step whose key the workspace built is not
  run again; the order sent to the worker names them with their layers, which the worker fetches from the
  workspace's own repository.
- Nothing is recorded unless the whole build succeeded, and then everything is, in one transaction.
  Recording does not depend on the caller: a client that goes away mid-build does not stop the build or
  lose its result (the next build of the same blueprint finds it).
- Secrets: a step names workspace secrets; their values reach the worker only the way every stub's
  secrets do (decrypted onto the worker's authenticated session, never stored in the task), and the
  worker gives each step only its own. The order itself (stored as the task's arguments) holds names.
- Users cannot make a ``build`` stub themselves (``GetOrCreateStub`` refuses the kind): the order's
  list of cached layers is the controlplane's word, and a forged one could name another workspace's
  layers.

The order (the task's argument) is :mod:`levers9.blueprints.order`'s tar archive.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from levers9.blueprints.order import write_order
from levers9.blueprints.spec import BlueprintError, BuildSpec, keys
from levers9.hooks.errors import Levers9Error
from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.services.stubs import BUILD_KIND
from levers9.services.tasks import task_logs
from levers9.state.sql.blueprints import BlueprintStore, NewStep
from levers9.state.sql.records import BlueprintImageRecord

__all__ = [
    "BUILDER_HANDLER",
    "BuildEvent",
    "Builds",
    "InvalidBlueprint",
    "NoBuildPool",
    "RegistryTarget",
]

log = logging.getLogger(__name__)

#: what a build stub's "handler" is: builds run the worker's own builder, never user code
BUILDER_HANDLER = b"levers9-builder/1"
#: a build's resources on its worker: the step containers' limits (package managers want memory)
BUILD_CPU_MILLICORES = 1000
BUILD_MEMORY_MIB = 2048
#: a build that runs longer is ended (a step waiting on a network that never answers)
BUILD_TIMEOUT_S = 3600.0


class InvalidBlueprint(ValueError):
    """A build spec or its files that can never build; the message names the field and what is accepted."""


class NoBuildPool(Levers9Error):
    """No pool the workspace may use builds images; the message says how to make one."""


@dataclass(frozen=True)
class RegistryTarget:
    """Where built images go: the registry's URL (what workers push to) and the host refs name."""

    url: str
    repository_prefix: str = "levers9"
    tls_verify: bool | str = True

    @property
    def host(self) -> str:
        """``host:port`` of the registry, as image refs name it."""
        return self.url.split("://", 1)[1].rstrip("/")

    def repository(self, workspace: str) -> str:
        return f"{self.repository_prefix}/{workspace.lower()}/blueprints"

    def ref(self, image: BlueprintImageRecord) -> str:
        """The ref a stub's ``image`` holds for a built image: pinned by digest."""
        return f"{self.host}/{image.repository}@{image.manifest_digest}"


@dataclass(frozen=True)
class BuildEvent:
    """One thing a build says: output (``log``), the start (``started``), and its end (``done`` or ``failed``)."""

    kind: Literal["started", "log", "done", "failed"]
    text: str = ""
    #: done: the image ref to run (the registry's host, the workspace's repository, the manifest digest)
    image: str = ""
    #: the key of the image (the last step's)
    key: str = ""
    #: done: nothing was run, the workspace had built this image before
    cached: bool = False
    task_id: str = ""
    steps: int = 0
    steps_cached: int = 0


class Builds:
    """Builds of every workspace, through one data plane and into one registry."""

    def __init__(self, dp: DataPlane, registry: RegistryTarget | None) -> None:
        self.dp = dp
        self.registry = registry
        self.store = BlueprintStore(dp.services.db)
        #: recordings under way, kept so that a caller going away does not cancel them
        self._finishing: set[asyncio.Task[BuildEvent]] = set()

    def _registry(self) -> RegistryTarget:
        if self.registry is None:
            raise NoBuildPool(
                "this controlplane has no image registry: set registry.url in its config, or leave it empty on "
                "a single controlplane for the embedded one (it needs Debian's docker-registry installed)"
            )
        return self.registry

    async def images(self, principal: Principal) -> list[tuple[BlueprintImageRecord, str]]:
        """The caller's workspace's built images, the most recently used first, each with the ref that runs it."""
        registry = self._registry()
        return [(i, registry.ref(i)) for i in await self.store.images(principal.require_workspace())]

    async def build(
        self, principal: Principal, spec_json: str, contents: Mapping[str, bytes]
    ) -> AsyncGenerator[BuildEvent, None]:
        workspace = principal.require_workspace()
        try:
            spec = BuildSpec.from_json(spec_json)
        except BlueprintError as exc:
            raise InvalidBlueprint(str(exc)) from None
        all_keys = keys(spec)
        needed = {s.content for s in spec.steps if s.op == "copy" and s.content is not None}
        missing = sorted(needed - set(contents))
        if missing:
            raise InvalidBlueprint(f"contents: the files of copy steps {', '.join(missing)} were not sent")
        for digest in sorted(needed):
            if "sha256:" + hashlib.sha256(contents[digest]).hexdigest() != digest:
                raise InvalidBlueprint(f"contents: the files sent for {digest} do not have that sha256")
        registry = self._registry()
        built = await self.store.image(workspace, all_keys[-1], touch=True)
        if built is not None:
            yield BuildEvent(
                "done",
                image=registry.ref(built),
                key=built.key,
                cached=True,
                steps=len(spec.steps),
                steps_cached=len(spec.steps),
            )
            return
        pools = self.dp.build_pools(workspace)
        if not pools:
            raise NoBuildPool(
                "no pool builds images: set `builds: true` on a pool whose runtime is runc or gvisor "
                f"(pools: {', '.join(sorted(self.dp.services.pools)) or 'none'})"
            )
        secret_names = sorted({name for step in spec.steps for name in step.secrets} | set(spec.base.credentials))
        known = await self.store.steps(workspace, all_keys)
        cached: dict[str, Any] = {}
        for key in all_keys:  # a step is only as good as its parents: the cached run is a prefix
            record = known.get(key)
            if record is None:
                break
            cached[key] = {
                "op": record.op,
                "diff_id": record.diff_id,
                "blob_digest": record.blob_digest,
                "size": record.size_bytes,
            }
        order = write_order(
            spec,
            all_keys,
            cached,
            {d: contents[d] for d in needed},
            registry={
                "url": registry.url,
                "repository": registry.repository(workspace),
                "tag": all_keys[-1].removeprefix("sha256:")[:40],
                "tls_verify": registry.tls_verify,
            },
        )
        stub_config = {
            "kind": BUILD_KIND,
            "app": "levers9-builds",
            "name": "build-" + hashlib.sha256(json.dumps(secret_names).encode()).hexdigest()[:16],
            "secrets": secret_names,
            "cpu_millicores": BUILD_CPU_MILLICORES,
            "memory_mib": BUILD_MEMORY_MIB,
            "timeout_s": BUILD_TIMEOUT_S,
        }
        stub_id, _ = await self.dp.get_or_create_stub(principal, stub_config, BUILDER_HANDLER, internal=True)
        (task_id,) = await self.dp.submit(principal, stub_id, [order])
        log.info(
            "build %s of workspace %s: %d steps, %d cached, on %s",
            task_id,
            workspace,
            len(all_keys),
            len(cached),
            ", ".join(pools),
        )
        yield BuildEvent(
            "started",
            task_id=task_id,
            key=all_keys[-1],
            steps=len(spec.steps),
            steps_cached=len(set(cached) - {all_keys[0]}),
            text=f"building on pool {' or '.join(pools)}",
        )
        finishing = asyncio.create_task(self._finish(principal, task_id, spec, all_keys, registry))
        self._finishing.add(finishing)
        finishing.add_done_callback(self._finishing.discard)
        async for data in task_logs(self.dp, principal, task_id, follow=True):
            yield BuildEvent("log", text=data.decode(errors="replace"), task_id=task_id)
        yield await asyncio.shield(finishing)

    async def _finish(
        self, principal: Principal, task_id: str, spec: BuildSpec, all_keys: tuple[str, ...], registry: RegistryTarget
    ) -> BuildEvent:
        workspace = principal.require_workspace()
        outcome = None
        async for result in self.dp.watch(principal, [task_id], just_submitted=False):
            outcome = result
        if outcome is None or outcome.status != "complete":
            what = "cancelled" if outcome is not None and outcome.status == "cancelled" else "failed"
            message = (outcome.error if outcome is not None else None) or f"the build {what}"
            return BuildEvent("failed", text=message, task_id=task_id, key=all_keys[-1])
        try:
            report = json.loads(outcome.result or b"")
            steps = [
                NewStep(
                    key=s["key"],
                    op=s["op"],
                    diff_id=s.get("diff_id"),
                    blob_digest=s.get("blob_digest"),
                    size_bytes=s.get("size"),
                )
                for s in report["steps"]
            ]
            digest, size = str(report["manifest_digest"]), int(report["size"])
        except (ValueError, KeyError, TypeError) as exc:
            return BuildEvent("failed", text=f"the build worker's report is malformed ({exc})", task_id=task_id)
        unknown = [s.key for s in steps if s.key not in all_keys]
        if unknown or not digest.startswith("sha256:"):
            return BuildEvent(
                "failed", text="the build worker reported steps this build did not ask for", task_id=task_id
            )
        image = await self.store.record(
            workspace,
            steps,
            key=all_keys[-1],
            repository=registry.repository(workspace),
            manifest_digest=digest,
            size_bytes=size,
            step_count=len(all_keys),
        )
        ran = {s.key for s in steps} - {all_keys[0]}
        return BuildEvent(
            "done",
            image=registry.ref(image),
            key=image.key,
            task_id=task_id,
            steps=len(spec.steps),
            steps_cached=len(spec.steps) - len(ran),
        )
