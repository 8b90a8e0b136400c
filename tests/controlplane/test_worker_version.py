"""A worker registers only with a controlplane of its own levers9 version; another is refused for good.

Through the real Worker gRPC service on real Services (SQLite and PostgreSQL,
embedded Redis): a Register naming another version (or none) is answered
FAILED_PRECONDITION with both versions and the image build command, before
the machine's join token is spent, so the same token registers once the
version matches; and a real worker process claiming another version exits at
once with :data:`~levers9.worker.session.EXIT_REFUSED` and the controlplane's
message, without retrying.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from levers9.__about__ import __version__
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginPolicy, PluginSet
from levers9.services.fleet import WorkerVersionMismatch, check_worker_version
from levers9.worker.session import EXIT_REFUSED, WorkerOptions, WorkerProcess
from tests.controlplane.conftest import Cp

OTHER = "0.0.1+elsewhere"


def expected_message(worker: str) -> str:
    return (
        f"worker levers9 {worker} does not match the controlplane's {__version__}: rebuild the worker image with "
        f"`levers9 worker-image build` on a machine with levers9 {__version__} (or install the controlplane's own "
        "wheel, GET /api/v1/wheels, never levers9 by name from a package index)"
    )


def test_only_the_exact_version_passes_the_check() -> None:
    check_worker_version(__version__)
    for other in (OTHER, f"{__version__}.post1", f"{__version__}+local", "0.0.0"):
        with pytest.raises(WorkerVersionMismatch) as refused:
            check_worker_version(other)
        assert str(refused.value) == expected_message(other)
    with pytest.raises(WorkerVersionMismatch, match=r"\(a worker that names no version\) does not match"):
        check_worker_version("")


async def test_another_version_is_refused_before_the_join_token_is_spent(cp: Cp) -> None:
    machine_id, join = await cp.machine()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cp.register(join, machine_id, version=OTHER)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == expected_message(OTHER)
    with pytest.raises(grpc.aio.AioRpcError) as unnamed:
        await cp.register(join, machine_id, version="")
    assert unnamed.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    # the refusals spent nothing: the same join token registers a worker of this version, once
    accepted = await cp.register(join, machine_id, version=__version__)
    assert accepted.worker_id
    assert accepted.session_token
    assert await cp.services.scheduler.workers.get(accepted.worker_id) is not None


async def test_a_worker_of_another_version_exits_at_once_with_the_message(
    cp: Cp, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    machine_id, join = await cp.machine()
    plugins = PluginSet(PluginPolicy.from_env())
    plugins.load_entry_points()
    hooks = Hooks(plugins)
    options = WorkerOptions(
        controlplane=f"grpc://127.0.0.1:{cp.port}",
        token=join,
        pool="cpu",
        machine_id=machine_id,
        state_dir=tmp_path / "worker",
        version=OTHER,
    )
    try:
        with caplog.at_level(logging.ERROR, logger="levers9.worker.session"):
            code = await asyncio.wait_for(WorkerProcess(options, hooks).run(), timeout=60)
    finally:
        hooks.close()
    assert code == EXIT_REFUSED
    refusals = [r.getMessage() for r in caplog.records if "refused this worker" in r.getMessage()]
    assert refusals == [f"the controlplane refused this worker: {expected_message(OTHER)}"]
    # it registered nowhere, and its machine's join token still works for a worker of this version
    accepted = await cp.register(join, machine_id, version=__version__)
    assert accepted.session_token
