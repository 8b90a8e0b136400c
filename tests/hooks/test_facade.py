"""The typed facade: dispatch, deadlines, isolation, result checking, and one test per hook.

Provider hooks run against the example third-party provider (toycloud),
installed as its own distribution. Runtime and checkpoint hooks run against
small plugins defined here, registered through the same manager.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from levers9.config.load import resolve
from levers9.config.model import Config
from levers9.config.yaml_source import SourceMap
from levers9.hooks.errors import (
    AuthenticationFailed,
    CheckpointUnavailable,
    InsufficientCapacity,
    PluginError,
    PluginTimeout,
    RestoreFailed,
    UnknownPlugin,
)
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet, load_plugins
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    CheckpointImage,
    CheckpointSupport,
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    GpuDevice,
    LayerDiff,
    LogChunk,
    Machine,
    MachineState,
    Pool,
    PreparedContainer,
    ProvisionRequest,
    Resources,
    RuntimeContext,
    WorkerBootstrap,
)

# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def hooks() -> Any:
    h = Hooks(load_plugins(PluginPolicy()), timeout=5)
    yield h
    h.close()


def toy_pool(hooks: Hooks, tmp_path: Path, name: str = "toy", **settings: Any) -> Pool:
    config = Config.model_validate(
        {
            "pools": {
                name: {
                    "provider": "toycloud",
                    "runtime": "process",
                    "gpu": "T4",
                    "settings": {"state_dir": str(tmp_path / "cloud"), "capacity": {"T4": 1}, **settings},
                }
            }
        }
    )
    return resolve(config, SourceMap("<test>"), hooks)[0][name]


def request(pool: Pool, machine_id: str = "m-1") -> ProvisionRequest:
    bootstrap = WorkerBootstrap(
        controlplane_url="grpc://127.0.0.1:1993",
        token="secret-token",
        machine_id=machine_id,
        pool=pool.name,
        levers9_version="0.0.0",
    )
    return ProvisionRequest(
        pool=pool, resources=Resources(gpu="T4", gpu_count=1), machine_id=machine_id, bootstrap=bootstrap
    )


class MemoryRuntime:
    """A runtime plugin that keeps containers in a dict: enough to exercise every runtime hook's plumbing."""

    class Settings(BaseModel):
        model_config = ConfigDict(extra="forbid")
        greeting: str = "hello"

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, Any]] = {}

    def levers9_runtime_settings(self) -> type[BaseModel]:
        return self.Settings

    def levers9_runtime_capabilities(self, runtime: RuntimeContext) -> Any:
        from levers9.hooks.types import Isolation, RuntimeCapabilities

        return RuntimeCapabilities(available=True, isolation=Isolation.NONE, version=runtime.settings.greeting)

    def levers9_container_prepare(self, runtime: RuntimeContext, spec: ContainerSpec) -> PreparedContainer:
        self.containers[spec.container_id] = {"status": ContainerStatus.CREATED, "log": b"", "signals": []}
        return PreparedContainer(container_id=spec.container_id, runtime=runtime.name, spec=spec)

    def levers9_container_start(self, container: PreparedContainer) -> ContainerState:
        entry = self.containers[container.container_id]
        entry["status"] = ContainerStatus.RUNNING
        entry["log"] = " ".join(container.spec.command).encode()
        return ContainerState(container_id=container.container_id, status=ContainerStatus.RUNNING, pid=4242)

    def levers9_container_state(self, container_id: str) -> ContainerState:
        entry = self.containers.get(container_id)
        status = entry["status"] if entry else ContainerStatus.UNKNOWN
        return ContainerState(container_id=container_id, status=status)

    def levers9_container_kill(self, container_id: str, signal: int) -> None:
        if container_id in self.containers:
            self.containers[container_id]["signals"].append(signal)
            self.containers[container_id]["status"] = ContainerStatus.EXITED

    def levers9_container_logs(self, container_id: str, offset: int) -> LogChunk:
        data = self.containers[container_id]["log"]
        return LogChunk(data=data[offset:], next_offset=len(data), eof=True)

    def levers9_container_remove(self, container_id: str) -> None:
        self.containers.pop(container_id, None)

    def levers9_container_list(self) -> list[str]:
        return sorted(self.containers)

    def levers9_container_changes(self, container_id: str, dest: str) -> LayerDiff:
        data = self.containers[container_id]["log"]
        Path(dest).write_bytes(data)
        return LayerDiff(path=dest, diff_id=f"sha256:{hashlib.sha256(data).hexdigest()}", size_bytes=len(data))


