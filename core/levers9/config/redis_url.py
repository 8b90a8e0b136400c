"""What ``state.redis_url`` may say, read into a :class:`RedisTarget`, and shown without its passwords.

Accepted forms (:data:`FORMS`)::

    redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?OPTIONS]       one server
    rediss://...                                               the same over TLS
    unix:///PATH[?db=DB]                                       a local socket
    redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB][?OPTIONS]
    rediss+sentinel://...                                      the same, TLS to the Sentinels and the servers

With Sentinel, HOSTs are the Sentinels (port 26379 when left out) and SERVICE is the name they monitor
(``sentinel monitor SERVICE ...``); the client asks them for the primary and asks again whenever a
connection to it breaks, so a failover is followed. USER and PASSWORD authenticate to the Redis servers
(an ACL user, or ``:PASSWORD`` for ``requirepass``), and the Sentinels too with ``sentinel_auth=yes``
(Sentinels that ask for a password must be given the servers' one: no password is put in the query, where
it would be shown). OPTIONS (:data:`OPTIONS`): ``ca_file``, ``cert_file``,
``key_file`` (PEM files for TLS: the CA that signed the servers' certificates, and a client certificate
where the servers ask for one), ``db`` (unix sockets), and ``sentinel_auth``.

Invariants:

* Nothing here ever puts a password into a message: :func:`redact` is what an error or a log line shows.
* :func:`parse` accepts exactly :data:`FORMS`; anything else is a :class:`RedisUrlError` naming the URL
  (redacted), what is wrong, and the accepted forms. The config's validator and :func:`connect` both use
  it, so a URL the config accepted is one the client can use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["FORMS", "OPTIONS", "RedisTarget", "RedisUrlError", "parse", "redact"]

#: the accepted forms, as an error shows them
FORMS = (
    "redis://[AUTH@]HOST[:PORT][/DB], rediss://... (TLS), unix:///PATH[?db=DB], "
    "redis+sentinel://[AUTH@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB] or rediss+sentinel://... (TLS), "
    "where AUTH is USER:PASSWORD (an ACL user) or :PASSWORD"
)
#: query options and what each means
OPTIONS = {
    "ca_file": "PEM CA bundle that verifies the servers' (and Sentinels') certificates (TLS forms)",
    "cert_file": "PEM client certificate, where the servers ask for one (TLS forms)",
    "key_file": "PEM private key of cert_file (TLS forms)",
    "db": "database number (unix form; the others put it in the path)",
    "sentinel_auth": "yes: the Sentinels get the URL's USER:PASSWORD too; no (the default): they get none",
}
#: the port of a Sentinel whose address gives none
SENTINEL_PORT = 26379
_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")


class RedisUrlError(ValueError):
    """A ``state.redis_url`` that is not one of :data:`FORMS`; the message holds no password."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: one server (:attr:`url`) or a Sentinel-watched service (:attr:`sentinels` set)."""

    #: the URL as configured (holds its password: never show it; :attr:`shown` is for messages)
    url: str
    scheme: str
    tls: bool
    #: Sentinel addresses; empty for one server
    sentinels: tuple[tuple[str, int], ...] = ()
    #: the service the Sentinels monitor; empty for one server
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    #: the query options (:data:`OPTIONS`)
    options: dict[str, str] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        """The URL with its passwords replaced by ``***``."""
        return redact(self.url)

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    @property
    def sentinel_auth(self) -> bool:
        """Whether the Sentinels are given :attr:`username` and :attr:`password` too."""
        return self.options.get("sentinel_auth") == "yes"

    def tls_kwargs(self) -> dict[str, object]:
        """redis-py's TLS arguments for the files named in the options (none for a plain connection)."""
        if not self.tls:
            return {}
        names = {"ca_file": "ssl_ca_certs", "cert_file": "ssl_certfile", "key_file": "ssl_keyfile"}
        return {names[key]: value for key, value in self.options.items() if key in names}

    def server_url(self) -> str:
        """For one server: the URL redis-py reads, with this module's own options taken out of the query."""
        if self.scheme == "unix":
            path = urlsplit(self.url).path
            return f"unix://{path}?db={self.db}"
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"


