"""The agent's state directory and its credential file, ``<state dir>/agent.json``.

``levers9 agent join`` spends a join token for the agent's own long-lived
credential and keeps it here; ``levers9 agent run`` (what the service unit
runs) reads it back. Invariants:

* The file is written whole or not at all (a 0600 temporary file, then one
  rename), and only its owner may read it: the credential lets whoever holds
  it receive this machine's orders, including workers' secrets.
* The directory is created 0700.
* A file that others may read, that is not a regular file or that does not
  hold what a join wrote is refused (:class:`CredentialError`, a
  ``ValueError``) naming the file and what is wrong; it is never rewritten
  or deleted here, so nothing the operator has is lost.
* :class:`NotJoined` (a :class:`CredentialError`) means there is no file: the
  machine never joined with this state directory.
* :func:`to_json` and :func:`from_json` are that file's text and its reading,
  for a credential kept elsewhere (in Kubernetes mode, a Secret:
  :mod:`levers9.agent.k8s_credential`); the same checks, the same messages.

Standard library only.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CREDENTIAL_FILE",
    "STATE_DIR_ENV",
    "AgentCredential",
    "CredentialError",
    "NotJoined",
    "default_state_dir",
    "from_json",
    "load",
    "save",
    "to_json",
]

STATE_DIR_ENV = "LEVERS9_AGENT_DIR"
CREDENTIAL_FILE = "agent.json"
_AGAIN = "join again into an empty --state-dir"


class CredentialError(ValueError):
    """The credential file cannot be used; the message names the file and why."""


class NotJoined(CredentialError):
    """There is no credential file: the machine has not joined (with this state directory)."""


@dataclass(frozen=True)
class AgentCredential:
    """What Join answered, and how to reach the controlplane again."""

    agent_id: str
    token: str
    controlplane: str
    provider: str
    #: the CA certificate (PEM) the controlplane's certificate is verified against; None: the system's store
    ca_pem: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: None: an operator's agent (shared pools)
    workspace: str | None = None
    #: joined with --insecure (plain-text gRPC, development only)
    insecure: bool = False

    def __repr__(self) -> str:  # never show the token in a log or a traceback
        return f"AgentCredential(agent_id={self.agent_id!r}, controlplane={self.controlplane!r})"


def default_state_dir() -> Path:
    """``$LEVERS9_AGENT_DIR``, else ``/var/lib/levers9/agent`` as root, else ``~/.levers9/agent``."""
    override = os.environ.get(STATE_DIR_ENV, "").strip()
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path("/var/lib/levers9/agent")
    return Path.home() / ".levers9" / "agent"


def to_json(credential: AgentCredential) -> str:
    """The credential's JSON, as ``agent.json`` holds it (the token included: keep it where only the agent reads)."""
    return json.dumps(asdict(credential), indent=2, sort_keys=True) + "\n"


def from_json(text: str, where: str, *, again: str = _AGAIN) -> AgentCredential:
    """The credential in ``text`` (what :func:`to_json` wrote), read from ``where`` (named in every error).

    ``again``: what the operator does about a credential that is not what a join wrote.
    :raises CredentialError: it is not JSON, or not what a join wrote.
    """
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise CredentialError(f"{where} is not JSON ({exc}); {again}") from None
    return _parse(data, where, again)


def save(state_dir: Path, credential: AgentCredential) -> Path:
    """Write ``credential`` to ``<state_dir>/agent.json`` (0600, whole or not at all); returns the path."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / CREDENTIAL_FILE
    partial = state_dir / f".{CREDENTIAL_FILE}.partial"
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(to_json(credential))
        file.flush()
        os.fsync(file.fileno())
    partial.replace(path)
    return path


def load(state_dir: Path) -> AgentCredential:
    """The credential in ``<state_dir>/agent.json``.

    :raises NotJoined: there is no such file.
    :raises CredentialError: others may read it, it is not a regular file, or it is not what a join wrote.
    """
    path = state_dir / CREDENTIAL_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise NotJoined(
            f"{path} does not exist: this machine has not joined; run `levers9 agent join` (with the command "
            "`levers9 machine create` printed) or pass the --state-dir it joined with"
        ) from None
    except OSError as exc:
        raise CredentialError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise CredentialError(
                f"{path} must be a regular file only its owner may read (mode 0600), not "
                f"{stat.filemode(info.st_mode)}: fix it with `chmod 600 {path}`"
            )
        text = file.read()
    return from_json(text, str(path))


def _parse(data: Any, path: str, again: str) -> AgentCredential:
    if not isinstance(data, dict):
        raise CredentialError(f"{path} must hold a JSON object, not {type(data).__name__}")
    missing = [key for key in ("agent_id", "token", "controlplane", "provider") if not isinstance(data.get(key), str)]
    if missing:
        raise CredentialError(f"{path} lacks {', '.join(missing)} (text fields): {again}")
    labels = data.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise CredentialError(f"{path}: labels must be an object of text values")
    ca_pem, workspace = data.get("ca_pem"), data.get("workspace")
    if ca_pem is not None and not isinstance(ca_pem, str):
        raise CredentialError(f"{path}: ca_pem must be PEM text or null")
    if workspace is not None and not isinstance(workspace, str):
        raise CredentialError(f"{path}: workspace must be text or null")
    return AgentCredential(
        agent_id=data["agent_id"],
        token=data["token"],
        controlplane=data["controlplane"],
        provider=data["provider"],
        ca_pem=ca_pem or None,
        labels=dict(labels),
        workspace=workspace or None,
        insecure=bool(data.get("insecure", False)),
    )
