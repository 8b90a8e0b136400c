"""OCI SDK clients for a pool's settings and region: how they authenticate, and how they are shared.

A pool's settings name its credentials by reference only (``auth``,
``config_file``, ``profile``, ``key_file``, ``pass_phrase_env``); this module
turns them into a signer and a ``ComputeClient`` / ``IdentityClient`` pair for
one region, both pointed at ``service_endpoint`` when the settings give one.

Invariants:

* **One set of clients per thread.** The SDK does not document its clients
  as safe for concurrent calls (each holds one ``requests`` session and
  mutable retry and circuit-breaker state), and hooks run on several threads
  at once. So nothing of the SDK is shared between threads: :class:`ClientCache`
  keeps the clients (and the signer they use) per thread, per
  (auth, config_file, profile, key_file, pass_phrase_env, region, endpoint).
  No lock is held during a call, so a slow launch never holds up a listing.
  Every client made is also recorded, so :meth:`ClientCache.close` closes all
  their sessions at ``levers9_shutdown``.
* **No SDK retries, no circuit breaker.** Every client is made with
  ``NoneRetryStrategy`` and ``NoCircuitBreakerStrategy`` (whatever
  ``OCI_SDK_DEFAULT_RETRY_ENABLED`` says): a capacity answer must reach the
  planner in one call, and throttling is retried by the core, which knows
  the other candidates. Calls time out after :data:`CONNECT_TIMEOUT_S` /
  :data:`READ_TIMEOUT_S`, inside the core's hook deadline.
* **No secret leaves.** The pass phrase is read from the environment variable
  ``pass_phrase_env`` names, straight into the signer; no message names more
  than the file paths and the variable's name.

Failures: a config file that cannot be read, a profile it lacks, a signing key
or security token that cannot be read or loaded, an unset pass phrase
variable: :class:`~levers9.hooks.errors.AuthenticationFailed` naming the file
(or variable) and the profile. ``instance_principal`` and
``resource_principal`` signers are made the SDK's way from the host's
identity (the instance metadata service, the resource principal environment);
a failure to get one is ``AuthenticationFailed`` too.

The ``oci`` package is imported inside the functions only.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.hooks.errors import AuthenticationFailed, InvalidRequest

__all__ = ["CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "ClientCache", "ClientKey", "Clients"]

#: seconds to connect to the API, and to wait for its answer (one call fits inside the core's 30 s deadline)
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 25.0


@dataclass(frozen=True)
class ClientKey:
    """What decides which clients a call needs: the credentials' references, the region and the endpoint."""

    auth: str
    config_file: str
    profile: str
    key_file: str | None
    pass_phrase_env: str | None
    #: None: the profile's (or the principal's) own region
    region: str | None
    endpoint: str | None

    @classmethod
    def of(cls, settings: Any, region: str | None) -> ClientKey:
        endpoint = str(settings.service_endpoint).rstrip("/") if settings.service_endpoint else None
        return cls(
            auth=settings.auth,
            config_file=str(Path(settings.config_file).expanduser()),
            profile=settings.profile,
            key_file=str(Path(settings.key_file).expanduser()) if settings.key_file else None,
            pass_phrase_env=settings.pass_phrase_env,
            region=region,
            endpoint=endpoint,
        )

    @property
    def who(self) -> str:
        """How these clients authenticate, for messages (paths and names, never secrets)."""
        if self.auth in ("instance_principal", "resource_principal"):
            return f"the host's {self.auth.replace('_', ' ')}"
        return f"profile {self.profile!r} of {self.config_file}"


@dataclass
class Clients:
    """A ComputeClient and an IdentityClient for one region, used by one thread only."""

    key: ClientKey
    compute: Any
    identity: Any
    #: the region the clients call (the key's, else the profile's or principal's own)
    region: str

    def close(self) -> None:
        for client in (self.compute, self.identity):
            session = getattr(getattr(client, "base_client", None), "session", None)
            if session is not None:
                session.close()


