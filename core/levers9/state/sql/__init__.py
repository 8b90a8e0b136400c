"""The SQL stores: one module per kind of record, all sharing one :class:`~levers9.state.sql.database.Database`.

SQL is the source of truth (tasks, machines, workspaces and tokens, secrets, apps and deployments,
checkpoints, clusters, blobs, built blueprints); every store owns its tables' reads and writes, and the records it returns
(:mod:`~levers9.state.sql.records`) are frozen. Only :mod:`levers9.services` and the scheduler use
the stores; transports reach them through the services.
"""
