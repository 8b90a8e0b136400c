"""Deployments: deploying a stub as a named version, listing them, stopping one, and which stub answers a name.

A deployment is a name in a workspace with numbered versions; each version
serves one stub until it is stopped. The version that answers when none is
named is the newest still serving. Another workspace's deployment is
NotFound, like one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers9.services.access import own_workspace
from levers9.services.auth import Principal
from levers9.services.dataplane import DataPlane
from levers9.state.errors import NotFound
from levers9.state.sql.records import DeploymentRecord, DeploymentVersionRecord

__all__ = [
    "MAX_VERSION",
    "Deployed",
    "DeploymentView",
    "deploy",
    "list_deployments",
    "serving_stub",
    "serving_stubs",
    "stop_version",
]

#: deployment versions are 32-bit everywhere (the database column, the gRPC field, a gateway URL)
MAX_VERSION = 2**31 - 1


@dataclass(frozen=True)
class DeploymentView:
    deployment: DeploymentRecord
    #: oldest first
    versions: list[DeploymentVersionRecord]
    #: the kind of stub its newest version serves ("" when it has no versions)
    kind: str


@dataclass(frozen=True)
class Deployed:
    deployment_id: str
    version: int


async def deploy(dp: DataPlane, principal: Principal, stub_id: str, name: str = "") -> Deployed:
    """Make ``stub_id`` the newest version of deployment ``name`` (omitted: the stub's name), serving at once."""
    workspace = principal.require_workspace()
    record, _ = await dp.stub(stub_id, workspace)
    store = dp.services.deployments
    name = name or record.name
    version = await store.create_version(workspace, record.app_id, name, record.id)
    deployment = await store.get(workspace, name)
    if deployment is None:
        raise NotFound("deployment", name)
    await store.activate(deployment.id, version)
    return Deployed(deployment.id, version)


async def list_deployments(dp: DataPlane, principal: Principal) -> list[DeploymentView]:
    """The caller's workspace's deployments by name, each with its versions."""
    workspace = own_workspace(principal, "list deployments")
    out = []
    for deployment, versions in await dp.services.deployments.for_workspace(workspace):
        kind = ""
        if versions:
            record, _ = await dp.stub(versions[-1].stub_id, workspace)
            kind = record.kind
        out.append(DeploymentView(deployment, versions, kind))
    return out


async def stop_version(dp: DataPlane, principal: Principal, name: str, version: int) -> DeploymentVersionRecord:
    """Stop one version; the others keep serving. Stopping a stopped version again is not an error."""
    workspace = own_workspace(principal, "stop deployments")
    if not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version: a version number (1, 2, ... {MAX_VERSION}) is needed, got {version}")
    return await dp.services.deployments.stop(workspace, name, version)


async def serving_stub(dp: DataPlane, workspace_id: str, name: str, version: int | None) -> str | None:
    """The stub that answers deployment ``name`` (``version``, or the newest serving); None when none does."""
    try:
        found = await dp.services.deployments.serving(workspace_id, name, version)
    except NotFound:
        return None
    return found.stub_id


async def serving_stubs(dp: DataPlane) -> list[tuple[str, str]]:
    """``(workspace id, stub id)`` of every version still serving, in every workspace."""
    return await dp.services.deployments.serving_stubs()
