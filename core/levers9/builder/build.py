"""A build: a blueprint's steps run in order on its base, and the image they make as an OCI layout.

:func:`run_build` takes a :class:`~levers9.blueprints.spec.BuildSpec`, the base's layers
(:class:`BaseImage`) and the steps already built (``cached``, by key: the controlplane knows them per
workspace), and runs the others in order: ``run``, ``apt`` and ``pip`` steps in containers of the
pool's runtime (:mod:`levers9.builder.steps`), with the build's egress proxy as their only way out
(:mod:`levers9.builder.egress`); ``copy`` steps as a re-rooted tar of their files; ``env`` and
``workdir`` steps as changes of the image's configuration alone. Each step that ran gives a
:class:`StepResult` (its key, layer, blob and the configuration it set) for the caller to record, and
the whole image is written as an OCI image layout directory (:mod:`levers9.builder.layout`) that
``skopeo inspect oci:DIR`` and :meth:`levers9.engine.images.ImageStore.resolve` accept, ready to push.

Events (:class:`BuildEvent`) go to ``on_event`` as they happen: a step starting, a step cached (not
run), each line a step's command prints, a step done, a request the egress proxy refused.

Invariants:

- a step whose key is in ``cached`` is not run; its layer must be in the node cache (the caller puts
  it there) and is used as it is. Every later step runs on the layers below it, cached or not;
- a failing step raises :class:`BuildFailed` naming it (its number, op and command), its exit code and
  its last lines of output; nothing after it runs and no image is written. Steps before it that ran
  are lost to the caller with the exception (their layers stay in the node cache and blob directory,
  where a retry finds them only through ``cached``);
- secrets reach only the steps that name them, as environment variables and files under
  ``/run/secrets``; their values are in no layer, no config and no history entry (only their names,
  in the history of the steps that use them), and are masked (``***``) in the output lines passed on
  and in a failure's message;
- nothing outlives the build: containers are removed (:mod:`levers9.builder.steps`), the proxy is
  stopped with its host-guard rules, and the build's private work directory is deleted, whether the
  build succeeds, fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from levers9.blueprints.spec import BuildSpec, Step, keys
from levers9.builder.base import BaseLayer
from levers9.builder.egress import EgressProxy, Refusal
from levers9.builder.layout import Layer, Written, gzip_layer, gzipped, write_layout
from levers9.builder.sources import PipSettings, deb_line_urls, egress_hosts, pip_settings
from levers9.builder.steps import (
    BuildError,
    StepFailed,
    StepLimits,
    StepRunner,
    copy_layer,
    describe,
    keep_layer,
)
from levers9.engine.images import ImageStore
from levers9.engine.network import Bridge
from levers9.engine.node import NodeSettings, bridge_for, images_for
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import RuntimeContext

__all__ = [
    "BaseImage",
    "BuildError",
    "BuildEvent",
    "BuildFailed",
    "BuildResult",
    "StepLimits",
    "StepResult",
    "run_build",
]

log = logging.getLogger(__name__)

EventKind = Literal["start", "cached", "output", "done", "refused"]
_CONTAINER_OPS = ("run", "apt", "pip")


@dataclass(frozen=True)
class BuildEvent:
    """Something that happened in a build; ``step`` counts from 1 (0: the build as a whole)."""

    kind: EventKind
    step: int
    total: int
    text: str

    def __str__(self) -> str:
        return f"step {self.step}/{self.total} {self.kind}: {self.text}" if self.step else self.text


@dataclass(frozen=True)
class BaseImage:
    """What a build starts from: the base's layers (lowest first, unpacked in the node cache) and its config."""

    layers: tuple[Layer, ...]
    env: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = "/"
    architecture: str = "amd64"
    #: RFC 3339, the base's own; the image's ``created`` (so the same build gives the same config)
    created: str | None = None
    #: the base's history entries, one per layer
    history: tuple[dict[str, Any], ...] = ()
    #: the archives the base's apt sources name: the egress proxy lets them through
    apt_urls: tuple[str, ...] = ()

    @classmethod
    def debian(cls, base: BaseLayer, store: ImageStore) -> BaseImage:
        """A Debian base from :mod:`levers9.builder.base`, unpacked into ``store`` and gzipped (once each). Blocks."""
        store.add_layer(base.path, base.diff_id)
        layer = gzipped(base.diff_id, store.cache_dir) or gzip_layer(base.path, store.cache_dir)
        config = base.config()
        return cls(
            layers=(layer,),
            env=base.env,
            cmd=base.cmd,
            workdir=config["config"]["WorkingDir"],
            architecture=base.architecture,
            created=base.created,
            history=tuple(config["history"]),
            apt_urls=tuple(deb_line_urls(base.sources)),
        )


