"""The levers9 provider contract, run against podmarket as installed, its pods booted by the kit with real Docker."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

from levers9.bootstrap import BootstrapContainer
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import Machine
from levers9.testing import ProviderContract


class TestPodMarketContract(ProviderContract):
    provider = "podmarket"
    pool_fields: ClassVar[dict[str, Any]] = {"gpu": "H100", "regions": ["eu", "us"]}
    settle_timeout = 10.0
    #: a pod is a container: the kit runs the container the pod holds (its image, command, env and secret)
    boots_containers = True

    @pytest.fixture(autouse=True)
    def marketplace(self, market: Any) -> None:
        self.market = market

    @pytest.fixture
    def levers9_docker_host(self, docker_host: str) -> str:
        return docker_host  # the session's private dockerd; by default the kit uses $DOCKER_HOST

    @pytest.fixture
    def pool_settings(self) -> dict[str, Any]:
        return {"api_url": self.market.url}

    @pytest.fixture
    def failing_pool_settings(self, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
        monkeypatch.setenv("PODMARKET_REVOKED_KEY", "pm-revoked")
        return {"api_url": self.market.url, "api_key_env": "PODMARKET_REVOKED_KEY"}

    @pytest.fixture
    def capacity_pool_settings(self) -> dict[str, Any]:
        self.market.set_stock(0)
        return {"api_url": self.market.url}

    def container_spec(self, machine: Machine) -> BootstrapContainer:
        return self.market.spec(machine.provider_id)

    def cloud_instances(self) -> dict[str, str | None]:
        alive = ("starting", "running")
        return {p["id"]: p["labels"].get("levers9-machine-id") for p in self.market.instances() if p["status"] in alive}

    @contextlib.contextmanager
    def fail_after_create(self) -> Iterator[None]:
        self.market.fail_after_create = True  # the next pod is created, then the API answers 500
        try:
            yield
        finally:
            self.market.fail_after_create = False

    def preempt(self, machine: Machine) -> None:
        self.market.outbid(machine.provider_id)

    def fail(self, machine: Machine) -> None:
        self.market.fail(machine.provider_id)


DOCS = Path(__file__).resolve().parents[3] / "docs" / "plugins.md"


def docs_example() -> ModuleType:
    """The provider docs/plugins.md ("Container clouds") shows, as a module: the docs' example must pass the kit too."""
    text = DOCS.read_text()
    start = text.index("```python\n# levers9_podmarket/__init__.py\n") + len("```python\n")
    module = ModuleType("levers9_podmarket_docs")
    exec(compile(text[start : text.index("```", start)], f"{DOCS}:Container clouds", "exec"), module.__dict__)
    return module


class TestDocsExampleContract(TestPodMarketContract):
    """docs/plugins.md's container-cloud example, loaded as the plugin ``podmarket`` instead of the installed one."""

    @pytest.fixture
    def levers9_plugin_set(self) -> PluginSet:
        plugins = PluginSet(PluginPolicy.from_env(block=["podmarket"]))  # every installed plugin but podmarket
        plugins.load_entry_points()
        plugins.policy = PluginPolicy.from_env()
        plugins.add("podmarket", docs_example().plugin)
        return plugins
