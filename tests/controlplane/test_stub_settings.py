"""A stub's serving settings are checked once, when it is defined: each refusal names the field."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from levers9.services.stubs import StubSettings


def _settings(**fields: Any) -> StubSettings:
    return StubSettings.model_validate({"name": "s", **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "box"}, "a box needs ports"),
        ({"kind": "box", "ports": [0]}, "ports must be TCP ports from 1 to 65535"),
        ({"kind": "endpoint", "min_containers": 3, "max_containers": 2}, "min_containers (3) is above max_containers"),
        ({"kind": "queue", "public": True}, "only endpoints can be public, not a queue"),
        ({"kind": "endpoint", "checkpoint_enabled": True}, "an endpoint cannot be checkpointed yet"),
        ({"kind": "endpoint", "interface": "wsgi"}, "interface"),
        ({"kind": "endpoint", "tasks_per_container": 0}, "tasks_per_container"),
        ({"kind": "endpoint", "max_pending": -1}, "max_pending"),
        ({"kind": "endpoint", "start_timeout_s": 0}, "start_timeout_s"),
        ({"kind": "daemon"}, "kind must be one of function, job, endpoint, queue, box"),
    ],
)
def test_what_can_never_serve_is_refused_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        _settings(**fields)


def test_an_endpoint_scales_to_zero_and_a_box_keeps_one_running_unless_told_otherwise() -> None:
    assert _settings(kind="endpoint").floor == 0
    assert _settings(kind="box", ports=[8000]).floor == 1
    assert _settings(kind="box", ports=[8000], min_containers=0).floor == 0
    assert _settings(kind="endpoint", min_containers=2).floor == 2
