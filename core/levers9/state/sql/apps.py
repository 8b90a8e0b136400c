"""Apps, stubs (a function's image, resource and GPU configuration) and deployments with numbered versions.

A stub is stored once per distinct configuration: deploying the same code
twice reuses the stub, so tasks and checkpoints that point at it stay valid,
while a changed GPU preference or image makes a new stub.
"""

from __future__ import annotations

import builtins
import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from levers9.state.errors import Conflict, NotFound
from levers9.state.sql._common import check_name, require, retry_on_race
from levers9.state.sql.database import Database
from levers9.state.sql.models import App, Deployment, DeploymentVersion, Stub, Workspace, new_id, utcnow
from levers9.state.sql.records import AppRecord, DeploymentRecord, DeploymentVersionRecord, StubRecord


def config_hash(name: str, kind: str, config: dict[str, Any]) -> str:
    """A stable hash of a stub: the same name, kind and config always give the same hash.

    The name and kind are part of it, not only the config: two functions of one
    app with identical resources are still two stubs.
    """
    try:
        text = json.dumps({"name": name, "kind": kind, "config": config}, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"stub config for {name!r} must be JSON (dicts, lists, strings, numbers): {exc}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _app(row: App) -> AppRecord:
    return AppRecord(id=row.id, workspace_id=row.workspace_id, name=row.name, created_at=row.created_at)


def _stub(row: Stub) -> StubRecord:
    return StubRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        app_id=row.app_id,
        name=row.name,
        kind=row.kind,
        config=dict(row.config),
        config_hash=row.config_hash,
        created_at=row.created_at,
    )


def _deployment(row: Deployment) -> DeploymentRecord:
    return DeploymentRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        app_id=row.app_id,
        name=row.name,
        active_version=row.active_version,
        created_at=row.created_at,
    )


def _version(row: DeploymentVersion) -> DeploymentVersionRecord:
    return DeploymentVersionRecord(
        id=row.id,
        deployment_id=row.deployment_id,
        version=row.version,
        stub_id=row.stub_id,
        created_at=row.created_at,
        stopped_at=row.stopped_at,
    )


class AppStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_or_create(self, workspace_id: str, name: str) -> AppRecord:
        check_name(name, "app name", 128)

        async def attempt() -> AppRecord:
            async with self._db.transaction() as session:
                row = await session.scalar(select(App).where(App.workspace_id == workspace_id, App.name == name))
                if row is None:
                    await require(session, Workspace, workspace_id, "workspace")
                    row = App(id=new_id("app"), workspace_id=workspace_id, name=name, created_at=utcnow())
                    session.add(row)
                    await session.flush()
                return _app(row)

        return await retry_on_race(attempt)

    async def get(self, app_id: str) -> AppRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(App, app_id)
            return None if row is None else _app(row)


class StubStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_or_create(
        self, workspace_id: str, app_id: str, name: str, kind: str, config: dict[str, Any]
    ) -> StubRecord:
        """The stub for exactly this name, kind and config in the app, made if it is new."""
        check_name(name, "stub name", 128)
        check_name(kind, "stub kind", 32)
        digest = config_hash(name, kind, config)

        async def attempt() -> StubRecord:
            async with self._db.transaction() as session:
                row = await session.scalar(select(Stub).where(Stub.app_id == app_id, Stub.config_hash == digest))
                if row is None:
                    app = await require(session, App, app_id, "app")
                    if app.workspace_id != workspace_id:
                        raise NotFound("app", app_id)  # another workspace's app is not there for this one
                    row = Stub(
                        id=new_id("stub"),
                        workspace_id=workspace_id,
                        app_id=app_id,
                        name=name,
                        kind=kind,
                        config=config,
                        config_hash=digest,
                        created_at=utcnow(),
                    )
                    session.add(row)
                    await session.flush()
                elif row.workspace_id != workspace_id:
                    raise NotFound("app", app_id)
                return _stub(row)

        return await retry_on_race(attempt)

    async def get(self, stub_id: str) -> StubRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Stub, stub_id)
            return None if row is None else _stub(row)


