"""Offers drive provisioning: which offer is started, what a miss on one marks, and failover between offers and pools."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from levers9.__about__ import __version__
from levers9.hooks.types import GpuOffer, Pool
from levers9.scheduler.offers import matching, ordered
from levers9.scheduler.pools import PoolSpec
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.tasks import TaskStore
from tests.scheduler.conftest import Harness, MakeHarness, eventually, worker_finished


def _offer(zone: str, **kw: Any) -> dict[str, Any]:
    fields = {"gpu": "H100", "gpu_count": 1, "gpu_memory_mib": 81559, "instance_type": "p5.48xlarge"}
    return fields | {"region": "us-east-1", "zone": zone} | kw


def _key(offer: dict[str, Any]) -> str:
    return GpuOffer(**offer).key


async def _plan(h: Harness, rounds: int) -> None:
    s = h.schedulers[-1]
    for _ in range(rounds):
        await s.plan_once()
        await h.settle(s)


async def test_a_capacity_miss_falls_over_to_the_pools_next_offer_then_the_next_pool(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]}), ("a100", "A100-80")])
    o1, o2 = _offer("us-east-1a"), _offer("us-east-1b")
    h.offer(h100=[o1, o2])
    h.behave(**{_key(o1): "capacity", _key(o2): "capacity"})
    s = h.scheduler()
    await s.start()  # the real loops: the planner is woken by each miss, not by its tick
    req = h.request(["H100", "A100-80"])
    await s.submit(req)

    async def on_a100() -> bool:
        return len(h.call_log()) >= 3

    await eventually(on_a100, "the provider to be asked for o1, o2, then the a100 pool")
    log = h.call_log()
    assert [(c["pool"], c["offer"], c["action"]) for c in log] == [
        ("h100", _key(o1), "capacity"),
        ("h100", _key(o2), "capacity"),
        ("a100", None, "ok"),
    ]
    assert [c["region"] for c in log] == ["us-east-1", "us-east-1", None]
    # The bound: each failover step (a miss, then the next attempt) in under 1 s. It is generous: the
    # planner is woken at once by the miss, so a step takes one planner pass plus one provider call (a few ms).
    gaps = [later["t"] - earlier["t"] for earlier, later in itertools.pairwise(log)]
    assert all(gap < 1.0 for gap in gaps), f"failover steps took {gaps} s"

    async def reported() -> bool:
        state = await s.backlog.get(req.id)
        return state is not None and sum(line.startswith("h100 offer ") for line in state.tried) == 2

    await eventually(reported, "the request's tried report to name both offers")
    state = await s.backlog.get(req.id)
    assert state is not None
    tried = dict(line.split("\t", 1) for line in state.tried)
    assert tried[f"h100 offer {_key(o1)}"].startswith(f"insufficient_capacity: [flaky] no {_key(o1)} capacity")
    assert tried[f"h100 offer {_key(o2)}"].startswith(f"insufficient_capacity: [flaky] no {_key(o2)} capacity")

    assert await h.register_started(s, at_least=1)

    async def placed() -> bool:
        return any(e.outcome == "placed" for e in await TaskStore(h.db).history(req.id))

    await eventually(placed, "the request to be placed on the a100 worker")
    history = await TaskStore(h.db).history(req.id)
    offers = [(e.pool, e.region, e.reason or "") for e in history if e.outcome == "unavailable" and e.pool == "h100"]
    assert [(pool, region, reason.split(":")[0]) for pool, region, reason in offers[:2]] == [
        ("h100", "us-east-1", f"offer {_key(o1)}"),
        ("h100", "us-east-1", f"offer {_key(o2)}"),
    ]
    assert "insufficient_capacity: [flaky] no p5.48xlarge/us-east-1/us-east-1a capacity" in offers[0][2]
    assert [(e.outcome, e.pool) for e in history if e.outcome == "placed"] == [("placed", "a100")]


async def test_cheapest_tries_the_lowest_price_first_unpriced_last_and_never_an_unavailable_offer(
    make_harness: MakeHarness,
) -> None:
    h = await make_harness([("h100", "H100", 1, {"strategy": "cheapest"})])
    dear, unpriced, cheap, gone = (
        _offer("a", price_per_hour=3.0),
        _offer("b"),
        _offer("c", price_per_hour=1.0),
        _offer("d", price_per_hour=0.5, availability="unavailable"),
    )
    h.offer(h100=[dear, unpriced, cheap, gone])
    h.behave(H100="capacity")
    s = h.scheduler()
    await s.submit(h.request("H100"))
    await s.place_once()
    await _plan(h, 5)
    assert [c["offer"] for c in h.call_log()] == [_key(cheap), _key(dear), _key(unpriced)]


def test_preference_keeps_the_providers_order_and_drops_only_unavailable_offers() -> None:
    pool = Pool(name="h100", provider="flaky", runtime="runc", gpu="H100", gpu_count=1)
    spec = PoolSpec(pool=pool, cpu_millicores=1000, memory_mib=1024)
    offers = [
        GpuOffer(**_offer(zone, price_per_hour=price, availability=availability))
        for zone, price, availability in (("a", 3.0, "limited"), ("b", None, "unknown"), ("c", 1.0, "unavailable"))
    ]
    assert [o.zone for o in ordered(spec, offers)] == ["a", "b"]


def test_an_h100_pool_takes_no_h100_nvl_offer_and_the_other_way_round() -> None:
    # Issue 38: the 94 GB H100 NVL was an alias of the 80 GB H100; it is its own type, and a type means its memory
    h100 = PoolSpec(
        pool=Pool(name="h100", provider="flaky", runtime="runc", gpu="H100", gpu_count=1),
        cpu_millicores=1000,
        memory_mib=1024,
    )
    nvl = PoolSpec(
        pool=Pool(name="nvl", provider="flaky", runtime="runc", gpu="H100-NVL", gpu_count=1),
        cpu_millicores=1000,
        memory_mib=1024,
    )
    sxm = GpuOffer(**_offer("a"))
    pcie_nvl = GpuOffer(**_offer("b", gpu="H100-NVL", gpu_memory_mib=95830, instance_type="h100-nvl"))
    assert matching(h100, [sxm, pcie_nvl]) == ([sxm], 1)
    assert matching(nvl, [sxm, pcie_nvl]) == ([pcie_nvl], 1)


async def test_an_offer_marked_unavailable_is_skipped_until_the_ttl_passes(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100")], unavailable_ttl_s=1.5)
    o1, o2 = _offer("us-east-1a"), _offer("us-east-1b")
    h.offer(h100=[o1, o2])
    h.behave(**{_key(o1): "capacity"})
    s = h.scheduler()
    first = h.request("H100", cpu_millicores=4000)  # each request fills a machine, so each needs its own
    await s.submit(first)
    await s.place_once()
    await _plan(h, 2)
    assert [(c["offer"], c["action"]) for c in h.call_log()] == [(_key(o1), "capacity"), (_key(o2), "ok")]

    second = h.request("H100", cpu_millicores=4000)
    await s.submit(second)
    await s.place_once()
    await _plan(h, 1)
    assert [c["offer"] for c in h.call_log()][2:] == [_key(o2)], "the marked offer is not asked again"
    skipped = [e.reason or "" for e in await TaskStore(h.db).history(second.id) if e.outcome == "unavailable"]
    assert skipped == [
        f"offer {_key(o1)}: insufficient_capacity: [flaky] no {_key(o1)} capacity in the test region (OutOfCapacity)"
    ]

    await asyncio.sleep(1.6)  # the mark lapses (the TTL under test; long enough that the rounds above fit in it)
    h.behave()
    third = h.request("H100", cpu_millicores=4000)
    await s.submit(third)
    await s.place_once()
    await _plan(h, 1)
    assert [c["offer"] for c in h.call_log()][3:] == [_key(o1)], "after the TTL the first offer is asked again"


@pytest.mark.parametrize(("action", "kind"), [("auth", "authentication_failed"), ("denied", "permission_denied")])
async def test_a_refusal_no_offer_escapes_skips_the_whole_pool(
    make_harness: MakeHarness, action: str, kind: str
) -> None:
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]}), ("a100", "A100-80")])
    o1, o2 = _offer("us-east-1a"), _offer("us-east-1b")
    h.offer(h100=[o1, o2])
    h.behave(**{_key(o1): action})
    s = h.scheduler()
    req = h.request(["H100", "A100-80"])
    await s.submit(req)
    await s.place_once()
    await _plan(h, 3)
    assert [(c["pool"], c["offer"]) for c in h.call_log()] == [("h100", _key(o1)), ("a100", None)]
    assert (await s.ctx.unavailable.reason("h100", "H100", "us-east-1") or "").startswith(f"{kind}: ")
    assert await s.ctx.unavailable.offer_reasons("h100", [_key(o1), _key(o2)]) == {}


async def test_the_request_carries_the_offer_and_the_bootstrap_and_terminate_gets_the_stored_machine(
    make_harness: MakeHarness,
) -> None:
    h = await make_harness(
        [("h100", "H100", 1, {"regions": ["us-east-1"], "labels": {"team": "ml"}, "idle_timeout_s": 0.0})],
        worker_image="ghcr.io/levers9/worker:test",
    )
    offer = _offer("us-east-1b", price_per_hour=2.5)
    h.offer(h100=[offer])
    s = h.scheduler()
    wheel = ("http://cp.example:8080/api/v1/wheels/levers9-0-py3-none-any.whl", "ab" * 32)

    async def own_wheel() -> tuple[str, str]:
        return wheel

    s.ctx.wheel = own_wheel  # what the server sets: levers9's own wheel on its HTTP listener
    req = h.request("H100")
    await s.submit(req)
    await s.place_once()
    await _plan(h, 1)

    [call] = h.call_log()
    [machine] = h.machines()
    boot = call["bootstrap"]
    assert call["has_token"]
    assert "token" not in boot
    assert boot == {
        "controlplane_url": s.ctx.controlplane_url,
        "controlplane_ca": "",
        "machine_id": machine["machine_id"],
        "pool": "h100",
        "levers9_version": __version__,
        "worker_image": "ghcr.io/levers9/worker:test",
        "environment": {"LEVERS9_CPU_MILLICORES": "4000", "LEVERS9_MEMORY_MIB": "8192", "LEVERS9_GPU_COUNT": "1"},
        "labels": {"team": "ml"},
        "runtime": "runc",  # the pool's: the boot script gives an OCI runtime's worker what it needs
        "wheel_url": wheel[0],  # never levers9 by name from a package index
        "wheel_sha256": wheel[1],
    }
    record = await MachineStore(h.db).get(machine["machine_id"])
    assert record is not None
    assert (record.provider_id, record.region, record.zone, record.instance_type) == (
        machine["id"],
        "us-east-1",
        "us-east-1b",
        "p5.48xlarge",
    )
    assert (record.provider_data, record.offer_key, record.price_per_hour) == (
        {"zone": "us-east-1b"},
        _key(offer),
        2.5,
    )

    await h.register_started(s)
    [placed] = (await s.place_once()).placed
    await worker_finished(s, placed.request, placed.worker)
    report = await s.upkeep_once()
    assert report.released == [machine["machine_id"]]
    assert h.terminates() == [
        {
            "provider_id": machine["id"],
            "machine_id": machine["machine_id"],
            "pool": "h100",
            "region": "us-east-1",
            "zone": "us-east-1b",
            "instance_type": "p5.48xlarge",
            "provider_data": {"zone": "us-east-1b"},
        }
    ]


async def test_the_offer_cache_keeps_its_last_answer_when_a_refresh_fails(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1"]}), ("cpu",)], offers_ttl_s=60.0)
    s = h.scheduler()
    cache = s.offers
    h100, cpu = s.ctx.pools["h100"], s.ctx.pools["cpu"]
    good = _offer("us-east-1a")
    h.offer(h100=[good, _offer("us-east-1b", gpu_count=8), _offer("eu-west-1a", region="eu-west-1")])
    assert cache.get("h100") is None
    assert await cache.candidates(h100) == [GpuOffer(**good)], "asked on first need; other shapes and regions dropped"
    known = cache.get("h100")
    assert known is not None
    assert (known.error, known.dropped) == (None, 2)
    assert await cache.candidates(cpu) == [None], "a CPU pool's only candidate is its own shape"
    assert cache.stale() == [], "answers younger than the TTL are not asked again"

    h.offer(h100=[_offer("us-east-1c", gpu="NOT-A-GPU")])
    await cache.refresh([h100])
    known = cache.get("h100")
    assert known is not None
    assert known.offers == (GpuOffer(**good),)
    assert "NOT-A-GPU" in (known.error or "")
    assert await cache.candidates(h100) == [GpuOffer(**good)]


async def test_giving_up_names_every_offer_tried_and_why(make_harness: MakeHarness) -> None:
    h = await make_harness([("h100", "H100")])
    o1, o2 = _offer("us-east-1a"), _offer("us-east-1b")
    h.offer(h100=[o1, o2])
    h.behave(H100="quota")
    s = h.scheduler()
    req = h.request("H100", max_wait_s=5.0)  # both offers' misses on a loaded machine (1 s was too short)
    await s.submit(req)
    await s.place_once()
    tasks = TaskStore(h.db)
    task = await tasks.get(req.id)
    for _ in range(500):
        await _plan(h, 1)
        task = await tasks.get(req.id)
        if task is None or task.status != "pending":
            break
        await asyncio.sleep(0.02)
    assert task is not None
    assert task.status == "error"
    # a quota holds for the region: the region's second offer is not asked (before: tried zone after zone)
    assert [c["offer"] for c in h.call_log()] == [_key(o1)]
    message = task.error or ""
    assert f"h100 (1x H100, flaky) offer {_key(o1)}: quota_exceeded: [flaky] H100 quota is 0" in message
    assert f"h100 (1x H100, flaky) offer {_key(o2)}: quota_exceeded: [flaky] H100 quota is 0" in message
    assert "h100 (1x H100, flaky): every offer is unavailable (2 tried)" in message


async def test_a_pool_whose_offers_are_still_being_listed_waits_for_them_and_never_starts_its_own_shape(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trial: describing EC2's instance types took 7.5 s, longer than the planner's first wait, and the
    # pool was started without an offer (EC2 refused it; a cluster put an L4 pool's worker on a T4 node).
    monkeypatch.setattr("levers9.scheduler.offers.FIRST_ASK_TIMEOUT_S", 0.2)
    h = await make_harness([("h100", "H100")])
    o1 = _offer("us-east-1a")
    h.offer(h100=[o1])
    h.slow_offers(h100={"delay_s": 1.5})
    s = h.scheduler()
    req = h.request("H100")
    await s.submit(req)
    await s.place_once()
    await _plan(h, 1)
    assert h.call_log() == [], "nothing is started while the pool's offers are still being listed"
    history = [e.reason or "" for e in await TaskStore(h.db).history(req.id) if e.outcome == "unavailable"]
    assert history == ["its offers are still being listed by flaky; it waits for them"]

    async def answered() -> bool:
        known = s.offers.get("h100")
        return known is not None and known.answered_at is not None

    await eventually(answered, "the slow listing to answer (it is not cut short at the planner's first wait)")
    assert s.ctx.planner_wanted.is_set(), "the first answer wakes the planner"
    for _ in range(200):
        await _plan(h, 1)
        if h.call_log():
            break
        await asyncio.sleep(0.05)
    assert [c["offer"] for c in h.call_log()] == [_key(o1)], "the machine is started from the offer"


async def test_a_pool_whose_listing_fails_waits_asks_again_soon_and_then_starts_an_offer(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("levers9.scheduler.offers.UNANSWERED_RETRY_S", 0.3)
    h = await make_harness([("h100", "H100")], offers_ttl_s=600.0)
    o1 = _offer("us-east-1a")
    h.offer(h100=[o1])
    h.slow_offers(h100={"error": "DescribeInstanceTypes is slow today"})
    s = h.scheduler()
    req = h.request("H100")
    await s.submit(req)
    await s.place_once()
    await _plan(h, 1)
    assert h.call_log() == []
    pick = await s.offers.pick(s.ctx.pools["h100"])
    assert not pick.free
    assert "listing its offers failed ([flaky] DescribeInstanceTypes is slow today (Slow))" in (pick.why or "")
    assert s.offers.stale() == [], "not asked again at once"
    await asyncio.sleep(0.35)
    assert [p.name for p in s.offers.stale()] == ["h100"], "a pool that never answered is asked again soon, not per TTL"
    h.slow_offers()
    await s.offers.refresh()
    for _ in range(200):
        await _plan(h, 1)
        if h.call_log():
            break
        await asyncio.sleep(0.05)
    assert [c["offer"] for c in h.call_log()] == [_key(o1)]


async def test_a_quota_skips_every_offer_of_its_region_at_once_and_an_account_quota_the_whole_pool(
    make_harness: MakeHarness,
) -> None:
    # The trial: VcpuLimitExceeded (a per-region limit) was retried zone by zone, 6 calls per call.
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1", "us-west-2"]}), ("a100", "A100-80")])
    east_a, east_b = _offer("us-east-1a"), _offer("us-east-1b")
    west = _offer("us-west-2a", region="us-west-2")
    h.offer(h100=[east_a, east_b, west])
    h.behave(**{_key(east_a): "quota", _key(east_b): "ok", _key(west): "quota-account"})
    s = h.scheduler()
    req = h.request(["H100", "A100-80"])
    await s.submit(req)
    await s.place_once()
    await _plan(h, 4)
    assert [(c["pool"], c["offer"]) for c in h.call_log()] == [
        ("h100", _key(east_a)),
        ("h100", _key(west)),
        ("a100", None),
    ]
    marks = await s.ctx.unavailable.offer_marks("h100", [GpuOffer(**o) for o in (east_a, east_b, west)])
    assert set(marks) == {_key(east_a), _key(east_b)}, "the region's offers, not the other region's"
    assert "quota_exceeded" in (await s.ctx.unavailable.reason("h100", "H100", "us-east-1") or ""), (
        "an account's quota skips the whole pool"
    )
    history = [e.reason or "" for e in await TaskStore(h.db).history(req.id) if e.outcome == "unavailable"]
    assert any(r.startswith(f"offer {_key(east_b)}: quota_exceeded:") for r in history), history


async def test_a_refused_payment_skips_the_whole_pool_at_once_and_asks_for_a_top_up(make_harness: MakeHarness) -> None:
    # Issue 38: an insufficient balance was raised as QuotaExceeded (scope region): the pool's other regions were
    # tried, each refused alike, and the pool's reason did not say what the operator had to do.
    h = await make_harness([("h100", "H100", 1, {"regions": ["us-east-1", "us-west-2"]}), ("a100", "A100-80")])
    east_a, east_b = _offer("us-east-1a"), _offer("us-east-1b")
    west = _offer("us-west-2a", region="us-west-2")
    h.offer(h100=[east_a, east_b, west])
    h.behave(H100="billing")
    s = h.scheduler()
    req = h.request(["H100", "A100-80"])
    await s.submit(req)
    await s.place_once()
    await _plan(h, 4)
    assert [(c["pool"], c["offer"], c["action"]) for c in h.call_log()] == [
        ("h100", _key(east_a), "billing"),
        ("a100", None, "ok"),
    ], "no other offer of the pool escapes a refused payment: the next pool is asked at once"
    reason = await s.ctx.unavailable.reason("h100", "H100", "us-east-1") or ""
    assert reason.startswith("billing_refused: [flaky] the account's balance is $0.00; add credit to launch"), reason
    assert "(InsufficientBalance)" in reason
    assert "top up the balance (or fix the payment method) of the account provider 'flaky' uses" in reason
    history = [e.reason or "" for e in await TaskStore(h.db).history(req.id) if e.outcome == "unavailable"]
    assert any("billing_refused" in r and "top up" in r for r in history), history
    machines = await MachineStore(h.db).list("h100")
    assert [(m.state.value, m.last_error) for m in machines] == [
        ("failed", "[flaky] the account's balance is $0.00; add credit to launch (InsufficientBalance)")
    ]
