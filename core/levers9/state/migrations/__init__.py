"""Alembic migrations of the levers9 database.

There is no alembic.ini: :func:`levers9.state.sql.database.alembic_config`
builds the configuration in code, pointing at this directory. To write a new
migration after changing :mod:`levers9.state.sql.models`, autogenerate one
against a scratch database that is at head, then read and fix it by hand::

    from alembic import command
    from levers9.state.sql.database import alembic_config

    config = alembic_config("sqlite:////tmp/scratch.db")
    command.upgrade(config, "head")
    command.revision(config, message="what changed", autogenerate=True)

The migration tests compare the migrated schema with the models on SQLite and
PostgreSQL, so a model change without its migration fails them.
"""
