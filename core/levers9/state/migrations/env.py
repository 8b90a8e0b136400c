"""Alembic's entry point: runs the migrations on the connection levers9 hands it.

:meth:`levers9.state.sql.database.Database.migrate` passes its own connection
(already inside a transaction) in ``config.attributes["connection"]``; the URL
form is only for developers running Alembic commands on a scratch database.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection, create_engine, pool

from levers9.state.sql.models import UtcDateTime, metadata

config = context.config


def _render_item(kind: str, item: Any, autogen: AutogenContext) -> str | Literal[False]:
    """Render the models' UtcDateTime as the plain type it stores, so migrations never import the models."""
    if kind == "type" and isinstance(item, UtcDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url, target_metadata=metadata, literal_binds=True, render_as_batch=True, render_item=_render_item
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection and no sqlalchemy.url: use levers9.state.sql.database.alembic_config(url)")
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as own:
            _run(own)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
