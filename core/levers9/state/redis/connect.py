"""Connecting to Redis, or to an embedded one when no URL is configured.

One machine should not need a Redis to set up to try levers9, so an empty
``state.redis_url`` gives an embedded one, which the same scheduler code runs
against. It lives and dies with the controlplane: SQL is the source of truth
and the backlog is rebuilt from it at start. Two kinds:

* a private ``redis-server`` child on a unix socket (:class:`ManagedRedis`), when
  the binary is installed: the scheduler's Lua runs many times faster there;
* an in-process Redis (fakeredis with real Lua, :class:`EmbeddedRedis`) otherwise,
  or when ``LEVERS9_EMBEDDED_REDIS=memory``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from levers9.config.redis_url import parse, redact
from levers9.state.errors import StateError

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["EmbeddedRedis", "ManagedRedis", "connect", "verify"]


class EmbeddedRedis:
    """An in-process Redis server; every client from :meth:`client` sees the same data."""

    def __init__(self) -> None:
        import fakeredis

        self._server: Any = fakeredis.FakeServer()

    def client(self) -> Redis:
        import fakeredis

        client: Redis = fakeredis.FakeAsyncRedis(server=self._server, decode_responses=True)
        return client


#: connections one client opens to a Redis server at most; a command past them waits for one to come back
MAX_CONNECTIONS = 100
#: how long such a command waits before it fails (``redis.exceptions.ConnectionError``)
POOL_WAIT_S = 20.0
#: how long a question to one Sentinel (connecting, or where the primary is) may take before the next is asked
SENTINEL_TIMEOUT_S = 2.0
#: how long an embedded ``redis-server`` has to listen on its socket once started
START_TIMEOUT_S = 20.0


def connect(url: str | None, *, embedded: EmbeddedRedis | None = None, max_connections: int = MAX_CONNECTIONS) -> Redis:
    """A client for ``url``, or for ``embedded`` (a fresh one when not given) when ``url`` is empty.

    A client of a server holds at most ``max_connections`` connections, and a command beyond them waits (up to
    :data:`POOL_WAIT_S`) for one to be free: redis-py's default pool raises at once instead, which a thousand
    workers reconnecting after a restart would turn into failed registrations and a reconnect storm.
    """
    if not url:
        return (embedded or EmbeddedRedis()).client()
    from redis.asyncio import BlockingConnectionPool, Redis

    target = parse(url)
    common: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": POOL_WAIT_S,
        "decode_responses": True,
        "health_check_interval": 30,
        **target.tls_kwargs(),
    }
    if not target.sentinel:
        return Redis.from_pool(BlockingConnectionPool.from_url(target.server_url(), **common))
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff

    sentinel_options: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "username": target.username if target.sentinel_auth else None,
        "password": target.password if target.sentinel_auth else None,
    }
    # one try per Sentinel: the client asks the next one at once (redis-py's default retries a dead one for seconds)
    sentinel_options["retry"] = Retry(NoBackoff(), 0)
    if target.tls:
        sentinel_options.update(ssl=True, **target.tls_kwargs())
    sentinels = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call]
    pool_class, client_class = _sentinel_classes()
    pool = pool_class(
        target.service,
        sentinels,
        db=target.db,
        username=target.username,
        password=target.password,
        ssl=target.tls,
        check_connection=True,
        **common,
    )
    client: Redis = client_class.from_pool(pool)
    return client


async def verify(redis: Redis, url: str) -> None:
    """Check that ``redis`` (a client of the configured ``url``) answers and accepts its credentials.

    Raises :class:`StateError` naming ``url`` without its password and saying what failed: a wrong
    user or password, a server (or, with Sentinel, every Sentinel) not reachable, a TLS handshake refused.
    The client is closed first, so a failed start leaves no connection behind.
    """
    from redis.asyncio.sentinel import MasterNotFoundError
    from redis.exceptions import AuthenticationError, AuthenticationWrongNumberOfArgsError, RedisError

    try:
        await redis.ping()
    except (AuthenticationError, AuthenticationWrongNumberOfArgsError) as exc:
        await redis.aclose()
        raise StateError(
            f"Redis at {redact(url)} refused the credentials in state.redis_url ({exc}): check the user and "
            "password (redis://USER:PASSWORD@HOST, or redis://:PASSWORD@HOST for requirepass)"
        ) from None
    except (RedisError, OSError) as exc:
        why = await _no_primary(redis) if isinstance(exc, MasterNotFoundError) else str(exc)
        await redis.aclose()
        raise StateError(f"Redis at {redact(url)} (state.redis_url) does not answer: {why}") from None


async def _no_primary(redis: Redis) -> str:
    """Why no Sentinel named a primary, one short reason per Sentinel (redis-py's message is the clients' reprs)."""
    pool: Any = redis.connection_pool
    service = pool.service_name
    reasons = []
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        where = f"{kwargs.get('host')}:{kwargs.get('port')}"
        try:
            state = (await sentinel.sentinel_masters()).get(service)
        except Exception as exc:
            reasons.append(f"{where}: {str(exc)[:200]}")
            continue
        if not state:
            reasons.append(f"{where}: monitors no {service!r}")
        else:
            down = "down" if state.get("is_sdown") or state.get("is_odown") else "not a primary"
            reasons.append(f"{where}: says {service!r} at {state.get('ip')}:{state.get('port')} is {down}")
    return f"no Sentinel named a primary for {service!r} ({'; '.join(reasons)})"


@cache
def _sentinel_classes() -> tuple[type, type[Redis]]:
    """The Sentinel-managed pool and the client that owns it, made on first use (redis-py is imported late).

    The pool waits for a free connection like :func:`connect`'s plain one. Its connections ask the
    Sentinels for the primary each time they connect, and one to a server that has become a replica
    (``READONLY``) is dropped, so the next command finds the new primary. Closing the client closes its
    connections to the Sentinels too.
    """
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.sentinel import SentinelConnectionPool

    class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
        pass

    class SentinelRedis(Redis):
        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            try:
                await super().aclose(close_connection_pool)
            finally:
                manager: Any = getattr(self.connection_pool, "sentinel_manager", None)
                if manager is not None:
                    await manager.aclose()

    return BlockingSentinelPool, SentinelRedis


#: the longest path a unix socket may have (sun_path is 108 bytes on Linux, its last one the terminating NUL);
#: a data directory deeper than that leaves room for none, so the socket goes to a short directory of its own
MAX_SOCKET_PATH = 107


class ManagedRedis:
    """A ``redis-server`` child process private to this controlplane: a unix socket, no persistence.

    It is told to die with its parent (``PR_SET_PDEATHSIG``), so even a controlplane
    killed with SIGKILL leaves no Redis behind. Should it die first, :meth:`restart`
    starts a new one on the same socket (clients reconnect to the same path), empty:
    :mod:`levers9.state.redis.supervisor` watches for that and has the controlplane
    rebuild what it held. What the child writes to stdout and stderr (a refusal to
    start, say) goes to its log file, which a failed start quotes.
    """

    def __init__(self, workdir: Path, binary: str) -> None:
        import fcntl

        workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.workdir = workdir
        # One controlplane per embedded Redis: a second one on the same data directory would take
        # the socket from the first. The lock is held for the life of this process.
        self._lock = (workdir / "lock").open("a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise StateError(
                f"another levers9 controlplane is running on {workdir.parent} (it holds {workdir / 'lock'}); "
                "stop it, or give this one another data_dir (an embedded Redis serves one controlplane; "
                "for several, configure state.redis_url)"
            ) from None
        self.binary = binary
        self.socket = workdir / "redis.sock"
        #: a short directory of its own for the socket when the data directory's path is too long for one
        self._short: Path | None = None
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            import tempfile

            self._short = Path(tempfile.mkdtemp(prefix="levers9-redis-"))  # 0700, this process's own
            self.socket = self._short / "redis.sock"
        self._log = workdir / "redis.log"
        self._log_from = 0
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        """A new ``redis-server`` on :attr:`socket` (a socket left by a dead one is removed first)."""
        import shutil

        self.socket.unlink(missing_ok=True)
        command = [
            self.binary,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--logfile",
            str(self._log),
        ]
        # util-linux's setpriv sets the death signal and execs Redis, so no Python runs between fork and exec:
        # a preexec_fn forces a plain fork (fork handlers, locks other threads held) in a process full of threads
        setpriv = shutil.which("setpriv")
        with open(self._log, "ab") as output:  # the child holds its own copy of the descriptor
            self._log_from = output.tell()  # where what this start writes begins (a failure quotes only that)
            return subprocess.Popen(
                [setpriv, "--pdeathsig", "TERM", *command] if setpriv is not None else command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                preexec_fn=None if setpriv is not None else _die_with_parent,
                # a session of its own: a terminal's Ctrl-C reaches the controlplane alone, which stops Redis
                # after its workers have drained, instead of Redis dying first and being restarted meanwhile
                start_new_session=True,
            )

    @classmethod
    def start(cls, workdir: Path, *, timeout: float = START_TIMEOUT_S) -> ManagedRedis | None:
        """A running server, or None when ``redis-server`` is not installed (or may not be used)."""
        import shutil
        import time

        if os.environ.get("LEVERS9_EMBEDDED_REDIS", "auto") == "memory":
            return None
        binary = shutil.which("redis-server")
        if binary is None:
            return None
        managed = cls(workdir, binary)
        deadline = time.monotonic() + timeout
        while not managed._ready():
            if time.monotonic() > deadline:
                managed.process.kill()
            if managed.process.poll() is not None:
                failure = managed._failed_start()
                managed.stop()
                raise failure
            time.sleep(0.01)
        return managed

    async def restart(self, *, timeout: float = START_TIMEOUT_S) -> None:
        """Start a new server on the same socket once the old one has exited (and been reaped).

        Raises :class:`StateError` quoting the server's log when the new one exits or does not listen
        within ``timeout``; the caller decides whether to try again.
        """
        import asyncio

        if self.process.poll() is None:
            raise StateError(f"the embedded redis-server (pid {self.process.pid}) still runs; it is not restarted")
        self.process = self._spawn()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                self.process.kill()
            if self.process.poll() is not None:
                raise self._failed_start()
            await asyncio.sleep(0.01)

    def _ready(self) -> bool:
        """Whether the server listens (its socket exists) and is still alive."""
        return self.socket.exists() and self.process.poll() is None

    def _failed_start(self) -> StateError:
        """Why the last start failed: its exit status and the end of what it wrote to its log."""
        try:
            with open(self._log, "rb") as log:
                log.seek(self._log_from)
                tail = log.read().decode(errors="replace")[-1000:].strip()
        except OSError:
            tail = ""
        return StateError(
            f"the embedded redis-server did not start (exit status {self.process.returncode}); "
            f"it wrote to {self._log}: {tail or '(nothing)'}"
        )

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.socket.unlink(missing_ok=True)
        if self._short is not None:
            with contextlib.suppress(OSError):
                self._short.rmdir()
        self._lock.close()


def _die_with_parent() -> None:
    """In the child before exec, where ``setpriv`` is missing: get SIGTERM when the controlplane dies, however it dies.

    Runs between fork and exec in a process that has other threads, so it must take no lock another thread
    may have held at fork time: the library and the function are looked up in the parent (``_PRCTL``), never
    here (a ``dlopen`` in the child could wait for ever on the loader's lock, and Redis would never start).
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, _SIGTERM)


#: ``prctl`` of the C library, resolved once in the parent; None where there is none (not Linux)
_PRCTL: Any = None
_PR_SET_PDEATHSIG = 1
_SIGTERM = 15
try:
    import ctypes as _ctypes

    _PRCTL = _ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _PRCTL = None
