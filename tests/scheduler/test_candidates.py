"""Which pools a request may use, in which order, and the refusal when none can ever take it."""

from __future__ import annotations

import pytest

from levers9.gpu.preference import parse_gpu
from levers9.hooks.types import Availability, GpuOffer, Pool
from levers9.scheduler.candidates import NoPoolOffers, candidates, groups, pool_price, pool_prices
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.request import CheckpointNeed, PlacementRequest
from levers9.state.redis.backlog import Group


def spec(name: str, gpu: str | None = None, count: int = 1, **kw: object) -> PoolSpec:
    labels = kw.pop("labels", {})
    runtime = kw.pop("runtime", "runc")
    pool = Pool(name=name, provider="toy", runtime=runtime, gpu=gpu, gpu_count=count if gpu else 0, labels=labels)
    defaults: dict[str, object] = {"cpu_millicores": 8000, "memory_mib": 32768}
    defaults.update(kw)
    return PoolSpec(pool=pool, **defaults)  # type: ignore[arg-type]


POOLS = {
    p.name: p
    for p in [
        spec("cpu"),
        spec("h100-aws", "H100", 8, priority=0),
        spec("h100-own", "H100", 2, priority=5),
        spec("a100", "A100-80", 1),
        spec("l40s", "L40S", 1, labels={"zone": "eu"}),
    ]
}


def req(gpu: object = None, **kw: object) -> PlacementRequest:
    fields: dict[str, object] = {"id": "t1", "workspace": "ws1", "submitted_ms": 1_000_000}
    fields["gpu"] = parse_gpu(gpu, **{k: kw.pop(k) for k in ("gpu_count", "fallback", "fallback_after") if k in kw})  # type: ignore[arg-type]
    fields.update(kw)
    return PlacementRequest(**fields)  # type: ignore[arg-type]


def test_preference_order_then_priority() -> None:
    found = groups(candidates(req(["L40S", "H100", "A100-80"]), POOLS))
    assert found == (
        Group(0, ("l40s",), 1),
        Group(0, ("h100-own",), 1),  # same GPU type: the higher priority pool is its own, earlier group
        Group(0, ("h100-aws",), 1),
        Group(0, ("a100",), 1),
    )


def test_equal_priority_pools_share_a_group() -> None:
    pools = dict(POOLS, **{"h100-gcp": spec("h100-gcp", "H100", 8)})
    found = groups(candidates(req("H100"), pools))
    assert found == (Group(0, ("h100-own",), 1), Group(0, ("h100-aws", "h100-gcp"), 1))


def test_cpu_fallback_opens_after_fallback_after() -> None:
    found = groups(candidates(req(["A100-80", "cpu"], fallback_after=30), POOLS))
    assert found == (Group(0, ("a100",), 1), Group(1_000_000 + 30_000, ("cpu",), 0))


def test_cpu_fallback_opens_at_once_when_no_pool_offers_a_listed_gpu() -> None:
    # Nothing offers B200 or H200: waiting fallback_after for them could never help.
    found = groups(candidates(req(["B200", "H200", "cpu"], fallback_after=30), POOLS))
    assert found == (Group(0, ("cpu",), 0),)
    # With one listed GPU offered, the fallback still waits for it.
    found = groups(candidates(req(["B200", "A100-80", "cpu"], fallback_after=30), POOLS))
    assert found == (Group(0, ("a100",), 1), Group(1_000_000 + 30_000, ("cpu",), 0))


def test_cpu_only_work_stays_off_gpu_pools_unless_the_pool_allows_it() -> None:
    assert groups(candidates(req(None), POOLS)) == (Group(0, ("cpu",), 0),)
    pools = dict(POOLS, shared=spec("shared", "L4", 1, cpu_work=True))
    assert groups(candidates(req(None), pools)) == (Group(0, ("cpu",), 0), Group(0, ("shared",), 0))


def test_gpu_count_memory_and_cpu_must_fit_a_worker() -> None:
    found = groups(candidates(req("H100", gpu_count=4), POOLS))
    assert found == (Group(0, ("h100-aws",), 4),)
    with pytest.raises(NoPoolOffers, match="workers have 32768 MiB memory, the request needs 65536 MiB"):
        candidates(req("H100", memory_mib=65536), POOLS)


