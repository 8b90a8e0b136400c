"""Opening databases: the URLs operators write, SQLite's settings, passwords kept out of logs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy import Connection, Table, insert, select
from sqlalchemy.exc import StatementError

from levers9.state.errors import DatabaseUrlError, StateError
from levers9.state.sql.database import (
    IDLE_IN_TRANSACTION_MS,
    Database,
    normalize_url,
    open_database,
    safe_url,
)
from levers9.state.sql.machines import MachineStore
from levers9.state.sql.models import Workspace, new_id, utcnow
from levers9.state.sql.workspaces import WorkspaceStore


@pytest.mark.parametrize(
    ("written", "driver"),
    [
        ("sqlite:////var/lib/levers9/levers9.db", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:////var/lib/levers9/levers9.db", "sqlite+aiosqlite"),
        ("postgresql://levers9@db.internal/levers9", "postgresql+psycopg"),
        ("postgresql+psycopg://levers9:pw@db.internal:5433/levers9", "postgresql+psycopg"),
    ],
)
def test_accepted_urls_map_to_the_async_drivers(written: str, driver: str) -> None:
    assert normalize_url(written).drivername == driver


def test_sqlite_paths_expand_the_home_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert normalize_url("sqlite:///~/state/levers9.db").database == str(tmp_path / "state" / "levers9.db")


def test_an_unsupported_scheme_lists_what_is_accepted_without_the_password() -> None:
    with pytest.raises(DatabaseUrlError) as caught:
        normalize_url("mysql://admin:hunter2@db/levers9")
    message = str(caught.value)
    assert "'mysql'" in message
    assert "sqlite:///PATH" in message
    assert "postgresql+psycopg://" in message
    assert "hunter2" not in message


def test_an_unparseable_url_is_not_echoed() -> None:
    with pytest.raises(DatabaseUrlError) as caught:
        normalize_url("not a url with password hunter2")
    assert "hunter2" not in str(caught.value)
    assert "expected sqlite:///PATH" in str(caught.value)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+aiosqlite://"])
def test_in_memory_sqlite_is_refused(url: str) -> None:
    with pytest.raises(DatabaseUrlError, match="give a file path"):
        normalize_url(url)


def test_safe_url_hides_the_password() -> None:
    assert "hunter2" not in safe_url("postgresql+psycopg://levers9:hunter2@db/levers9")
    assert safe_url("postgresql+psycopg://levers9:hunter2@db/levers9") == "postgresql+psycopg://levers9:***@db/levers9"


async def test_sqlite_gets_its_directory_and_settings(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "levers9.db"
    db = await open_database(f"sqlite:///{path}")
    try:
        assert path.exists()
        async with db.engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
            assert (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar() == 15000
    finally:
        await db.close()


async def test_postgres_password_stays_out_of_logs_and_repr(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The test server trusts every local connection, so any password is accepted and must still be hidden.
    with_password = postgres_url.replace("postgres@", "postgres:hunter2@", 1)
    caplog.set_level(logging.DEBUG, logger="levers9")
    db = await open_database(with_password)
    try:
        assert db.dialect == "postgresql"
        assert "hunter2" not in repr(db)
        assert "hunter2" not in db.url
        assert "opening database" in caplog.text
        assert "hunter2" not in caplog.text
    finally:
        await db.close()


async def test_timestamps_are_aware_utc_and_naive_ones_are_refused(db: Database) -> None:
    workspace = await WorkspaceStore(db).create("clock")
    assert workspace.created_at.tzinfo is UTC
    fetched = await WorkspaceStore(db).get(workspace.id)
    assert fetched is not None
    assert fetched.created_at == workspace.created_at
    assert fetched.created_at.tzinfo is UTC
    with pytest.raises(StatementError, match="has no time zone"):
        await MachineStore(db).create("pool", "local", register_by=datetime(2030, 1, 1))


async def test_database_is_an_async_context_manager(database_url: str) -> None:
    async with await open_database(database_url) as db:
        assert await WorkspaceStore(db).get_or_create("default") == await WorkspaceStore(db).get_or_create("default")


async def test_run_commits_what_work_did_and_rolls_back_when_it_raises(db: Database) -> None:
    """``Database.run`` is the hot paths' one-hop transaction (SQLite runs it in its own thread)."""
    workspaces = WorkspaceStore(db)
    table = cast(Table, Workspace.__table__)

    def add(name: str, fail: bool) -> Callable[[Connection], int]:
        def work(connection: Connection) -> int:
            connection.execute(insert(table).values(id=new_id("ws"), name=name, created_at=utcnow()))
            if fail:
                raise RuntimeError("work failed half way")
            return len(connection.execute(select(table.c.id)).all())

        return work

    assert await db.run(add("kept", fail=False)) >= 1
    with pytest.raises(RuntimeError, match="half way"):
        await db.run(add("dropped", fail=True))
    assert await workspaces.by_name("kept") is not None
    assert await workspaces.by_name("dropped") is None
    # the async sessions see what run committed, and run sees what they commit
    created = await workspaces.create("from-a-session")
    assert await db.run(lambda c: c.scalar(select(table.c.name).where(table.c.id == created.id))) == "from-a-session"


async def test_run_after_close_fails_clearly(database_url: str) -> None:
    db = await open_database(database_url)
    await db.close()
    await db.close()  # twice is harmless
    if db.dialect == "sqlite":
        with pytest.raises(StateError, match="closed"):
            await db.run(lambda c: c.scalar(select(1)))


async def test_only_sqlite_has_the_direct_path(db: Database) -> None:
    """state/sql/direct.py: SQLite runs the call path's statements on its driver; PostgreSQL refuses to."""
    if db.dialect == "sqlite":
        assert db.direct
        assert await db.run_direct(lambda connection: connection.execute("SELECT 41 + 1").fetchone()) == (42,)
        return
    assert not db.direct
    with pytest.raises(StateError, match="SQLite only"):
        await db.run_direct(lambda connection: None)


async def test_a_postgres_session_idle_in_a_transaction_is_ended_by_the_server(postgres_url: str) -> None:
    """A replica frozen mid-transaction must not hold its row locks for as long as it stays frozen."""
    from sqlalchemy import text

    db = await open_database(postgres_url + "?options=-c%20statement_timeout%3D60000")
    try:
        async with db.transaction() as session:
            shown = (await session.execute(text("SHOW idle_in_transaction_session_timeout"))).scalar_one()
            kept = (await session.execute(text("SHOW statement_timeout"))).scalar_one()
        assert shown == f"{IDLE_IN_TRANSACTION_MS // 1000}s"
        assert kept == "1min", "options given in the URL are kept"
    finally:
        await db.close()
