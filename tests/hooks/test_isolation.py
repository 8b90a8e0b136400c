"""Each plugin on its own threads, deadlines that count from the hook's start, and unhealthy providers.

The plugins here are small in-process objects registered through the real
plugin manager; the hooks run on the facade's real threads. Hangs are
``threading.Event`` waits the test releases, so what is asserted is order
(entered, still blocked, answered), not how long anything took; the one
exception is the deadline-from-start test, whose margins are explained there.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from levers9.hooks.errors import InsufficientCapacity, PluginError, PluginTimeout
from levers9.hooks.facade import Hooks
from levers9.hooks.health import HealthBook, PluginQueueTimeout, ProviderUnhealthy
from levers9.hooks.manager import PluginSet
from levers9.hooks.types import Machine, Pool


class Settings(BaseModel):
    pass


class Provider:
    """A provider whose ``levers9_list_machines`` does what the test says: block, fail, or answer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = threading.Event()
        self.block = False
        self.fail_with: Exception | None = None
        self.lock = threading.Lock()
        self.entered = 0
        self.left = 0

    def levers9_provider_settings(self) -> type[BaseModel]:
        return Settings

    def levers9_list_machines(self, pool: Pool) -> list[Machine]:
        with self.lock:
            self.entered += 1
        try:
            if self.block:
                self.release.wait(30)
            if self.fail_with is not None:
                raise self.fail_with
            return [Machine(provider_id=f"{self.name}-1", pool=pool.name)]
        finally:
            with self.lock:
                self.left += 1


def pool(provider: str) -> Pool:
    return Pool(name=f"pool-{provider}", provider=provider, runtime="process")


@pytest.fixture
def providers() -> Iterator[dict[str, Provider]]:
    made = {name: Provider(name) for name in ("stuck", "fine")}
    yield made
    for p in made.values():
        p.release.set()


