"""SQLite on a full disk: writes fail as DataDirectoryFull naming the directory, reads and tokens go on, nothing latches.

The database lives on a small tmpfs that the test fills with a file and then
frees, as a real data directory's disk would fill and be cleaned up.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from levers9.state.disk import MIN_FREE_BYTES, is_full, require_room, room
from levers9.state.errors import DataDirectoryFull
from levers9.state.sql.database import Database, open_database
from levers9.state.sql.workspaces import TokenStore, WorkspaceStore
from tests.fixtures.tmpfs import fill, tmpfs

#: room for the migrated database and its log, and levers9's margin (so it starts out not full)
_SIZE = MIN_FREE_BYTES + 32 * 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "data", _SIZE) as mounted:
        yield mounted


@pytest.fixture
async def db(small_disk: Path) -> AsyncIterator[Database]:
    database = await open_database(f"sqlite:///{small_disk / 'levers9.db'}")
    try:
        yield database
    finally:
        await database.close()


def _insert(connection: sqlite3.Connection | Connection, name: str) -> None:
    """A workspace row with 1 MiB of name: more than any room the write-ahead log may have kept."""
    statement = "INSERT INTO workspaces (id, name, created_at) VALUES (?, ?, '2026-01-01 00:00:00')"
    values = (f"ws_{name}", name + "x" * (1024 * 1024))
    if isinstance(connection, sqlite3.Connection):
        connection.execute(statement, values)
    else:
        connection.exec_driver_sql(statement, values)


async def test_every_way_to_write_raises_data_directory_full_naming_the_directory_until_space_returns(
    db: Database, small_disk: Path
) -> None:
    workspaces = WorkspaceStore(db)
    await workspaces.create("before")
    filler = fill(small_disk)
    with pytest.raises(DataDirectoryFull) as caught:
        await workspaces.create("during")  # Database.transaction
    assert str(caught.value).startswith(f"data directory full: {small_disk} has ")
    assert str(caught.value).endswith("; free space there")
    assert caught.value.free_bytes < MIN_FREE_BYTES
    with pytest.raises(DataDirectoryFull):
        await db.run(lambda c: _insert(c, "run"))
    with pytest.raises(DataDirectoryFull):
        await db.run_direct(lambda c: _insert(c, "direct"))
    # reads go on
    assert [w.name for w in await workspaces.list()] == ["before"]
    filler.unlink()
    # nothing latched: the next write of each kind works
    await workspaces.create("after")
    await db.run(lambda c: _insert(c, "run"))
    await db.run_direct(lambda c: _insert(c, "direct"))
    async with db.engine.connect() as connection:
        count = (await connection.execute(text("SELECT count(*) FROM workspaces"))).scalar_one()
    assert count == 4


async def test_a_valid_token_is_verified_on_a_full_disk_and_its_last_use_stamped_once_space_returns(
    db: Database, small_disk: Path
) -> None:
    tokens = TokenStore(db)
    record, token = await tokens.issue("user", subject="someone")
    assert record.last_used_at is None
    filler = fill(small_disk)
    verified = await tokens.verify(token)
    assert verified is not None
    assert (verified.id, verified.last_used_at) == (record.id, None)  # the stamp had no room: skipped
    filler.unlink()
    stamped = await tokens.verify(token)
    assert stamped is not None
    assert stamped.last_used_at is not None
    assert (await tokens.get(record.id)) == stamped


def test_room_is_ok_until_the_directory_fills_and_ok_again_once_freed(small_disk: Path) -> None:
    assert room(small_disk) == "ok"
    require_room(small_disk)
    filler = fill(small_disk)
    said = room(small_disk)
    assert said.startswith(f"data directory full: {small_disk} has ")
    assert f"(levers9 takes new work with at least {MIN_FREE_BYTES} free)" in said
    with pytest.raises(DataDirectoryFull):
        require_room(small_disk)
    filler.unlink()
    assert room(small_disk) == "ok"


def test_a_full_disk_is_told_from_other_errors_however_it_is_wrapped() -> None:
    sqlite_full = sqlite3.OperationalError("database or disk is full")
    assert is_full(sqlite_full)
    assert is_full(OperationalError("INSERT ...", {}, sqlite_full))  # SQLAlchemy keeps the driver's as orig
    assert is_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    wrapped = RuntimeError("storing failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert is_full(wrapped)
    assert not is_full(sqlite3.OperationalError("database is locked"))
    assert not is_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_full(ValueError("database or disk is full"))  # the words alone, from no database
