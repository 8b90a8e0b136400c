"""``levers9 deploy``, ``deployments`` and ``stop``: versions of an app's functions, endpoints and queues.

Each deploy adds a version to every deployment the app declares; older versions
keep serving until stopped, so a new version can be tried beside the old one and
the old one stopped when it is no longer called.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from levers9.cli.client_cmds import UNARY_TIMEOUT_S, Metadata, call, context_option, resolve_context, when
from levers9.cli.output import Col, err, iso, out, print_json, print_table
from levers9.cli.run_cmd import fail

if TYPE_CHECKING:
    from levers9.proto.v1 import controlplane_pb2 as pb
    from levers9.proto.v1.controlplane_pb2_grpc import ControlPlaneStub


def deploy(
    file: Path = typer.Argument(
        ..., help="The app file; every levers9 function, endpoint and queue in it is deployed."
    ),
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per deployment."),
) -> None:
    """Deploy an app: a new version of each of its functions, endpoints and queues."""
    import os

    from levers9.cli.run_cmd import import_file
    from levers9.sdk.context import ENV_CONTEXT

    if not file.is_file():
        fail(f"no such file: {file}")
    if context is not None:
        os.environ[ENV_CONTEXT] = resolve_context(context).name
    try:
        module = import_file(file)
    except typer.Exit:
        raise
    except Exception as exc:
        fail(f"{file} could not be imported: {type(exc).__name__}: {exc}")
    from levers9.sdk.functions import Function

    found = list({id(v): v for v in vars(module).values() if isinstance(v, Function)}.values())
    if not found:
        fail(f"{file} declares nothing to deploy: no @levers9.endpoint, queue, job, box or function")
    deployed = [_deploy_one(fn) for fn in found]
    if as_json:
        print_json(deployed)
        return
    for d in deployed:
        out.print(f"deployed {d['name']} v{d['version']} ({d['kind']})", markup=False)


def _deploy_one(fn: Any) -> dict[str, Any]:
    import grpc.aio

    from levers9.proto.v1 import controlplane_pb2 as pb
    from levers9.sdk.client import client_for, translate
    from levers9.sdk.context import ContextError
    from levers9.sdk.errors import ControlPlaneError

    try:
        client = client_for(None)
    except ContextError as exc:
        fail(str(exc))

    async def run() -> pb.DeployResponse:
        stub_id = await fn._stub_id(client)
        try:
            response: pb.DeployResponse = await client.stub.Deploy(
                pb.DeployRequest(stub_id=stub_id, name=fn.config["name"]),
                metadata=client.metadata,
                timeout=UNARY_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, client.ctx) from None
        return response

    try:
        response = client.run(run())
    except ControlPlaneError as exc:
        fail(f"deploying {fn.config['name']}: {exc}")
    return {
        "name": fn.config["name"],
        "kind": fn.config["kind"],
        "version": response.version,
        "deployment_id": response.deployment_id,
    }


def deployments(
    context: str | None = context_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per deployment, with its versions."),
) -> None:
    """List the workspace's deployments and their versions (serving or stopped)."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> list[pb.DeploymentInfo]:
        response: pb.ListDeploymentsResponse = await stub.ListDeployments(
            pb.ListDeploymentsRequest(), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return list(response.deployments)

    found = call(context, action)
    if as_json:
        print_json([_deployment(d) for d in found])
        return
    if not found:
        err.print("no deployments", markup=False)
        return
    now = time.time()
    rows = []
    for d in found:
        for v in d.versions:
            state = "serving" if not v.stopped_at else "stopped"
            if v.version == d.active_version:
                state += " (default)"
            rows.append([d.name, d.kind, f"v{v.version}", state, when(v.created_at, now)])
    print_table([Col(c) for c in ("name", "kind", "version", "state", "deployed")], rows)


def stop(
    name: str = typer.Argument(..., help="The deployment."),
    version: int = typer.Option(..., "--version", "-v", min=1, help="The version to stop; the others keep serving."),
    context: str | None = context_option(),
) -> None:
    """Stop one version of a deployment."""
    from levers9.proto.v1 import controlplane_pb2 as pb

    async def action(stub: ControlPlaneStub, metadata: Metadata) -> pb.DeploymentVersion:
        stopped: pb.DeploymentVersion = await stub.StopDeployment(
            pb.StopDeploymentRequest(name=name, version=version), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        return stopped

    call(context, action)
    out.print(f"stopped {name} v{version}", markup=False)


def _deployment(d: pb.DeploymentInfo) -> dict[str, Any]:
    return {
        "id": d.id,
        "name": d.name,
        "kind": d.kind,
        "active_version": d.active_version or None,
        "versions": [
            {
                "version": v.version,
                "stub_id": v.stub_id,
                "created_at": iso(v.created_at),
                "stopped_at": iso(v.stopped_at),
                "serving": not v.stopped_at,
            }
            for v in d.versions
        ],
    }
