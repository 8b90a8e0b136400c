"""Opening the database: URL handling, SQLite tuning and schema migrations.

Operators write the URLs they know (``sqlite:///path``, ``postgresql://...``);
they are mapped here to the async drivers levers9 uses, so nobody has to know
that ``aiosqlite`` or psycopg's async mode exist.

A SQLite database holds every token hash and encrypted secret, so its files
are private to the user running levers9: the file is created 0600 before
SQLite first opens it (SQLite gives its -wal and -shm files the database
file's mode), a directory created for it is 0700, and files found with looser
modes are tightened each time the database is opened.

A SQLite transaction that fails because the disk under the file is full
raises :class:`~levers9.state.errors.DataDirectoryFull` naming the file's
directory and what is free there (:mod:`levers9.state.disk`), from every way
in (:meth:`Database.transaction`, :meth:`Database.run`,
:meth:`Database.run_direct`): callers answer it as a refusal, never as an
internal error, and the next transaction after space returns goes through.

A PostgreSQL session left idle inside a transaction for
:data:`IDLE_IN_TRANSACTION_MS` is ended by the server: a replica frozen
mid-transaction (SIGSTOP) would otherwise hold its row locks, and stop every
other replica's writes to those rows, for as long as it stays frozen. When it
resumes, that transaction fails (its connection is gone) and is not retried
on what it had read.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sqlite3
import time
import traceback
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from levers9.config.data_dir import PRIVATE_DIR, PRIVATE_FILE, tighten
from levers9.state.disk import full_error, is_full
from levers9.state.errors import DatabaseUrlError, StateError

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long a SQLite connection waits for another writer before failing, in milliseconds
SQLITE_BUSY_TIMEOUT_MS = 15_000
#: a transaction on SQLite held longer than this is logged, with where it came from
SLOW_TRANSACTION_S = 5.0
#: an arbitrary constant: the PostgreSQL advisory lock held while migrating, so replicas migrate one at a time
_MIGRATION_LOCK = 0x1E7E_0509

_ACCEPTED = "sqlite:///PATH, sqlite+aiosqlite:///PATH, postgresql://USER@HOST/DB or postgresql+psycopg://USER@HOST/DB"
_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


def normalize_url(url: str) -> URL:
    """The async SQLAlchemy URL for what an operator wrote.

    psycopg 3 serves both sync and async under one dialect name, so a
    PostgreSQL URL keeps working if someone hands it to a sync tool.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        # SQLAlchemy's own message repeats the whole string, password included.
        raise DatabaseUrlError(f"the database URL cannot be parsed; expected {_ACCEPTED}") from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise DatabaseUrlError(
            f"database URL scheme {parsed.drivername!r} is not supported ({parsed.render_as_string()}); "
            f"expected {_ACCEPTED}"
        )
    parsed = parsed.set(drivername=driver)
    if driver.startswith("sqlite"):
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:") or "mode=memory" in database:
            raise DatabaseUrlError(
                "an in-memory SQLite database loses every task on restart and is not shared between "
                "connections; give a file path: sqlite:///PATH (a temporary directory in tests)"
            )
        parsed = parsed.set(database=str(Path(database).expanduser()))
    return parsed