class MemoryCheckpointer:
    """Checkpoints only the 'memory' runtime; a marker file in the image decides whether restore works."""

    def levers9_checkpoint_support(self, runtime: RuntimeContext) -> CheckpointSupport | None:
        if runtime.name != "memory":
            return None
        return CheckpointSupport(available=True, mechanism="memory")

    def levers9_checkpoint(self, runtime: RuntimeContext, container_id: str, image_dir: str) -> Any:
        if runtime.name != "memory":
            return None
        Path(image_dir, "image").write_text(container_id)
        return CheckpointImage(checkpoint_id="ck-1", runtime="memory", path=image_dir, size_bytes=10)

    def levers9_restore(self, runtime: RuntimeContext, container: PreparedContainer, image: CheckpointImage) -> Any:
        if runtime.name != "memory":
            return None
        if not Path(image.path, "image").exists():
            raise RestoreFailed(f"image {image.checkpoint_id} is missing its data")
        return ContainerState(container_id=container.container_id, status=ContainerStatus.RUNNING)


@pytest.fixture
def runtime_hooks(tmp_path: Path) -> Any:
    plugins = PluginSet()
    memory = MemoryRuntime()
    plugins.add("memory", memory)
    plugins.add("memory_checkpoint", MemoryCheckpointer())
    h = Hooks(plugins, timeout=5)
    ctx = RuntimeContext(name="memory", settings=MemoryRuntime.Settings(), state_dir=str(tmp_path))
    yield h, ctx, memory
    h.close()


def spec(container_id: str = "c1") -> ContainerSpec:
    return ContainerSpec(container_id=container_id, image="/images/base", command=["echo", "hi"])


# --------------------------------------------------------------------------- one test per hook


def test_hook_levers9_provision(hooks: Hooks, tmp_path: Path) -> None:
    pool = toy_pool(hooks, tmp_path)
    machine = hooks_run(hooks.provision(request(pool)))
    assert machine.pool == "toy"
    assert machine.machine_id == "m-1"
    assert machine.gpu == "T4"
    with pytest.raises(InsufficientCapacity) as info:
        hooks_run(hooks.provision(request(pool, "m-2")))
    assert info.value.plugin == "toycloud"
    assert "[toycloud]" in str(info.value)


def test_hook_levers9_list_machines(hooks: Hooks, tmp_path: Path) -> None:
    pool = toy_pool(hooks, tmp_path, capacity={"T4": 2})
    other = toy_pool(hooks, tmp_path, name="other", capacity={"T4": 2})
    machine = hooks_run(hooks.provision(request(pool)))
    listed = hooks_run(hooks.list_machines(pool))
    assert [m.provider_id for m in listed] == [machine.provider_id]
    assert listed[0].state is MachineState.RUNNING
    assert hooks_run(hooks.list_machines(other)) == []


def test_hook_levers9_terminate(hooks: Hooks, tmp_path: Path) -> None:
    pool = toy_pool(hooks, tmp_path)
    machine = hooks_run(hooks.provision(request(pool)))
    hooks_run(hooks.terminate(pool, machine))
    hooks_run(hooks.terminate(pool, machine))  # idempotent
    hooks_run(hooks.terminate(pool, machine.model_copy(update={"provider_id": "toy-unknown"})))  # never known
    listed = hooks_run(hooks.list_machines(pool))  # toycloud keeps terminated machines listed, as terminated
    assert [(m.provider_id, m.state) for m in listed] in ([], [(machine.provider_id, MachineState.TERMINATED)])


def test_hook_levers9_gpu_offers(hooks: Hooks, tmp_path: Path) -> None:
    pool = toy_pool(hooks, tmp_path, capacity={"T4": 1, "H100": 0}, price_per_hour={"T4": 0.5})
    offers = hooks_run(hooks.gpu_offers(pool))
    assert [(o.gpu, o.instance_type, o.price_per_hour) for o in offers] == [("T4", "toy.t4", 0.5)]


