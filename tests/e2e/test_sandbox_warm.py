"""Warm sandboxes on a real `levers9 up` (``sandboxes_warm: 1``): the pool's option reaches its worker, whose
next create of the same shape takes the sandbox it kept started, with that create's own variables and secrets.

What a REST client sees does not change (the same info, the same processes); the worker's log says which
container a create took. The secret reaches the sandbox's processes, never its container's own environment
(PID 1, the runner, was started before anyone asked for it).
"""

from __future__ import annotations

import contextlib
import re
import time

import httpx
import pytest

from tests.e2e.test_sandboxes import _client, _exec, _output
from tests.e2e.test_sandboxes import create_sandbox as _create
from tests.fixtures.levers9_up import Up

pytestmark = pytest.mark.e2e


def _worker_log(up: Up) -> str:
    """What the pool's local workers logged (their logs are the local provider's, under the state directory)."""
    return "".join(log.read_text(errors="replace") for log in sorted((up.root / "state").rglob("*.log")))


def _until_logged(up: Up, pattern: str, timeout_s: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while not (found := re.findall(pattern, _worker_log(up))):
        assert time.monotonic() < deadline, f"the worker never logged {pattern!r}:\n{_worker_log(up)[-3000:]}"
        time.sleep(0.1)
    return found


def _sh(client: httpx.Client, sid: object, script: str) -> str:
    out, err, code = _output(client, sid, _exec(client, sid, argv=["/bin/sh", "-c", script]))
    assert code == 0, err
    return out


def test_the_next_create_of_a_shape_takes_the_warm_sandbox_with_its_own_secrets(levers9_up: Up) -> None:
    levers9_up.use_runtime("runc")
    levers9_up.sandboxes, levers9_up.sandboxes_warm = 2, 1
    levers9_up.min_workers = levers9_up.max_workers = 1
    levers9_up.start()
    levers9_up.secret("API_TOKEN", "t0ken-of-the-second")
    shape = {"cpu_millicores": 250, "memory_mib": 256}
    with contextlib.closing(_client(levers9_up)) as client:
        first = _create(client, env={"WHO": "first"}, **shape)
        [ready] = _until_logged(levers9_up, r"warm sandbox container (\S+) is ready")
        second = _create(client, env={"WHO": "second"}, secrets=["API_TOKEN"], **shape)
        assert _until_logged(levers9_up, rf"sandbox {second['id']} of workspace \S+ took warm container (\S+)") == [
            ready
        ]
        assert _sh(client, second["id"], 'printf %s "$WHO:$API_TOKEN"') == "second:t0ken-of-the-second"
        assert "t0ken" not in _sh(client, second["id"], "tr '\\0' '\\n' < /proc/1/environ")
        assert _sh(client, first["id"], 'printf %s "$WHO:${API_TOKEN:-none}"') == "first:none"
        for sid in (first["id"], second["id"]):
            assert client.delete(f"/sandboxes/{sid}").json()["state"] == "ended"
