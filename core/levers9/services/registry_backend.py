"""The registry behind the controlplane's ``/v2/`` relay: the embedded ``docker-registry``, or the operator's.

Images built from blueprints are named by refs whose registry host is the controlplane's own HTTP
address; the controlplane relays the distribution API to the registry this module holds
(:mod:`levers9.controlplane.registry_proxy`), so nobody but the controlplane ever speaks to it.

- ``registry.url`` empty: an :class:`~levers9.registry.server.EmbeddedRegistry` on 127.0.0.1 serving
  ``<data_dir>/registry``, restarted when it dies (:class:`~levers9.registry.supervisor.RegistrySupervisor`),
  stopped by :meth:`RegistryBackend.close`. It demands HTTP basic with a credential only this process
  knows: a random password kept in ``<data_dir>/registry/password`` (mode 0600, made once and kept) and
  its bcrypt hash in ``<data_dir>/registry/htpasswd`` (0600, written at each start). The hash has the
  lowest bcrypt cost, 4: distribution checks it on every request, and a 256-bit random password needs no
  stretching against guessing. Only one controlplane replica can use it (its storage is this data
  directory's); several replicas need ``registry.url``.
- ``registry.url`` set: that registry, with ``registry.username`` and the password in the environment
  variable ``registry.password_env``, answered as the registry asks (HTTP basic, or the bearer-token
  flow: a token per repository scope, kept until shortly before it expires).

Invariants: the backend is started once (:meth:`RegistryBackend.start`, by the server at start-up, or
by the first request that needs it); a backend that cannot be had (the binary missing, a password
variable unset, a start that failed, a supervisor that gave up) leaves the controlplane running,
logs one warning, and makes :meth:`RegistryBackend.ready` raise :class:`RegistryUnavailable` saying
why, with ``apt-get install -y docker-registry`` when the binary is what is missing. A password never
appears in a log line, an error or a repr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING

import bcrypt
import httpx

from levers9.hooks.errors import Levers9Error
from levers9.registry.auth import RegistryAuth, parse_challenge
from levers9.registry.errors import RegistryError
from levers9.registry.server import INSTALL, EmbeddedRegistry
from levers9.registry.supervisor import RegistrySupervisor

if TYPE_CHECKING:
    from collections.abc import Mapping

    from levers9.config.model import RegistryConfig

__all__ = ["EMBEDDED_USER", "INSTALL", "RegistryBackend", "RegistryUnavailable"]

log = logging.getLogger(__name__)

#: the user name the embedded registry's htpasswd file holds
EMBEDDED_USER = "levers9"
#: bcrypt's lowest cost (see the module docstring)
_BCRYPT_ROUNDS = 4
#: a token is dropped this long before its token service says it expires
_TOKEN_MARGIN_S = 10.0
#: what a token lives when its token service does not say (the token spec's default)
_TOKEN_DEFAULT_S = 60.0
#: connecting to the backend; reads wait longer (a big blob, a slow disk), but not for ever
_CONNECT_S = 10.0
_READ_S = 300.0


class RegistryUnavailable(Levers9Error):
    """The controlplane has no registry to relay to; the message says why and what to do."""


class RegistryBackend:
    """The registry the ``/v2/`` relay speaks to (see the module docstring). Make it, :meth:`start` it, :meth:`close` it."""

    def __init__(self, config: RegistryConfig, data_dir: Path, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.data_dir = Path(data_dir).expanduser() / "registry"
        environ = os.environ if environ is None else environ
        #: why there is no backend; None while there is (or may be, before :meth:`start`)
        self.problem: str | None = None
        self.embedded: EmbeddedRegistry | None = None
        self.supervisor: RegistrySupervisor | None = None
        self._auth: RegistryAuth | None = None
        #: the backend's base URL (the embedded one's is known once it started)
        self.url: str | None = config.url
        if config.url is None:
            self.embedded = EmbeddedRegistry(self.data_dir, htpasswd=self.data_dir / "htpasswd")
        elif config.password_env:
            password = environ.get(config.password_env, "")
            if not password:
                self.problem = (
                    f"registry.password_env names ${config.password_env}, which is not set in the controlplane's "
                    "environment; set it to the registry's password"
                )
            else:
                self._auth = RegistryAuth(config.username or "", password)
        elif config.username:
            self.problem = (
                "registry.username is set but registry.password_env is not: name the environment variable "
                "that holds the registry's password"
            )
        self._http: httpx.AsyncClient | None = None
        self._started = False
        self._lock: asyncio.Lock | None = None
        self._scheme: str | None = None  # what the backend asked for: "basic", "bearer", or "" (nothing)
        self._bearer: dict[str, str] = {}  # the bearer challenge's realm and service
        self._tokens: dict[str, tuple[str, float]] = {}  # scope -> (token, monotonic expiry)

    @property
    def embedded_auth(self) -> RegistryAuth | None:
        """The embedded registry's credential (for the tests that check it is demanded); None for another."""
        return self._auth if self.embedded is not None else None

    @property
    def http(self) -> httpx.AsyncClient:
        """The client requests to the backend go through (made by :meth:`start`)."""
        if self._http is None:
            raise RegistryUnavailable("the image registry was not started")
        return self._http

    async def start(self) -> None:
        """Start the embedded registry and its supervisor, or ready the configured one; at most once.

        Never raises for a backend that cannot be had: :attr:`problem` says why, logged once as a warning.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._started:
                return
            self._started = True
            if self.problem is None and self.embedded is not None:
                await self._start_embedded(self.embedded)
            if self.problem is not None:
                log.warning(
                    "no image registry: %s; blueprint builds and image pulls through this controlplane "
                    "will fail until it is fixed",
                    self.problem,
                )
                return
            verify: bool | ssl.SSLContext = True
            if self.embedded is None and isinstance(self.config.tls_verify, str):
                try:
                    verify = ssl.create_default_context(cafile=self.config.tls_verify)
                except (OSError, ssl.SSLError) as exc:
                    self.problem = f"registry.tls_verify names a CA bundle that cannot be read: {exc}"
                    log.warning("no image registry: %s", self.problem)
                    return
            elif self.embedded is None:
                verify = bool(self.config.tls_verify)
            self._http = httpx.AsyncClient(
                verify=verify,
                timeout=httpx.Timeout(_READ_S, connect=_CONNECT_S),
                headers={"User-Agent": "levers9-controlplane"},
            )

    async def _start_embedded(self, embedded: EmbeddedRegistry) -> None:
        if shutil.which("docker-registry") is None:
            self.problem = f"the embedded registry needs the docker-registry binary, which is not installed: {INSTALL}"
            return
        password = await asyncio.to_thread(self._credential)
        self._auth = RegistryAuth(EMBEDDED_USER, password)
        try:
            await asyncio.to_thread(embedded.start)
        except RegistryError as exc:
            self.problem = str(exc)
            return
        self.url = embedded.url
        self._scheme = "basic"
        self.supervisor = RegistrySupervisor(embedded)
        self.supervisor.start()
        log.info("the embedded image registry serves %s on %s", embedded.data_dir / "storage", embedded.address)

    def _credential(self) -> str:
        """The embedded registry's password (made once, kept), its htpasswd file written anew."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.data_dir / "password"
        try:
            password = path.read_text().strip()
        except FileNotFoundError:
            password = ""
        if not password:
            password = secrets.token_urlsafe(32)
            _write_private(path, password + "\n")
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=_BCRYPT_ROUNDS)).decode()
        _write_private(self.data_dir / "htpasswd", f"{EMBEDDED_USER}:{hashed}\n")
        return password

    async def ready(self) -> str:
        """The backend's base URL; :class:`RegistryUnavailable` saying why when there is none to relay to."""
        await self.start()
        if self.supervisor is not None and self.supervisor.failure is not None:
            raise RegistryUnavailable(f"the image registry is down: {self.supervisor.failure}")
        if self.problem is not None or self.url is None:
            raise RegistryUnavailable(f"this controlplane has no image registry: {self.problem or 'not started'}")
        return self.url

    async def authorization(self, scope: str) -> str | None:
        """What to send as ``Authorization`` for a request in ``scope`` (``repository:NAME:pull,push``)."""
        if self._auth is None:
            return None
        if self._scheme is None:
            await self._learn()
        if self._scheme == "basic":
            return self._auth.basic()
        if self._scheme == "bearer":
            return f"Bearer {await self._token(scope)}"
        return None

    async def _learn(self) -> None:
        """Ask the backend's ``/v2/`` which scheme it wants (once: it does not change)."""
        try:
            answer = await self.http.get(f"{self.url}/v2/")
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(f"the image registry at {self.url} cannot be reached: {exc}") from exc
        challenge = parse_challenge(answer.headers.get("WWW-Authenticate", "")) if answer.status_code == 401 else None
        if challenge is None:
            self._scheme = ""
        elif challenge.scheme in ("basic", "bearer"):
            self._scheme = challenge.scheme
            self._bearer = {key: challenge.params.get(key, "") for key in ("realm", "service")}
        else:
            raise RegistryUnavailable(
                f"the image registry at {self.url} asks for {challenge.scheme!r} authentication; accepted: Basic, "
                "Bearer"
            )

    async def _token(self, scope: str) -> str:
        held = self._tokens.get(scope)
        if held is not None and time.monotonic() < held[1]:
            return held[0]
        realm, auth = self._bearer.get("realm", ""), self._auth
        if not realm.startswith(("https://", "http://")) or auth is None:
            raise RegistryUnavailable(f"the image registry at {self.url} names no http(s) token realm")
        params = {"scope": scope} | ({"service": self._bearer["service"]} if self._bearer.get("service") else {})
        try:
            answer = await self.http.get(realm, params=params, headers={"Authorization": auth.basic()})
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(f"the image registry's token service {realm} cannot be reached: {exc}") from exc
        body = answer.json() if answer.status_code == 200 else None
        token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryUnavailable(
                f"the image registry's token service {realm} gave user {auth.username!r} no token "
                f"(HTTP {answer.status_code}): check registry.username and registry.password_env"
            )
        lifetime = body.get("expires_in") if isinstance(body, dict) else None
        seconds = float(lifetime) if isinstance(lifetime, int | float) and lifetime > 0 else _TOKEN_DEFAULT_S
        self._tokens[scope] = (token, time.monotonic() + max(seconds - _TOKEN_MARGIN_S, 1.0))
        return token

    async def close(self) -> None:
        """Stop the supervisor, then the embedded registry (so the stop is not taken for a death); close the client."""
        if self.supervisor is not None:
            await self.supervisor.close()
            self.supervisor = None
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (0600), replacing it whole."""
    spare = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(spare, path)
    except BaseException:
        spare.unlink(missing_ok=True)
        raise
