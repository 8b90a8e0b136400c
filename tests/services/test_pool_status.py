"""`levers9 pools`' status: a pool whose every offer is out is not `ok`, and the reason is the provider's.

A real controlplane's services (SQLite or PostgreSQL, embedded Redis) over a pool of a provider plugin the
test controls (``tests/scheduler/flaky_provider.py``, installed as a distribution): its offers come from
a file, the marks are the scheduler's own (Redis), and the pool is listed as every front end lists it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from levers9.hooks.types import GpuOffer
from levers9.services import pools
from levers9.services.auth import Principal
from levers9.services.core import Services
from levers9.state.sql.records import TokenKind
from tests.fixtures.services import opened_services
from tests.scheduler.flaky_provider import SOURCE

if TYPE_CHECKING:
    from tests.conftest import Installed

CONFIG = """\
version: 1
data_dir: {{data_dir}}
state:
  database_url: {{database_url}}
pools:
  h100:
    provider: flaky
    runtime: runc
    gpu: H100
    region: r1
    settings:
      state_dir: {cloud}
"""


def _offer(zone: str, **kw: Any) -> dict[str, Any]:
    fields = {"gpu": "H100", "gpu_count": 1, "gpu_memory_mib": 81559, "instance_type": "h100x1", "region": "r1"}
    return fields | {"zone": zone} | kw


@pytest.fixture
async def services(installed: Installed, tmp_path: Path, database_url: str) -> AsyncIterator[Services]:
    installed.add("levers9-flaky", {"flaky": "l9_flaky"}, {"l9_flaky": SOURCE})
    cloud = tmp_path / "cloud"
    (cloud / "machines").mkdir(parents=True)
    async with opened_services(tmp_path, CONFIG.format(cloud=cloud), database_url) as opened:
        yield opened


async def _status(services: Services) -> str | None:
    record, _ = await services.tokens.issue("user", subject="root")  # an operator's token: bound to no workspace
    (pool,) = await pools.list_pools(services, Principal(record.id, TokenKind.USER, None, "root"))
    return pool.unavailable


async def _offers(services: Services, tmp_path: Path, *offers: dict[str, Any]) -> list[str]:
    (tmp_path / "cloud" / "offers.json").write_text(json.dumps({"h100": list(offers)}))
    await services.scheduler.offers.refresh(list(services.pools.values()))
    return [GpuOffer(**o).key for o in offers]


async def test_every_offer_marked_is_unavailable_with_the_first_marks_reason(
    services: Services, tmp_path: Path
) -> None:
    a, b = await _offers(services, tmp_path, _offer("r1a"), _offer("r1b"))
    marks = services.scheduler.ctx.unavailable
    assert await _status(services) is None  # ok: nothing marked
    await marks.mark_offer("h100", a, "quota_exceeded: VcpuLimitExceeded in r1", 60)
    assert await _status(services) is None  # ok: r1b may still start
    await marks.mark_offer("h100", b, "insufficient_capacity: none in r1b", 60)
    status = await _status(services)
    assert status is not None
    assert status.startswith("every offer is unavailable (2)")
    assert "quota_exceeded: VcpuLimitExceeded in r1" in status


async def test_offers_the_provider_reports_unavailable_are_not_ok(services: Services, tmp_path: Path) -> None:
    await _offers(services, tmp_path, _offer("r1a", availability="unavailable"))
    assert await _status(services) == "the provider reports every offer unavailable (1)"
    marks = services.scheduler.ctx.unavailable
    await marks.mark("h100", "H100", "r1", "permission_denied: no RunInstances", 60)
    assert await _status(services) == "permission_denied: no RunInstances"  # the whole pool's mark first


async def test_a_regions_quota_shows_as_the_reason(services: Services, tmp_path: Path) -> None:
    # a QuotaExceeded of scope region marks the region, not each offer: the pool is out all the same
    await _offers(services, tmp_path, _offer("r1a"), _offer("r1b"))
    await services.scheduler.ctx.unavailable.mark_region("h100", "r1", "quota_exceeded: VcpuLimitExceeded in r1", 60)
    status = await _status(services)
    assert status is not None
    assert status.startswith("every offer is unavailable (2)")
    assert "VcpuLimitExceeded in r1" in status


async def test_a_refused_payment_is_the_pools_status_with_what_to_do(services: Services, tmp_path: Path) -> None:
    # Issue 38: a marketplace's "insufficient balance", mapped to a quota of one region, left `levers9 pools` at ok
    # while its other regions' offers stood; a BillingRefused marks the whole pool, whatever its other offers.
    await _offers(services, tmp_path, _offer("r1a"), _offer("r2a", region="r2"))
    (tmp_path / "cloud" / "behaviour.json").write_text(json.dumps({"H100": "billing"}))
    spec = services.pools["h100"]
    known = services.scheduler.offers.get("h100")
    assert known is not None
    provisioner = services.scheduler.provisioner
    machine_id = await provisioner.start(spec, "test", known.offers[0])
    await asyncio.gather(*provisioner._tasks.values())
    status = await _status(services)
    assert status is not None
    assert status.startswith("billing_refused: [flaky] the account's balance is $0.00; add credit to launch"), status
    assert "top up the balance (or fix the payment method) of the account provider 'flaky' uses" in status
    machine = await services.machines.get(machine_id)
    assert machine is not None
    assert machine.state.value == "failed"
