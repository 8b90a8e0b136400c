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
