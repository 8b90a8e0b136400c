"""What each workspace built from blueprints: its steps by content key, and its images.

A build looks up the keys of a blueprint's steps here (:meth:`BlueprintStore.steps`) and skips those
found; when it ends, every step it ran and the image are recorded in one transaction
(:meth:`BlueprintStore.record`), so a failed build records nothing.

Invariants: every read and write names the workspace, and no query crosses workspaces: a step another
workspace built with the same key is never returned (a key says what was asked for, not who may have it).
Recording a key that is already there keeps the first record (two builds of one blueprint racing make the
same layers; the first one stored wins and the second is not an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from levers9.state.sql.database import Database
from levers9.state.sql.models import BlueprintImage, BlueprintStep, utcnow
from levers9.state.sql.records import BlueprintImageRecord, BlueprintStepRecord

__all__ = ["BlueprintStore", "NewStep"]


@dataclass(frozen=True, slots=True)
class NewStep:
    """A step a build ran, to record: its key, and its layer's digests (None for a config-only step)."""

    key: str
    op: str
    diff_id: str | None = None
    blob_digest: str | None = None
    size_bytes: int | None = None


def _step(row: BlueprintStep) -> BlueprintStepRecord:
    return BlueprintStepRecord(
        workspace_id=row.workspace_id,
        key=row.key,
        op=row.op,
        diff_id=row.diff_id,
        blob_digest=row.blob_digest,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
    )


def _image(row: BlueprintImage) -> BlueprintImageRecord:
    return BlueprintImageRecord(
        workspace_id=row.workspace_id,
        key=row.key,
        repository=row.repository,
        manifest_digest=row.manifest_digest,
        size_bytes=row.size_bytes,
        steps=row.steps,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
    )


class BlueprintStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def steps(self, workspace_id: str, keys: Sequence[str]) -> dict[str, BlueprintStepRecord]:
        """The steps of ``keys`` this workspace built, by key; keys it did not build are absent."""
        if not keys:
            return {}
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(BlueprintStep).where(
                    BlueprintStep.workspace_id == workspace_id, BlueprintStep.key.in_(list(dict.fromkeys(keys)))
                )
            )
            return {row.key: _step(row) for row in rows}

    async def image(self, workspace_id: str, key: str, *, touch: bool = False) -> BlueprintImageRecord | None:
        """The workspace's image whose last step has ``key``; ``touch`` marks it used now."""
        async with self._db.transaction() as session:
            row = await session.get(BlueprintImage, (workspace_id, key), with_for_update=touch)
            if row is None:
                return None
            if touch:
                row.last_used_at = utcnow()
            return _image(row)

    async def image_by_digest(self, workspace_id: str, manifest_digest: str) -> BlueprintImageRecord | None:
        """The workspace's image with this manifest digest (``sha256:<hex>``), if it built one."""
        async with self._db.transaction() as session:
            row = await session.scalar(
                select(BlueprintImage)
                .where(BlueprintImage.workspace_id == workspace_id, BlueprintImage.manifest_digest == manifest_digest)
                .limit(1)
            )
            return None if row is None else _image(row)

    async def images(self, workspace_id: str) -> list[BlueprintImageRecord]:
        """The workspace's images, the most recently used first."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(BlueprintImage)
                .where(BlueprintImage.workspace_id == workspace_id)
                .order_by(BlueprintImage.last_used_at.desc(), BlueprintImage.key)
            )
            return [_image(row) for row in rows]

    async def record(
        self,
        workspace_id: str,
        steps: Sequence[NewStep],
        *,
        key: str,
        repository: str,
        manifest_digest: str,
        size_bytes: int,
        step_count: int,
    ) -> BlueprintImageRecord:
        """Record a finished build: the steps it ran (those already known are kept as they are) and its image."""
        now = utcnow()
        async with self._db.transaction() as session:
            wanted = {s.key: s for s in steps}
            known = (
                set(
                    await session.scalars(
                        select(BlueprintStep.key).where(
                            BlueprintStep.workspace_id == workspace_id, BlueprintStep.key.in_(list(wanted))
                        )
                    )
                )
                if wanted
                else set()
            )
            for step in wanted.values():
                if step.key in known:
                    continue
                session.add(
                    BlueprintStep(
                        workspace_id=workspace_id,
                        key=step.key,
                        op=step.op,
                        diff_id=step.diff_id,
                        blob_digest=step.blob_digest,
                        size_bytes=step.size_bytes,
                        created_at=now,
                    )
                )
            row = await session.get(BlueprintImage, (workspace_id, key), with_for_update=True)
            if row is None:
                row = BlueprintImage(
                    workspace_id=workspace_id,
                    key=key,
                    repository=repository,
                    manifest_digest=manifest_digest,
                    size_bytes=size_bytes,
                    steps=step_count,
                    created_at=now,
                    last_used_at=now,
                )
                session.add(row)
            else:
                row.last_used_at = now
            await session.flush()
            return _image(row)