def safe_url(url: str | URL) -> str:
    """The URL as it may appear in logs and errors: never with its password."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return "<unparseable database URL>"
    return url.render_as_string(hide_password=True)


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # SQLAlchemy, not the sqlite3 module, decides when transactions begin (see _sqlite_begin).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # First the wait for a busy file: switching to WAL needs a moment of exclusive access, and a
        # replica starting while another migrates must queue for it, not fail at once.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets readers proceed while one writer commits; the controlplane and CLI share the file.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    """Start every transaction holding SQLite's write lock.

    A deferred transaction that reads and then writes must upgrade its lock;
    if another connection wrote in between, SQLite fails at once with
    "database is locked" and ``busy_timeout`` does not help. Taking the lock at
    BEGIN makes writers queue for it instead. SQLite has one writer at a time
    anyway, so little concurrency is lost, and WAL readers outside levers9
    (backups, the sqlite3 shell) are not blocked.
    """
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(url: str | None = None) -> Config:
    """The Alembic configuration, built in code so no alembic.ini has to ship or be found.

    With ``url`` the Alembic commands (``revision --autogenerate``, ``history``)
    can be used by a developer on a scratch database; :meth:`Database.migrate`
    hands Alembic its own connection instead.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).resolve().parent.parent / "migrations"))
    if url is not None:
        sync = normalize_url(url)
        if sync.drivername == "sqlite+aiosqlite":
            sync = sync.set(drivername="sqlite")
        # ConfigParser interpolation would read a '%' in a password as a placeholder.
        config.set_main_option("sqlalchemy.url", sync.render_as_string(hide_password=False).replace("%", "%%"))
    return config