def test_makes_offers_says_which_providers_implement_gpu_offers() -> None:
    class SettingsOnly:
        @hookimpl
        def levers9_provider_settings(self) -> type[BaseModel]:
            return BaseModel

    class Offering(SettingsOnly):
        @hookimpl
        def levers9_gpu_offers(self, pool: Pool) -> list[object]:
            return []

    plugins = PluginSet()
    plugins.add("settings_only", SettingsOnly())
    plugins.add("offering", Offering())
    hooks = Hooks(plugins)
    assert hooks.makes_offers("offering")
    assert not hooks.makes_offers("settings_only")
    assert not hooks.makes_offers("not_installed")


def test_hook_levers9_runtime_settings(runtime_hooks: Any) -> None:
    hooks, _, _ = runtime_hooks
    model = hooks.runtime_settings_model("memory")
    assert model is MemoryRuntime.Settings


def test_hook_levers9_container_prepare(runtime_hooks: Any) -> None:
    hooks, ctx, memory = runtime_hooks
    prepared = hooks_run(hooks.container_prepare(ctx, spec()))
    assert prepared.runtime == "memory"
    assert memory.containers["c1"]["status"] is ContainerStatus.CREATED


def test_hook_levers9_container_start(runtime_hooks: Any) -> None:
    hooks, ctx, _ = runtime_hooks
    prepared = hooks_run(hooks.container_prepare(ctx, spec()))
    state = hooks_run(hooks.container_start(ctx, prepared))
    assert (state.status, state.pid) == (ContainerStatus.RUNNING, 4242)


def test_hook_levers9_container_state(runtime_hooks: Any) -> None:
    hooks, ctx, _ = runtime_hooks
    assert hooks_run(hooks.container_state(ctx, "nope")).status is ContainerStatus.UNKNOWN
    hooks_run(hooks.container_start(ctx, hooks_run(hooks.container_prepare(ctx, spec()))))
    assert hooks_run(hooks.container_state(ctx, "c1")).status is ContainerStatus.RUNNING


def test_hook_levers9_container_kill(runtime_hooks: Any) -> None:
    hooks, ctx, memory = runtime_hooks
    hooks_run(hooks.container_start(ctx, hooks_run(hooks.container_prepare(ctx, spec()))))
    hooks_run(hooks.container_kill(ctx, "c1", 15))
    assert memory.containers["c1"]["signals"] == [15]


def test_hook_levers9_container_logs(runtime_hooks: Any) -> None:
    hooks, ctx, _ = runtime_hooks
    hooks_run(hooks.container_start(ctx, hooks_run(hooks.container_prepare(ctx, spec()))))
    chunk = hooks_run(hooks.container_logs(ctx, "c1", 3))
    assert (chunk.data, chunk.next_offset, chunk.eof) == (b"o hi", 7, True)


def test_hook_levers9_container_remove(runtime_hooks: Any) -> None:
    hooks, ctx, memory = runtime_hooks
    hooks_run(hooks.container_prepare(ctx, spec()))
    hooks_run(hooks.container_remove(ctx, "c1"))
    hooks_run(hooks.container_remove(ctx, "c1"))
    assert memory.containers == {}


def test_hook_levers9_container_list(runtime_hooks: Any) -> None:
    hooks, ctx, _ = runtime_hooks
    assert hooks_run(hooks.container_list(ctx)) == []
    hooks_run(hooks.container_prepare(ctx, spec()))
    hooks_run(hooks.container_prepare(ctx, spec("c0")))
    assert hooks_run(hooks.container_list(ctx)) == ["c0", "c1"]
    hooks_run(hooks.container_remove(ctx, "c1"))
    assert hooks_run(hooks.container_list(ctx)) == ["c0"]


def test_hook_levers9_container_changes(runtime_hooks: Any, tmp_path: Path) -> None:
    hooks, ctx, _ = runtime_hooks
    hooks_run(hooks.container_start(ctx, hooks_run(hooks.container_prepare(ctx, spec()))))
    diff = hooks_run(hooks.container_changes(ctx, "c1", str(tmp_path / "layer.tar")))
    assert diff == LayerDiff(
        path=str(tmp_path / "layer.tar"), size_bytes=7, diff_id=f"sha256:{hashlib.sha256(b'echo hi').hexdigest()}"
    )
    assert hooks.captures_changes(ctx)
    # a runtime whose plugin lacks the hook cannot say what a container changed: None, not an error
    plugins = PluginSet()
    plugins.add("bare", type("Bare", (), {"levers9_runtime_settings": MemoryRuntime.levers9_runtime_settings})())
    bare = Hooks(plugins, timeout=5)
    try:
        bare_ctx = ctx.model_copy(update={"name": "bare"})
        assert not bare.captures_changes(bare_ctx)
        assert hooks_run(bare.container_changes(bare_ctx, "c1", str(tmp_path / "other.tar"))) is None
    finally:
        bare.close()


