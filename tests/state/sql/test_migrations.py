"""The migrations create exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from levers9.state.sql.database import Database, alembic_config, open_database
from levers9.state.sql.models import metadata

#: the newest migration; a new migration file changes this
HEAD = "0010"

EVERY_TABLE = {
    "workspaces",
    "users",
    "identities",
    "members",
    "blobs",
    "blob_chunks",
    "tokens",
    "apps",
    "stubs",
    "deployments",
    "deployment_versions",
    "tasks",
    "task_placements",
    "secrets",
    "machines",
    "checkpoints",
    "clusters",
    "task_io",
    "task_logs",
    "joined_machines",
    "blueprint_steps",
    "blueprint_images",
    "volumes",
    "sandbox_snapshots",
}


async def _tables(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))


async def _revision(db: Database) -> list[str]:
    async with db.engine.connect() as conn:
        return [row[0] for row in (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()]


def test_the_models_name_every_table() -> None:
    assert set(metadata.tables) == EVERY_TABLE


async def test_migrate_from_empty_then_again(database_url: str) -> None:
    db = await open_database(database_url, migrate=False)
    try:
        assert await _tables(db) == set()
        await db.migrate()
        assert await _tables(db) == EVERY_TABLE | {"alembic_version"}
        assert await _revision(db) == [HEAD]
        await db.migrate()  # already at head: nothing happens, nothing fails
        assert await _revision(db) == [HEAD]
    finally:
        await db.close()
    reopened = await open_database(database_url)
    try:
        assert await _revision(reopened) == [HEAD]
    finally:
        await reopened.close()


async def test_replicas_starting_together_migrate_once(database_url: str) -> None:
    opened = await asyncio.gather(*(open_database(database_url) for _ in range(3)), return_exceptions=True)
    databases = [db for db in opened if isinstance(db, Database)]
    try:
        assert len(databases) == 3, f"some replicas failed to open: {opened}"
        assert await _revision(databases[0]) == [HEAD]
        assert await _tables(databases[0]) == EVERY_TABLE | {"alembic_version"}
    finally:
        for db in databases:
            await db.close()


async def test_migrated_schema_matches_the_models(database_url: str) -> None:
    db = await open_database(database_url)

    def differences(conn: Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return list(compare_metadata(context, metadata))

    try:
        async with db.engine.connect() as conn:
            assert await conn.run_sync(differences) == []
    finally:
        await db.close()


async def test_the_comparison_notices_a_missing_index(database_url: str) -> None:
    """The check above can fail: drop an index the models declare and it is reported."""
    db = await open_database(database_url)

    def differences(conn: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))

    try:
        async with db.engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_tasks_status"))
        async with db.engine.connect() as conn:
            diff = await conn.run_sync(differences)
        assert [(d[0], d[1].name) for d in diff if isinstance(d, tuple)] == [("add_index", "ix_tasks_status")]
    finally:
        await db.close()


async def test_downgrade_to_base_and_up_again(database_url: str) -> None:
    db = await open_database(database_url)
    config = alembic_config()

    def downgrade(conn: Connection) -> None:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")

    try:
        async with db.engine.begin() as conn:
            await conn.run_sync(downgrade)
        assert await _tables(db) == {"alembic_version"}
        assert await _revision(db) == []
        await db.migrate()
        assert await _tables(db) == EVERY_TABLE | {"alembic_version"}
    finally:
        await db.close()
