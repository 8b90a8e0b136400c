"""Builds through the controlplane: where they go, what a build worker is sent, what is recorded, for whom.

Real Services (SQLite and PostgreSQL, embedded Redis) and the real Worker gRPC service; the build
worker is the test's own client speaking the worker protocol with a real pool worker token, so this
covers the controlplane's half (tests/e2e/test_blueprints.py runs real builds on real workers).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from levers9.blueprints.order import read_order
from levers9.blueprints.spec import Base, BuildSpec, Step, keys
from levers9.proto.v1 import common_pb2, worker_pb2
from levers9.services.auth import Principal
from levers9.services.builds import BuildEvent, Builds, InvalidBlueprint, NoBuildPool, RegistryTarget
from levers9.services.core import Services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.services.metrics import Metrics
from levers9.services.stubs import InvalidStub
from levers9.state.sql.records import TokenKind
from tests.controlplane.conftest import CONFIG, Cp, worker_service
from tests.controlplane.test_worker_trust import Forged, forged_worker
from tests.fixtures.services import opened_services

DEADLINE_S = 30.0
BUILDS_CONFIG = CONFIG.replace("    max_workers: 3\n", "    max_workers: 3\n    builds: true\n", 1)
REGISTRY = RegistryTarget(url="http://127.0.0.1:5999", repository_prefix="levers9")
CONTENT = b"a deterministic tar, as far as the controlplane can tell"
SPEC = BuildSpec(
    base=Base(kind="debian", python_version="3.11"),
    steps=(
        Step(op="apt", args=("jq",)),
        Step(op="copy", args=("/app",), content="sha256:" + hashlib.sha256(CONTENT).hexdigest()),
        Step(op="run", args=("echo $TOKEN > /dev/null",), secrets=("TOKEN",)),
        Step(op="env", env=(("MODE", "fast"),)),
    ),
)


@pytest.fixture
async def build_cp(tmp_path: Path, database_url: str) -> AsyncIterator[Cp]:
    async with opened_services(tmp_path, BUILDS_CONFIG, database_url) as services:
        metrics = Metrics()
        dataplane = DataPlane(services, Hub(services.redis, name="builds-test"), metrics)
        async with worker_service(services, "builds-test", dataplane) as (stub, port):
            yield Cp(services, stub, port, dataplane, metrics)


@pytest.fixture
async def worker(build_cp: Cp) -> AsyncIterator[Forged]:
    """One worker of the builds pool, for the whole test."""
    async with forged_worker(build_cp) as forged:
        yield forged


async def _user(services: Services, name: str) -> Principal:
    workspace = await services.workspaces.get_or_create(name)
    await services.secrets.put(workspace.id, "TOKEN", "hunter2-secret-value")
    return Principal(token_id="t-" + name, kind=TokenKind.USER, workspace_id=workspace.id, subject="someone")


async def _collect(events: AsyncIterator[BuildEvent]) -> list[BuildEvent]:
    return [event async for event in events]


def _report(order: dict[str, Any]) -> bytes:
    """What a build worker answers: a layer for every step not cached (the env step makes none)."""
    spec = BuildSpec.from_json(order["spec"])
    steps = []
    for key, step in zip(order["keys"], (None, *spec.steps), strict=True):
        if key in order["cached"]:
            continue
        op = "base" if step is None else step.op
        layer = op != "env"
        steps.append(
            {
                "key": key,
                "op": op,
                "diff_id": "d" * 64 if layer else None,
                "blob_digest": "b" * 64 if layer else None,
                "size": 10 if layer else None,
            }
        )
    return json.dumps({"manifest_digest": "sha256:" + "e" * 64, "size": 1234, "steps": steps}).encode()


_STUBS: dict[str, worker_pb2.StubDefinition] = {}


async def _serve_one_build(worker: Forged, *, fail: bool = False) -> tuple[dict[str, Any], worker_pb2.StubDefinition]:
    """Take one build as a worker of the builds pool would: its order, output, and report (or an error).

    One worker serves a whole test: one that left would still be placed on for a while.
    """
    if True:
        while True:
            message = await asyncio.wait_for(worker.down.get(), DEADLINE_S)
            kind = message.WhichOneof("kind")
            if kind == "stub":
                _STUBS[message.stub.stub_id] = message.stub
            elif kind == "requests":
                (request,) = message.requests.requests
                break
        stub = _STUBS[request.stub_id]
        parsed = read_order(request.args)
        assert parsed.contents == {SPEC.steps[1].content: CONTENT}
        order = {
            "keys": list(parsed.keys),
            "cached": dict(parsed.cached),
            "registry": dict(parsed.registry),
            "spec": parsed.spec.to_json(),
        }
        result = (
            common_pb2.TaskResult(
                task_id=request.task_id,
                status="error",
                error=common_pb2.RemoteError(type="BuildFailed", message="step 2/5 (apt) exited 100"),
            )
            if fail
            else common_pb2.TaskResult(task_id=request.task_id, status="complete", result=_report(order))
        )
        worker.send(
            started=[worker_pb2.TaskStarted(task_id=request.task_id, container_id="build")],
            logs=[worker_pb2.TaskLog(task_id=request.task_id, data=b"step 2/5 apt jq\n")],
        )
        await asyncio.sleep(0.3)  # the output is stored before the result (as a worker's outbox sends them)
        worker.send(results=[result])
        await asyncio.sleep(0.5)
        return order, stub


async def test_a_build_runs_on_a_build_pool_and_is_recorded_for_its_workspace_only(
    build_cp: Cp, worker: Forged
) -> None:
    services, dp = build_cp.services, build_cp.dataplane
    builds = Builds(dp, REGISTRY)
    alice, bob = await _user(services, "team-a"), await _user(services, "team-b")
    contents = {SPEC.steps[1].content or "": CONTENT}
    serving = asyncio.create_task(_serve_one_build(worker))
    events = await asyncio.wait_for(_collect(builds.build(alice, SPEC.to_json(), contents)), DEADLINE_S)
    order, stub = await serving
    # the order: the spec, every key, nothing cached, the workspace's own repository; secrets by name only
    assert order["keys"] == list(keys(SPEC))
    assert order["cached"] == {}
    assert order["registry"]["repository"] == f"levers9/{alice.workspace_id}/blueprints"
    assert b"hunter2" not in json.dumps(order).encode()
    # the stub: the internal build kind, whose secret is sent decrypted on the worker's session only
    assert (stub.kind, dict(stub.secret_env)) == ("build", {"TOKEN": "hunter2-secret-value"})
    assert next(e.kind for e in events) == "started"
    assert events[-1].kind == "done"
    assert "step 2/5 apt jq" in "".join(e.text for e in events if e.kind == "log")
    done = events[-1]
    assert done.image == f"127.0.0.1:5999/levers9/{alice.workspace_id}/blueprints@sha256:{'e' * 64}"
    assert (done.cached, done.key) == (False, keys(SPEC)[-1])
    # built before: answered at once, no task
    again = await _collect(builds.build(alice, SPEC.to_json(), contents))
    assert [(e.kind, e.cached, e.image) for e in again] == [("done", True, done.image)]
    assert [ref for _, ref in await builds.images(alice)] == [done.image]
    # another workspace has built nothing: its build of the same blueprint runs, from no cache
    assert await builds.images(bob) == []
    serving = asyncio.create_task(_serve_one_build(worker))
    theirs = await asyncio.wait_for(_collect(builds.build(bob, SPEC.to_json(), contents)), DEADLINE_S)
    order, _ = await serving
    assert order["cached"] == {}
    assert theirs[-1].kind == "done"
    assert not theirs[-1].cached


async def test_a_changed_last_step_is_sent_with_the_steps_before_it_cached(build_cp: Cp, worker: Forged) -> None:
    services, dp = build_cp.services, build_cp.dataplane
    builds = Builds(dp, REGISTRY)
    alice = await _user(services, "team-a")
    contents = {SPEC.steps[1].content or "": CONTENT}
    serving = asyncio.create_task(_serve_one_build(worker))
    await asyncio.wait_for(_collect(builds.build(alice, SPEC.to_json(), contents)), DEADLINE_S)
    await serving
    changed = BuildSpec(base=SPEC.base, steps=(*SPEC.steps[:-1], Step(op="env", env=(("MODE", "slow"),))))
    serving = asyncio.create_task(_serve_one_build(worker))
    events = await asyncio.wait_for(_collect(builds.build(alice, changed.to_json(), contents)), DEADLINE_S)
    order, _ = await serving
    assert sorted(order["cached"]) == sorted(keys(changed)[:-1])  # base, apt, copy, run: all but the changed one
    assert order["cached"][keys(changed)[1]] == {"op": "apt", "diff_id": "d" * 64, "blob_digest": "b" * 64, "size": 10}
    assert (events[0].steps, events[0].steps_cached) == (4, 3)  # the base is not a step
    assert events[-1].kind == "done"


async def test_a_failed_build_records_nothing(build_cp: Cp, worker: Forged) -> None:
    services, dp = build_cp.services, build_cp.dataplane
    builds = Builds(dp, REGISTRY)
    alice = await _user(services, "team-a")
    contents = {SPEC.steps[1].content or "": CONTENT}
    serving = asyncio.create_task(_serve_one_build(worker, fail=True))
    events = await asyncio.wait_for(_collect(builds.build(alice, SPEC.to_json(), contents)), DEADLINE_S)
    await serving
    assert events[-1].kind == "failed"
    assert "step 2/5 (apt) exited 100" in events[-1].text
    assert await builds.images(alice) == []
    assert await builds.store.steps(alice.workspace_id or "", keys(SPEC)) == {}


async def test_refusals(build_cp: Cp, tmp_path: Path, database_url: str) -> None:
    dp = build_cp.dataplane
    alice = await _user(build_cp.services, "team-a")
    builds = Builds(dp, REGISTRY)
    with pytest.raises(InvalidBlueprint, match=r"steps\[0\]\.op"):
        await _collect(
            builds.build(alice, '{"base":{"kind":"debian","python_version":"3.11"},"steps":[{"op":"x"}]}', {})
        )
    with pytest.raises(InvalidBlueprint, match="were not sent"):
        await _collect(builds.build(alice, SPEC.to_json(), {}))
    with pytest.raises(InvalidBlueprint, match="do not have that sha256"):
        await _collect(builds.build(alice, SPEC.to_json(), {SPEC.steps[1].content or "": b"other files"}))
    with pytest.raises(NoBuildPool, match="registry"):
        await _collect(Builds(dp, None).build(alice, SPEC.to_json(), {SPEC.steps[1].content or "": CONTENT}))
    # users cannot define the builder's stubs: a forged order could name another workspace's layers
    with pytest.raises(InvalidStub, match="kind must be one of function"):
        await dp.get_or_create_stub(alice, {"kind": "build", "name": "mine"}, b"handler")
    # a controlplane with no pool that builds says how to make one
    (tmp_path / "plain").mkdir()
    async with opened_services(tmp_path / "plain", CONFIG, database_url) as services:
        plain = DataPlane(services, Hub(services.redis, name="no-builds"))
        try:
            bob = await _user(services, "team-b")
            contents = {SPEC.steps[1].content or "": CONTENT}
            with pytest.raises(NoBuildPool, match="set `builds: true` on a pool"):
                await _collect(Builds(plain, REGISTRY).build(bob, SPEC.to_json(), contents))
        finally:
            await plain.close()