def test_hook_levers9_checkpoint(runtime_hooks: Any, tmp_path: Path) -> None:
    hooks, ctx, _ = runtime_hooks
    image = hooks_run(hooks.checkpoint(ctx, "c1", str(tmp_path)))
    assert image.checkpoint_id == "ck-1"
    other = ctx.model_copy(update={"name": "runc"})
    with pytest.raises(CheckpointUnavailable, match="runtime 'runc'"):
        hooks_run(hooks.checkpoint(other, "c1", str(tmp_path)))


def test_hook_levers9_restore(runtime_hooks: Any, tmp_path: Path) -> None:
    hooks, ctx, _ = runtime_hooks
    prepared = hooks_run(hooks.container_prepare(ctx, spec()))
    image = hooks_run(hooks.checkpoint(ctx, "c1", str(tmp_path)))
    assert hooks_run(hooks.restore(ctx, prepared, image)).status is ContainerStatus.RUNNING
    os.remove(tmp_path / "image")
    with pytest.raises(RestoreFailed, match="missing its data"):
        hooks_run(hooks.restore(ctx, prepared, image))


# --------------------------------------------------------------------------- isolation and checking


class Good:
    def levers9_gpu_devices(self) -> list[GpuDevice]:
        return [GpuDevice(index=1, uuid="GPU-b", model="NVIDIA L4", gpu="L4", memory_mib=23034)]


class AlsoGood:
    def levers9_gpu_devices(self) -> list[GpuDevice]:
        return [
            GpuDevice(index=0, uuid="GPU-a", model="NVIDIA L4", gpu="L4", memory_mib=23034),
            GpuDevice(index=1, uuid="GPU-b", model="NVIDIA L4", gpu="L4", memory_mib=23034),
        ]


class Raises:
    def levers9_gpu_devices(self) -> list[GpuDevice]:
        raise OSError("device plugin socket gone")


