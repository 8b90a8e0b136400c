"""Encryption of secrets at rest, and the format of API tokens.

Workspace secrets and attached clusters' kubeconfigs are encrypted before they
reach the database, so a copied database file or a leaked backup reveals
nothing without the key, which is kept apart from the database (an environment
variable or a file of its own). Fernet is used because it authenticates as well
as encrypts: a tampered row fails to decrypt instead of yielding garbage.

Keys rotate without downtime: the first key encrypts, every listed key
decrypts. An operator prepends a new key, restarts, re-encrypts (see
:meth:`SecretBox.rotate`), then drops the old key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from levers9.state.errors import DecryptionError, SecretKeyError

log = logging.getLogger(__name__)

#: comma-separated Fernet keys; overrides the key file
ENV_KEY = "LEVERS9_SECRET_KEY"
#: the key file used when the config names none, inside the data directory
DEFAULT_KEY_FILE = "secret.key"

_KEY_HELP = (
    "a key is 32 url-safe base64-encoded bytes (44 characters), as made by Fernet.generate_key(): "
    "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
)
_TOKEN_KIND = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def _check_key(key: bytes, source: str) -> bytes:
    try:
        Fernet(key)
    except (ValueError, TypeError):
        # Never echo the key: a near-miss of a real key is still a secret.
        raise SecretKeyError(f"{source} is not a valid secret key; {_KEY_HELP}") from None
    return key


def _keys_from_file(path: Path) -> list[bytes]:
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError:
        raise SecretKeyError(f"secret key file {path} is not plain text; {_KEY_HELP}") from None
    except OSError as exc:
        raise SecretKeyError(f"cannot read secret key file {path}: {exc.strerror or exc}") from None
    if os.name == "posix" and path.stat().st_mode & 0o077:
        log.warning("secret key file %s is readable by other users; chmod 600 it", path)
    keys: list[bytes] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keys.append(_check_key(line.encode("ascii"), f"line {number} of secret key file {path}"))
    if not keys:
        raise SecretKeyError(
            f"secret key file {path} holds no key (blank lines and # comments are skipped); {_KEY_HELP}"
        )
    return keys


def _create_key_file(path: Path) -> None:
    """Write a fresh key so that the file appears complete or not at all.

    Two processes starting together (a controlplane and a CLI command) may both
    find no key: each writes a private temporary file and links it into place;
    the loser's link fails and it reads the winner's key instead of overwriting
    it, which would make everything the winner already encrypted unreadable.
    """
    directory = path.parent
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
    temp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(b"# levers9 secret key: the first key encrypts, every key decrypts. Keep a backup.\n")
            handle.write(Fernet.generate_key() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        else:
            log.info("created secret key file %s", path)
    finally:
        temp.unlink(missing_ok=True)


def load_keys(secret_key_file: str | None, data_dir: str) -> list[bytes]:
    """The keys that encrypt secrets: the first encrypts, all decrypt.

    ``LEVERS9_SECRET_KEY`` wins so containerised deployments can inject the key
    without a file; then the configured file; then ``secret.key`` in the data
    directory, created on first use so a single-machine install needs no setup.
    """
    env = os.environ.get(ENV_KEY, "")
    if env.strip():
        parts = [part.strip() for part in env.split(",")]
        keys = [
            _check_key(part.encode("ascii", "replace"), f"key {index} of {ENV_KEY}")
            for index, part in enumerate(parts, start=1)
            if part
        ]
        return keys
    if secret_key_file:
        path = Path(secret_key_file).expanduser()
        if not path.exists():
            raise SecretKeyError(
                f"secret key file {path} (state.secret_key_file) does not exist; create it with one key per line "
                f"or set {ENV_KEY}; {_KEY_HELP}"
            )
        return _keys_from_file(path)
    path = Path(data_dir).expanduser() / DEFAULT_KEY_FILE
    if not path.exists():
        _create_key_file(path)
    return _keys_from_file(path)


class SecretBox:
    """Encrypts with the first key and decrypts with any, so keys can rotate."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise SecretKeyError(f"no secret key given; {_KEY_HELP}")
        self._fernet = MultiFernet([Fernet(_check_key(key, f"key {i}")) for i, key in enumerate(keys, start=1)])
        self._count = len(keys)

    @classmethod
    def from_config(cls, secret_key_file: str | None, data_dir: str) -> SecretBox:
        """The box for a config: ``SecretBox.from_config(config.state.secret_key_file, config.data_dir)``."""
        return cls(load_keys(secret_key_file, data_dir))

    def __repr__(self) -> str:
        return f"SecretBox({self._count} key{'s' if self._count != 1 else ''})"

    def encrypt(self, plaintext: bytes) -> bytes:
        return self._fernet.encrypt(plaintext)

    def decrypt(self, ciphertext: bytes) -> bytes:
        try:
            return self._fernet.decrypt(ciphertext)
        except InvalidToken:
            raise DecryptionError(
                f"a stored secret cannot be decrypted with the {self._count} configured key(s): the key does not "
                f"match the one it was encrypted with (or the row was altered). After a key rotation keep the old "
                f"key listed after the new one ({ENV_KEY}=NEW,OLD or one key per line in the key file) until every "
                f"secret has been re-encrypted"
            ) from None

    def rotate(self, ciphertext: bytes) -> bytes:
        """Re-encrypt with the first key, so that older keys can then be dropped."""
        try:
            return self._fernet.rotate(ciphertext)
        except InvalidToken:
            self.decrypt(ciphertext)  # raises the explanatory error
            raise

    def seal(self, value: str, *, context: str) -> bytes:
        """Encrypt ``value`` bound to ``context`` (where it is stored, such as workspace and name).

        Fernet has no associated data, so the binding travels inside the
        ciphertext: someone able to write the database cannot move one
        workspace's secret into another's row and have it accepted there.
        """
        return self.encrypt(json.dumps({"c": context, "v": value}, separators=(",", ":")).encode())

    def unseal(self, ciphertext: bytes, *, context: str) -> str:
        """Decrypt what :meth:`seal` made, checking it was sealed for this same ``context``."""
        payload = json.loads(self.decrypt(ciphertext))
        if not isinstance(payload, dict) or payload.get("c") != context or not isinstance(payload.get("v"), str):
            raise DecryptionError(
                f"a stored secret was encrypted for another record than {context!r}; the database row was "
                f"copied or altered, so it is refused"
            )
        value: str = payload["v"]
        return value


def new_token(kind: str) -> str:
    """A fresh API token, ``l9_<kind>_<random>``.

    The readable prefix lets secret scanners and operators recognise a levers9
    token and its kind in a leaked log; the 256 random bits are what make it
    unguessable.
    """
    if not _TOKEN_KIND.match(kind):
        raise ValueError(f"token kind {kind!r} must be 1-16 lowercase letters or digits, starting with a letter")
    return f"l9_{kind}_{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    """The form of a token that is stored: its SHA-256, hex.

    A slow password hash (bcrypt, scrypt) exists to make guessing low-entropy
    passwords expensive; tokens are 256-bit random values that cannot be
    guessed, so a fast hash loses nothing, and it keeps verification cheap on
    every RPC while still letting the database be looked up by hash directly.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


__all__ = ["DEFAULT_KEY_FILE", "ENV_KEY", "SecretBox", "hash_token", "load_keys", "new_token"]
