"""A machine's token joins once: its first Register answers a session credential, a second is refused.

Through the real Worker gRPC service on real Services (SQLite and PostgreSQL, embedded Redis), as a booted
machine's worker calls it: the join token in the ``authorization`` header, the session credential read
from ``RegisterResponse.session_token``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from levers9.config.load import load_config
from levers9.controlplane.grpc_worker import WorkerService
from levers9.proto.v1 import worker_pb2, worker_pb2_grpc
from levers9.services.core import Services, open_services
from levers9.services.dataplane import DataPlane
from levers9.services.hub import Hub
from levers9.worker.credentials import SESSION_FILE, read_session_credential, write_token_file
from tests.controlplane.conftest import Cp


async def test_the_join_token_registers_once_and_the_session_credential_from_then_on(cp: Cp) -> None:
    machine_id, join = await cp.machine()
    first = await cp.register(join, machine_id)
    assert first.worker_id
    session = first.session_token
    assert session
    assert session != join
    machine = await cp.services.machines.get(machine_id)
    assert machine is not None
    assert (machine.state.value, machine.worker_id) == ("running", first.worker_id)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cp.register(join, machine_id, worker_id=first.worker_id)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # the session credential re-registers (a reconnect, here or on any replica) and keeps the worker's id
    again = await cp.register(session, machine_id, worker_id=first.worker_id)
    assert again.worker_id == first.worker_id
    assert again.session_token == "", "a session credential is not exchanged again"
    assert (await cp.register(session, machine_id, worker_id=first.worker_id)).worker_id == first.worker_id

    # terminating the machine revokes both (they share its id as subject)
    assert await cp.services.tokens.revoke_subject(machine_id) >= 1
    record = await cp.services.tokens.find(session)
    assert record is not None
    assert record.revoked_at is not None
    cp.services.auth.forget(record.id)  # as revoking through the API does on this replica (else within 10 s)
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await cp.register(session, machine_id, worker_id=first.worker_id)
    assert gone.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_two_registrations_racing_with_one_join_token_let_exactly_one_in(cp: Cp) -> None:
    machine_id, join = await cp.machine()
    results = await asyncio.gather(*(cp.register(join, machine_id) for _ in range(4)), return_exceptions=True)
    joined = [r for r in results if isinstance(r, worker_pb2.RegisterResponse)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(joined) == 1, results
    assert joined[0].session_token
    assert len(refused) == 3
    assert {r.code() for r in refused} == {grpc.StatusCode.UNAUTHENTICATED}


async def test_a_join_token_past_the_machines_registration_deadline_is_refused(cp: Cp) -> None:
    machine_id, join = await cp.machine(register_in_s=-1.0)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cp.register(join, machine_id)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "registration deadline" in (refused.value.details() or "")
    machine = await cp.services.machines.get(machine_id)
    assert machine is not None
    assert machine.worker_id is None


async def test_a_pool_worker_token_is_not_a_join_token(cp: Cp) -> None:
    _, token = await cp.services.tokens.issue("worker", subject="cpu")
    first = await cp.register(token, "")
    assert first.session_token == ""
    second = await cp.register(token, "")
    assert second.worker_id
    assert second.worker_id != first.worker_id, "two workers may share a pool worker token"


RUNC_CONFIG = """\
version: 1
data_dir: {data_dir}
state:
  database_url: {database_url}
pools:
  boxes:
    provider: local
    runtime: runc
    cpu: 1
    memory: 1GiB
    min_workers: 0
    max_workers: 1
"""


@pytest.fixture
async def runc_cp(tmp_path: Path, database_url: str) -> AsyncIterator[tuple[Services, int]]:
    """Real Services with one runc pool, and the Worker service on a real port (no scheduler provisioning)."""
    if shutil.which("runc") is None or os.geteuid() != 0:
        pytest.fail("this test needs root and runc: run scripts/setup as root")
    path = tmp_path / "levers9.yaml"
    path.write_text(RUNC_CONFIG.format(data_dir=tmp_path / "data", database_url=database_url))
    loaded = load_config(path)
    services = await open_services(loaded, controlplane_url="grpc://127.0.0.1:1993")
    dataplane = DataPlane(services, Hub(services.redis, name="restart-test"))
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerService(dataplane), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield services, port
    finally:
        await server.stop(None)
        await dataplane.close()
        await services.scheduler.stop()
        await services.close()
        loaded.hooks.close()


async def _until(what: str, check: Callable[[], Awaitable[bool]], log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s; the worker said:\n{log.read_text()[-3000:]}")
        await asyncio.sleep(0.1)


async def test_a_restarted_worker_registers_again_with_its_saved_session_credential(
    runc_cp: tuple[Services, int], tmp_path: Path
) -> None:
    """The join token is spent and deleted; a worker process killed and started again on the same machine
    (docker's restart policy, a crash) comes back as the same worker with the credential it saved (runc keeps
    calls out of the worker's files, so it may save it)."""
    services, port = runc_cp
    record = await services.machines.create("boxes", "local", register_by=datetime.now(UTC) + timedelta(seconds=600))
    token_record, join = await services.tokens.issue("machine", subject=record.id)
    await services.machines.set_token(record.id, token_record.id)
    token_file = write_token_file(tmp_path / "join.token", join)
    state = tmp_path / "worker-state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(
        LEVERS9_CONTROLPLANE_URL=f"grpc://127.0.0.1:{port}",
        LEVERS9_TOKEN_FILE=str(token_file),
        LEVERS9_MACHINE_ID=record.id,
        LEVERS9_POOL="boxes",
        LEVERS9_WORKER_STATE_DIR=str(state),
        PYTHONUNBUFFERED="1",
    )
    started: list[subprocess.Popen[bytes]] = []

    def start(log: Path) -> None:
        with log.open("ab") as out:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "levers9", "worker"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    try:
        start(first_log)
        saved = state / SESSION_FILE

        async def joined() -> bool:
            machine = await services.machines.get(record.id)
            return machine is not None and machine.worker_id is not None and saved.exists()

        await _until("the worker joined and saved its session credential", joined, first_log)
        machine = await services.machines.get(record.id)
        assert machine is not None
        worker_id = machine.worker_id
        assert not token_file.exists(), "the worker deletes its join token file"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        credential = read_session_credential(state)
        assert credential is not None
        assert credential[1] == worker_id
        assert credential[0] != join
        spent = await services.tokens.find(join)
        assert spent is not None
        assert spent.revoked_at is not None, "the join token is spent"

        os.killpg(started[0].pid, signal.SIGKILL)  # no chance to clean up: its state directory stays
        started[0].wait(30)
        start(second_log)

        async def back() -> bool:
            return f"registered as {worker_id} " in second_log.read_text()

        await _until("the restarted worker registered again as the same worker", back, second_log)
        assert "refused" not in second_log.read_text()
        again = await services.machines.get(record.id)
        assert again is not None
        assert (again.state.value, again.worker_id) == ("running", worker_id)
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        subprocess.run(
            [sys.executable, "-m", "levers9", "worker", "--cleanup", "--state-dir", str(state)],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
