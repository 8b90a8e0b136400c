"""The generated gRPC code is committed; it must be exactly what proto/ generates today."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "core" / "levers9" / "proto" / "v1"


def test_generated_code_matches_the_proto_files(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "protos"), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"scripts/protos failed (is grpcio-tools installed? run scripts/setup):\n{done.stderr}"
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "levers9" / "proto" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in GENERATED.iterdir() if p.name != "__init__.py" and p.is_file()}
    assert sorted(fresh) == sorted(committed), "generated files differ in name: run scripts/protos and commit"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"{', '.join(stale)} are stale: run scripts/protos and commit the result"


def test_every_service_method_has_a_servicer_implementation() -> None:
    from levers9.controlplane.grpc_api import ControlPlaneService
    from levers9.controlplane.grpc_worker import WorkerService
    from levers9.proto.v1 import controlplane_pb2, worker_pb2

    for descriptor, servicer in (
        (controlplane_pb2.DESCRIPTOR.services_by_name["ControlPlane"], ControlPlaneService),
        (worker_pb2.DESCRIPTOR.services_by_name["Worker"], WorkerService),
    ):
        for method in descriptor.methods:
            implemented = servicer.__dict__.get(method.name)
            assert implemented is not None, f"{descriptor.name}.{method.name} is not implemented"
