"""AWS credentials of a pool, and the boto3 clients made from them: one cache, shared by every hook thread.

A pool's settings name its credentials, never hold them (:mod:`levers9_ec2.settings`):

* ``access_key_id_env`` / ``secret_access_key_env`` (/ ``session_token_env``):
  the variables are read **at each call**, so a rotated key is used at once;
  an unset or empty variable is :class:`AuthenticationFailed` naming the
  variable (never a value);
* ``profile``: a named profile of the shared config and credentials files
  (unknown profile: :class:`AuthenticationFailed`);
* neither: boto3's default chain (environment, SSO, instance role).

:class:`Clients` keeps one ``boto3.Session`` per (credential reference, the
digest of the key values read, region, endpoint) and one client per session,
service and kind. boto3 sessions are not thread-safe, clients are: sessions
and clients are made under one lock and only clients leave it. Two kinds of
EC2 client exist: the *launch* client has botocore's retries off
(``total_max_attempts=1``), so a capacity error (an HTTP 500, which botocore
would retry) reaches the scheduler in one call; every other client keeps
botocore's standard retries. ``endpoint_url`` goes to every EC2 client, and to
STS too unless it is an AWS host (a VPC interface endpoint of EC2 serves EC2
alone; a test double such as moto serves every service). ``close`` (from
``levers9_shutdown``) drops everything. boto3 is imported only when a client
is first made.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from levers9.hooks.errors import AuthenticationFailed
from levers9_ec2.settings import Ec2Settings

__all__ = ["LAUNCH_CONNECT_TIMEOUT_S", "LAUNCH_READ_TIMEOUT_S", "Clients", "Credentials", "credentials"]

#: the launch call's own timeouts: RunInstances answers in a few seconds; past these the plugin asks again
#: with the same ClientToken (see levers9_ec2.launch)
LAUNCH_CONNECT_TIMEOUT_S = 10.0
LAUNCH_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Credentials:
    """What a session is made from; ``describe`` names the reference (never a secret)."""

    #: ``profile 'prod'``, ``keys from $AWS_KEY_ID``, ``the default credential chain``
    describe: str
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def cache_key(self) -> tuple[str, str]:
        """The reference and a digest of the values read (a rotated key makes a new session)."""
        values = "\0".join(v or "" for v in (self.access_key_id, self.secret_access_key, self.session_token))
        return self.describe, hashlib.sha256(values.encode()).hexdigest()


def _read(variable: str, what: str, pool: str) -> str:
    value = os.environ.get(variable, "")
    if not value:
        raise AuthenticationFailed(
            f"pool {pool!r}: environment variable {variable} (the {what}) is not set in the controlplane's environment",
            code="CredentialVariableUnset",
        )
    return value


def credentials(settings: Ec2Settings, pool: str) -> Credentials:
    """The pool's credentials, read now. Raises :class:`AuthenticationFailed` naming an unset variable."""
    if settings.access_key_id_env and settings.secret_access_key_env:
        token = _read(settings.session_token_env, "session token", pool) if settings.session_token_env else None
        return Credentials(
            describe=f"keys from ${settings.access_key_id_env}",
            access_key_id=_read(settings.access_key_id_env, "access key id", pool),
            secret_access_key=_read(settings.secret_access_key_env, "secret access key", pool),
            session_token=token,
        )
    if settings.profile:
        return Credentials(describe=f"profile {settings.profile!r}", profile=settings.profile)
    return Credentials(describe="the default credential chain")


def _serves_sts(endpoint: str | None) -> bool:
    if endpoint is None:
        return False
    host = urlsplit(endpoint).hostname or ""
    return not (host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn"))


class Clients:
    """A thread-safe cache of boto3 sessions and clients (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[Any, ...], Any] = {}
        self._clients: dict[tuple[Any, ...], Any] = {}

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
            self._sessions.clear()
        for client in clients:
            close = getattr(client, "close", None)
            if close is not None:
                close()

    def ec2(self, settings: Ec2Settings, pool: str, region: str, *, launch: bool = False) -> Any:
        """An EC2 client for ``region`` with the pool's credentials; ``launch``: retries off (RunInstances)."""
        return self._client(settings, pool, region, "ec2", launch)

    def sts(self, settings: Ec2Settings, pool: str, region: str) -> Any:
        return self._client(settings, pool, region, "sts", False)

    def _client(self, settings: Ec2Settings, pool: str, region: str, service: str, launch: bool) -> Any:
        creds = credentials(settings, pool)
        endpoint = str(settings.endpoint_url) if settings.endpoint_url is not None else None
        session_key = (*creds.cache_key(), region, endpoint)
        key = (*session_key, service, launch)
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                return client
            session = self._sessions.get(session_key)
            if session is None:
                session = self._session(creds, region, pool)
                self._sessions[session_key] = session
            client = self._make(session, service, region, endpoint, launch, pool)
            self._clients[key] = client
            return client

    @staticmethod
    def _session(creds: Credentials, region: str, pool: str) -> Any:
        import boto3
        import botocore.exceptions

        try:
            return boto3.Session(
                profile_name=creds.profile,
                aws_access_key_id=creds.access_key_id,
                aws_secret_access_key=creds.secret_access_key,
                aws_session_token=creds.session_token,
                region_name=region,
            )
        except botocore.exceptions.ProfileNotFound as exc:
            raise AuthenticationFailed(f"pool {pool!r}: {exc}", code="ProfileNotFound") from None

    @staticmethod
    def _make(session: Any, service: str, region: str, endpoint: str | None, launch: bool, pool: str) -> Any:
        from botocore.config import Config

        if launch:
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=LAUNCH_CONNECT_TIMEOUT_S,
                read_timeout=LAUNCH_READ_TIMEOUT_S,
            )
        else:
            config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=30)
        url = endpoint if service == "ec2" or (service == "sts" and _serves_sts(endpoint)) else None
        return session.client(service, region_name=region, endpoint_url=url, config=config)
