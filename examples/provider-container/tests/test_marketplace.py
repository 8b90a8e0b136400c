"""podmarket against a fake marketplace that runs its pods with real Docker: what the contract kit does not ask.

A pod's worker registers with a stand-in controlplane from inside its
container; the join token is a marketplace secret that no listing shows and
terminating deletes; an outbid spot pod is ``preempted``; an account without
balance is ``BillingRefused``, and leaves nothing behind; offers carry the
marketplace's facts in ``details``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from levers9.config.load import resolve
from levers9.config.model import Config
from levers9.config.yaml_source import SourceMap
from levers9.gpu.catalog import gpu_memory_mib
from levers9.hooks.errors import BillingRefused
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.hooks.types import Machine, MachineState, Pool, ProvisionRequest, Resources, WorkerBootstrap
from levers9.testing.container_boot import worker_image
from levers9.testing.registrar import Registrar


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    """The installed plugins, called as the controlplane calls them."""
    plugins = PluginSet(PluginPolicy.from_env())
    plugins.load_entry_points()
    facade = Hooks(plugins)
    asyncio.run(facade.startup())
    yield facade
    asyncio.run(facade.shutdown())


def _pool(hooks: Hooks, **settings: Any) -> Pool:
    name = f"pods-{uuid.uuid4().hex[:6]}"
    config = Config.model_validate(
        {"pools": {name: {"provider": "podmarket", "gpu": "H100", "runtime": "process", "settings": settings}}}
    )
    return resolve(config, SourceMap("<test>"), hooks)[0][name]


def _request(hooks: Hooks, pool: Pool, url: str = "grpc://127.0.0.1:1993", image: str = "l9/w:1") -> ProvisionRequest:
    offer = asyncio.run(hooks.gpu_offers(pool))[0]
    machine_id = f"m-{uuid.uuid4().hex[:12]}"
    bootstrap = WorkerBootstrap(
        controlplane_url=url,
        token=f"join-{uuid.uuid4().hex}",
        machine_id=machine_id,
        pool=pool.name,
        levers9_version=importlib.metadata.version("levers9"),
        worker_image=image,
    )
    return ProvisionRequest(
        pool=pool,
        resources=Resources(cpu_millicores=1000, memory_mib=1024, gpu="H100", gpu_count=1),
        machine_id=machine_id,
        bootstrap=bootstrap,
        region=offer.region,
        offer=offer,
    )


def _listed(hooks: Hooks, pool: Pool, machine: Machine) -> Machine:
    return next(m for m in asyncio.run(hooks.list_machines(pool)) if m.provider_id == machine.provider_id)


def test_a_spot_pod_boots_its_worker_keeps_its_token_secret_and_is_preempted_when_outbid(
    hooks: Hooks, docker_market: Any, docker_host: str
) -> None:
    pool = _pool(hooks, api_url=docker_market.url, spot=True, bid_per_hour=1.5)
    with Registrar() as standin:
        request = _request(hooks, pool, standin.url, worker_image(docker_host))
        machine = asyncio.run(hooks.provision(request))
        found = standin.wait_for(request.bootstrap.token, request.machine_id, 120)
        assert found is not None, f"the pod's worker did not register: {standin.registrations}"
        listed = _listed(hooks, pool, machine)
        assert listed.state is MachineState.RUNNING
        assert listed.provider_data["reachable"] is False
        shown = json.dumps(docker_market.instances()) + repr(listed)
        assert request.bootstrap.token not in shown, "the join token is visible in the marketplace's pod listing"
        assert docker_market.secrets == {f"levers9-{request.machine_id}": request.bootstrap.token}

        docker_market.outbid(machine.provider_id)
        preempted = _listed(hooks, pool, machine)
        assert preempted.state is MachineState.PREEMPTED
        assert preempted.reason is not None
        assert "outbid" in preempted.reason

        asyncio.run(hooks.terminate(pool, preempted))
    assert docker_market.secrets == {}, "terminating left the join token's secret behind"
    assert [p["status"] for p in docker_market.instances()] == ["terminated"]


def test_an_account_without_balance_is_billing_refused_and_leaves_nothing(hooks: Hooks, market: Any) -> None:
    pool = _pool(hooks, api_url=market.url)
    market.balance = 0.0
    with pytest.raises(BillingRefused, match="top up the account"):
        asyncio.run(hooks.provision(_request(hooks, pool)))
    assert market.secrets == {}
    assert market.instances() == []


def test_offers_carry_the_marketplace_facts_in_details(hooks: Hooks, market: Any) -> None:
    offers = asyncio.run(hooks.gpu_offers(_pool(hooks, api_url=market.url)))
    assert {(o.zone, o.details["cloud"], o.details["form_factor"]) for o in offers} == {
        ("eu-ro-1", "secure", "sxm"),
        ("eu-se-1", "community", "pcie"),
        ("us-tx-3", "secure", "sxm"),
    }
    secure = asyncio.run(hooks.gpu_offers(_pool(hooks, api_url=market.url, cloud="secure")))
    assert {o.details["cloud"] for o in secure} == {"secure"}


@pytest.mark.parametrize(
    ("gpu", "offered"),
    [
        ("H100", {"h100-sxm-secure-eu-ro-1", "h100-pcie-community-eu-se-1", "h100-sxm-secure-us-tx-3"}),
        ("H100-NVL", {"h100-nvl-secure-us-tx-3"}),
        ("RTX3090", {"rtx3090-community-eu-se-1"}),
        ("RTX6000-Ada", {"rtx6000ada-secure-eu-ro-1"}),
    ],
)
def test_each_marketplace_card_is_its_catalog_type_with_its_memory(
    hooks: Hooks, market: Any, gpu: str, offered: set[str]
) -> None:
    """The 94 GB H100 NVL is never offered for an 80 GB H100; each card's memory is within 1 % of the catalog's."""
    name = f"pods-{uuid.uuid4().hex[:6]}"
    config = Config.model_validate(
        {
            "pools": {
                name: {"provider": "podmarket", "gpu": gpu, "runtime": "process", "settings": {"api_url": market.url}}
            }
        }
    )
    offers = asyncio.run(hooks.gpu_offers(resolve(config, SourceMap("<test>"), hooks)[0][name]))
    assert {o.instance_type for o in offers} == offered
    for offer in offers:
        assert offer.gpu == gpu
        assert abs(offer.gpu_memory_mib - gpu_memory_mib(gpu)) <= gpu_memory_mib(gpu) * 0.01
