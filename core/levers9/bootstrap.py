"""How a booted machine starts its levers9 worker: one text for every provider.

A provider never writes its own boot script. It hands
:class:`~levers9.hooks.types.WorkerBootstrap` (``ProvisionRequest.bootstrap``)
to one of the renderers here and passes the result to the machine as it is:
:func:`cloud_init` as a VM's user data (EC2, OCI, Lambda), :func:`shell_script`
where a provider runs a command instead of cloud-init, :func:`container_spec`
for a pod or a container. Invariants:

* **The worker reads only these variables.** :data:`~levers9.worker_variables.WORKER_VARIABLES` is the
  complete list of what ``levers9 worker`` reads from its environment (the
  worker warns about a ``LEVERS9_*`` name that is a near miss of one);
  ``WorkerBootstrap.environment`` may hold only the ones no bootstrap field
  carries (:func:`check_environment`), so a provider cannot invent settings
  the worker silently ignores.
* **The token is in a 0600 file or a secret, never elsewhere.** The script
  writes it to ``/etc/levers9/token`` under ``umask 077`` and passes the
  worker only that path (``LEVERS9_TOKEN_FILE``); it is on no command line
  and not in the environment file. A container spec carries it apart from
  the plain environment (``secret_env``), for the provider to store as a
  secret. User data itself is readable on the machine (EC2's instance
  metadata service serves it to any local process): the token is therefore a
  *join* token, spent by the worker's first registration, after which the
  worker holds a session credential of its own (see
  :mod:`levers9.worker.credentials`).
* **Same text everywhere.** The renderers depend on the bootstrap alone, so
  two providers given the same bootstrap boot identical machines, and the
  contract kit can run the very script a provider was asked to pass.

The script runs the worker three ways, first that works: the ``levers9`` on
``PATH`` when ``levers9 --version`` is exactly ``levers9 <levers9_version>``;
else ``docker run`` of ``worker_image`` (host network, never restarted: the
join token is spent by the first registration, so a worker that exits leaves
its machine to the reconciler, which replaces it; ``--gpus all`` when
``LEVERS9_GPU_COUNT`` is above 0); else levers9's own wheel, fetched from the
controlplane (``wheel_url``, the CA trusted, the sha256 ``wheel_sha256``
checked before the file is kept) and installed with pip (in a virtualenv at
``/opt/levers9`` when ``python3 -m venv`` works), its third-party requirements
from the index by their own names. Never ``levers9`` by name from an index:
that name is another project's there. Without a ``wheel_url`` that third path
fails, saying so.

The pool's runtime (``WorkerBootstrap.runtime``) changes two things. On the
docker path a ``runc`` or ``gvisor`` worker container gets
:func:`levers9.worker_container.docker_run_flags`: what the agent gives the
same container on a joined machine (capabilities, unconfined seccomp,
AppArmor and system paths, the host's cgroup namespace and tree, the host's
network records, Docker's init, a named volume for the state directory);
a ``process`` worker container gets none of it. On the two paths that run the
worker on the machine itself (as root), a ``runc`` worker needs the
machine's ``runc``: a missing one is installed with ``apt-get install -y
runc`` where apt-get exists (logged; a failed install is logged and the
worker started anyway, to refuse the pool in its own words). ``runsc`` for
a ``gvisor`` pool must be in the machine image: its absence is logged, not
mended. Every path it touches is
under ``$LEVERS9_BOOT_ROOT`` (empty on a real machine), so an emulated boot
runs it in a temporary directory; it logs to
``/var/log/levers9-bootstrap.log``.

Failures: every renderer raises ValueError naming the field or variable at
fault and what would be accepted (an unknown variable, a value with a line
break, user data over :data:`USER_DATA_MAX_BYTES`, a container spec without
``worker_image``).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from levers9.hooks.types import WorkerBootstrap
from levers9.wheel_fetch import FETCH_PROGRAM
from levers9.worker_container import DEVICES, OCI_RUNTIMES, docker_run_flags
from levers9.worker_variables import BOOTSTRAP_FIELD_VARIABLES, WORKER_VARIABLES, closest_variable

__all__ = [
    "BOOT_DIR",
    "CA_PATH",
    "ENV_PATH",
    "LOG_PATH",
    "SCRIPT_PATH",
    "TOKEN_PATH",
    "USER_DATA_MAX_BYTES",
    "BootstrapContainer",
    "check_environment",
    "cloud_init",
    "container_spec",
    "shell_script",
    "worker_environment",
]

#: where the script keeps what it writes, on the machine (under ``$LEVERS9_BOOT_ROOT`` in an emulated boot)
BOOT_DIR = "/etc/levers9"
SCRIPT_PATH = f"{BOOT_DIR}/bootstrap.sh"
TOKEN_PATH = f"{BOOT_DIR}/token"
CA_PATH = f"{BOOT_DIR}/ca.pem"
ENV_PATH = f"{BOOT_DIR}/worker.env"
LOG_PATH = "/var/log/levers9-bootstrap.log"
#: the worker's state directory unless ``environment`` names another
STATE_DIR = "/var/lib/levers9/worker"
#: the largest user data :func:`cloud_init` renders: EC2's limit (16 KB before base64), the smallest of the clouds
USER_DATA_MAX_BYTES = 16 * 1024
#: the container name the docker path uses (a re-run of the script replaces it)
CONTAINER_NAME = "levers9-worker"

_EOF = "LEVERS9_END_OF_FILE"


class BootstrapContainer(BaseModel):
    """The worker as one container (Kubernetes pod, docker container): what a container provider runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str
    command: list[str] = Field(default_factory=lambda: ["levers9", "worker"])
    #: the plain environment (no secret in it)
    env: dict[str, str] = Field(default_factory=dict)
    #: store these as a secret (a Kubernetes Secret, say) and expose them to the container as variables
    secret_env: dict[str, str] = Field(default_factory=dict, repr=False)


