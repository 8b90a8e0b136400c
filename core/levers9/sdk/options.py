"""A function's settings: the decorators' options checked, and turned into what the controlplane stores.

:func:`function_config` reads the options every decorator takes (resources,
GPU preference, retries, timeouts, secrets) into a plain ``config`` dict;
:func:`check_serving` checks the options of endpoints and boxes; and
:func:`stub_config` serialises a config into the ``StubConfig`` message that
``GetOrCreateStub`` registers.

Invariants: every option is checked here, on the user's machine, against the
bounds the controlplane itself enforces (:mod:`levers9.stub_bounds`), so what
the decorator accepts the controlplane accepts too; a bad option raises
:class:`~levers9.sdk.errors.InvalidFunction` naming the function, the option
and what would be accepted. The config dict holds only JSON values: its
hash (with the pickled handler) keys the client's cache of stub ids.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from levers9 import stub_bounds as bounds
from levers9.proto.v1 import controlplane_pb2, volume_pb2
from levers9.quantities import NotAQuantity, parse_cpu_millicores, parse_memory_mib
from levers9.sdk.errors import InvalidFunction
from levers9.sdk.volumes import volume_configs

__all__ = ["check_serving", "function_config", "stub_config"]


def function_config(fn: Callable[..., Any], kind: str, **options: Any) -> dict[str, Any]:
    """``fn``'s config from :func:`~levers9.sdk.functions.function`'s options, each checked; raises InvalidFunction."""
    from levers9.gpu.preference import parse_gpu

    gpu = options.pop("gpu")
    gpu_count = options.pop("gpu_count")
    fallback = options.pop("fallback")
    fallback_after = options.pop("fallback_after")
    try:
        request = parse_gpu(gpu, gpu_count, fallback=fallback, fallback_after=fallback_after)
    except (ValueError, TypeError) as exc:
        raise InvalidFunction(f"{fn.__qualname__}: gpu: {exc}") from None
    preference = list(request.types) or (["any"] if request.any_gpu else [])
    if request.fallback_cpu:
        preference.append("cpu")
    where = fn.__qualname__
    try:
        cpu_millicores = parse_cpu_millicores(
            options.pop("cpu"), field="cpu", minimum=bounds.CPU_MILLICORES_MIN, maximum=bounds.CPU_MILLICORES_MAX
        )
        memory_mib = parse_memory_mib(
            options.pop("memory"), field="memory", minimum=bounds.MEMORY_MIB_MIN, maximum=bounds.MEMORY_MIB_MAX
        )
    except NotAQuantity as exc:
        raise InvalidFunction(f"{where}: {exc}") from None
    timeout = _seconds(where, "timeout", options.pop("timeout"), above=0.0, none_means="no timeout")
    retries = _whole(where, "retries", options.pop("retries"), bounds.RETRIES_MIN, bounds.RETRIES_MAX)
    keep_warm = _seconds(
        where,
        "keep_warm",
        options.pop("keep_warm"),
        least=bounds.KEEP_WARM_S_MIN,
        most=bounds.KEEP_WARM_S_MAX,
        none_means="the default",
    )
    name = options.pop("name") or fn.__qualname__.replace("<locals>.", "")
    if not isinstance(name, str) or not bounds.NAME_LENGTH_MIN <= len(name) <= bounds.NAME_LENGTH_MAX:
        raise InvalidFunction(
            f"{where}: name: {name!r} is not a name; use a string of {bounds.NAME_LENGTH_MIN} to "
            f"{bounds.NAME_LENGTH_MAX} characters"
        )
    secrets = options.pop("secrets") or ()
    return {
        "kind": kind,
        "app": options.pop("app") or _app_name(fn),
        "name": name,
        "image": options.pop("image"),
        "cpu_millicores": cpu_millicores,
        "memory_mib": memory_mib,
        "gpu": preference,
        "gpu_count": request.count if request.wants_gpu else 0,
        "fallback_after_s": fallback_after,
        "retries": retries,
        "timeout_s": timeout or 0.0,
        "secrets": [secrets] if isinstance(secrets, str) else list(secrets),
        "env": dict(options.pop("env") or {}),
        "keep_warm_s": keep_warm,
        "checkpoint_enabled": bool(options.pop("checkpoint", False)),
        "volumes": volume_configs(where, options.pop("volumes", None)),
    }


def _whole(where: str, option: str, value: object, least: int, most: int, *, none_ok: bool = False) -> int | None:
    """A whole-number option, checked against the bounds the controlplane enforces (levers9.stub_bounds)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFunction(f"{where}: {option}: {value!r} is not a whole number; use an int from {least} to {most}")
    if not least <= value <= most:
        raise InvalidFunction(f"{where}: {option}: {value} is out of range; use an int from {least} to {most}")
    return value


