"""``POST /api/v1/sandboxes/ID/processes?wait=true`` on a real `levers9 up` (runc): one request that starts a
process and streams its output to its exit, relayed through the worker's tunnel as NDJSON.

Its first line is the process (``process``, ``pid``, ``argv``), then the output lines exactly as the output
route gives them, then ``{"exit": code}``. The output is that answer's (the output route answers
``output_busy``), and everything refused is refused before a process starts, as the plain exec is: another
workspace's sandbox as not found, a bad ``wait`` as a validation error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_sandboxes import _client, _create, _error, _exec, _output, _start, _terminated  # noqa: F401
from tests.fixtures.levers9_up import Up, _finish

pytestmark = pytest.mark.e2e

SLOW = (
    "import os, sys, time\n"
    "print('one', flush=True)\n"
    "while not os.path.exists('/tmp/go'): time.sleep(0.05)\n"
    "print('two', file=sys.stderr)\n"
    "sys.exit(3)"
)


@pytest.fixture(scope="module")
def wait_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("sandbox-wait-up")
    up = Up(root)
    try:
        _start(up, sandboxes=2)
        yield up
    finally:
        _finish(up, root)


def test_an_exec_that_waits_streams_the_process_then_its_output_then_its_exit(wait_up: Up) -> None:
    client = _client(wait_up)
    sid = _create(client)["id"]
    path = f"/sandboxes/{sid}/processes"
    with client.stream("POST", path, params={"wait": "true"}, json={"code": SLOW}) as stream:
        assert stream.status_code == 201
        assert stream.headers["content-type"].startswith("application/x-ndjson")
        lines = stream.iter_lines()
        started = json.loads(next(lines))
        assert set(started) == {"process", "pid", "argv"}
        number = started["process"]
        assert json.loads(next(lines))["data"] == "one\n"
        # the first line came while the process runs (it waits for a file only this test writes)
        assert client.get(f"{path}/{number}").json()["running"] is True
        assert _error(client.get(f"{path}/{number}/output"))[:2] == (409, "output_busy")
        assert _output(client, sid, _exec(client, sid, argv=["touch", "/tmp/go"]))[2] == 0
        rest: list[dict[str, Any]] = [json.loads(line) for line in lines if line]
    assert rest == [{"stream": "stderr", "data": "two\n", "encoding": "utf-8", "partial": False}, {"exit": 3}]
    assert client.get(f"{path}/{number}").json()["exit_code"] == 3

    answer = client.post(path, params={"wait": "true"}, json={"argv": ["sh", "-c", "echo hi; exit 7"]})
    assert answer.status_code == 201
    got = [json.loads(line) for line in answer.text.splitlines()]
    assert got[1:] == [{"stream": "stdout", "data": "hi\n", "encoding": "utf-8", "partial": False}, {"exit": 7}]
    assert set(client.post(path, json={"argv": ["true"]}).json()) == {"process", "pid", "argv"}


def test_an_exec_that_waits_is_refused_as_the_plain_one_is(wait_up: Up) -> None:
    client = _client(wait_up)
    sid = _create(client)["id"]
    path = f"/sandboxes/{sid}/processes"
    before = len(client.get(path).json()["processes"])
    bad = client.post(path, params={"wait": "soon"}, json={"argv": ["true"]})
    assert bad.status_code == 422
    assert "wait" in bad.text
    assert _error(client.post(path, params={"wait": "true"}, json={"argv": []}))[:2] == (422, "validation_error")
    made = wait_up.levers9("token", "create", "--workspace", "team-w")
    assert made.returncode == 0, made.stderr
    other = _client(wait_up, made.stdout.strip())
    assert _error(other.post(path, params={"wait": "true"}, json={"argv": ["true"]}))[:2] == (404, "sandbox_not_found")
    assert _error(_client(wait_up, "l9_user_not_a_token").post(path, params={"wait": "true"}, json={}))[0] == 401
    assert len(client.get(path).json()["processes"]) == before
