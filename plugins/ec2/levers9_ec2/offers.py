"""What EC2 can start for a pool: one :class:`GpuOffer` per (instance type, availability zone, spot).

Per region of the pool (``pool.regions``, in the pool's order):

* ``DescribeInstanceTypes`` (paginated; only ``settings.instance_types`` when
  given) keeps the types with ``GpuInfo`` whose GPUs
  :func:`levers9.gpu.normalize.from_ec2_gpu_info` names as the pool's ``gpu``,
  ``gpu_count`` of them;
* ``DescribeInstanceTypeOfferings(LocationType="availability-zone")`` says in
  which zones each is sold; the zones are narrowed to
  ``settings.availability_zones`` when given, else to the zones the configured
  ``subnet_ids`` cover (``DescribeSubnets``), else every zone;
* prices: on demand from the shipped catalog (:mod:`levers9_ec2.prices`; None
  when it has no figure); for spot, the latest ``DescribeSpotPriceHistory``
  entry (Linux/UNIX) of the type in the zone (None when EC2 has none).

A pool buys spot when ``settings.market`` is ``spot``, or when it is left out
and the pool is ``preemptible``: then every offer is a spot offer, else none is.
Availability is always ``unknown``: EC2 publishes no free capacity, and a
sold-out zone shows up only as ``InsufficientInstanceCapacity`` at launch,
which marks that one offer unavailable.

Within a region, offers are ordered cheapest first (unpriced last), then by
fewer vCPUs, then by type and zone, so ``strategy: preference`` also starts
with the cheapest fitting type.

The describe answers (types, offerings, subnets) change rarely and are cached
here for :data:`DESCRIBE_TTL_S`, per credentials, endpoint and region, under a
lock (hooks run on several threads); spot prices are asked each time (the core
caches the offers themselves). Failures are translated by
:mod:`levers9_ec2.errors`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from levers9.gpu.catalog import CATALOG
from levers9.gpu.normalize import from_ec2_gpu_info
from levers9.hooks.types import Availability, GpuOffer, Pool
from levers9_ec2.prices import on_demand_price
from levers9_ec2.settings import Ec2Settings, zone_of_region

__all__ = ["DESCRIBE_TTL_S", "DescribeCache", "GpuType", "build_offers", "uses_spot"]

#: how long describe answers (instance types, offerings, subnets) are kept
DESCRIBE_TTL_S = 300.0
#: EC2 takes at most this many values in one filter
_FILTER_VALUES = 100

T = TypeVar("T")


@dataclass(frozen=True)
class GpuType:
    """An instance type with GPUs, as DescribeInstanceTypes reports it."""

    instance_type: str
    gpu: str | None
    gpu_count: int
    vcpus: int
    memory_mib: int


def uses_spot(pool: Pool, settings: Ec2Settings) -> bool:
    """Spot when the settings say so, or when they are silent and the pool is preemptible."""
    if settings.market is not None:
        return settings.market == "spot"
    return pool.preemptible


class DescribeCache:
    """Answers kept for :data:`DESCRIBE_TTL_S`, thread-safe; each key is computed by one thread at a time."""

    def __init__(self, ttl: float = DESCRIBE_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[tuple[Any, ...], threading.Lock] = {}
        self._values: dict[tuple[Any, ...], tuple[float, Any]] = {}

    def get(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        with self._lock:
            key_lock = self._keys.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                found = self._values.get(key)
            if found is not None and found[0] > self._clock():
                value: T = found[1]
                return value
            value = compute()
            with self._lock:
                self._values[key] = (self._clock() + self._ttl, value)
            return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


def _chunks(values: list[str], size: int = _FILTER_VALUES) -> Iterable[list[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def describe_gpu_types(client: Any, instance_types: list[str]) -> list[GpuType]:
    """Every instance type with GPUs (of ``instance_types`` only, when given)."""
    found: list[GpuType] = []
    paginator = client.get_paginator("describe_instance_types")
    kwargs: dict[str, Any] = {"InstanceTypes": instance_types} if instance_types else {}
    for page in paginator.paginate(**kwargs):
        for entry in page.get("InstanceTypes", []):
            if "GpuInfo" not in entry:
                continue
            gpu, count = from_ec2_gpu_info(entry)
            found.append(
                GpuType(
                    instance_type=entry["InstanceType"],
                    gpu=gpu,
                    gpu_count=count,
                    vcpus=int((entry.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
                    memory_mib=int((entry.get("MemoryInfo") or {}).get("SizeInMiB") or 0),
                )
            )
    return found


def describe_offerings(client: Any, instance_types: list[str]) -> dict[str, list[str]]:
    """``{instance type: [zones where it is sold]}`` for ``instance_types``."""
    zones: dict[str, list[str]] = {}
    paginator = client.get_paginator("describe_instance_type_offerings")
    for chunk in _chunks(sorted(instance_types)):
        filters = [{"Name": "instance-type", "Values": chunk}]
        for page in paginator.paginate(LocationType="availability-zone", Filters=filters):
            for offering in page.get("InstanceTypeOfferings", []):
                zones.setdefault(offering["InstanceType"], []).append(offering["Location"])
    return {t: sorted(set(z)) for t, z in zones.items()}


def describe_subnet_zones(client: Any, subnet_ids: list[str]) -> dict[str, str]:
    """``{subnet id: its zone}`` for the subnets of ``subnet_ids`` that exist in the client's region."""
    found: dict[str, str] = {}
    paginator = client.get_paginator("describe_subnets")
    for chunk in _chunks(sorted(subnet_ids)):
        for page in paginator.paginate(Filters=[{"Name": "subnet-id", "Values": chunk}]):
            for subnet in page.get("Subnets", []):
                found[subnet["SubnetId"]] = subnet["AvailabilityZone"]
    return found