def check_environment(bootstrap: WorkerBootstrap) -> None:
    """ValueError unless ``bootstrap`` can be rendered: known variables only, values that fit on a line.

    ``environment`` may hold the :data:`~levers9.worker_variables.WORKER_VARIABLES` that no field carries;
    the text fields may not hold line breaks (they go into an environment file
    and a script), nor may the token hold whitespace.
    """
    allowed = sorted(set(WORKER_VARIABLES) - set(BOOTSTRAP_FIELD_VARIABLES))
    for name, value in bootstrap.environment.items():
        if name in BOOTSTRAP_FIELD_VARIABLES:
            raise ValueError(
                f"WorkerBootstrap.environment: {name} is carried by the field "
                f"{BOOTSTRAP_FIELD_VARIABLES[name]!r}; set that field instead"
            )
        if name not in WORKER_VARIABLES:
            near = closest_variable(name)
            hint = f" (did you mean {near}?)" if near else ""
            raise ValueError(
                f"WorkerBootstrap.environment: the worker does not read {name}{hint}; accepted: {', '.join(allowed)}"
            )
        _one_line(f"WorkerBootstrap.environment[{name!r}]", value)
    _count(bootstrap)
    for field in ("controlplane_url", "machine_id", "pool", "levers9_version", "runtime"):
        value = getattr(bootstrap, field)
        if not value.strip():
            raise ValueError(f"WorkerBootstrap.{field} is empty; the worker cannot start without it")
        _one_line(f"WorkerBootstrap.{field}", value)
    if bootstrap.worker_image is not None:
        _one_line("WorkerBootstrap.worker_image", bootstrap.worker_image)
    if not bootstrap.token or any(c.isspace() for c in bootstrap.token):
        raise ValueError("WorkerBootstrap.token must be a non-empty token without whitespace")
    if any(line.strip() == _EOF for line in bootstrap.controlplane_ca.splitlines()):
        raise ValueError(f"WorkerBootstrap.controlplane_ca holds the line {_EOF}; it must be PEM certificates only")
    if bootstrap.wheel_url:
        if not bootstrap.wheel_url.startswith(("https://", "http://")):
            raise ValueError(f"WorkerBootstrap.wheel_url {bootstrap.wheel_url!r} must be an https:// or http:// URL")
        _one_line("WorkerBootstrap.wheel_url", bootstrap.wheel_url)
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+\.whl", bootstrap.wheel_url.rsplit("/", 1)[-1]):
            raise ValueError(
                f"WorkerBootstrap.wheel_url {bootstrap.wheel_url!r} must end in a wheel's file name (levers9-X-py3-none-any.whl)"
            )
        if not re.fullmatch(r"[0-9a-f]{64}", bootstrap.wheel_sha256):
            raise ValueError(
                f"WorkerBootstrap.wheel_sha256 {bootstrap.wheel_sha256!r} must be the wheel's sha256: 64 hex digits"
            )


def _one_line(what: str, value: str) -> None:
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{what} holds a line break or NUL; it must be one line of text")