class DeploymentStore:
    """Named deployments of an app; each deploy adds a version, and one version is active."""

    def __init__(self, db: Database) -> None:
        self._db = db
        #: told ``(workspace id, name, stub id)`` after a version is stopped here: the gateway stops serving it
        self.on_stopped: builtins.list[Callable[[str, str, str], None]] = []

    async def create_version(self, workspace_id: str, app_id: str, name: str, stub_id: str) -> int:
        """Add a version running ``stub_id`` to deployment ``name`` (made on first use); returns its number.

        Numbers are 1, 2, 3... per deployment. Two deploys at once cannot get
        the same number: the unique (deployment, version) constraint rejects the
        loser, which then retries with the next number.
        """
        check_name(name, "deployment name", 128)

        async def attempt() -> int:
            now = utcnow()
            async with self._db.transaction() as session:
                deployment = await session.scalar(
                    select(Deployment)
                    .where(Deployment.workspace_id == workspace_id, Deployment.name == name)
                    .with_for_update()
                )
                stub = await require(session, Stub, stub_id, "stub")
                if stub.workspace_id != workspace_id or stub.app_id != app_id:
                    raise Conflict(f"stub {stub_id!r} belongs to app {stub.app_id!r}, not to app {app_id!r}")
                if deployment is None:
                    deployment = Deployment(
                        id=new_id("dep"),
                        workspace_id=workspace_id,
                        app_id=app_id,
                        name=name,
                        active_version=None,
                        created_at=now,
                    )
                    session.add(deployment)
                    await session.flush()
                elif deployment.app_id != app_id:
                    raise Conflict(
                        f"deployment {name!r} belongs to app {deployment.app_id!r}; choose another name for "
                        f"app {app_id!r}"
                    )
                latest = await session.scalar(
                    select(func.max(DeploymentVersion.version)).where(DeploymentVersion.deployment_id == deployment.id)
                )
                version = (latest or 0) + 1
                session.add(
                    DeploymentVersion(
                        id=new_id("depv"),
                        deployment_id=deployment.id,
                        version=version,
                        stub_id=stub_id,
                        created_at=now,
                        stopped_at=None,
                    )
                )
                await session.flush()
                return version

        return await retry_on_race(attempt)

    async def activate(self, deployment_id: str, version: int) -> DeploymentRecord:
        """Make ``version`` the one that serves the deployment (a deploy, or a rollback)."""
        async with self._db.transaction() as session:
            deployment = await require(session, Deployment, deployment_id, "deployment", lock=True)
            exists = await session.scalar(
                select(DeploymentVersion.id).where(
                    DeploymentVersion.deployment_id == deployment_id, DeploymentVersion.version == version
                )
            )
            if exists is None:
                raise NotFound("deployment version", f"{deployment.name} v{version}")
            deployment.active_version = version
            return _deployment(deployment)

    async def get(self, workspace_id: str, name: str) -> DeploymentRecord | None:
        async with self._db.transaction() as session:
            row = await session.scalar(
                select(Deployment).where(Deployment.workspace_id == workspace_id, Deployment.name == name)
            )
            return None if row is None else _deployment(row)

    async def by_id(self, deployment_id: str) -> DeploymentRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Deployment, deployment_id)
            return None if row is None else _deployment(row)

    async def versions(self, deployment_id: str) -> list[DeploymentVersionRecord]:
        """Every version of the deployment, oldest first."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(DeploymentVersion)
                .where(DeploymentVersion.deployment_id == deployment_id)
                .order_by(DeploymentVersion.version)
            )
            return [_version(row) for row in rows]

    async def for_workspace(
        self, workspace_id: str
    ) -> builtins.list[tuple[DeploymentRecord, builtins.list[DeploymentVersionRecord]]]:
        """A workspace's deployments by name, each with its versions, oldest first."""
        async with self._db.transaction() as session:
            deployments = list(
                await session.scalars(
                    select(Deployment).where(Deployment.workspace_id == workspace_id).order_by(Deployment.name)
                )
            )
            versions = await session.scalars(
                select(DeploymentVersion)
                .where(DeploymentVersion.deployment_id.in_([d.id for d in deployments]))
                .order_by(DeploymentVersion.version)
            )
            by_deployment: dict[str, builtins.list[DeploymentVersionRecord]] = {}
            for row in versions:
                by_deployment.setdefault(row.deployment_id, []).append(_version(row))
            return [(_deployment(d), by_deployment.get(d.id, [])) for d in deployments]

    async def serving(self, workspace_id: str, name: str, version: int | None = None) -> DeploymentVersionRecord:
        """The version of deployment ``name`` that answers: ``version``, or the newest still serving.

        NotFound (never "forbidden") for another workspace's deployment, a version that does not
        exist or no longer serves, so a caller learns nothing about what it may not see.
        """
        async with self._db.transaction() as session:
            deployment = await session.scalar(
                select(Deployment).where(Deployment.workspace_id == workspace_id, Deployment.name == name)
            )
            if deployment is None:
                raise NotFound("deployment", name)
            query = select(DeploymentVersion).where(
                DeploymentVersion.deployment_id == deployment.id, DeploymentVersion.stopped_at.is_(None)
            )
            if version is not None:
                query = query.where(DeploymentVersion.version == version)
            row = await session.scalar(query.order_by(DeploymentVersion.version.desc()).limit(1))
            if row is None:
                raise NotFound(
                    "deployment version", f"{name} v{version}" if version is not None else f"{name} (all stopped)"
                )
            return _version(row)

    async def serving_stubs(self) -> builtins.list[tuple[str, str]]:
        """``(workspace id, stub id)`` of every version still serving, in every workspace: what the gateway keeps up."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(Deployment.workspace_id, DeploymentVersion.stub_id)
                .join(DeploymentVersion, DeploymentVersion.deployment_id == Deployment.id)
                .where(DeploymentVersion.stopped_at.is_(None))
            )
            return [(str(w), str(s)) for w, s in rows]

    async def stop(self, workspace_id: str, name: str, version: int) -> DeploymentVersionRecord:
        """Stop one version (again is harmless); the deployment's active version moves to the newest still serving."""
        async with self._db.transaction() as session:
            deployment = await session.scalar(
                select(Deployment)
                .where(Deployment.workspace_id == workspace_id, Deployment.name == name)
                .with_for_update()
            )
            if deployment is None:
                raise NotFound("deployment", name)
            row = await session.scalar(
                select(DeploymentVersion).where(
                    DeploymentVersion.deployment_id == deployment.id, DeploymentVersion.version == version
                )
            )
            if row is None:
                raise NotFound("deployment version", f"{name} v{version}")
            if row.stopped_at is None:
                row.stopped_at = utcnow()
            await session.flush()
            newest = await session.scalar(
                select(func.max(DeploymentVersion.version)).where(
                    DeploymentVersion.deployment_id == deployment.id, DeploymentVersion.stopped_at.is_(None)
                )
            )
            deployment.active_version = newest
            stopped = _version(row)
        for listener in self.on_stopped:
            listener(workspace_id, name, stopped.stub_id)
        return stopped


__all__ = ["AppStore", "DeploymentStore", "StubStore", "config_hash"]
