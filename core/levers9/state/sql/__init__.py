"""The SQL stores: one module per kind of record, all sharing one :class:`~levers9.state.sql.database.Database`."""