def _seconds(
    where: str,
    option: str,
    value: object,
    *,
    above: float | None = None,
    least: float | None = None,
    most: float | None = None,
    none_means: str,
) -> float | None:
    """A duration in seconds (None: ``none_means``), checked against the controlplane's bounds."""
    lower = f"above {above:g}" if above is not None else f"at least {least:g}" if least is not None else ""
    upper = f"at most {most:g}" if most is not None else ""
    accepted = f"use seconds as a number ({' and '.join(p for p in (lower, upper) if p)}), or None for {none_means}"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidFunction(f"{where}: {option}: {value!r} is not a number of seconds; {accepted}")
    if (
        (above is not None and value <= above)
        or (least is not None and value < least)
        or (most is not None and value > most)
    ):
        raise InvalidFunction(f"{where}: {option}: {value} is out of range; {accepted}")
    return float(value)


def _app_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", "") or "app"
    if module == "__main__":
        file = getattr(sys.modules.get("__main__"), "__file__", None)
        if file:
            from pathlib import Path

            return Path(file).stem
    return module.rsplit(".", 1)[-1]


def check_serving(where: str, serving: dict[str, Any]) -> None:
    """Check an endpoint's or box's own options against the controlplane's bounds, as :func:`function` does."""
    for option, field, least, most in (
        ("min_containers", "min_containers", bounds.MIN_CONTAINERS_MIN, bounds.MIN_CONTAINERS_MAX),
        ("max_containers", "max_containers", bounds.MAX_CONTAINERS_MIN, bounds.MAX_CONTAINERS_MAX),
        ("tasks_per_container", "tasks_per_container", bounds.TASKS_PER_CONTAINER_MIN, bounds.TASKS_PER_CONTAINER_MAX),
        ("max_pending", "max_pending", bounds.MAX_PENDING_MIN, bounds.MAX_PENDING_MAX),
    ):
        if field in serving:
            _whole(where, option, serving[field], least, most, none_ok=True)
    if "start_timeout_s" in serving:
        _seconds(
            where,
            "start_timeout",
            serving["start_timeout_s"],
            above=bounds.START_TIMEOUT_S_ABOVE,
            most=bounds.START_TIMEOUT_S_MAX,
            none_means="the default",
        )
    low, high = serving.get("min_containers"), serving.get("max_containers")
    if low is not None and high is not None and low > high:
        raise InvalidFunction(f"{where}: min_containers ({low}) is above max_containers ({high})")
    for port in serving.get("ports", ()):
        _whole(where, "ports", port, bounds.PORT_MIN, bounds.PORT_MAX)


def stub_config(c: dict[str, Any]) -> controlplane_pb2.StubConfig:
    """The ``StubConfig`` registering a function of config ``c``, for this process's Python version."""
    config = controlplane_pb2.StubConfig(
        kind=c["kind"],
        app=c["app"],
        name=c["name"],
        image=c["image"],
        cpu_millicores=c["cpu_millicores"],
        memory_mib=c["memory_mib"],
        gpu=c["gpu"],
        gpu_count=c["gpu_count"],
        retries=c["retries"],
        timeout_s=c["timeout_s"],
        secrets=c["secrets"],
        env=c["env"],
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        checkpoint_enabled=c["checkpoint_enabled"],
    )
    if c["fallback_after_s"] is not None:
        config.fallback_after_s = c["fallback_after_s"]
    if c["keep_warm_s"] is not None:
        config.keep_warm_s = c["keep_warm_s"]
    for volume in c.get("volumes", ()):
        mount = config.volumes.add(name=volume["name"], mount_path=volume["mount_path"])
        if "bucket" in volume:
            mount.bucket.CopyFrom(volume_pb2.CloudBucket(**volume["bucket"]))
    serving = c.get("serving") or {}
    for field_name, value in serving.items():
        if field_name == "ports":
            config.ports.extend(value)
        elif value is not None:
            setattr(config, field_name, value)
    return config
