"""Plugins' startup and shutdown with their context, and the firstresult hooks through pluggy's own caller."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from levers9.hooks.context import AgentAck, AgentInventory, AgentOrder, PluginContext
from levers9.hooks.errors import PluginError, PluginTimeout
from levers9.hooks.facade import Hooks
from levers9.hooks.health import ProviderUnhealthy
from levers9.hooks.manager import PluginSet
from levers9.hooks.types import (
    CheckpointImage,
    CheckpointSupport,
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    Machine,
    Pool,
    PreparedContainer,
    RuntimeContext,
)


class Settings(BaseModel):
    pass


class Hub:
    """An agent hub as a plugin sees it; only its identity matters here."""

    async def send(self, order: AgentOrder, *, timeout: float) -> AgentAck:
        return AgentAck(order_id="o-1", ok=True)

    def inventories(self, provider: str | None = None, *, workspace: Any = None) -> list[AgentInventory]:
        return []


class Counter:
    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.counts: dict[str, float] = {}

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self.counts[name] = value


class Remembers:
    """A provider that keeps its context from startup and uses it in a later hook and at shutdown."""

    def __init__(self) -> None:
        self.started: list[PluginContext] = []
        self.stopped: list[PluginContext] = []

    def levers9_provider_settings(self) -> type[BaseModel]:
        return Settings

    def levers9_startup(self, ctx: PluginContext) -> None:
        ctx.state["session"] = "open"
        ctx.metrics.count("starts")
        ctx.log.info("started")
        self.started.append(ctx)

    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        ctx = self.started[-1]
        return [Machine(provider_id=ctx.state["session"], pool=pool.name)]

    def levers9_shutdown(self, ctx: PluginContext) -> None:
        ctx.state["session"] = "closed"
        self.stopped.append(ctx)


class FailsToStart:
    def __init__(self, failures: int = 1) -> None:
        self.failures = failures
        self.starts = 0
        self.stopped = False
        self.listed = 0

    def levers9_provider_settings(self) -> type[BaseModel]:
        return Settings

    def levers9_startup(self, ctx: PluginContext) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise ConnectionError("cannot reach the cloud API to open a session")

    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        self.listed += 1
        return []

    def levers9_shutdown(self, ctx: PluginContext) -> None:
        self.stopped = True


class HangsAtStart:
    def __init__(self) -> None:
        self.release = threading.Event()

    def levers9_startup(self, ctx: PluginContext) -> None:
        self.release.wait(30)


class FailsToStop:
    def levers9_shutdown(self, ctx: PluginContext) -> None:
        raise RuntimeError("session already gone")


def pool(provider: str) -> Pool:
    return Pool(name=f"pool-{provider}", provider=provider, runtime="process")


async def test_hook_levers9_startup(caplog: pytest.LogCaptureFixture) -> None:
    remembers, fails, hangs = Remembers(), FailsToStart(), HangsAtStart()
    plugins = PluginSet()
    for name, plugin in {"remembers": remembers, "fails": fails, "hangs": hangs}.items():
        plugins.add(name, plugin)
    hub = Hub()
    meters: dict[str, Counter] = {}

    def metrics(name: str) -> Counter:
        meters[name] = Counter(name)
        return meters[name]

    hooks = Hooks(plugins, timeout=0.3, probe_every_s=3600)
    try:
        with caplog.at_level(logging.INFO, logger="levers9"):
            await hooks.startup(agents=hub, metrics=metrics)
        (ctx,) = remembers.started
        assert ctx is hooks.context("remembers")
        assert (ctx.name, ctx.log.name) == ("remembers", "levers9.plugin.remembers")
        assert ctx.agents is hub
        assert ctx.metrics is meters["remembers"]
        assert meters["remembers"].counts == {"starts": 1}
        assert any(r.name == "levers9.plugin.remembers" and r.message == "started" for r in caplog.records)
        assert await hooks.list_machines(pool("remembers")) == [Machine(provider_id="open", pool="pool-remembers")]

        health = hooks.health()
        assert health["remembers"].healthy
        assert not health["fails"].healthy
        assert health["fails"].reason == (
            "levers9_startup failed: raised ConnectionError: cannot reach the cloud API to open a session"
        )
        assert not health["hangs"].healthy
        assert health["hangs"].reason == "levers9_startup failed: did not answer within 0.3 s"
        with pytest.raises(ProviderUnhealthy, match="levers9_startup failed: raised ConnectionError"):
            await hooks.list_machines(pool("fails"))
        assert fails.listed == 0

        await hooks.startup()  # once only: contexts and plugins are left as they are
        assert len(remembers.started) == 1
        assert hooks.context("remembers") is ctx
    finally:
        hangs.release.set()
        hooks.close()


async def test_a_plugin_that_failed_to_start_is_started_again_by_its_probe() -> None:
    fails = FailsToStart(failures=2)
    plugins = PluginSet()
    plugins.add("fails", fails)
    hooks = Hooks(plugins, probe_every_s=0)
    try:
        await hooks.startup()
        with pytest.raises(ProviderUnhealthy, match="levers9_startup failed"):
            await hooks.list_machines(pool("fails"))  # the probe's start fails too
        assert (fails.starts, fails.listed) == (2, 0)
        assert await hooks.list_machines(pool("fails")) == []  # third start succeeds, then the call runs
        assert (fails.starts, fails.listed) == (3, 1)
        assert hooks.health()["fails"].healthy
        await hooks.shutdown()
        assert fails.stopped, "a plugin started by its probe is shut down like the others"
    finally:
        hooks.close()


async def test_hook_levers9_shutdown(caplog: pytest.LogCaptureFixture) -> None:
    remembers, fails = Remembers(), FailsToStart()
    plugins = PluginSet()
    plugins.add("remembers", remembers)
    plugins.add("fails", fails)
    plugins.add("fails_to_stop", FailsToStop())
    hooks = Hooks(plugins)
    await hooks.startup()
    with caplog.at_level(logging.ERROR, logger="levers9.plugins"):
        await hooks.shutdown()  # a raising shutdown is logged, not raised
    assert remembers.stopped == remembers.started, "shutdown gets the context startup got"
    assert remembers.stopped[0].state == {"session": "closed"}
    assert not fails.stopped, "a plugin that never started is not shut down"
    assert any("'fails_to_stop' failed to shut down" in r.message for r in caplog.records)
    assert any("session already gone" in r.message for r in caplog.records)
    with pytest.raises(RuntimeError, match="closed"):
        await hooks.list_machines(pool("remembers"))


async def test_shutdown_without_startup_calls_no_hook_and_closes() -> None:
    remembers = Remembers()
    plugins = PluginSet()
    plugins.add("remembers", remembers)
    hooks = Hooks(plugins)
    await hooks.shutdown()
    assert remembers.stopped == []


def test_a_context_before_startup_is_bare_and_stable() -> None:
    plugins = PluginSet()
    plugins.add("remembers", Remembers())
    hooks = Hooks(plugins)
    ctx = hooks.context("remembers")
    assert (ctx.name, ctx.agents, ctx.state) == ("remembers", None, {})
    assert hooks.context("remembers") is ctx
    with pytest.raises(Exception, match="unknown plugin 'nobody'"):
        hooks.context("nobody")
    hooks.close()


# --------------------------------------------------------------------------- firstresult hooks through pluggy


class Answers:
    def __init__(self) -> None:
        self.asked = 0

    def levers9_checkpoint_support(self, runtime: RuntimeContext) -> CheckpointSupport | None:
        self.asked += 1
        return CheckpointSupport(available=True, mechanism="answers") if runtime.name == "rt" else None

    def levers9_checkpoint(self, runtime: RuntimeContext, container_id: str, image_dir: str) -> Any:
        return CheckpointImage(checkpoint_id="ck", runtime=runtime.name, path=image_dir, size_bytes=1)

    def levers9_restore(self, runtime: RuntimeContext, container: PreparedContainer, image: CheckpointImage) -> Any:
        return ContainerState(container_id=container.container_id, status=ContainerStatus.RUNNING)


class Declines:
    def __init__(self) -> None:
        self.asked = 0

    def levers9_checkpoint_support(self, runtime: RuntimeContext) -> CheckpointSupport | None:
        self.asked += 1
        return None


class WrongType:
    def levers9_checkpoint(self, runtime: RuntimeContext, container_id: str, image_dir: str) -> Any:
        return {"checkpoint_id": "ck", "runtime": runtime.name, "path": image_dir, "size_bytes": 1}


class Raises:
    def levers9_restore(self, runtime: RuntimeContext, container: PreparedContainer, image: CheckpointImage) -> Any:
        raise KeyError("criu-dump.log")


class Hangs:
    def __init__(self) -> None:
        self.release = threading.Event()

    def levers9_checkpoint_support(self, runtime: RuntimeContext) -> CheckpointSupport | None:
        self.release.wait(30)
        return None


RT = RuntimeContext(name="rt", state_dir="/nonexistent")
PREPARED = PreparedContainer(
    container_id="c1", runtime="rt", spec=ContainerSpec(container_id="c1", image="/i", command=["true"])
)
IMAGE = CheckpointImage(checkpoint_id="ck", runtime="rt", path="/nonexistent", size_bytes=1)


async def test_firstresult_goes_through_pluggys_caller_and_returns_the_first_answer() -> None:
    answers, declines = Answers(), Declines()
    plugins = PluginSet()
    plugins.add("answers", answers)
    plugins.add("declines", declines)  # registered last, so pluggy asks it first
    called: list[str] = []
    plugins.pm.add_hookcall_monitoring(lambda name, impls, kwargs: called.append(name), lambda *a: None)
    hooks = Hooks(plugins)
    try:
        support = await hooks.checkpoint_support(RT)
        assert support == CheckpointSupport(available=True, mechanism="answers")
        assert called == ["levers9_checkpoint_support"], "the call went through pluggy's hook caller"
        assert (declines.asked, answers.asked) == (1, 1)
        other = await hooks.checkpoint_support(RT.model_copy(update={"name": "other"}))
        assert (other.available, other.reason) == (
            False,
            "no installed plugin checkpoints containers of runtime 'other'",
        )
    finally:
        hooks.close()


async def test_firstresult_names_the_plugin_whose_answer_has_the_wrong_type(tmp_path: Path) -> None:
    plugins = PluginSet()
    plugins.add("answers", Answers())
    plugins.add("wrong", WrongType())  # asked first
    hooks = Hooks(plugins)
    try:
        with pytest.raises(PluginError) as info:
            await hooks.checkpoint(RT, "c1", str(tmp_path))
        assert (info.value.plugin, info.value.hook) == ("wrong", "levers9_checkpoint")
        assert "returned dict, expected CheckpointImage" in str(info.value)
    finally:
        hooks.close()


async def test_firstresult_names_the_plugin_that_raised() -> None:
    plugins = PluginSet()
    plugins.add("answers", Answers())
    plugins.add("raises", Raises())  # asked first
    hooks = Hooks(plugins)
    try:
        with pytest.raises(PluginError) as info:
            await hooks.restore(RT, PREPARED, IMAGE)
        assert (info.value.plugin, info.value.hook) == ("raises", "levers9_restore")
        assert "raised KeyError: 'criu-dump.log'" in str(info.value)
    finally:
        hooks.close()


async def test_firstresult_names_the_plugin_that_hung() -> None:
    hangs = Hangs()
    plugins = PluginSet()
    plugins.add("answers", Answers())
    plugins.add("hangs", hangs)  # asked first
    hooks = Hooks(plugins)
    try:
        with pytest.raises(PluginTimeout) as info:
            await hooks.checkpoint_support(RT, timeout=0.2)
        assert str(info.value) == "plugin 'hangs', hook levers9_checkpoint_support: did not answer within 0.2 s"
    finally:
        hangs.release.set()
        hooks.close()
