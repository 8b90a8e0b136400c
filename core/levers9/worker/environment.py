"""What ``levers9 worker`` reads from its environment: the variables of :data:`levers9.worker_variables.WORKER_VARIABLES`.

The worker reads no other variable, so a boot script (:mod:`levers9.bootstrap`)
and the worker agree by construction. A ``LEVERS9_*`` variable outside the list
that is a near miss of one (``LEVERS9_DISCONECT_EXIT_S``) is warned about,
naming the variable meant, and otherwise ignored: the worker keeps working. A
value that cannot be used (a number that is not one, an unreadable token or CA
file) is a ValueError naming the variable. Where the token comes from, and how
it is kept from the calls the worker runs, is :mod:`levers9.worker.credentials`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from levers9.proto.tls import read_ca_file
from levers9.worker.credentials import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    discard_token_file,
    read_session_credential,
    scrub_environ,
    take_token_file,
)
from levers9.worker_variables import WORKER_VARIABLES, closest_variable

__all__ = ["default_state_dir", "options_from_env"]

log = logging.getLogger(__name__)

#: how each variable the worker reads becomes an option (the rest are read where they are used)
_OPTIONS: dict[str, tuple[str, type]] = {
    "LEVERS9_CONTROLPLANE_URL": ("controlplane", str),
    "LEVERS9_POOL": ("pool", str),
    "LEVERS9_MACHINE_ID": ("machine_id", str),
    "LEVERS9_CPU_MILLICORES": ("cpu_millicores", int),
    "LEVERS9_MEMORY_MIB": ("memory_mib", int),
    "LEVERS9_DISCONNECT_EXIT_S": ("disconnect_exit_s", float),
    "LEVERS9_WORKER_STATE_DIR": ("state_dir", Path),
    "LEVERS9_MACHINE_IDENTITY": ("machine_identity", str),
    "LEVERS9_SANDBOXES": ("sandboxes", int),
    "LEVERS9_SANDBOXES_WARM": ("sandboxes_warm", int),
}


def options_from_env(environ: dict[str, str] | None = None, *, state_dir: Path | None = None) -> dict[str, Any]:
    """Defaults for the worker command from the variables of :data:`levers9.worker_variables.WORKER_VARIABLES`.

    The token is the session credential an earlier worker process saved in the state directory
    (``state_dir``, else ``LEVERS9_WORKER_STATE_DIR``, else the machine's default; with the worker id
    that process had, which the worker registers as again), else the one in
    ``LEVERS9_TOKEN_FILE`` (read, then deleted), else ``LEVERS9_TOKEN``; reading the process's own
    environment removes both from it, so nothing the worker starts inherits them (see
    :mod:`levers9.worker.credentials`). A ``LEVERS9_*`` variable the worker does not read but that is
    a near miss of one is warned about. Raises ValueError naming the variable when a value, the token
    file or the CA file cannot be used.
    """
    env = os.environ if environ is None else environ
    _warn_near_misses(env)
    out = _options(env)
    token_file, token = env.get(TOKEN_FILE_ENV), env.get(TOKEN_ENV)
    if environ is None:
        scrub_environ()
    where = state_dir or out.get("state_dir")
    if where is None and out.get("machine_id"):
        where = default_state_dir(out["machine_id"])
    out.update(_credential(Path(where) if where is not None else None, token_file, token))
    if env.get("LEVERS9_CONTROLPLANE_CA"):
        out["controlplane_ca"] = env["LEVERS9_CONTROLPLANE_CA"]
    elif env.get("LEVERS9_CONTROLPLANE_CA_FILE"):
        path = env["LEVERS9_CONTROLPLANE_CA_FILE"]
        out["controlplane_ca"] = read_ca_file(path, "LEVERS9_CONTROLPLANE_CA_FILE").decode()
    grace = env.get("LEVERS9_STOP_GRACE_S")
    if grace:
        # the provider SIGKILLs after its grace: leave a few seconds to remove the containers
        out["drain_timeout_s"] = max(1.0, float(grace) - 3.0)
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None and all(p.strip().isdigit() for p in cuda.split(",") if p.strip()):
        out["visible_gpus"] = [int(p) for p in cuda.split(",") if p.strip()]
    return out


def _warn_near_misses(env: Mapping[str, str]) -> None:
    for name in sorted(k for k in env if k.startswith("LEVERS9_") and k not in WORKER_VARIABLES):
        near = closest_variable(name)
        if near is not None:
            log.warning("%s is not a variable the worker reads (ignored); did you mean %s?", name, near)


def _options(env: Mapping[str, str]) -> dict[str, Any]:
    """The options of :data:`_OPTIONS` that are set, each of its type; ValueError naming the variable."""
    out: dict[str, Any] = {}
    for variable, (name, kind) in _OPTIONS.items():
        if env.get(variable):
            try:
                out[name] = kind(env[variable])
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                raise ValueError(f"{variable}={env[variable]!r} is not {what} ({WORKER_VARIABLES[variable]})") from None
    return out


def _credential(state_dir: Path | None, token_file: str | None, token: str | None) -> dict[str, Any]:
    """``token`` (and ``worker_id``): the session credential saved in ``state_dir`` (a join token file is then
    spent and deleted), else the token file's (read, then deleted), else ``token``; none of them: nothing."""
    saved = read_session_credential(state_dir) if state_dir is not None else None
    if saved:
        if token_file:
            discard_token_file(token_file)  # a join token: spent when the session credential was given
        return {"token": saved[0], "worker_id": saved[1]}
    if token_file:
        return {"token": take_token_file(token_file)}
    if token:
        return {"token": token}
    return {}


def default_state_dir(machine_id: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "levers9" / "worker" / (machine_id or f"pid-{os.getpid()}")
