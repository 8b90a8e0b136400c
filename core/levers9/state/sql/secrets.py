"""Workspace secrets, encrypted at rest.

Values are sealed with the :class:`~levers9.state.crypto.SecretBox` bound to
their workspace and name, so the database never holds a plaintext value and a
row copied into another workspace is refused rather than decrypted there.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from levers9.state.crypto import SecretBox
from levers9.state.errors import NotFound
from levers9.state.sql._common import check_name, retry_on_race
from levers9.state.sql.database import Database
from levers9.state.sql.models import Secret, Workspace, new_id, utcnow


def _context(workspace_id: str, name: str) -> str:
    return f"secret:{workspace_id}/{name}"


class SecretStore:
    """Named secret values per workspace; a workspace only ever sees its own."""

    def __init__(self, db: Database, box: SecretBox) -> None:
        self._db = db
        self._box = box

    async def put(self, workspace_id: str, name: str, value: str) -> None:
        """Set the secret ``name``, replacing any earlier value."""
        check_name(name, "secret name", 255)
        ciphertext = self._box.seal(value, context=_context(workspace_id, name))

        async def attempt() -> None:
            now = utcnow()
            async with self._db.transaction() as session:
                row = await session.scalar(
                    select(Secret).where(Secret.workspace_id == workspace_id, Secret.name == name).with_for_update()
                )
                if row is not None:
                    row.ciphertext = ciphertext
                    row.updated_at = now
                    return
                if await session.get(Workspace, workspace_id) is None:
                    raise NotFound("workspace", workspace_id)
                session.add(
                    Secret(
                        id=new_id("sec"),
                        workspace_id=workspace_id,
                        name=name,
                        ciphertext=ciphertext,
                        created_at=now,
                        updated_at=now,
                    )
                )
                await session.flush()

        await retry_on_race(attempt)

    async def get(self, workspace_id: str, name: str) -> str | None:
        """The value, or None when this workspace has no such secret (whatever other workspaces have)."""
        async with self._db.transaction() as session:
            ciphertext = await session.scalar(
                select(Secret.ciphertext).where(Secret.workspace_id == workspace_id, Secret.name == name)
            )
        if ciphertext is None:
            return None
        return self._box.unseal(ciphertext, context=_context(workspace_id, name))

    async def names(self, workspace_id: str) -> list[str]:
        """The workspace's secret names, sorted; values are only read one at a time, on purpose."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Secret.name).where(Secret.workspace_id == workspace_id).order_by(Secret.name)
            )
            return list(rows)

    async def delete(self, workspace_id: str, name: str) -> bool:
        """Remove the secret; False if there was none."""
        async with self._db.transaction() as session:
            result = await session.execute(
                delete(Secret).where(Secret.workspace_id == workspace_id, Secret.name == name)
            )
            deleted: int = result.rowcount  # type: ignore[attr-defined]
            return deleted > 0

    async def reencrypt(self) -> int:
        """Re-encrypt every secret with the first key, after a key rotation; returns how many.

        Once this has run, older keys can be removed from the key list.
        """
        count = 0
        async with self._db.transaction() as session:
            rows = await session.scalars(select(Secret).with_for_update())
            for row in rows:
                row.ciphertext = self._box.rotate(row.ciphertext)
                row.updated_at = utcnow()
                count += 1
        return count


__all__ = ["SecretStore"]