def make_hooks(providers: dict[str, Provider], **kwargs: Any) -> Hooks:
    plugins = PluginSet()
    for name, provider in providers.items():
        plugins.add(name, provider)
    return Hooks(plugins, **kwargs)


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check`` (a bound for a hang only: 20 s, never a timing assertion)."""
    deadline = time.monotonic() + 20
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for: {what}")
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- per-plugin threads


async def test_a_plugin_with_every_thread_stuck_queues_only_its_own_calls(providers: dict[str, Provider]) -> None:
    stuck = providers["stuck"]
    stuck.block = True
    hooks = make_hooks(providers, timeout=30)  # 4 threads per provider plugin, the default
    try:
        calls = [asyncio.create_task(hooks.list_machines(pool("stuck"))) for _ in range(14)]
        await until(lambda: stuck.entered == 4, "the stuck plugin to fill its 4 threads")
        await until(lambda: hooks.health()["stuck"].queued == 10, "the other 10 calls to queue")

        # With one shared pool these 14 would hold 14 threads; here the other plugin has all of its own.
        answers = await asyncio.gather(*(hooks.list_machines(pool("fine")) for _ in range(8)))
        assert [m[0].provider_id for m in answers] == ["fine-1"] * 8
        assert (stuck.entered, stuck.left) == (4, 0), "the stuck calls are still blocked"
        assert not any(c.done() for c in calls)
        health = hooks.health()
        assert (health["stuck"].threads, health["stuck"].running, health["stuck"].queued) == (4, 4, 10)
        assert health["fine"].queued == 0

        stuck.release.set()
        listed = await asyncio.gather(*calls)
        assert len(listed) == 14
        assert stuck.entered == 14
    finally:
        hooks.close()


async def test_the_deadline_counts_from_when_the_hook_starts(providers: dict[str, Provider]) -> None:
    """Two calls on a one-thread plugin, each running 1.0 s, deadline 1.5 s: both succeed.

    The second waits about 1.0 s for the thread and then runs 1.0 s, 2.0 s in all: past the deadline
    if it counted from submission, within it counted from the start (0.5 s of margin each way, so a
    loaded machine does not turn this into a false failure).
    """

    class Slow:
        def levers9_provider_settings(self) -> type[BaseModel]:
            return Settings

        def levers9_list_machines(self, pool: Pool) -> list[Machine]:
            time.sleep(1.0)
            return []

    plugins = PluginSet()
    plugins.add("slow", Slow())
    hooks = Hooks(plugins, plugin_threads={"slow": 1})
    try:
        started = time.monotonic()
        results = await asyncio.gather(*(hooks.list_machines(pool("slow"), timeout=1.5) for _ in range(2)))
        assert results == [[], []]
        assert time.monotonic() - started > 1.5, "the second call did wait behind the first"
    finally:
        hooks.close()


async def test_a_call_that_never_gets_a_thread_is_withdrawn_and_says_so(providers: dict[str, Provider]) -> None:
    stuck = providers["stuck"]
    stuck.block = True
    hooks = make_hooks(providers, plugin_threads={"stuck": 1})
    try:
        first = asyncio.create_task(hooks.list_machines(pool("stuck"), timeout=30))
        await until(lambda: stuck.entered == 1, "the first call to take the only thread")
        with pytest.raises(PluginQueueTimeout) as info:
            await hooks.list_machines(pool("stuck"), timeout=0.2)
        assert isinstance(info.value, PluginTimeout)
        assert str(info.value) == (
            "plugin 'stuck', hook levers9_list_machines: never started: all 1 of the plugin's threads stayed "
            "busy with earlier calls for 0.2 s (the hook was not called)"
        )
        assert hooks.health()["stuck"].queued == 0, "the withdrawn call no longer counts as waiting"
        stuck.release.set()
        await first
        assert await hooks.list_machines(pool("stuck")) == [Machine(provider_id="stuck-1", pool="pool-stuck")]
        assert stuck.entered == 2, "the withdrawn call never ran, even once the thread was free"
    finally:
        hooks.close()


async def test_a_hook_that_runs_past_its_deadline_keeps_its_thread_not_the_callers(
    providers: dict[str, Provider],
) -> None:
    stuck = providers["stuck"]
    stuck.block = True
    hooks = make_hooks(providers, plugin_threads={"stuck": 1})
    try:
        with pytest.raises(PluginTimeout, match=re.escape("did not answer within 0.1 s")) as info:
            await hooks.list_machines(pool("stuck"), timeout=0.1)
        assert not isinstance(info.value, PluginQueueTimeout)
        assert (stuck.entered, stuck.left) == (1, 0)
        assert hooks.health()["stuck"].running == 1
    finally:
        hooks.close()


# --------------------------------------------------------------------------- health


async def test_a_provider_that_keeps_timing_out_is_unhealthy_and_its_calls_fail_fast(
    providers: dict[str, Provider],
) -> None:
    stuck = providers["stuck"]
    stuck.block = True
    hooks = make_hooks(providers, unhealthy_after=3, probe_every_s=3600)
    try:
        for attempt in range(3):
            assert hooks.health()["stuck"].healthy, f"healthy before timeout {attempt + 1}"
            with pytest.raises(PluginTimeout):
                await hooks.list_machines(pool("stuck"), timeout=0.1)
        health = hooks.health()["stuck"]
        assert not health.healthy
        assert health.reason == "levers9_list_machines did not answer within 0.1 s, 3 times in a row"
        assert health.timeouts_in_a_row == 3
        assert hooks.health()["fine"].healthy

        with pytest.raises(ProviderUnhealthy) as info:
            await hooks.list_machines(pool("stuck"), timeout=0.1)
        assert isinstance(info.value, PluginError), "the scheduler treats a PluginError as 'pool unavailable'"
        assert info.value.plugin == "stuck"
        message = str(info.value)
        assert message.startswith("plugin 'stuck', hook levers9_list_machines: not called: the provider is unhealthy")
        assert "levers9_list_machines did not answer within 0.1 s, 3 times in a row" in message
        assert stuck.entered == 3, "an unhealthy provider's hook is not called"
        assert await hooks.list_machines(pool("fine")) == [Machine(provider_id="fine-1", pool="pool-fine")]
    finally:
        hooks.close()


async def test_an_answer_breaks_the_run_of_timeouts(providers: dict[str, Provider]) -> None:
    stuck = providers["stuck"]
    hooks = make_hooks(providers, unhealthy_after=2)
    try:
        stuck.block = True
        with pytest.raises(PluginTimeout):
            await hooks.list_machines(pool("stuck"), timeout=0.1)
        stuck.block, stuck.fail_with = False, InsufficientCapacity("none left")
        with pytest.raises(InsufficientCapacity):
            await hooks.list_machines(pool("stuck"))  # a typed error is an answer
        assert hooks.health()["stuck"].timeouts_in_a_row == 0
        stuck.block, stuck.fail_with = True, None
        with pytest.raises(PluginTimeout):
            await hooks.list_machines(pool("stuck"), timeout=0.1)
        assert hooks.health()["stuck"].healthy
    finally:
        hooks.close()


async def test_half_open_one_probe_at_a_time_and_an_answer_heals(providers: dict[str, Provider]) -> None:
    stuck = providers["stuck"]
    stuck.block = True
    # probe_every_s=0: a probe is due at once, so what is tested is "one at a time" and what heals
    hooks = make_hooks(providers, unhealthy_after=1, probe_every_s=0)
    try:
        with pytest.raises(PluginTimeout):
            await hooks.list_machines(pool("stuck"), timeout=0.1)
        assert not hooks.health()["stuck"].healthy

        probe = asyncio.create_task(hooks.list_machines(pool("stuck"), timeout=30))
        await until(lambda: stuck.entered == 2, "the probe to reach the hook")
        with pytest.raises(ProviderUnhealthy):
            await hooks.list_machines(pool("stuck"))  # a probe is in flight: no second one
        assert stuck.entered == 2

        stuck.release.set()
        assert await probe == [Machine(provider_id="stuck-1", pool="pool-stuck")]
        health = hooks.health()["stuck"]
        assert health.healthy
        assert health.reason is None
        assert await hooks.list_machines(pool("stuck")) != []
    finally:
        hooks.close()


async def test_a_probe_that_times_out_keeps_the_provider_unhealthy(providers: dict[str, Provider]) -> None:
    stuck = providers["stuck"]
    stuck.block = True
    hooks = make_hooks(providers, unhealthy_after=1, probe_every_s=0)
    try:
        for _ in range(2):  # the mark, then a probe
            with pytest.raises(PluginTimeout):
                await hooks.list_machines(pool("stuck"), timeout=0.1)
        health = hooks.health()["stuck"]
        assert not health.healthy
        assert health.reason == "levers9_list_machines did not answer within 0.1 s, 2 times in a row"
    finally:
        hooks.close()


def test_health_book_probes_once_per_interval() -> None:
    now = [100.0]
    book = HealthBook(unhealthy_after=2, probe_every_s=30, clock=lambda: now[0])
    book.timed_out("p", "levers9_provision", 120)
    assert book.admit("p", "levers9_provision") is False, "healthy: not a probe"
    book.timed_out("p", "levers9_provision", 120)
    with pytest.raises(ProviderUnhealthy, match=r"asked again in 30 s"):
        book.admit("p", "levers9_provision")
    now[0] += 30
    assert book.admit("p", "levers9_provision") is True
    with pytest.raises(ProviderUnhealthy):
        book.admit("p", "levers9_provision")  # one probe at a time
    book.timed_out("p", "levers9_provision", 120, probe=True)
    now[0] += 29
    with pytest.raises(ProviderUnhealthy, match=r"asked again in 1 s"):
        book.admit("p", "levers9_provision")
    now[0] += 1
    assert book.admit("p", "levers9_provision") is True
    book.answered("p", probe=True)
    assert book.get("p").healthy
    assert book.admit("p", "levers9_provision") is False


async def test_runtime_hooks_are_never_refused() -> None:
    class Runtime:
        def __init__(self) -> None:
            self.release = threading.Event()

        def levers9_runtime_settings(self) -> type[BaseModel]:
            return Settings

        def levers9_container_list(self) -> list[str]:
            self.release.wait(30)
            return ["c1"]

    from levers9.hooks.types import RuntimeContext

    runtime = Runtime()
    plugins = PluginSet()
    plugins.add("rt", runtime)
    hooks = Hooks(plugins, unhealthy_after=1, probe_every_s=3600)
    ctx = RuntimeContext(name="rt", state_dir="/nonexistent")
    try:
        for _ in range(2):
            with pytest.raises(PluginTimeout):
                await hooks.container_list(ctx, timeout=0.1)
        runtime.release.set()
        assert await hooks.container_list(ctx) == ["c1"]
    finally:
        runtime.release.set()
        hooks.close()
