"""An EC2 machine's join token is bound to its instance: the worker must show the instance's signed identity document.

Through the real Worker gRPC service on real Services (SQLite and PostgreSQL,
embedded Redis) with an ``ec2`` pool, as a booted instance's worker calls it.
The identity documents come from the fake metadata service
(:mod:`tests.fakes.imds`), fetched with the plugin's own IMDSv2 client; the
pool verifies them with the fake's certificate (``identity_certificate_file``).
What is checked: a registration without the identity, or with another
instance's, is refused and leaves the token unspent, so the real worker still
joins; a machine whose instance id is not recorded yet is answered ABORTED
(retried by the worker); the session credential re-registers without it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from levers9.__about__ import __version__
from levers9.hooks.types import MachineIdentity
from levers9.proto.v1 import worker_pb2, worker_pb2_grpc
from levers9.services.core import Services
from levers9_ec2.identity import fetch_identity
from tests.controlplane.conftest import worker_service
from tests.fakes import CloudInstance
from tests.fakes.imds import FakeImds
from tests.fixtures.services import opened_services

CONFIG = """\
version: 1
data_dir: {{data_dir}}
state:
  database_url: {{database_url}}
pools:
  h100:
    provider: ec2
    runtime: process
    workspace: default
    region: us-east-1
    gpu: H100
    gpu_count: 8
    max_workers: 2
    settings:
      ami: ami-0123456789abcdef0
      identity_certificate_file: {certificate}
"""


def instance(instance_id: str) -> CloudInstance:
    return CloudInstance(
        id=instance_id,
        state="running",
        running=True,
        gone=False,
        instance_type="p5.48xlarge",
        region="us-east-1",
        zone="us-east-1a",
    )


@dataclass
class Ec2Cp:
    services: Services
    stub: worker_pb2_grpc.WorkerStub
    imds: FakeImds

    async def machine(self, provider_id: str | None) -> tuple[str, str]:
        """A machine record of the ec2 pool (with its instance id when given) and its join token."""
        machines, tokens = self.services.machines, self.services.tokens
        record = await machines.create("h100", "ec2", register_by=datetime.now(UTC) + timedelta(minutes=10))
        token_record, token = await tokens.issue("machine", subject=record.id)
        await machines.set_token(record.id, token_record.id)
        if provider_id is not None:
            await machines.set_placement(record.id, provider_id=provider_id, region="us-east-1", zone="us-east-1a")
        return record.id, token

    def identity(self, instance_id: str) -> MachineIdentity:
        return fetch_identity(self.imds.endpoint(instance(instance_id)), budget_s=5)

    async def register(
        self, token: str, machine_id: str, identity: MachineIdentity | None = None, worker_id: str = ""
    ) -> worker_pb2.RegisterResponse:
        shown = (
            worker_pb2.MachineIdentity(document=identity.document, signature=identity.signature)
            if identity is not None
            else None
        )
        request = worker_pb2.RegisterRequest(
            pool="h100",
            machine_id=machine_id,
            hostname="ip-10-0-0-10",
            version=__version__,
            worker_id=worker_id,
            identity=shown,
        )
        response: worker_pb2.RegisterResponse = await self.stub.Register(
            request, metadata=(("authorization", f"Bearer {token}"),), timeout=30
        )
        return response


@pytest.fixture
async def ec2_cp(tmp_path: Path, database_url: str) -> AsyncIterator[Ec2Cp]:
    imds = FakeImds(tmp_path)
    try:
        config = CONFIG.format(certificate=imds.certificate_file)
        async with (
            opened_services(tmp_path, config, database_url) as services,
            worker_service(services, "identity-test") as (stub, _),
        ):
            yield Ec2Cp(services, stub, imds)
    finally:
        imds.close()


async def refused(call: object, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


async def test_a_stolen_join_token_is_refused_without_being_spent(ec2_cp: Ec2Cp) -> None:
    machine_id, join = await ec2_cp.machine("i-0abc1234def567890")

    # the token read from the user data, shown from elsewhere: no identity, or another instance's genuine one
    said = await refused(ec2_cp.register(join, machine_id))
    assert "did not prove it runs on that machine" in said
    assert "showed no instance identity document" in said
    assert "not spent" in said
    said = await refused(ec2_cp.register(join, machine_id, ec2_cp.identity("i-0fff1234def567890")))
    assert "names EC2 instance 'i-0fff1234def567890', not 'i-0abc1234def567890'" in said
    machine = await ec2_cp.services.machines.get(machine_id)
    assert machine is not None
    assert machine.worker_id is None, "nobody joined"

    # the real worker, with its instance's document, still joins with the same token
    joined = await ec2_cp.register(join, machine_id, ec2_cp.identity("i-0abc1234def567890"))
    assert joined.session_token
    machine = await ec2_cp.services.machines.get(machine_id)
    assert machine is not None
    assert machine.worker_id == joined.worker_id

    # once spent, even the right identity cannot use the join token again; the session credential needs none
    await refused(ec2_cp.register(join, machine_id, ec2_cp.identity("i-0abc1234def567890")))
    again = await ec2_cp.register(joined.session_token, machine_id, worker_id=joined.worker_id)
    assert again.worker_id == joined.worker_id


async def test_a_machine_whose_instance_id_is_not_recorded_yet_is_asked_to_register_again(ec2_cp: Ec2Cp) -> None:
    machine_id, join = await ec2_cp.machine(None)
    said = await refused(
        ec2_cp.register(join, machine_id, ec2_cp.identity("i-0abc1234def567890")), grpc.StatusCode.ABORTED
    )
    assert "no provider id recorded yet" in said
    await ec2_cp.services.machines.set_placement(machine_id, provider_id="i-0abc1234def567890", region="us-east-1")
    joined = await ec2_cp.register(join, machine_id, ec2_cp.identity("i-0abc1234def567890"))
    assert joined.session_token


async def test_a_malformed_identity_is_refused_naming_the_field(ec2_cp: Ec2Cp) -> None:
    machine_id, join = await ec2_cp.machine("i-0abc1234def567890")
    huge = worker_pb2.RegisterRequest(
        pool="h100",
        machine_id=machine_id,
        version=__version__,
        identity=worker_pb2.MachineIdentity(document="x" * 20000, signature="c2ln"),
    )
    said = await refused(
        ec2_cp.stub.Register(huge, metadata=(("authorization", f"Bearer {join}"),), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "RegisterRequest.identity" in said
