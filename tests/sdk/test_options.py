"""``@levers9.function`` options are read and range-checked when the function is decorated.

The bounds are the controlplane's own (``StubSettings``, reading
``levers9.stub_bounds``), so what the decorator accepts the controlplane
accepts too, and a mistake fails at the line that made it rather than at the
first call.
"""

from __future__ import annotations

from typing import Any

import pytest

import levers9
from levers9 import stub_bounds
from levers9.sdk.errors import InvalidFunction
from levers9.services.stubs import StubSettings


def _work() -> int:
    return 1


def _decorate(**options: Any) -> Any:
    return levers9.function(**options)(_work)


@pytest.mark.parametrize(
    ("memory", "mib"), [("1Gi", 1024), ("256Mi", 256), ("16GiB", 16384), ("16GB", 16384), (512, 512), ("512", 512)]
)
def test_memory_takes_sizes_and_a_bare_number_is_mib(memory: object, mib: int) -> None:
    assert _decorate(memory=memory).config["memory_mib"] == mib


@pytest.mark.parametrize(("cpu", "millicores"), [("500m", 500), ("0.5", 500), ("2", 2000), (0.125, 125), (4, 4000)])
def test_cpu_takes_cores_or_millicores(cpu: object, millicores: int) -> None:
    assert _decorate(cpu=cpu).config["cpu_millicores"] == millicores


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"memory": "1Gb"},
            "_work: memory: '1Gb' is not a quantity; use MiB as a number (512) or a string like '256Mi', '1Gi', '16GiB'",
        ),
        (
            {"memory": 10**12},
            "_work: memory: 1000000000000 is out of range; it must be at least 1 MiB and at most 16 TiB",
        ),
        ({"memory": True}, "_work: memory: True is not a quantity"),
        ({"memory": [512]}, "_work: memory: [512] is not a quantity"),
        ({"cpu": "1 core"}, "_work: cpu: '1 core' is not a CPU amount; use cores as a number (0.5, 2) or a string"),
        ({"cpu": 0}, "_work: cpu: 0 is out of range; it must be at least 1m"),
        ({"cpu": 2000}, "_work: cpu: 2000 is out of range; it must be at least 1m (0.001 cores) and at most 1024000m"),
        ({"retries": -1}, "_work: retries: -1 is out of range; use an int from 0 to 100"),
        ({"retries": 101}, "_work: retries: 101 is out of range; use an int from 0 to 100"),
        ({"retries": "3"}, "_work: retries: '3' is not a whole number; use an int from 0 to 100"),
        (
            {"timeout": 0},
            "_work: timeout: 0 is out of range; use seconds as a number (above 0), or None for no timeout",
        ),
        ({"timeout": "60"}, "_work: timeout: '60' is not a number of seconds"),
        (
            {"keep_warm": 90_000},
            "_work: keep_warm: 90000 is out of range; use seconds as a number (at least 0 and at most 86400)",
        ),
        ({"keep_warm": -1}, "_work: keep_warm: -1 is out of range"),
        ({"gpu": "H100", "gpu_count": 3}, "_work: gpu: gpu_count must be 1, 2, 4 or 8, not 3"),
        ({"name": "x" * 129}, "_work: name: 'xxxx"),
    ],
)
def test_a_bad_option_fails_at_decoration_naming_it_and_what_is_accepted(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidFunction) as info:
        _decorate(**options)
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("decorator", "options", "message"),
    [
        (
            levers9.endpoint,
            {"max_containers": 0},
            "_work: max_containers: 0 is out of range; use an int from 1 to 1000",
        ),
        (
            levers9.endpoint,
            {"min_containers": 5, "max_containers": 2},
            "_work: min_containers (5) is above max_containers (2)",
        ),
        (levers9.endpoint, {"tasks_per_container": "2"}, "_work: tasks_per_container: '2' is not a whole number"),
        (levers9.endpoint, {"max_pending": -1}, "_work: max_pending: -1 is out of range; use an int from 0 to 1000000"),
        (
            levers9.endpoint,
            {"start_timeout": 7200},
            "_work: start_timeout: 7200 is out of range; use seconds as a number (above 0 and at most 3600)",
        ),
        (levers9.endpoint, {"memory": "1Gb"}, "_work: memory: '1Gb' is not a quantity"),
        (levers9.box, {"ports": [70000]}, "_work: ports: 70000 is out of range; use an int from 1 to 65535"),
    ],
)
def test_serving_options_are_checked_at_decoration(decorator: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidFunction) as info:
        decorator(**options)(_work)
    assert str(info.value).startswith(message), str(info.value)


def _settings(decorated: Any) -> StubSettings:
    """What the controlplane makes of a decorated function's options (the fields GetOrCreateStub sends)."""
    c = decorated.config
    fields = (
        "kind",
        "app",
        "name",
        "image",
        "cpu_millicores",
        "memory_mib",
        "gpu",
        "gpu_count",
        "retries",
        "timeout_s",
    )
    raw = {name: c[name] for name in fields}
    if c["keep_warm_s"] is not None:
        raw["keep_warm_s"] = c["keep_warm_s"]
    raw.update({k: v for k, v in (c.get("serving") or {}).items() if v is not None})
    return StubSettings.model_validate(raw)


def test_the_largest_values_the_decorator_accepts_are_accepted_by_the_controlplane() -> None:
    top = _decorate(
        cpu=f"{stub_bounds.CPU_MILLICORES_MAX}m",
        memory=stub_bounds.MEMORY_MIB_MAX,
        retries=stub_bounds.RETRIES_MAX,
        keep_warm=stub_bounds.KEEP_WARM_S_MAX,
        name="n" * stub_bounds.NAME_LENGTH_MAX,
    )
    settings = _settings(top)
    assert (settings.cpu_millicores, settings.memory_mib) == (
        stub_bounds.CPU_MILLICORES_MAX,
        stub_bounds.MEMORY_MIB_MAX,
    )
    served = levers9.endpoint(
        max_containers=stub_bounds.MAX_CONTAINERS_MAX,
        min_containers=stub_bounds.MIN_CONTAINERS_MAX,
        tasks_per_container=stub_bounds.TASKS_PER_CONTAINER_MAX,
        max_pending=stub_bounds.MAX_PENDING_MAX,
        start_timeout=stub_bounds.START_TIMEOUT_S_MAX,
    )(_work)
    assert _settings(served).max_pending == stub_bounds.MAX_PENDING_MAX


def test_the_controlplane_refuses_just_past_the_shared_bounds() -> None:
    base = _settings(_decorate()).model_dump()
    for name, value in (
        ("cpu_millicores", stub_bounds.CPU_MILLICORES_MAX + 1),
        ("memory_mib", stub_bounds.MEMORY_MIB_MAX + 1),
        ("retries", stub_bounds.RETRIES_MAX + 1),
        ("keep_warm_s", stub_bounds.KEEP_WARM_S_MAX + 1),
        ("max_pending", stub_bounds.MAX_PENDING_MAX + 1),
    ):
        with pytest.raises(ValueError, match=name):
            StubSettings.model_validate({**base, name: value})
