"""Durable state: the SQL database that is the source of truth for workspaces, tasks and machines.

Nothing is imported here on purpose: SQLAlchemy, Alembic and the database
drivers are only loaded by the code that opens a database, so commands that
never touch state (``levers9 --help``, plugin loading) stay fast. Import from
the submodules: :mod:`levers9.state.sql.database`, :mod:`levers9.state.crypto`
and the stores under :mod:`levers9.state.sql`.
"""
