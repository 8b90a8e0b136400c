"""Workspace secrets, encrypted at rest.

Values are sealed with the :class:`~levers9.state.crypto.SecretBox` bound to
their workspace and name, so the database never holds a plaintext value and a
row copied into another workspace is refused rather than decrypted there.

A secret reaches a function as an environment variable of the same name, so a
name must be one (:func:`check_secret_name`) and a value must be something an
environment can hold (:func:`check_secret_value`). Listings carry names and
times only: a value is read one at a time, by the worker that needs it.
"""

from __future__ import annotations

import builtins
import re

from sqlalchemy import delete, select

from levers9.state.crypto import SecretBox
from levers9.state.errors import NotFound
from levers9.state.sql._common import retry_on_race
from levers9.state.sql.database import Database
from levers9.state.sql.models import Secret, Workspace, new_id, utcnow
from levers9.state.sql.records import SecretInfo

#: the longest name and value accepted; a value is an environment variable's, so it is kept small
MAX_NAME = 255
MAX_VALUE_BYTES = 64 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_secret_name(name: str) -> str:
    """``name`` when it can be an environment variable's name, else ValueError saying what is accepted."""
    if not _ENV_NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise ValueError(
            f"secret name {name[:300]!r} is not valid: a secret is exposed as an environment variable of the same "
            f"name, so it must be 1-{MAX_NAME} letters, digits and underscores, not starting with a digit "
            "(for example OPENAI_API_KEY)"
        )
    return name


def check_secret_value(value: str) -> str:
    """``value`` when an environment variable can hold it, else ValueError (never quoting the value)."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("secret value: not valid Unicode text (it holds a lone surrogate)") from None
    if not value:
        raise ValueError("secret value: empty; a secret needs a value")
    if size > MAX_VALUE_BYTES:
        raise ValueError(f"secret value: {size} bytes; at most {MAX_VALUE_BYTES} bytes (UTF-8) are accepted")
    if "\0" in value:
        raise ValueError("secret value: holds a NUL character, which no environment variable can hold")
    return value


def _context(workspace_id: str, name: str) -> str:
    return f"secret:{workspace_id}/{name}"


class SecretStore:
    """Named secret values per workspace; a workspace only ever sees its own."""

    def __init__(self, db: Database, box: SecretBox) -> None:
        self._db = db
        self._box = box

    async def put(self, workspace_id: str, name: str, value: str) -> tuple[SecretInfo, bool]:
        """Set the secret ``name``, replacing any earlier value; returns it and whether it is new."""
        check_secret_name(name)
        check_secret_value(value)
        ciphertext = self._box.seal(value, context=_context(workspace_id, name))

        async def attempt() -> tuple[SecretInfo, bool]:
            now = utcnow()
            async with self._db.transaction() as session:
                row = await session.scalar(
                    select(Secret).where(Secret.workspace_id == workspace_id, Secret.name == name).with_for_update()
                )
                if row is not None:
                    row.ciphertext = ciphertext
                    row.updated_at = now
                    return SecretInfo(row.name, row.created_at, row.updated_at), False
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
                return SecretInfo(name, now, now), True

        return await retry_on_race(attempt)

    async def get(self, workspace_id: str, name: str) -> str | None:
        """The value, or None when this workspace has no such secret (whatever other workspaces have)."""
        async with self._db.transaction() as session:
            ciphertext = await session.scalar(
                select(Secret.ciphertext).where(Secret.workspace_id == workspace_id, Secret.name == name)
            )
        if ciphertext is None:
            return None
        return self._box.unseal(ciphertext, context=_context(workspace_id, name))

    async def names(self, workspace_id: str) -> builtins.list[str]:
        """The workspace's secret names, sorted; values are only read one at a time, on purpose."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(Secret.name).where(Secret.workspace_id == workspace_id).order_by(Secret.name)
            )
            return list(rows)

    async def list(self, workspace_id: str) -> builtins.list[SecretInfo]:
        """The workspace's secrets by name, with their times; never their values."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(Secret.name, Secret.created_at, Secret.updated_at)
                .where(Secret.workspace_id == workspace_id)
                .order_by(Secret.name)
            )
            return [SecretInfo(name, created, updated) for name, created, updated in rows]

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


__all__ = ["MAX_NAME", "MAX_VALUE_BYTES", "SecretStore", "check_secret_name", "check_secret_value"]