def redact(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if sep and at and ":" in userinfo:
        rest = userinfo.partition(":")[0] + ":***@" + hosts + slash + tail
    shown = scheme + sep + rest
    return shown


def parse(url: str) -> RedisTarget:
    """Read ``url`` (see the module docstring); :class:`RedisUrlError` says what is wrong with it."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _SCHEMES:
        raise _error(url, f"the scheme {scheme + ':' if sep else '(none)'} is not one of " + ", ".join(_SCHEMES))
    before_query, _, query = rest.partition("?")
    tls = scheme.startswith("rediss")
    sentinel = scheme.endswith("+sentinel")
    options = _options(url, query, tls=tls, sentinel=sentinel)
    if scheme == "unix":
        path = before_query
        if not path.startswith("/"):
            raise _error(url, "a unix socket's path must be absolute (unix:///run/redis.sock)")
        return RedisTarget(url, scheme, False, db=_db(url, options.get("db", "0")), options=options)
    if "db" in options:
        raise _error(url, "the database number goes in the path (/DB), not in ?db=")
    netloc, _, path = before_query.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username, password = _credentials(url, userinfo) if at else (None, None)
    if not hosts:
        raise _error(url, "no host")
    addresses = tuple(_address(url, host, SENTINEL_PORT if sentinel else 6379) for host in hosts.split(","))
    segments = [s for s in path.split("/")] if path else []
    if sentinel:
        if not segments or not segments[0]:
            raise _error(url, "no service name: the path must be /SERVICE or /SERVICE/DB")
        if len(segments) > 2:
            raise _error(url, "the path must be /SERVICE or /SERVICE/DB")
        db = _db(url, segments[1]) if len(segments) == 2 else 0
        return RedisTarget(url, scheme, tls, addresses, unquote(segments[0]), db, username, password, options)
    if len(addresses) > 1:
        raise _error(url, "several hosts need Sentinel: redis+sentinel://HOST1,HOST2,.../SERVICE")
    if len(segments) > 1:
        raise _error(url, "the path must be /DB")
    db = _db(url, segments[0]) if segments and segments[0] else 0
    return RedisTarget(url, scheme, tls, db=db, username=username, password=password, options=options)


def _options(url: str, query: str, *, tls: bool, sentinel: bool) -> dict[str, str]:
    """The query's OPTIONS, each known and fitting the scheme (TLS files need TLS, sentinel_auth Sentinel)."""
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key not in OPTIONS:
            raise _error(url, f"unknown option {key!r} (known: {', '.join(OPTIONS)})")
        options[key] = value
    if not tls and any(k in options for k in ("ca_file", "cert_file", "key_file")):
        raise _error(url, "ca_file, cert_file and key_file need TLS: use rediss:// or rediss+sentinel://")
    if not sentinel and any(k.startswith("sentinel_") for k in options):
        raise _error(url, "sentinel_auth belongs to redis+sentinel:// URLs")
    if options.get("sentinel_auth", "no") not in ("yes", "no"):
        raise _error(url, "sentinel_auth is yes or no")
    if ("cert_file" in options) != ("key_file" in options):
        raise _error(url, "cert_file and key_file go together")
    return options


def _credentials(url: str, userinfo: str) -> tuple[str | None, str | None]:
    """(username, password) of the user part before ``@``: USER:PASSWORD or :PASSWORD."""
    user, colon, secret = userinfo.partition(":")
    if not colon:  # redis-py reads a lone word as the password; say which it is instead of guessing
        raise _error(url, "the user part must be USER:PASSWORD or :PASSWORD")
    return unquote(user) or None, unquote(secret)


def _address(url: str, text: str, default_port: int) -> tuple[str, int]:
    match = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::(\d*))?", text)
    if match is None:
        raise _error(url, f"{text!r} is not HOST or HOST:PORT")
    host, port = match.group(1).strip("[]"), match.group(2)
    if port is None or port == "":
        return host, default_port
    if not 0 < int(port) < 65536:
        raise _error(url, f"port {port} is out of range (1-65535)")
    return host, int(port)


def _db(url: str, text: str) -> int:
    if not text.isdigit():
        raise _error(url, f"the database {text!r} is not a number (0, 1, ...)")
    return int(text)


def _error(url: str, what: str) -> RedisUrlError:
    return RedisUrlError(f"{redact(url)!r} is not a Redis URL: {what}; accepted forms: {FORMS}")