def spot_prices(client: Any, instance_types: list[str]) -> dict[tuple[str, str], float]:
    """``{(instance type, zone): USD/hour}``: the latest Linux/UNIX spot price of each type in each zone."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    paginator = client.get_paginator("describe_spot_price_history")
    now = datetime.now(UTC)
    for chunk in _chunks(sorted(instance_types)):
        pages = paginator.paginate(InstanceTypes=chunk, ProductDescriptions=["Linux/UNIX"], StartTime=now)
        for page in pages:
            for entry in page.get("SpotPriceHistory", []):
                key = (entry["InstanceType"], entry["AvailabilityZone"])
                stamp = entry.get("Timestamp") or datetime.min.replace(tzinfo=UTC)
                if key not in latest or stamp > latest[key][0]:
                    latest[key] = (stamp, float(entry["SpotPrice"]))
    return {key: price for key, (_, price) in latest.items()}


def allowed_zones(settings: Ec2Settings, region: str, subnet_zones: dict[str, str] | None) -> set[str] | None:
    """The zones of ``region`` the pool may use; None: every zone."""
    if settings.availability_zones:
        return {z for z in settings.availability_zones if zone_of_region(z, region)}
    if settings.subnet_ids:
        return set((subnet_zones or {}).values())
    return None


def build_offers(
    pool: Pool,
    region: str,
    gpu_types: list[GpuType],
    offerings: dict[str, list[str]],
    zones: set[str] | None,
    spot: bool,
    spot_price: dict[tuple[str, str], float] | None = None,
) -> list[GpuOffer]:
    """The offers of one region (pure: the describe answers in, offers out)."""
    if pool.gpu is None or pool.gpu not in CATALOG:
        return []
    offers: list[tuple[tuple[Any, ...], GpuOffer]] = []
    for kind in gpu_types:
        if kind.gpu != pool.gpu or kind.gpu_count != pool.gpu_count:
            continue
        for zone in offerings.get(kind.instance_type, []):
            if zones is not None and zone not in zones:
                continue
            price = (spot_price or {}).get((kind.instance_type, zone)) if spot else None
            if not spot:
                price = on_demand_price(region, kind.instance_type)
            offer = GpuOffer(
                gpu=pool.gpu,
                gpu_count=kind.gpu_count,
                gpu_memory_mib=CATALOG[pool.gpu].memory_mib,
                region=region,
                zone=zone,
                instance_type=kind.instance_type,
                cpu_millicores=kind.vcpus * 1000 or None,
                memory_mib=kind.memory_mib or None,
                availability=Availability.UNKNOWN,
                price_per_hour=price,
                spot=spot,
            )
            order = (price is None, price or 0.0, kind.vcpus, kind.instance_type, zone)
            offers.append((order, offer))
    return [offer for _, offer in sorted(offers, key=lambda item: item[0])]