def _count(bootstrap: WorkerBootstrap) -> int:
    raw = bootstrap.environment.get("LEVERS9_GPU_COUNT", "0").strip() or "0"
    if not raw.isdigit():
        raise ValueError(
            f"WorkerBootstrap.environment['LEVERS9_GPU_COUNT'] is {raw!r}; it must be a whole number of GPUs (0 or more)"
        )
    return int(raw)


def worker_environment(bootstrap: WorkerBootstrap) -> dict[str, str]:
    """The worker's whole environment (the CA as PEM text), never the token: a provider adds the token its own way."""
    check_environment(bootstrap)
    env = {
        "LEVERS9_CONTROLPLANE_URL": bootstrap.controlplane_url,
        "LEVERS9_MACHINE_ID": bootstrap.machine_id,
        "LEVERS9_POOL": bootstrap.pool,
    }
    if bootstrap.controlplane_ca:
        env["LEVERS9_CONTROLPLANE_CA"] = bootstrap.controlplane_ca
    env.update(bootstrap.environment)
    return env


def _devices_step() -> str:
    """Set ``DEVICES`` to the ``--device`` flags of :data:`~levers9.worker_container.DEVICES` this machine has.

    A missing device is said in the log and left out, not fatal: FUSE (``modprobe fuse`` is tried first) only
    mounts volumes, and a worker without it refuses those calls with that reason.
    """
    lines = ['  DEVICES=""\n']
    for device in DEVICES:
        if device == "/dev/fuse":
            lines.append(f"  if [ ! -e {device} ]; then modprobe fuse >/dev/null 2>&1 || true; fi\n")
        lines.append(
            f'  if [ -e {device} ]; then DEVICES="$DEVICES --device={device}:{device}:rwm"; '
            f'else say "no {device} on this machine: its worker cannot mount volumes"; fi\n'
        )
    return "".join(lines)


def _heredoc(target: str, text: str) -> str:
    """Shell lines writing ``text`` to ``target`` (a shell word) through cat's stdin: no argument holds it."""
    body = text if text.endswith("\n") else text + "\n"
    return f"cat >{target} <<'{_EOF}'\n{body}{_EOF}\n"


def shell_script(bootstrap: WorkerBootstrap) -> str:
    """The POSIX ``sh`` script that writes the token, the CA and the environment file, then starts the worker."""
    check_environment(bootstrap)
    q = shlex.quote
    version = bootstrap.levers9_version
    env = {k: v for k, v in worker_environment(bootstrap).items() if k != "LEVERS9_CONTROLPLANE_CA"}
    env_lines = "".join(f"{name}={value}\n" for name, value in env.items())
    gpus = "--gpus all " if _count(bootstrap) > 0 else ""
    access = "".join(f"{q(flag)} " for flag in docker_run_flags(bootstrap.runtime, bootstrap.machine_id, devices=False))
    oci = bootstrap.runtime in OCI_RUNTIMES
    if oci:
        access += "$DEVICES "  # unquoted: one --device flag for each of worker_container.DEVICES the machine has
    parts = [
        "#!/bin/sh\n",
        f"# levers9 worker bootstrap: machine {bootstrap.machine_id} of pool {bootstrap.pool} "
        f"(runtime {bootstrap.runtime}), levers9 {version}\n",
        "# Rendered by levers9.bootstrap; every path is under $LEVERS9_BOOT_ROOT (empty on a real machine).\n",
        "set -eu\n",
        'ROOT="${LEVERS9_BOOT_ROOT:-}"\n',
        f'DIR="$ROOT{BOOT_DIR}"\nLOG="$ROOT{LOG_PATH}"\nTOKEN_FILE="$ROOT{TOKEN_PATH}"\n',
        f'CA_FILE="$ROOT{CA_PATH}"\nENV_FILE="$ROOT{ENV_PATH}"\n',
        f"VERSION={q(version)}\n",
        'PATH="$ROOT/opt/levers9/bin:$PATH"\nexport PATH\n',
        "umask 077\n",
        'mkdir -p "$DIR" "${LOG%/*}"\n',
        'say() { printf \'%s levers9-bootstrap: %s\\n\' "$(date -u +%FT%TZ 2>/dev/null || true)" "$*" '
        '>>"$LOG"; printf \'levers9-bootstrap: %s\\n\' "$*" >&2; }\n',
        'fail() { say "$*"; exit 1; }\n',
        # the join token and the CA: files only root may read, their contents through cat's stdin
        _heredoc('"$TOKEN_FILE"', bootstrap.token),
    ]
    if bootstrap.controlplane_ca:
        parts.append(_heredoc('"$CA_FILE"', bootstrap.controlplane_ca))
    parts.append(_heredoc('"$ENV_FILE"', env_lines.rstrip("\n")))
    if bootstrap.controlplane_ca:
        parts.append('printf \'LEVERS9_CONTROLPLANE_CA_FILE=%s\\n\' "$CA_FILE" >>"$ENV_FILE"\n')
    if "LEVERS9_WORKER_STATE_DIR" not in env:
        parts.append(f'printf \'LEVERS9_WORKER_STATE_DIR=%s\\n\' "$ROOT{STATE_DIR}" >>"$ENV_FILE"\n')
    parts.append(
        'load_env() { while IFS= read -r line; do if [ -n "$line" ]; then export "$line"; fi; done <"$ENV_FILE"; }\n'
    )
    parts.append(_runtime_check(bootstrap.runtime))
    parts.append(
        # 1. the right levers9 is installed (a prepared image): run it
        'if command -v levers9 >/dev/null 2>&1 && [ "$(levers9 --version 2>/dev/null || true)" = "levers9 $VERSION" ]'
        "; then\n"
        '  say "starting the installed levers9 $VERSION worker"\n'
        "  runtime_check\n"
        "  load_env\n"
        '  LEVERS9_TOKEN_FILE="$TOKEN_FILE" exec levers9 worker >>"$LOG" 2>&1\n'
        "fi\n"
    )
    if bootstrap.worker_image:
        image = q(bootstrap.worker_image)
        parts.append(
            # 2. docker and an image: the worker as a container on the host's network
            "if command -v docker >/dev/null 2>&1; then\n"
            f'  say "starting the worker container {bootstrap.worker_image}"\n'
            f"  docker rm -f {CONTAINER_NAME} >/dev/null 2>&1 || true\n"
            + (_devices_step() if oci else "")
            + f"  exec docker run -d --name {CONTAINER_NAME} --network host {gpus}"
            '--env-file "$ENV_FILE" -e LEVERS9_TOKEN_FILE="$TOKEN_FILE" -v "$DIR:$DIR:ro" '
            f'{access}{image} levers9 worker >>"$LOG" 2>&1\n'
            "fi\n"
        )
    parts.append(_install_step(bootstrap))
    return "".join(parts)


