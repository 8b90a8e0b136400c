"""Kubernetes clusters attached by a workspace.

A cluster's settings carry its kubeconfig, which is a credential, so they are
stored sealed with the :class:`~levers9.state.crypto.SecretBox` and only come
back decrypted through :meth:`ClusterStore.settings`: listing clusters never
decrypts anything.
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from levers9.state.crypto import SecretBox
from levers9.state.errors import AlreadyExists
from levers9.state.sql._common import check_name, require
from levers9.state.sql.database import Database
from levers9.state.sql.models import Cluster, Workspace, new_id, utcnow
from levers9.state.sql.records import ClusterRecord


def _context(cluster_id: str) -> str:
    return f"cluster:{cluster_id}"


def _cluster(row: Cluster) -> ClusterRecord:
    return ClusterRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        name=row.name,
        kind=row.kind,
        pool=row.pool,
        has_settings=row.settings_ciphertext is not None,
        created_at=row.created_at,
    )


class ClusterStore:
    def __init__(self, db: Database, box: SecretBox) -> None:
        self._db = db
        self._box = box

    def _seal(self, cluster_id: str, settings: dict[str, Any] | None) -> bytes | None:
        if settings is None:
            return None
        try:
            text = json.dumps(settings, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cluster settings must be JSON (dicts, lists, strings, numbers): {exc}") from None
        return self._box.seal(text, context=_context(cluster_id))

    async def create(
        self, workspace_id: str, name: str, kind: str, pool: str, settings: dict[str, Any] | None = None
    ) -> ClusterRecord:
        """Attach a cluster serving ``pool``; ``settings`` (kubeconfig and the like) are stored encrypted."""
        check_name(name, "cluster name", 128)
        cluster_id = new_id("clu")
        ciphertext = self._seal(cluster_id, settings)
        try:
            async with self._db.transaction() as session:
                await require(session, Workspace, workspace_id, "workspace")
                row = Cluster(
                    id=cluster_id,
                    workspace_id=workspace_id,
                    name=name,
                    kind=kind,
                    pool=pool,
                    settings_ciphertext=ciphertext,
                    created_at=utcnow(),
                )
                session.add(row)
                await session.flush()
                return _cluster(row)
        except IntegrityError:
            raise AlreadyExists(f"this workspace already has a cluster named {name!r}") from None

    async def get(self, cluster_id: str) -> ClusterRecord | None:
        async with self._db.transaction() as session:
            row = await session.get(Cluster, cluster_id)
            return None if row is None else _cluster(row)

    async def by_name(self, workspace_id: str, name: str) -> ClusterRecord | None:
        async with self._db.transaction() as session:
            row = await session.scalar(
                select(Cluster).where(Cluster.workspace_id == workspace_id, Cluster.name == name)
            )
            return None if row is None else _cluster(row)

    async def settings(self, cluster_id: str) -> dict[str, Any] | None:
        """The cluster's decrypted settings; None when it has none. Ask only where they are used."""
        async with self._db.transaction() as session:
            row = await require(session, Cluster, cluster_id, "cluster")
            ciphertext = row.settings_ciphertext
        if ciphertext is None:
            return None
        settings: dict[str, Any] = json.loads(self._box.unseal(ciphertext, context=_context(cluster_id)))
        return settings

    async def set_settings(self, cluster_id: str, settings: dict[str, Any] | None) -> ClusterRecord:
        ciphertext = self._seal(cluster_id, settings)
        async with self._db.transaction() as session:
            row = await require(session, Cluster, cluster_id, "cluster", lock=True)
            row.settings_ciphertext = ciphertext
            return _cluster(row)

    async def delete(self, cluster_id: str) -> bool:
        async with self._db.transaction() as session:
            result = await session.execute(delete(Cluster).where(Cluster.id == cluster_id))
            deleted: int = result.rowcount  # type: ignore[attr-defined]
            return deleted > 0

    async def reencrypt(self) -> int:
        """Re-encrypt every cluster's settings with the first key, after a key rotation; returns how many."""
        count = 0
        async with self._db.transaction() as session:
            for row in await session.scalars(select(Cluster).where(Cluster.settings_ciphertext.is_not(None))):
                assert row.settings_ciphertext is not None
                row.settings_ciphertext = self._box.rotate(row.settings_ciphertext)
                count += 1
        return count

    async def list(self, workspace_id: str) -> builtins.list[ClusterRecord]:
        """The workspace's clusters by name; settings stay encrypted."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Cluster).where(Cluster.workspace_id == workspace_id).order_by(Cluster.name)
            )
            return [_cluster(row) for row in rows]

    async def list_kind(self, kind: str) -> builtins.list[tuple[ClusterRecord, dict[str, Any] | None]]:
        """Every workspace's clusters of ``kind`` with their decrypted settings (what each replica's pools are
        made of), by workspace and name."""
        async with self._db.transaction() as session:
            rows = list(
                await session.scalars(
                    select(Cluster).where(Cluster.kind == kind).order_by(Cluster.workspace_id, Cluster.name)
                )
            )
        found = []
        for row in rows:
            settings = None
            if row.settings_ciphertext is not None:
                settings = json.loads(self._box.unseal(row.settings_ciphertext, context=_context(row.id)))
            found.append((_cluster(row), settings))
        return found


__all__ = ["ClusterStore"]