class ClientCache:
    """Clients per thread and :class:`ClientKey` (see the module docstring)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made: list[Clients] = []

    def get(self, settings: Any, region: str | None) -> Clients:
        """This thread's clients for ``settings`` in ``region`` (None: the profile's region), made on first use."""
        key = ClientKey.of(settings, region)
        mine: dict[ClientKey, Clients] | None = getattr(self._local, "clients", None)
        if mine is None:
            mine = self._local.clients = {}
        clients = mine.get(key)
        if clients is None:
            clients = _make(key)
            mine[key] = clients
            with self._lock:
                self._made.append(clients)
        return clients

    def made(self) -> list[Clients]:
        """Every set of clients made and not yet closed, of any thread."""
        with self._lock:
            return list(self._made)

    def close(self) -> None:
        """Close every client made so far (any thread's); later calls make new ones."""
        with self._lock:
            made, self._made = self._made, []
        self._local = threading.local()
        for clients in made:
            clients.close()


def _make(key: ClientKey) -> Clients:
    import oci

    config, signer = _credentials(key)
    region = key.region or config.get("region") or getattr(signer, "region", None)
    if not region:
        raise InvalidRequest(
            f"no OCI region for {key.who}: give the pool a region (region: us-ashburn-1) or the profile one",
            code="MissingRegion",
        )
    config = {**config, "region": region}
    options: dict[str, Any] = {
        "signer": signer,
        "retry_strategy": oci.retry.NoneRetryStrategy(),
        "circuit_breaker_strategy": oci.circuit_breaker.NoCircuitBreakerStrategy(),
        "timeout": (CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
    }
    if key.endpoint:
        options["service_endpoint"] = key.endpoint
    compute = oci.core.ComputeClient(config, **options)
    identity = oci.identity.IdentityClient(config, **options)
    return Clients(key=key, compute=compute, identity=identity, region=region)


def _credentials(key: ClientKey) -> tuple[dict[str, Any], Any]:
    """The SDK config (without secrets) and the signer for ``key``'s auth."""
    import oci

    if key.auth == "instance_principal":
        try:
            return {}, oci.auth.signers.InstancePrincipalsSecurityTokenSigner()
        except Exception as exc:  # the SDK raises many kinds here; none says more than its message
            raise AuthenticationFailed(
                f"could not get an instance principal token from this host's metadata service: {type(exc).__name__}",
                code="InstancePrincipal",
            ) from exc
    if key.auth == "resource_principal":
        try:
            return {}, oci.auth.signers.get_resource_principals_signer()
        except Exception as exc:
            raise AuthenticationFailed(
                f"could not get a resource principal signer from this environment: {type(exc).__name__}",
                code="ResourcePrincipal",
            ) from exc
    config = _profile(key)
    key_file = key.key_file or config.get("key_file")
    if not key_file:
        raise AuthenticationFailed(f"{key.who} names no key_file, and the pool's settings give none", code="NoKeyFile")
    key_file = str(Path(key_file).expanduser())
    pass_phrase = _pass_phrase(key, config)
    try:
        private_key = oci.signer.load_private_key_from_file(key_file, pass_phrase)
    except OSError as exc:
        raise AuthenticationFailed(
            f"cannot read the signing key {key_file} of {key.who}: {exc.strerror or type(exc).__name__}",
            code="KeyFileUnreadable",
        ) from exc
    except (oci.exceptions.InvalidPrivateKey, ValueError, TypeError) as exc:
        raise AuthenticationFailed(
            f"the signing key {key_file} of {key.who} cannot be loaded (not a private key, or a wrong or "
            f"missing pass phrase{f' in ${key.pass_phrase_env}' if key.pass_phrase_env else ''})",
            code="InvalidPrivateKey",
        ) from exc
    config = {k: v for k, v in config.items() if k not in ("pass_phrase", "key_content")}
    config["key_file"] = key_file
    if key.auth == "security_token":
        token_file = config.get("security_token_file")
        if not token_file:
            raise AuthenticationFailed(
                f"{key.who} has no security_token_file (run `oci session authenticate`)", code="NoSecurityToken"
            )
        token_path = Path(token_file).expanduser()
        try:
            token = token_path.read_text().strip()
        except OSError as exc:
            raise AuthenticationFailed(
                f"cannot read the security token {token_path} of {key.who}: {exc.strerror or type(exc).__name__}",
                code="SecurityTokenUnreadable",
            ) from exc
        return config, oci.auth.signers.SecurityTokenSigner(token, private_key)
    missing = [name for name in ("tenancy", "user", "fingerprint") if not config.get(name)]
    if missing:
        raise AuthenticationFailed(f"{key.who} lacks {', '.join(missing)}", code="InvalidConfig")
    signer = oci.signer.Signer(
        tenancy=config["tenancy"],
        user=config["user"],
        fingerprint=config["fingerprint"],
        private_key_file_location=key_file,
        private_key_content=_pem(private_key),
    )
    return config, signer


def _profile(key: ClientKey) -> dict[str, Any]:
    """The profile's entries, read the SDK's way (``oci.config.from_file``)."""
    import oci

    path = key.config_file
    if not os.access(path, os.R_OK):
        raise AuthenticationFailed(
            f"cannot read the OCI config file {path} (profile {key.profile!r})", code="ConfigFile"
        )
    try:
        return dict(oci.config.from_file(path, key.profile))
    except oci.exceptions.ProfileNotFound as exc:
        raise AuthenticationFailed(
            f"the OCI config file {path} has no profile {key.profile!r}", code="Profile"
        ) from exc
    except oci.exceptions.InvalidKeyFilePath as exc:
        if key.key_file:
            # the profile's own key_file is missing, but the pool names another: read the profile without it
            return _raw_profile(path, key.profile)
        raise AuthenticationFailed(
            f"the key_file of profile {key.profile!r} in {path} is not a readable file", code="KeyFileUnreadable"
        ) from exc
    except (oci.exceptions.ConfigFileNotFound, oci.exceptions.InvalidConfig, ValueError) as exc:
        raise AuthenticationFailed(
            f"the OCI config file {path} (profile {key.profile!r}) cannot be used: {type(exc).__name__}",
            code="ConfigFile",
        ) from exc


def _raw_profile(path: str, profile: str) -> dict[str, Any]:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return dict(parser[profile])


def _pass_phrase(key: ClientKey, config: dict[str, Any]) -> str | None:
    if key.pass_phrase_env:
        value = os.environ.get(key.pass_phrase_env)
        if value is None:
            raise AuthenticationFailed(
                f"the pass phrase variable ${key.pass_phrase_env} of {key.who} is not set", code="PassPhraseUnset"
            )
        return value
    phrase = config.get("pass_phrase")
    return str(phrase) if phrase else None


def _pem(private_key: Any) -> bytes:
    """The loaded key as unencrypted PEM, in memory only, so the signer never reads the file (or phrase) again."""
    from cryptography.hazmat.primitives import serialization

    pem: bytes = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem
