"""Fixtures of the ``lambda_labs`` tests: the fake Lambda Cloud API, the key variable, pools and requests.

Every test gets its own fake (:mod:`tests.fakes.lambda_cloud`, an HTTP server
on 127.0.0.1, stopped afterwards) with the documented rate limits switched off:
the tests about pacing and 429 switch them back on themselves. The API key
reaches the plugin only the way it does in production, through the
environment variable the pool names (set for the test, restored afterwards).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from levers9.hooks.context import PluginContext
from levers9.hooks.types import Pool, ProvisionRequest
from levers9_lambda_labs import LambdaLabsProvider, LambdaLabsSettings
from levers9_lambda_labs.ratelimit import LaunchPacer
from tests.fakes.lambda_cloud import DEFAULT_API_KEY, DEFAULT_SSH_KEY, LambdaCloud, running
from tests.plugins.provision import provision_request

#: the variable the test pools name as ``api_key_env``
KEY_ENV = "LEVERS9_TEST_LAMBDA_KEY"


@pytest.fixture
def lambda_cloud() -> Iterator[LambdaCloud]:
    """A fake Cloud API without rate limits (tests about them set them)."""
    yield from running(requests_per_s=None, launch_interval_s=None)


@pytest.fixture
def lambda_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The fake's API key, in the variable the test pools name."""
    monkeypatch.setenv(KEY_ENV, DEFAULT_API_KEY)
    return DEFAULT_API_KEY


def settings_for(cloud: LambdaCloud, **overrides: Any) -> dict[str, Any]:
    """Pool settings pointing at ``cloud`` (as they would appear in config)."""
    return {
        "api_key_env": KEY_ENV,
        "api_url": cloud.url,
        "ssh_key_names": [DEFAULT_SSH_KEY],
        "request_timeout_s": 10,
        **overrides,
    }


@pytest.fixture
def make_pool(lambda_cloud: LambdaCloud, lambda_key: str) -> Callable[..., Pool]:
    """``make_pool(name=None, gpu="A10", gpu_count=1, regions=["us-east-1"], **settings)``."""

    def make(
        name: str | None = None,
        *,
        gpu: str | None = "A10",
        gpu_count: int = 1,
        regions: list[str] | None = None,
        **settings: Any,
    ) -> Pool:
        regions = ["us-east-1"] if regions is None else regions
        return Pool(
            name=name or f"lambda-{uuid.uuid4().hex[:8]}",
            provider="lambda_labs",
            runtime="process",
            gpu=gpu,
            gpu_count=gpu_count if gpu else 0,
            region=regions[0] if regions else None,
            regions=regions,
            settings=LambdaLabsSettings.model_validate(settings_for(lambda_cloud, **settings)),
        )

    return make


@pytest.fixture
def lambda_provider() -> Iterator[LambdaLabsProvider]:
    """A provider object of its own (the plugin's hooks delegate to one like it), launches unpaced."""
    provider = LambdaLabsProvider(pacer=LaunchPacer(interval_s=0.0))
    provider.levers9_startup(PluginContext.bare("lambda_labs"))
    yield provider
    provider.levers9_shutdown(PluginContext.bare("lambda_labs"))


def request_for(
    provider: LambdaLabsProvider, pool: Pool, machine_id: str | None = None, **bootstrap: Any
) -> ProvisionRequest:
    """The request the planner would make: the pool's first available offer."""
    offers = provider.levers9_gpu_offers(pool)
    offer = next((o for o in offers if o.availability.value == "available"), offers[0] if offers else None)
    return provision_request(pool, offer, machine_id, **bootstrap)
