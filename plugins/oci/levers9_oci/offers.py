"""OCI shapes as levers9 offers: one :class:`~levers9.hooks.types.GpuOffer` per (shape, availability domain).

What ``ListShapes`` says of a shape in a domain becomes an offer when its GPUs
normalise (:func:`levers9.gpu.normalize.from_oci_shape`) to the pool's GPU type
and count, and it is one of ``settings.shapes`` when those are given. CPU and
memory come from ``ocpus`` (one OCPU is two vCPUs) and ``memory_in_gbs``; GPU
memory is the catalog's. OCI's list API publishes no price: the price is the
shape's in the catalog the plugin ships (:mod:`levers9_oci.prices`), None for a
shape it lacks.

Availability comes from a compute capacity report when one answers:
``AVAILABLE`` is available, ``OUT_OF_HOST_CAPACITY`` unavailable, anything
else (``HARDWARE_NOT_SUPPORTED``, a status OCI adds later, a shape the report
left out) unknown. The report is optional: the caller asks for it and passes
an empty mapping when it failed, so every offer is then ``unknown``.

Pure functions over plain mappings (``oci.util.to_dict`` of the SDK models):
nothing here calls the API or imports the SDK.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from levers9.gpu.catalog import CATALOG
from levers9.gpu.normalize import from_oci_shape
from levers9.hooks.types import Availability, GpuOffer, Pool, settings_of
from levers9_oci.prices import on_demand_price
from levers9_oci.settings import OciSettings

__all__ = ["availability_from_report", "matching_shapes", "shape_offer"]

_STATUS = {"AVAILABLE": Availability.AVAILABLE, "OUT_OF_HOST_CAPACITY": Availability.UNAVAILABLE}


def matching_shapes(pool: Pool, shapes: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str, int]]:
    """The shapes that can serve ``pool``, each with its canonical GPU type and count, in the API's order."""
    wanted = set(settings_of(pool, OciSettings).shapes)
    found = []
    seen: set[str] = set()
    for shape in shapes:
        name = str(shape.get("shape") or "")
        if not name or name in seen or (wanted and name not in wanted):
            continue
        gpu, count = from_oci_shape(shape)
        if gpu is None or gpu not in CATALOG or count < 1:
            continue
        if gpu != pool.gpu or (pool.gpu_count and count != pool.gpu_count):
            continue
        seen.add(name)
        found.append((shape, gpu, count))
    return found


def availability_from_report(report: Mapping[str, Any] | None) -> dict[str, Availability]:
    """Availability per shape name from a ``ComputeCapacityReport`` (as a dict); the worst answer per shape wins."""
    found: dict[str, Availability] = {}
    for item in (report or {}).get("shape_availabilities") or []:
        name = item.get("instance_shape")
        if not name:
            continue
        status = _STATUS.get(str(item.get("availability_status") or ""), Availability.UNKNOWN)
        before = found.get(name)
        if before is None or (before is Availability.AVAILABLE and status is not Availability.AVAILABLE):
            found[name] = status
    return found


def shape_offer(
    shape: Mapping[str, Any], gpu: str, count: int, *, region: str, domain: str, availability: Availability
) -> GpuOffer:
    """The offer of ``shape`` in ``domain`` of ``region``."""
    ocpus = _number(shape.get("ocpus"))
    memory_gb = _number(shape.get("memory_in_gbs"))
    return GpuOffer(
        gpu=gpu,
        gpu_count=count,
        gpu_memory_mib=CATALOG[gpu].memory_mib,
        region=region,
        zone=domain,
        instance_type=str(shape["shape"]),
        cpu_millicores=int(ocpus * 2 * 1000) if ocpus else None,
        memory_mib=int(memory_gb * 1024) if memory_gb else None,
        availability=availability,
        price_per_hour=on_demand_price(str(shape["shape"])),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)