def test_selector_and_named_pools() -> None:
    assert groups(candidates(req(["H100", "L40S"], selector={"zone": "eu"}), POOLS)) == (Group(0, ("l40s",), 1),)
    assert groups(candidates(req("H100", pools=("h100-aws",)), POOLS)) == (Group(0, ("h100-aws",), 1),)


def test_checkpoint_goes_only_where_runtime_and_gpu_match() -> None:
    pools = dict(POOLS, sandboxed=spec("sandboxed", "H100", 2, runtime="gvisor"))
    ckpt = CheckpointNeed(checkpoint_id="ck1", runtime="gvisor", gpu="H100")
    assert groups(candidates(req(["A100-80", "H100"], checkpoint=ckpt), pools)) == (Group(0, ("sandboxed",), 1),)
    with pytest.raises(NoPoolOffers, match="checkpoint ck1 was taken with gvisor on H100"):
        candidates(req("A100-80", checkpoint=ckpt), pools)


def test_attached_cluster_serves_only_its_workspace_and_is_invisible_to_others() -> None:
    pools = dict(POOLS, mine=spec("mine", "B200", 8, workspace="ws1"))
    assert groups(candidates(req("B200"), pools)) == (Group(0, ("mine",), 1),)
    with pytest.raises(NoPoolOffers) as info:
        candidates(req("B200", workspace="ws2"), pools)
    assert "mine" not in str(info.value)
    assert "B200" not in str(info.value).split("GPU types the pools offer:")[1]


def test_a_gpu_no_pool_offers_is_refused_naming_the_pools_and_their_gpus() -> None:
    with pytest.raises(NoPoolOffers) as info:
        candidates(req("B200"), POOLS)
    message = str(info.value)
    assert "no pool can run request t1 (1x B200" in message
    for line in ("cpu (CPU, toy)", "h100-aws (8x H100, toy)", "a100 (1x A100-80, toy)", "l40s (1x L40S, toy)"):
        assert line in message
    assert "B200 is not in" not in message
    assert "H100 is not in the request's preference" in message
    assert message.endswith("GPU types the pools offer: A100-80, H100, L40S")


def test_a_cpu_request_nothing_fits_says_nothing_of_gpus() -> None:
    with pytest.raises(NoPoolOffers) as info:
        candidates(req(None, cpu_millicores=64_000), {"cpu": spec("cpu")})
    assert str(info.value) == (
        "no pool can run request t1 (CPU only, 64 CPU, 1024 MiB). Configured pools:\n"
        "  - cpu (CPU, toy): workers have 8 CPUs, the request needs 64"
    )  # which GPUs the pools have says nothing about a request for none


def test_no_pools_at_all() -> None:
    with pytest.raises(NoPoolOffers, match="no pools are configured"):
        candidates(req(None), {})


def test_pools_of_one_group_follow_the_config_then_the_price() -> None:
    # listed z-first: config order is the file's, not the names'
    pools = {p.name: p for p in [spec("z-own", "H100", 1), spec("a-aws", "H100", 8), spec("m-gcp", "H100", 2)]}
    assert groups(candidates(req("H100"), pools, order="config")) == (Group(0, ("z-own", "a-aws", "m-gcp"), 1),)
    prices = {"a-aws": 2.0, "m-gcp": 1.5}  # per GPU-hour; z-own has none
    assert groups(candidates(req("H100"), pools, order="price", prices=prices)) == (
        Group(0, ("m-gcp", "a-aws", "z-own"), 1),
    )
    assert groups(candidates(req("H100"), pools, order="config", prices=prices))[0].pools[0] == "z-own"


def test_a_pools_price_is_its_cheapest_usable_offer_per_gpu_hour() -> None:
    pool = POOLS["h100-aws"]  # 8x H100
    offer = {"gpu": "H100", "gpu_count": 8, "gpu_memory_mib": 81559, "instance_type": "p5.48xlarge"}
    offers = [
        GpuOffer(**offer, zone="a", price_per_hour=40.0),
        GpuOffer(**offer, zone="b", price_per_hour=8.0, availability=Availability.UNAVAILABLE),
        GpuOffer(**offer, zone="c"),
    ]
    assert pool_price(pool, offers) == 5.0
    assert pool_price(pool, offers[1:]) is None
    assert pool_prices(POOLS, {"h100-aws": offers, "a100": []}) == {"h100-aws": 5.0}