def _install_step(bootstrap: WorkerBootstrap) -> str:
    """Path 3: levers9's own wheel fetched from the controlplane, its hash checked, installed with pip (never
    ``levers9`` by name from an index: another project owns that name there); without a wheel URL, a failure."""
    docker = ", no docker for the worker image" if bootstrap.worker_image else ""
    if not bootstrap.wheel_url:
        return (
            f'fail "no levers9 $VERSION on PATH{docker}, and the controlplane gave no wheel to install it from: '
            'use a machine image with levers9 $VERSION or Docker"\n'
        )
    q = shlex.quote
    ca = '"$CA_FILE"' if bootstrap.controlplane_ca else "''"
    return (
        # 3. install levers9's own wheel with pip: into a virtualenv when python3 can make one, else the system's
        f'command -v python3 >/dev/null 2>&1 || fail "no levers9 $VERSION on PATH{docker}, and no python3 to install '
        'it with"\n'
        f"WHEEL_URL={q(bootstrap.wheel_url)}\nWHEEL_SHA256={q(bootstrap.wheel_sha256)}\n"
        f'WHEEL_FILE="$DIR/{bootstrap.wheel_url.rsplit("/", 1)[-1]}"\n'
        'say "installing levers9 $VERSION from the controlplane\'s wheel $WHEEL_URL"\n'
        'if python3 -m venv "$ROOT/opt/levers9" >>"$LOG" 2>&1; then\n'
        '  PY="$ROOT/opt/levers9/bin/python"\n'
        "else\n"
        "  PY=python3\n"
        "  PIP_BREAK_SYSTEM_PACKAGES=1\n"
        "  export PIP_BREAK_SYSTEM_PACKAGES\n"
        "fi\n"
        f'"$PY" - "$WHEEL_URL" "$WHEEL_SHA256" "$WHEEL_FILE" {ca} >>"$LOG" 2>&1 <<\'L9FETCH\' || '
        'fail "could not fetch levers9\'s wheel from $WHEEL_URL with sha256 $WHEEL_SHA256 (see $LOG)"\n'
        f"{FETCH_PROGRAM}L9FETCH\n"
        '"$PY" -m pip install --quiet "levers9 @ file://$WHEEL_FILE" >>"$LOG" 2>&1 || '
        'fail "pip could not install levers9 $VERSION from $WHEEL_FILE (see $LOG)"\n'
        'say "starting the levers9 $VERSION worker installed from the controlplane\'s wheel"\n'
        "runtime_check\n"
        "load_env\n"
        'LEVERS9_TOKEN_FILE="$TOKEN_FILE" exec "$PY" -m levers9 worker >>"$LOG" 2>&1\n'
    )


def _runtime_check(runtime: str) -> str:
    """The shell function ``runtime_check``: what a worker running on the machine itself needs of it.

    A ``runc`` worker runs the machine's ``runc``: when it is missing and ``apt-get`` exists, it is installed
    (logged; a failed install is logged and the worker started anyway, so its own refusal, naming what is
    missing, reaches the controlplane's log). A ``gvisor`` worker needs ``runsc`` in the machine image: it is
    not installed here (its packages differ by distribution), only named. The docker path needs neither: the
    worker image carries both.
    """
    if runtime == "runc":
        body = (
            "  command -v runc >/dev/null 2>&1 && return 0\n"
            "  if ! command -v apt-get >/dev/null 2>&1; then\n"
            '    say "runc is not on PATH and there is no apt-get to install it: the worker will refuse this '
            'runc pool (use a machine image with runc)"\n'
            "    return 0\n"
            "  fi\n"
            '  say "runc is not on PATH and this pool runs runc: apt-get install -y runc"\n'
            '  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y runc >>"$LOG" 2>&1; then\n'
            '    apt-get update >>"$LOG" 2>&1 || true\n'
            '    DEBIAN_FRONTEND=noninteractive apt-get install -y runc >>"$LOG" 2>&1 || '
            'say "apt-get could not install runc (see $LOG): the worker will refuse this runc pool"\n'
            "  fi\n"
        )
    elif runtime == "gvisor":
        body = (
            "  command -v runsc >/dev/null 2>&1 && return 0\n"
            '  say "runsc is not on PATH and this pool runs gvisor: the worker will refuse it '
            '(the machine image needs gVisor runsc, for example apt-get install -y runsc on Debian 12)"\n'
        )
    else:
        body = "  return 0\n"
    return "runtime_check() {\n" + body + "}\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the script reads as a script in the user data."""


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def cloud_init(bootstrap: WorkerBootstrap) -> str:
    """``#cloud-config`` user data: the script at :data:`SCRIPT_PATH` (0700, root's), run once by ``runcmd``.

    :raises ValueError: the bootstrap is invalid, or the user data exceeds :data:`USER_DATA_MAX_BYTES`.
    """
    document = {
        "write_files": [
            {"path": SCRIPT_PATH, "owner": "root:root", "permissions": "0700", "content": shell_script(bootstrap)}
        ],
        "runcmd": [[SCRIPT_PATH]],
    }
    text = "#cloud-config\n" + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1_000_000)
    size = len(text.encode())
    if size > USER_DATA_MAX_BYTES:
        raise ValueError(
            f"the worker's user data takes {size} bytes, at most {USER_DATA_MAX_BYTES} fit (EC2's limit): "
            "shorten WorkerBootstrap.controlplane_ca (one CA, not a bundle) or environment"
        )
    return text


def container_spec(bootstrap: WorkerBootstrap) -> BootstrapContainer:
    """The worker as a container running ``worker_image``; the token in ``secret_env`` only.

    ``command`` is ``levers9 worker``; ``env`` is :func:`worker_environment` (no secret in it); ``secret_env``
    holds the join token as ``LEVERS9_TOKEN``, for the provider to store as its platform's secret (which the
    provider deletes with the machine) and expose to the container as a variable. ``worker_image`` is the
    controlplane's ``scheduler.worker_image``: the image ``levers9 worker-image build`` makes, of exactly the
    controlplane's version, pushed by the operator to a registry the machines can pull from.

    :raises ValueError: the bootstrap is invalid, or names no ``worker_image``.
    """
    if not bootstrap.worker_image:
        raise ValueError(
            "WorkerBootstrap.worker_image is None: a container provider needs the worker image to run; set "
            "scheduler.worker_image to the image `levers9 worker-image build` makes for this levers9 version, "
            "pushed to a registry the provider's machines pull from (levers9 publishes none)"
        )
    return BootstrapContainer(
        image=bootstrap.worker_image,
        env=worker_environment(bootstrap),
        secret_env={"LEVERS9_TOKEN": bootstrap.token},
    )
