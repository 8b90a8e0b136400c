"""Fixtures for the SQL store tests: a migrated database on each backend, a key, a workspace."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import text

from levers9.state.crypto import SecretBox
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.records import WorkspaceRecord
from levers9.state.sql.workspaces import WorkspaceStore


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = await open_database(database_url)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def box() -> SecretBox:
    return SecretBox([Fernet.generate_key()])


@pytest.fixture
async def workspace(db: Database) -> WorkspaceRecord:
    return await WorkspaceStore(db).create("team-a")


@pytest.fixture
def raw_stored() -> Callable[[Database, str], Awaitable[bytes]]:
    """Everything the database holds that a thief could read, for plaintext searches.

    SQLite: the bytes of the database file and its write-ahead log after the
    database is closed (so nothing is only in memory). PostgreSQL: the raw
    column values from a plain SQL query, bypassing the ORM and the SecretBox.
    """

    async def read(db: Database, query: str) -> bytes:
        if db.dialect == "sqlite":
            path = Path(str(db.engine.url.database))
            await db.close()
            data = b""
            for candidate in (path, path.with_name(path.name + "-wal")):
                if candidate.exists():
                    data += candidate.read_bytes()
            assert data, f"nothing was read from {path}"
            return data
        async with db.engine.connect() as conn:
            rows = (await conn.execute(text(query))).all()
        assert rows, f"{query} found no rows"
        return b"".join(
            bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
            for row in rows
            for value in row
        )

    return read
