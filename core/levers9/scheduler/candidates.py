"""Which pools may take a request, in which order: the scheduler's one ranking rule.

Pools are grouped by the position of their GPU type in the request's preference
list, then by the operator's pool priority; within a group the fullest fitting
worker wins (that choice is made in Redis, see ``place.lua``). A CPU fallback is
one more group that opens ``fallback_after`` seconds after submission, or at once
when no pool offers any of the GPU types the request lists.

Within a group the pools are listed in the order the planner walks them to
start a machine (``scheduler.pool_order``):

- ``price`` (the default): the pool whose cheapest known offer costs least per
  GPU-hour (per machine-hour for a CPU pool) first, so with the same GPU in
  several pools the cheaper one is started; pools without a known price come
  after every priced one, in configuration order. The operator ranks pools
  above price with ``priority``: a higher priority is an earlier group, so
  price only orders pools of equal priority;
- ``config``: the order of the pools in the configuration file.

Prices are what the caller passes (:func:`pool_prices` of the offers this
replica knows); a price unknown when the request is queued (offers not asked
yet) counts as no price, and the order is fixed for the request's life.

A request no pool could ever take is refused here, before it is stored, with
the configured pools and their GPU types in the message: waiting would not help.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import Availability, GpuOffer
from levers9.scheduler.pools import PoolSpec
from levers9.scheduler.request import PlacementRequest
from levers9.state.redis.backlog import Group
from levers9.state.sql.records import root_workspace

__all__ = ["Candidate", "NoPoolOffers", "PoolOrder", "candidates", "groups", "pool_price", "pool_prices"]

#: how pools of one group are ordered (``scheduler.pool_order``); see the module docstring
PoolOrder = Literal["price", "config"]


class NoPoolOffers(Levers9Error):
    """No configured pool could ever run the request; the message names the pools and why each is out."""


@dataclass(frozen=True)
class Candidate:
    pool: PoolSpec
    #: position of the pool's GPU type in the preference (0 is best)
    rank: int
    #: epoch ms from which this pool may be used (the CPU fallback waits)
    not_before_ms: int
    #: GPUs the request holds on this pool's workers (0 on CPU, and for CPU work on a GPU pool)
    gpu_count: int


def _why_not(request: PlacementRequest, pool: PoolSpec) -> str | None:
    """Why ``pool`` can never run ``request``, or None when it can."""
    if request.pools is not None and pool.name not in request.pools:
        return "not among the pools the request names"
    wanted = request.gpu
    if pool.gpu is None:
        if wanted.wants_gpu and not wanted.fallback_cpu:
            return "CPU only, and the request needs a GPU (no CPU fallback)"
    else:
        if wanted.cpu_only and not pool.cpu_work:
            return "GPU pool, and the request is CPU-only (the pool does not set cpu_work)"
        if wanted.wants_gpu and wanted.rank(pool.gpu) is None:
            return f"{pool.gpu} is not in the request's preference"
        if wanted.count > pool.gpu_count:
            return f"workers have {pool.gpu_count} GPUs, the request needs {wanted.count}"
    if request.cpu_millicores > pool.cpu_millicores:
        return f"workers have {pool.cpu_millicores / 1000:g} CPUs, the request needs {request.cpu_millicores / 1000:g}"
    if request.memory_mib > pool.memory_mib:
        return f"workers have {pool.memory_mib} MiB memory, the request needs {request.memory_mib} MiB"
    for key, value in request.selector.items():
        if pool.pool.labels.get(key) != value:
            return f"label {key}={value} not on the pool"
    if request.checkpoint is not None:
        ckpt = request.checkpoint
        if pool.pool.runtime != ckpt.runtime or pool.gpu != ckpt.gpu:
            taken = f"{ckpt.runtime} on {ckpt.gpu or 'CPU'}"
            return f"checkpoint {ckpt.checkpoint_id} was taken with {taken}, the pool runs {pool.pool.runtime} on {pool.gpu or 'CPU'}"
    return None


def _visible(request: PlacementRequest, pool: PoolSpec) -> bool:
    """A workspace's attached cluster is invisible to every other workspace, even in error messages."""
    return pool.workspace is None or pool.workspace == root_workspace(request.workspace)


