"""Fixtures for the ``oci`` provider's tests: a signing key, an OCI config file, a fake region over HTTP.

The real ``oci`` SDK signs every request with the test's RSA key (written to a
temporary directory with an SDK config file naming it); the fake region
(:class:`tests.fakes.oci_cloud.FakeOci`, a thread on 127.0.0.1) knows the
public half and refuses anything not signed by it. Pools point
``service_endpoint`` at the fake, so the plugin, a test's own SDK client and a
subprocess all reach it over HTTP. Each test gets a fresh fake (stopped at
its end) and a fresh provider (shut down at its end).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from levers9.hooks.context import PluginContext
from levers9.hooks.types import Pool
from levers9_oci.provider import OciProvider
from levers9_oci.settings import OciSettings
from tests.fakes.oci_cloud import FakeOci
from tests.fakes.oci_tenancy import (
    AD1,
    AD2,
    COMPARTMENT,
    IMAGE,
    REGION,
    SUBNET,
    TENANCY,
    OciCredentials,
    make_credentials,
)


@pytest.fixture(scope="session")
def oci_private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def oci_credentials(tmp_path: Path, oci_private_key: rsa.RSAPrivateKey) -> OciCredentials:
    return make_credentials(tmp_path, oci_private_key)


@pytest.fixture
def fake_oci(oci_credentials: OciCredentials) -> Iterator[FakeOci]:
    fake = FakeOci(
        region=REGION,
        availability_domains=(AD1, AD2),
        compartments=(COMPARTMENT, TENANCY),
        images=(IMAGE,),
        subnets=(SUBNET,),
    )
    fake.add_key(oci_credentials.key_id, oci_credentials.private_key.public_key())
    with fake:
        yield fake


@pytest.fixture
def oci_settings(fake_oci: FakeOci, oci_credentials: OciCredentials) -> dict[str, Any]:
    """Working pool settings against the fake, as they would appear in config."""
    return {
        "config_file": str(oci_credentials.config_file),
        "compartment_id": COMPARTMENT,
        "subnet_id": SUBNET,
        "image_id": IMAGE,
        "service_endpoint": fake_oci.url,
    }


@pytest.fixture
def sdk_compute(fake_oci: FakeOci, oci_credentials: OciCredentials) -> Any:
    """The test's own ComputeClient on the fake: how a test reads back what the plugin launched."""
    import oci

    config = oci.config.from_file(str(oci_credentials.config_file))
    return oci.core.ComputeClient(config, service_endpoint=fake_oci.url, retry_strategy=oci.retry.NoneRetryStrategy())


@pytest.fixture
def provider() -> Iterator[OciProvider]:
    """A fresh provider (its own client cache), shut down at the end; it never sleeps between launches."""
    made = OciProvider(sleep=lambda seconds: None)
    yield made
    made.levers9_shutdown(PluginContext.bare("oci"))


@pytest.fixture
def make_pool(oci_settings: dict[str, Any]) -> Callable[..., Pool]:
    """``make_pool(name="p", gpu="A10", gpu_count=1, regions=[REGION], preemptible=False, **settings)``."""

    def make(
        name: str = "p",
        *,
        gpu: str | None = "A10",
        gpu_count: int = 1,
        regions: list[str] | None = None,
        preemptible: bool = False,
        **settings: Any,
    ) -> Pool:
        regions = [REGION] if regions is None else regions
        return Pool(
            name=name,
            provider="oci",
            runtime="process",
            gpu=gpu,
            gpu_count=gpu_count if gpu else 0,
            region=regions[0] if regions else None,
            regions=regions,
            preemptible=preemptible,
            settings=OciSettings.model_validate({**oci_settings, **settings}),
        )

    return make
