"""A pool's ``sandboxes``: gVisor unless the operator chose a runtime, never the process runtime."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from levers9.config.model import PoolConfig


def test_a_pool_with_sandboxes_runs_gvisor_unless_a_runtime_is_chosen() -> None:
    assert PoolConfig(provider="local", sandboxes=4).runtime == "gvisor"
    assert PoolConfig(provider="local", sandboxes=4, runtime="runc").runtime == "runc"
    assert PoolConfig(provider="local").runtime == "runc"  # no sandboxes: the usual default


def test_sandboxes_on_the_process_runtime_or_out_of_range_are_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="sandboxes need a runtime that gives each container its own"):
        PoolConfig(provider="local", sandboxes=2, runtime="process", workspace="default")
    with pytest.raises(ValidationError, match="sandboxes"):
        PoolConfig(provider="local", sandboxes=-1)


def test_warm_sandboxes_are_at_most_the_pools_sandboxes_and_reach_the_pool_spec() -> None:
    from levers9.hooks.types import Pool
    from levers9.scheduler.pools import PoolSpec

    assert PoolConfig(provider="local", sandboxes=4).sandboxes_warm == 0  # off unless asked for
    config = PoolConfig(provider="local", sandboxes=4, sandboxes_warm=2)
    assert config.sandboxes_warm == 2
    with pytest.raises(ValidationError, match=r"sandboxes_warm is 3, above sandboxes \(2\)"):
        PoolConfig(provider="local", sandboxes=2, sandboxes_warm=3)
    with pytest.raises(ValidationError, match="sandboxes_warm"):
        PoolConfig(provider="local", sandboxes=2, sandboxes_warm=-1)
    assert PoolSpec.from_config(Pool(name="p", provider="local", runtime="runc"), config).sandboxes_warm == 2
