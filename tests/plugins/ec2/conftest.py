"""Fixtures of the ``ec2`` plugin's tests: one fake EC2 (moto behind the fault proxy) and fake keys.

The fake is started once per session (moto takes a few seconds to start) and
each test gets it with no faults and zeroed call counts; faults a test
injected are cleared when it ends, and every instance still alive in moto is
terminated, so no test sees another's machines running. The credentials are
two environment variables set per test with made-up keys (moto accepts any),
named by the pool settings the way an operator would name theirs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from levers9.hooks.context import PluginContext
from levers9.hooks.types import Pool
from levers9_ec2.offers import DescribeCache
from levers9_ec2.provider import Ec2Provider
from levers9_ec2.settings import Ec2Settings
from tests.fakes.ec2_cloud import FakeEc2

#: an Amazon Linux Deep Learning AMI moto knows in every region (its root device is /dev/xvda)
AMI = "ami-999844e0"
KEY_ID_ENV = "L9_TEST_EC2_KEY_ID"
SECRET_ENV = "L9_TEST_EC2_SECRET"
#: made-up keys; the secret must never appear in a message
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "l9-test-secret-wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


@pytest.fixture(scope="session")
def fake_ec2_server() -> Iterator[FakeEc2]:
    with FakeEc2() as fake:
        yield fake


@pytest.fixture
def fake_ec2(fake_ec2_server: FakeEc2) -> Iterator[FakeEc2]:
    fake_ec2_server.clear_faults()
    fake_ec2_server.reset_calls()
    yield fake_ec2_server
    fake_ec2_server.clear_faults()
    fake_ec2_server.terminate_all()


@pytest.fixture
def aws_keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The pool's credential variables, set; the settings that name them."""
    monkeypatch.setenv(KEY_ID_ENV, KEY_ID)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return {"access_key_id_env": KEY_ID_ENV, "secret_access_key_env": SECRET_ENV}


@pytest.fixture
def ec2_settings(fake_ec2: FakeEc2, aws_keys: dict[str, str]) -> dict[str, Any]:
    """Working pool settings: the fake's endpoint, the keys' variables, an AMI moto knows."""
    return {"ami": AMI, "endpoint_url": fake_ec2.url, **aws_keys}


@pytest.fixture(scope="session")
def describe_cache() -> DescribeCache:
    """Describe answers shared by the tests' providers: moto takes seconds to list its ~1400 instance types."""
    return DescribeCache()


@pytest.fixture
def provider(describe_cache: DescribeCache) -> Iterator[Ec2Provider]:
    """A provider object of its own (not the plugin module's) sharing the session's describe answers."""
    made = Ec2Provider(describe_cache)
    yield made
    made.clients.close()


@pytest.fixture
def fresh_provider() -> Iterator[Ec2Provider]:
    """A provider with a describe cache of its own, for tests that count or fault describe calls."""
    made = Ec2Provider()
    yield made
    made.levers9_shutdown(PluginContext.bare("ec2"))


def make_pool(
    settings: dict[str, Any],
    *,
    name: str = "train",
    gpu: str | None = "H100",
    gpu_count: int = 8,
    regions: list[str] | None = None,
    preemptible: bool = False,
) -> Pool:
    regions = regions or ["us-east-1"]
    return Pool(
        name=name,
        provider="ec2",
        runtime="process",
        gpu=gpu,
        gpu_count=gpu_count,
        region=regions[0],
        regions=regions,
        preemptible=preemptible,
        settings=Ec2Settings.model_validate(settings, context={"pool": name, "regions": regions}),
    )