@dataclass(frozen=True)
class StepResult:
    """One step as built: its key, its layer (None for env and workdir steps) and the configuration it set."""

    key: str
    op: str
    #: the history entry's ``created_by``: what the step does, secrets by name only
    created_by: str
    diff_id: str | None = None
    blob_digest: str | None = None
    blob_path: Path | None = None
    #: the blob's size in bytes
    size: int | None = None
    #: variables the step set (env steps)
    env: tuple[tuple[str, str], ...] = ()
    #: the working directory the step set (workdir steps)
    workdir: str | None = None

    def layer(self) -> Layer | None:
        if self.diff_id is None:
            return None
        return Layer(diff_id=self.diff_id, blob_digest=self.blob_digest, blob_path=self.blob_path, blob_size=self.size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what the caller records for the step's key."""
        return {
            "key": self.key,
            "op": self.op,
            "created_by": self.created_by,
            "diff_id": self.diff_id,
            "blob_digest": self.blob_digest,
            "blob_path": str(self.blob_path) if self.blob_path else None,
            "size": self.size,
            "env": [list(p) for p in self.env],
            "workdir": self.workdir,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepResult:
        return cls(
            key=data["key"],
            op=data["op"],
            created_by=data["created_by"],
            diff_id=data.get("diff_id"),
            blob_digest=data.get("blob_digest"),
            blob_path=Path(data["blob_path"]) if data.get("blob_path") else None,
            size=data.get("size"),
            env=tuple((str(k), str(v)) for k, v in data.get("env") or ()),
            workdir=data.get("workdir"),
        )


@dataclass(frozen=True)
class BuildResult:
    """A finished build: the image's layout directory and digests, and every step in order."""

    layout: Path
    manifest_digest: str
    config_digest: str
    #: one per step of the spec, cached or run, in order
    steps: tuple[StepResult, ...]
    #: the steps run (their numbers, from 1) and those taken from ``cached``
    ran: tuple[int, ...]
    cached: tuple[int, ...]
    #: blob digests the layout lists but does not hold (cached steps built elsewhere): the registry has them
    missing_blobs: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = field(default=(), compare=False)


class BuildFailed(Levers9Error):
    """A step failed: which one (``step`` from 1, its ``op`` and ``command``), its exit code and last lines."""

    def __init__(
        self, step: int, total: int, op: str, command: str, reason: str, exit_code: int | None, lines: Sequence[str]
    ) -> None:
        tail = "\n".join(f"  {line}" for line in lines) or "  (no output)"
        super().__init__(f"step {step}/{total} ({command}) {reason}; its last lines of output:\n{tail}")
        self.step = step
        self.total = total
        self.op = op
        self.command = command
        self.reason = reason
        self.exit_code = exit_code
        self.lines = tuple(lines)


def _env_dict(entries: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in entries:
        name, _, value = entry.partition("=")
        env[name] = value
    return env


def _config(base: BaseImage, env: Mapping[str, str], workdir: str, history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    section: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": workdir}
    if base.cmd:
        section["Cmd"] = list(base.cmd)
    config: dict[str, Any] = {
        "architecture": base.architecture,
        "os": "linux",
        "config": section,
        "history": list(history),
    }
    if base.created:
        config["created"] = base.created
    return config


async def run_build(
    spec: BuildSpec,
    *,
    hooks: Hooks,
    runtime: RuntimeContext,
    store: ImageStore,
    base: BaseImage,
    cached: Mapping[str, StepResult],
    secrets: Mapping[str, str],
    content: Callable[[str], Path],
    on_event: Callable[[BuildEvent], None],
    out_dir: Path,
    pip: PipSettings | None = None,
    limits: StepLimits | None = None,
    work_dir: Path | None = None,
) -> BuildResult:
    """Build ``spec`` into the OCI layout ``out_dir`` (see the module docstring).

    ``content(digest)``: the path of a copy step's files as the deterministic tar of that digest.
    ``pip``: the build machine's pip configuration (default: read now, :func:`~levers9.builder.sources.pip_settings`).
    ``work_dir``: where the build's private scratch directory goes (default: ``builds/`` in the runtime's state).
    """
    all_keys = keys(spec)
    total = len(spec.steps)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise BuildError(f"out_dir {out_dir} is not an empty directory: the image's layout is written into a new one")
    to_run = [i for i, step in enumerate(spec.steps, 1) if all_keys[i] not in cached]
    containers = [i for i in to_run if spec.steps[i - 1].op in _CONTAINER_OPS]
    if containers:
        _check_runtime(hooks, runtime, store)
    for i in to_run:
        unset = [name for name in spec.steps[i - 1].secrets if name not in secrets]
        if unset:
            raise BuildError(f"step {i}/{total} names the secrets {', '.join(unset)}, which the build was not given")
    pip = pip if pip is not None else pip_settings()
    for note in pip.skipped:
        log.info("build: pip configuration: %s", note)
    parent = work_dir or Path(runtime.state_dir) / "builds"
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=parent))
    bridge = _bridge(runtime) if containers else None
    refusals: list[Refusal] = []

    def refused(refusal: Refusal) -> None:
        refusals.append(refusal)
        on_event(BuildEvent("refused", 0, total, str(refusal)))

    proxy = None
    if bridge is not None:
        index_urls = [s.index_url for s in spec.steps if s.index_url]
        allowed = egress_hosts(pip, index_urls=index_urls, apt_urls=base.apt_urls)
        proxy = EgressProxy(bridge, allowed=allowed, on_refusal=refused)
    try:
        if proxy is not None:
            await proxy.start()
        runner = StepRunner(
            hooks=hooks,
            runtime=runtime,
            store=store,
            work=work,
            proxy=proxy,
            bridge=bridge,
            pip=pip,
            limits=limits or StepLimits(),
        )
        return await _steps(spec, all_keys, runner, base, cached, secrets, content, on_event, out_dir, refusals)
    finally:
        if proxy is not None:
            await asyncio.shield(proxy.close())
        await asyncio.to_thread(shutil.rmtree, work, True)


async def _steps(
    spec: BuildSpec,
    all_keys: Sequence[str],
    runner: StepRunner,
    base: BaseImage,
    cached: Mapping[str, StepResult],
    secrets: Mapping[str, str],
    content: Callable[[str], Path],
    on_event: Callable[[BuildEvent], None],
    out_dir: Path,
    refusals: list[Refusal],
) -> BuildResult:
    total = len(spec.steps)
    layers = list(base.layers)
    env = _env_dict(base.env)
    workdir = base.workdir
    history = list(base.history)
    results: list[StepResult] = []
    ran: list[int] = []
    from_cache: list[int] = []
    masked = [value for value in secrets.values() if value]
    for i, step in enumerate(spec.steps, 1):
        key = all_keys[i]
        what = describe(step)
        if key in cached:
            result = cached[key]
            if result.diff_id is not None and runner.store.layer_path(result.diff_id) is None:
                raise BuildError(
                    f"step {i}/{total} is cached as layer {result.diff_id}, which is not in the node cache"
                )
            from_cache.append(i)
            on_event(BuildEvent("cached", i, total, what))
        else:
            on_event(BuildEvent("start", i, total, what))
            result = await _run_step(
                i, total, key, step, runner, layers, env, workdir, history, base, secrets, content, on_event, masked
            )
            ran.append(i)
            on_event(BuildEvent("done", i, total, result.diff_id or "configuration only"))
        layer = result.layer()
        if layer is not None:
            layers.append(layer)
        env.update(dict(result.env))
        workdir = result.workdir or workdir
        entry: dict[str, Any] = {"created_by": result.created_by}
        if layer is None:
            entry["empty_layer"] = True
        history.append(entry)
        results.append(result)
    config = _config(base, env, workdir, history)
    written: Written = await asyncio.to_thread(write_layout, out_dir, layers, config)
    return BuildResult(
        layout=out_dir,
        manifest_digest=written.manifest_digest,
        config_digest=written.config_digest,
        steps=tuple(results),
        ran=tuple(ran),
        cached=tuple(from_cache),
        missing_blobs=written.missing,
        refusals=tuple(refusals),
    )


async def _run_step(
    i: int,
    total: int,
    key: str,
    step: Step,
    runner: StepRunner,
    layers: Sequence[Layer],
    env: Mapping[str, str],
    workdir: str,
    history: Sequence[dict[str, Any]],
    base: BaseImage,
    secrets: Mapping[str, str],
    content: Callable[[str], Path],
    on_event: Callable[[BuildEvent], None],
    masked: Sequence[str],
) -> StepResult:
    what = describe(step)
    if step.op == "env":
        return StepResult(key=key, op=step.op, created_by=what, env=step.env)
    if step.op == "workdir":
        return StepResult(key=key, op=step.op, created_by=what, workdir=step.args[0])
    try:
        if step.op == "copy":
            assert step.content is not None  # a copy step has one (the spec checks)
            layer = await asyncio.to_thread(_copy, runner, content, step, i)
        else:
            config = _config(base, env, workdir, history)
            layer = await runner.run(
                i,
                step,
                layers=layers,
                config=config,
                workdir=workdir,
                secrets=secrets,
                on_line=lambda line: on_event(BuildEvent("output", i, total, line)),
            )
    except StepFailed as failed:
        lines = [_masked(line, masked) for line in failed.lines]
        raise BuildFailed(i, total, step.op, what, _masked(failed.reason, masked), failed.exit_code, lines) from None
    return StepResult(
        key=key,
        op=step.op,
        created_by=what,
        diff_id=layer.diff_id,
        blob_digest=layer.blob_digest,
        blob_path=layer.blob_path,
        size=layer.blob_size,
    )


def _copy(runner: StepRunner, content: Callable[[str], Path], step: Step, index: int) -> Layer:
    assert step.content is not None
    source = content(step.content)
    tar = runner.work / f"copy-{index}.tar"
    try:
        copy_layer(source, step.content, step.args[0], tar)
        return keep_layer(runner.store, tar)
    finally:
        tar.unlink(missing_ok=True)


def _masked(text: str, values: Sequence[str]) -> str:
    for value in values:
        text = text.replace(value, "***")
    return text


def _check_runtime(hooks: Hooks, runtime: RuntimeContext, store: ImageStore) -> None:
    if not hooks.captures_changes(runtime):
        raise BuildError(f"runtime {runtime.name!r} cannot build images; builds need runc or gvisor")
    settings = _node_settings(runtime)
    if settings is not None:
        theirs = images_for(runtime, settings).cache_dir
        if os.path.realpath(theirs) != os.path.realpath(store.cache_dir):
            raise BuildError(
                f"the build's image store ({store.cache_dir}) is not runtime {runtime.name!r}'s image cache ({theirs}): "
                "its step containers would not find the layers the build keeps"
            )


def _node_settings(runtime: RuntimeContext) -> NodeSettings | None:
    try:
        return NodeSettings.of(runtime)
    except ValueError:
        return None  # a runtime whose settings are not a node's (no bridge, no image cache of levers9's)


def _bridge(runtime: RuntimeContext) -> Bridge | None:
    settings = _node_settings(runtime)
    return bridge_for(settings) if settings is not None else None