class Database:
    """An async engine and its session factory; one per process, shared by every store."""

    def __init__(self, engine: AsyncEngine, sqlite_sync: Engine | None = None) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        # SQLite has one writer, and every levers9 transaction takes the write lock at BEGIN. Queueing
        # this process's transactions here, instead of letting each connection poll SQLite's busy
        # handler, keeps a busy controlplane fast and never fails a transaction with "database is
        # locked" while another of its own commits.
        self._serial: asyncio.Lock | None = asyncio.Lock() if engine.dialect.name == "sqlite" else None
        #: for :meth:`run` on SQLite: a plain sqlite3 engine used only from one thread of its own
        self._sqlite_sync = sqlite_sync
        #: SQLite's own thread: :meth:`run` (with ``sqlite_sync``) and :meth:`run_direct` work there
        self._sqlite_thread = (
            ThreadPoolExecutor(1, thread_name_prefix="levers9-sqlite") if self._serial is not None else None
        )
        #: for :meth:`run_direct`: the driver's own connection, opened on (and only used from) that thread
        self._direct: sqlite3.Connection | None = None
        #: the directory of the SQLite file, named when its disk is full; None for PostgreSQL
        self._sqlite_dir = Path(str(engine.url.database)).parent if self._serial is not None else None

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @property
    def url(self) -> str:
        """The URL without its password, for logs."""
        return safe_url(self.engine.url)

    def __repr__(self) -> str:
        return f"Database({self.url!r})"

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session inside one transaction: committed when the block ends, rolled back if it raises."""
        if self._serial is None:
            async with self.sessions() as session, session.begin():
                yield session
            return
        try:
            async with self._serial, self.sessions() as session, session.begin():
                began = time.monotonic()
                try:
                    yield session
                finally:
                    _held(began, None)
        except Exception as exc:
            self._raise_if_full(exc)
            raise

    def _raise_if_full(self, exc: Exception) -> None:
        """Raise :class:`~levers9.state.errors.DataDirectoryFull` (from ``exc``) when ``exc`` is SQLite's full disk."""
        if self._sqlite_dir is not None and is_full(exc):
            raise full_error(self._sqlite_dir) from exc

    async def run(self, work: Callable[[Connection], T]) -> T:
        """``work(connection)`` inside one transaction, committed when it returns, rolled back if it raises.

        This is for the hot paths (submit, placement, results), which run several
        statements per transaction. Through aiosqlite every statement, the BEGIN
        and the COMMIT is a hop to the driver's thread and back through the event
        loop, which a busy controlplane turns into milliseconds per transaction; here
        SQLite costs one hop, since the whole transaction runs in the database's own
        thread. PostgreSQL keeps its async driver: its hops are network round trips
        either way. ``work`` must not touch the event loop.
        """
        if self._sqlite_sync is None or self._serial is None:
            async with self.engine.begin() as connection:
                return await connection.run_sync(work)
        if self._sqlite_thread is None:
            raise StateError(f"{self!r} is closed")
        engine, thread = self._sqlite_sync, self._sqlite_thread

        def transaction() -> T:
            began = time.monotonic()
            try:
                with engine.begin() as connection:
                    return work(connection)
            finally:
                _held(began, f"Database.run({getattr(work, '__qualname__', work)!r})")

        try:
            async with self._serial:
                return await asyncio.get_running_loop().run_in_executor(thread, transaction)
        except Exception as exc:
            self._raise_if_full(exc)
            raise

    @property
    def direct(self) -> bool:
        """Whether :meth:`run_direct` is available: SQLite, the call path's statements on the driver itself."""
        return self._serial is not None

    async def run_direct(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work(connection)`` on SQLite's driver connection, in one ``BEGIN IMMEDIATE`` transaction.

        :mod:`levers9.state.sql.direct` says why the call path's statements skip
        SQLAlchemy. The transaction queues behind this process's others, as
        :meth:`run` does, and runs in the same thread; it is committed when
        ``work`` returns and rolled back if it raises. ``work`` must not touch the
        event loop. Only on SQLite (see :attr:`direct`).
        """
        serial, thread = self._serial, self._sqlite_thread
        if serial is None:
            raise StateError(f"{self!r}: run_direct is for SQLite only")
        if thread is None:
            raise StateError(f"{self!r} is closed")

        def transaction() -> T:
            connection = self._direct
            if connection is None:
                connection = self._direct = self._open_direct()
            began = time.monotonic()
            connection.execute("BEGIN IMMEDIATE")
            try:
                result = work(connection)
                connection.execute("COMMIT")
                return result
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            finally:
                _held(began, f"Database.run_direct({getattr(work, '__qualname__', work)!r})")

        try:
            async with serial:
                return await asyncio.get_running_loop().run_in_executor(thread, transaction)
        except Exception as exc:
            self._raise_if_full(exc)
            raise

    def _open_direct(self) -> sqlite3.Connection:
        connection = sqlite3.connect(str(self.engine.url.database), isolation_level=None, check_same_thread=True)
        _sqlite_connect(connection, None)
        return connection

    def _close_direct(self) -> None:
        connection, self._direct = self._direct, None
        if connection is not None:
            connection.close()

    async def migrate(self) -> None:
        """Bring the schema to the newest migration; does nothing when it is already there."""
        from alembic import command

        config = alembic_config()

        def upgrade(connection: Connection) -> None:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

        async with self.engine.connect() as connection:
            sqlite = self.dialect == "sqlite"
            if sqlite:
                # Alembic rebuilds SQLite tables to alter them ("batch" mode); with foreign keys on,
                # dropping the old copy would cascade-delete rows that point at it.
                await connection.run_sync(_sqlite_pragma, "foreign_keys=OFF")
            try:
                async with connection.begin():
                    if self.dialect == "postgresql":
                        await connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
                    await connection.run_sync(upgrade)
                    if sqlite:
                        await connection.run_sync(_sqlite_foreign_key_check)
            finally:
                if sqlite:
                    await connection.run_sync(_sqlite_pragma, "foreign_keys=ON")
        log.debug("database %s is at the newest schema", self.url)

    async def close(self) -> None:
        """Close every pooled connection; the Database cannot be used afterwards."""
        await self.engine.dispose()
        thread, self._sqlite_thread = self._sqlite_thread, None  # closing twice is harmless
        if thread is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(thread, self._close_direct)
            if self._sqlite_sync is not None:
                await loop.run_in_executor(thread, self._sqlite_sync.dispose)
            thread.shutdown(wait=True)

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _held(began: float, where: str | None) -> None:
    """Warn when a transaction held SQLite's write lock long enough to fail another process's writers.

    ``where`` names the work; None: the caller's stack, taken only when the warning is due.
    """
    held = time.monotonic() - began
    if held > SLOW_TRANSACTION_S:
        if where is None:
            where = "".join(traceback.format_stack(limit=7)[:-1])
        log.warning(
            "a transaction held the database's write lock for %.1f s (other processes wait at most %.0f s):\n%s",
            held,
            SQLITE_BUSY_TIMEOUT_MS / 1000,
            where,
        )


def _sqlite_pragma(connection: Connection, pragma: str) -> None:
    # A PRAGMA issued inside a transaction is ignored, so it goes to the driver outside SQLAlchemy's.
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(f"PRAGMA {pragma}")
    finally:
        cursor.close()


def _sqlite_foreign_key_check(connection: Connection) -> None:
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        tables = sorted({str(row[0]) for row in broken})
        raise StateError(f"the migration left rows whose foreign keys point nowhere, in: {', '.join(tables)}")


#: how long a PostgreSQL session may sit idle inside a transaction before the server ends it (see open_database)
IDLE_IN_TRANSACTION_MS = 10_000


async def open_database(url: str, *, migrate: bool = True) -> Database:
    """Open the database at ``url`` (see :func:`normalize_url`) and, by default, migrate it to the newest schema.

    For SQLite the file's directory is created, so a fresh data directory works.
    """
    parsed = normalize_url(url)
    options: dict[str, Any] = {}
    if parsed.drivername == "sqlite+aiosqlite":
        assert parsed.database is not None  # normalize_url refuses an empty path
        private_sqlite_files(Path(parsed.database))
    else:
        if importlib.util.find_spec("psycopg") is None:
            raise DatabaseUrlError(
                "PostgreSQL needs the psycopg driver, which is not installed: pip install 'psycopg[binary]>=3.1'"
            )
        # A database restarted under a running controlplane leaves dead pooled connections.
        options["pool_pre_ping"] = True
        # A replica frozen (SIGSTOP, a stalled host) inside a transaction keeps its row locks, and every other
        # replica's writes to those rows (a worker's results) wait for it: PostgreSQL ends such a session after
        # IDLE_IN_TRANSACTION_MS, far beyond the pauses of a levers9 transaction, whose statements run back to back
        setting = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
        given = parsed.query.get("options")
        options["connect_args"] = {"options": f"{given} {setting}" if isinstance(given, str) else setting}
    engine = create_async_engine(parsed, **options)
    sqlite_sync = None
    if parsed.drivername == "sqlite+aiosqlite":
        sqlite_sync = create_engine(parsed.set(drivername="sqlite"), pool_size=1, max_overflow=0)
        for target in (engine.sync_engine, sqlite_sync):
            event.listen(target, "connect", _sqlite_connect)
            event.listen(target, "begin", _sqlite_begin)
    database = Database(engine, sqlite_sync)
    log.info("opening database %s", database.url)
    if migrate:
        try:
            if parsed.drivername == "sqlite+aiosqlite":
                assert parsed.database is not None
                async with _file_lock(Path(parsed.database + ".migrate.lock")):
                    await database.migrate()
            else:
                await database.migrate()
        except BaseException:
            await database.close()
            raise
    return database


#: SQLite's companions of a database file, by suffix
_SQLITE_COMPANIONS = ("-wal", "-shm", "-journal", ".migrate.lock")


def private_sqlite_files(database: Path) -> None:
    """Make a SQLite database's files private: create it 0600 (and its directory 0700), tighten what exists."""
    directory = database.parent
    if not directory.exists():
        directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    with suppress(FileExistsError):  # an empty file is an empty SQLite database
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    for path in (database, *(database.with_name(database.name + suffix) for suffix in _SQLITE_COMPANIONS)):
        tighten(path, PRIVATE_FILE)


@asynccontextmanager
async def _file_lock(path: Path) -> AsyncIterator[None]:
    """Processes opening one SQLite file take turns to migrate it.

    The first connection switches the file to WAL and a migration rebuilds tables; on a loaded machine
    SQLite could still answer "database is locked" to a replica starting at the same moment. The lock
    is taken in a thread, so other coroutines of this process go on meanwhile.
    """
    import fcntl

    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE), "a") as handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["Database", "alembic_config", "normalize_url", "open_database", "private_sqlite_files", "safe_url"]