def pool_price(pool: PoolSpec, offers: Iterable[GpuOffer]) -> float | None:
    """What the cheapest of ``offers`` costs per GPU-hour of ``pool`` (per machine-hour on CPU); None when none
    of them has a price. Offers the provider itself reports unavailable are never started, so not counted."""
    per = max(pool.gpu_count, 1) if pool.gpu is not None else 1
    found = [
        o.price_per_hour / per
        for o in offers
        if o.price_per_hour is not None and o.availability is not Availability.UNAVAILABLE
    ]
    return min(found) if found else None


def pool_prices(pools: Mapping[str, PoolSpec], offers: Mapping[str, Iterable[GpuOffer]]) -> dict[str, float]:
    """:func:`pool_price` of every pool in ``pools`` with a priced offer in ``offers`` (pool name -> offers)."""
    out: dict[str, float] = {}
    for name, pool in pools.items():
        price = pool_price(pool, offers.get(name, ()))
        if price is not None:
            out[name] = price
    return out


def candidates(
    request: PlacementRequest,
    pools: Mapping[str, PoolSpec],
    *,
    order: PoolOrder = "price",
    prices: Mapping[str, float] | None = None,
) -> list[Candidate]:
    """Every pool that can run ``request``, best first; raises :class:`NoPoolOffers` when there is none.

    ``order`` and ``prices`` (pool name -> price per GPU-hour, see :func:`pool_prices`) order the pools of
    equal rank and priority (see the module docstring); ``pools`` is in configuration order.
    """
    wanted = request.gpu
    found: list[Candidate] = []
    refused: list[tuple[PoolSpec, str]] = []
    position = {name: i for i, name in enumerate(pools)}
    priced = prices if order == "price" and prices is not None else {}
    for pool in pools.values():
        if not _visible(request, pool):
            continue
        why = _why_not(request, pool)
        if why is not None:
            refused.append((pool, why))
            continue
        not_before = 0
        if pool.gpu is None and wanted.wants_gpu:
            rank = wanted.rank(None)
            assert rank is not None  # the fallback is on, checked above
            not_before = request.submitted_ms + round(wanted.fallback_after_s * 1000)
        elif pool.gpu is not None and wanted.cpu_only:
            rank = 1  # a GPU pool taking CPU work comes after every CPU pool
        else:
            rank = wanted.rank(pool.gpu) or 0
        gpus = wanted.count if pool.gpu is not None and wanted.wants_gpu else 0
        found.append(Candidate(pool, rank, not_before, gpus))
    if not found:
        raise NoPoolOffers(_nothing_fits(request, refused))
    if wanted.wants_gpu and all(c.pool.gpu is None for c in found):
        # No pool offers any GPU the request lists: waiting for one cannot help, so the fallback opens now.
        found = [Candidate(c.pool, c.rank, 0, c.gpu_count) for c in found]
    found.sort(key=lambda c: (c.rank, -c.pool.priority, *_price_key(priced.get(c.pool.name)), position[c.pool.name]))
    return found


def _price_key(price: float | None) -> tuple[bool, float]:
    """Priced pools first, the cheapest first; every unpriced pool after them (their order is the config's)."""
    return (price is None, price or 0.0)


def groups(found: list[Candidate]) -> tuple[Group, ...]:
    """Candidates as the backlog stores them: one group per (rank, priority)."""
    out: list[Group] = []
    key: tuple[int, int, int, int] | None = None
    for c in found:
        this = (c.rank, c.pool.priority, c.not_before_ms, c.gpu_count)
        if this == key:
            out[-1] = out[-1]._replace(pools=(*out[-1].pools, c.pool.name))
        else:
            out.append(Group(c.not_before_ms, (c.pool.name,), c.gpu_count))
            key = this
    return tuple(out)


def _nothing_fits(request: PlacementRequest, refused: list[tuple[PoolSpec, str]]) -> str:
    head = f"no pool can run request {request.id} ({request.gpu.describe()}, {request.cpu_millicores / 1000:g} CPU, {request.memory_mib} MiB"
    if request.selector:
        head += ", selector " + ",".join(f"{k}={v}" for k, v in sorted(request.selector.items()))
    head += ")"
    if not refused:
        return head + ": no pools are configured; add one under pools: in the config"
    lines = [f"  - {pool.describe()}: {why}" for pool, why in refused]
    message = head + ". Configured pools:\n" + "\n".join(lines)
    if not request.gpu.wants_gpu:
        return message  # which GPUs the pools have says nothing about a request for none
    offered = sorted({p.gpu for p, _ in refused if p.gpu})
    return (
        message + "\n" + (f"GPU types the pools offer: {', '.join(offered)}" if offered else "the pools offer no GPUs")
    )