class Hangs:
    """Blocks until the test releases it: if the facade waited for it, ``hangs`` would answer and not fail."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def levers9_gpu_devices(self) -> list[GpuDevice]:
        self.release.wait(30)
        return []


class WrongType:
    def levers9_gpu_devices(self) -> Any:
        return [{"index": 0, "uuid": "x"}]


def test_gpu_discovery_keeps_good_answers_when_others_fail_or_hang() -> None:
    plugins = PluginSet()
    hangs = Hangs()
    for name, plugin in {
        "good": Good(),
        "also_good": AlsoGood(),
        "raises": Raises(),
        "hangs": hangs,
        "wrong": WrongType(),
    }.items():
        plugins.add(name, plugin)
    hooks = Hooks(plugins, timeout=0.5)
    try:
        found = hooks_run(hooks.gpu_devices())
    finally:
        hangs.release.set()
        hooks.close()
    assert [d.uuid for d in found.devices] == ["GPU-a", "GPU-b"]
    failures = {f.plugin: f.error for f in found.failures}
    assert set(failures) == {"raises", "hangs", "wrong"}
    assert "OSError: device plugin socket gone" in failures["raises"]
    assert "did not answer within 0.5 s" in failures["hangs"]
    assert "expected list[GpuDevice]" in failures["wrong"]


def test_untyped_exception_becomes_plugin_error_naming_plugin_and_hook(tmp_path: Path) -> None:
    class Buggy:
        def levers9_provider_settings(self) -> type[BaseModel]:
            return MemoryRuntime.Settings

        def levers9_list_machines(self, pool: Pool) -> Any:
            raise KeyError("instances")

    plugins = PluginSet()
    plugins.add("buggy", Buggy())
    plugins.add("process", MemoryRuntime())
    hooks = Hooks(plugins)
    try:
        pool = Pool(name="p", provider="buggy", runtime="process")
        with pytest.raises(PluginError) as info:
            hooks_run(hooks.list_machines(pool))
        assert info.value.plugin == "buggy"
        assert info.value.hook == "levers9_list_machines"
        assert "KeyError" in str(info.value)
        with pytest.raises(PluginError, match="is not implemented by this plugin"):
            hooks_run(hooks.provision(request(pool)))
    finally:
        hooks.close()


def test_listing_another_pools_machines_is_refused(tmp_path: Path) -> None:
    class Sloppy:
        def levers9_provider_settings(self) -> type[BaseModel]:
            return MemoryRuntime.Settings

        def levers9_list_machines(self, pool: Pool) -> list[Machine]:
            return [Machine(provider_id="i-1", pool="someone-else")]

    plugins = PluginSet()
    plugins.add("sloppy", Sloppy())
    hooks = Hooks(plugins)
    try:
        with pytest.raises(PluginError, match="reported machines of other pools"):
            hooks_run(hooks.list_machines(Pool(name="mine", provider="sloppy", runtime="x")))
    finally:
        hooks.close()


def test_provider_timeout_is_typed() -> None:
    class Slow:
        def levers9_provider_settings(self) -> type[BaseModel]:
            return MemoryRuntime.Settings

        def levers9_terminate(self, pool: Pool, machine: Machine) -> None:
            time.sleep(2)

    plugins = PluginSet()
    plugins.add("slow", Slow())
    hooks = Hooks(plugins)
    machine = Machine(provider_id="i-1", pool="p")
    try:
        with pytest.raises(
            PluginTimeout, match=re.escape("plugin 'slow', hook levers9_terminate: did not answer within 0.2 s")
        ):
            hooks_run(hooks.terminate(Pool(name="p", provider="slow", runtime="x"), machine, timeout=0.2))
    finally:
        hooks.close()


def test_typed_provider_error_passes_through_with_plugin_name(hooks: Hooks, tmp_path: Path) -> None:
    os.environ.pop("TOY_KEY", None)
    pool = toy_pool(hooks, tmp_path, api_key_env="TOY_KEY")
    with pytest.raises(AuthenticationFailed) as info:
        hooks_run(hooks.provision(request(pool)))
    assert info.value.plugin == "toycloud"
    assert info.value.code == "invalid-api-key"


def test_unknown_provider_suggests_and_lists(hooks: Hooks) -> None:
    with pytest.raises(UnknownPlugin) as info:
        hooks.provider_settings_model("ec3")
    message = str(info.value)
    assert "unknown provider 'ec3'" in message
    assert "Did you mean 'ec2'" in message
    assert "lambda_labs" in message


def test_facade_checks_argument_types(hooks: Hooks) -> None:
    with pytest.raises(TypeError, match="pool must be Pool, got dict"):
        hooks_run(hooks.list_machines({"name": "p"}))  # type: ignore[arg-type]


def test_checkpoint_support_falls_back_to_a_clear_no(runtime_hooks: Any) -> None:
    hooks, ctx, _ = runtime_hooks
    assert hooks_run(hooks.checkpoint_support(ctx)).available
    answer = hooks_run(hooks.checkpoint_support(ctx.model_copy(update={"name": "other"})))
    assert not answer.available
    assert answer.reason == "no installed plugin checkpoints containers of runtime 'other'"


def test_created_at_round_trips(hooks: Hooks, tmp_path: Path) -> None:
    pool = toy_pool(hooks, tmp_path)
    machine = hooks_run(hooks.provision(request(pool)))
    assert machine.created_at is not None
    assert abs((datetime.now(UTC) - machine.created_at).total_seconds()) < 60


def hooks_run(awaitable: Any) -> Any:
    from levers9.testing.provider_contract import run

    return run(awaitable)


def test_listing_many_pools_isolates_a_failing_or_hanging_provider(hooks: Hooks, tmp_path: Path) -> None:
    release = threading.Event()

    class Broken:
        def levers9_provider_settings(self) -> type[BaseModel]:
            return MemoryRuntime.Settings

        def levers9_list_machines(self, pool: Pool) -> list[Any]:
            raise ConnectionError("API endpoint unreachable")

        def levers9_gpu_offers(self, pool: Pool) -> list[Any]:
            raise ConnectionError("API endpoint unreachable")

    class Wedged:
        def levers9_provider_settings(self) -> type[BaseModel]:
            return MemoryRuntime.Settings

        def levers9_list_machines(self, pool: Pool) -> list[Any]:
            release.wait(30)
            return []

        def levers9_gpu_offers(self, pool: Pool) -> list[Any]:
            release.wait(30)
            return []

    hooks.plugins.add("broken", Broken())
    hooks.plugins.add("wedged", Wedged())
    toy = toy_pool(hooks, tmp_path)
    machine = hooks_run(hooks.provision(request(toy)))
    pools = [
        toy,
        Pool(name="b", provider="broken", runtime="process"),
        Pool(name="w", provider="wedged", runtime="process"),
    ]
    try:
        listing = hooks_run(hooks.list_machines_for(pools, timeout=0.5))
        offers = hooks_run(hooks.gpu_offers_for(pools, timeout=0.5))
    finally:
        release.set()
    assert list(listing.answers) == ["toy"]
    assert [m.provider_id for m in listing.answers["toy"]] == [machine.provider_id]
    failed = {f.plugin: f.error for f in listing.failures}
    assert set(failed) == {"broken", "wedged"}
    assert "pool 'b'" in failed["broken"]
    assert "ConnectionError: API endpoint unreachable" in failed["broken"]
    assert "did not answer within 0.5 s" in failed["wedged"]
    assert [o.gpu for o in offers.answers["toy"]] == ["T4"]
    assert {f.plugin for f in offers.failures} == {"broken", "wedged"}


class Checked:
    """A provider whose ``levers9_check`` answers what its pool's settings say (a dict: a misbehaving plugin)."""

    class Settings(BaseModel):
        model_config = ConfigDict(extra="forbid")
        answer: str = "ok"

    def levers9_provider_settings(self) -> type[BaseModel]:
        return self.Settings

    def levers9_check(self, pool: Pool) -> Any:
        from levers9.hooks.types import ProviderCheck

        if pool.settings.answer == "dict":
            return {"ok": True, "message": "fine"}
        if pool.settings.answer == "denied":
            return ProviderCheck(ok=False, message="ec2:DescribeInstances denied", hint="grant it to the role")
        return ProviderCheck(ok=True, message="credentials accepted in us-east-1")


def test_hook_levers9_check() -> None:
    from levers9.hooks.types import ProviderCheck

    plugins = PluginSet()
    plugins.add("checked", Checked())

    class NoCheck:  # a provider without the optional hook
        def levers9_provider_settings(self) -> type[BaseModel]:
            return Checked.Settings

    plugins.add("nocheck", NoCheck())
    hooks = Hooks(plugins)
    try:

        def pool(provider: str, answer: str = "ok") -> Pool:
            return Pool(name="p", provider=provider, runtime="x", settings=Checked.Settings(answer=answer))

        assert hooks_run(hooks.check(pool("checked"))) == ProviderCheck(
            ok=True, message="credentials accepted in us-east-1"
        )
        denied = hooks_run(hooks.check(pool("checked", "denied")))
        assert (denied.ok, denied.hint) == (False, "grant it to the role")
        assert hooks_run(hooks.check(pool("nocheck"))) is None, "the hook is optional"
        with pytest.raises(UnknownPlugin, match="unknown provider 'nope'"):
            hooks_run(hooks.check(pool("nope")))
        with pytest.raises(PluginError) as info:
            hooks_run(hooks.check(pool("checked", "dict")))
        assert str(info.value) == (
            "plugin 'checked', hook levers9_check: returned dict, expected ProviderCheck: a dict where a "
            "ProviderCheck is expected; return levers9.hooks.types.ProviderCheck(...) instead"
        )
    finally:
        hooks.close()


def test_a_dict_where_a_model_is_expected_is_refused_even_when_it_would_validate() -> None:
    class Loose:
        def levers9_gpu_devices(self) -> Any:
            good = GpuDevice(index=0, uuid="GPU-a", model="NVIDIA L4", gpu="L4", memory_mib=23034)
            return [good, {"index": 1, "uuid": "GPU-b", "model": "NVIDIA L4", "gpu": "L4", "memory_mib": 23034}]

    plugins = PluginSet()
    plugins.add("loose", Loose())
    hooks = Hooks(plugins)
    try:
        found = hooks_run(hooks.gpu_devices())
    finally:
        hooks.close()
    assert found.devices == []
    (failure,) = found.failures
    assert failure.error == (
        "plugin 'loose', hook levers9_gpu_devices: returned list[GpuDevice | dict], expected list[GpuDevice] at 1: "
        "a dict where a GpuDevice is expected; return levers9.hooks.types.GpuDevice(...) instead"
    )
