"""The variables ``levers9 worker`` reads, and nothing else: the one list the worker, its boot scripts and docs use.

Standard library only, so ``levers9 --help`` can list them under ``levers9
worker`` without importing the bootstrap renderers (pydantic, YAML). The
worker reads no ``LEVERS9_*`` variable missing here and warns about one that
looks like a misspelling of one of these (:func:`closest_variable`);
:func:`levers9.bootstrap.check_environment` refuses the others in a
``WorkerBootstrap``.
"""

from __future__ import annotations

import difflib

__all__ = ["BOOTSTRAP_FIELD_VARIABLES", "WORKER_VARIABLES", "closest_variable"]

#: every variable ``levers9 worker`` reads, with what it means (docs, ``levers9 worker --help``, validation)
WORKER_VARIABLES: dict[str, str] = {
    "LEVERS9_CONTROLPLANE_URL": "where to dial: grpc://HOST:PORT or grpcs://HOST:PORT, or every replica's, comma-separated",
    "LEVERS9_CONTROLPLANE_CA": "PEM text of the CA that verifies a grpcs:// controlplane (default: system CAs)",
    "LEVERS9_CONTROLPLANE_CA_FILE": "the same CA as a file path, when LEVERS9_CONTROLPLANE_CA is unset",
    "LEVERS9_TOKEN_FILE": "a 0600 file holding the worker's token (a machine's join token); deleted once read",
    "LEVERS9_TOKEN": "the token itself, for a worker started by hand (prefer LEVERS9_TOKEN_FILE)",
    "LEVERS9_MACHINE_ID": "levers9's id for this machine (its provider's ProvisionRequest.machine_id)",
    "LEVERS9_POOL": "the pool this worker serves (a machine token implies it)",
    "LEVERS9_CPU_MILLICORES": "CPU this worker offers, in millicores (default: the pool's)",
    "LEVERS9_MEMORY_MIB": "memory this worker offers, in MiB (default: the pool's)",
    "LEVERS9_GPU_COUNT": "GPUs the machine was given (the boot script adds --gpus all when above 0); "
    "the worker counts the GPUs it finds itself",
    "CUDA_VISIBLE_DEVICES": "GPU indices (nvidia-smi's) the worker may use; unset: every GPU found",
    "LEVERS9_DISCONNECT_EXIT_S": "exit after this many seconds without any controlplane (default: never)",
    "LEVERS9_STOP_GRACE_S": "seconds between SIGTERM and SIGKILL from whoever stops the worker; calls still "
    "running 3 s before it are stopped",
    "LEVERS9_WORKER_STATE_DIR": "where containers are prepared and the session credential kept (removed at exit)",
    "LEVERS9_BUILD_CACHE": "where a build worker keeps the Debian base layers it built for blueprints (default: "
    "build-cache beside its state directory; kept across restarts)",
    "LEVERS9_LOG_LEVEL": "DEBUG, INFO, WARNING or ERROR (default INFO)",
    "LEVERS9_NVIDIA_SMI": "the nvidia-smi executable GPU discovery runs (default: nvidia-smi on PATH)",
    "LEVERS9_MACHINE_IDENTITY": "the plugin that proves which machine this is at the first registration (its "
    "levers9_machine_identity hook; ec2: the signed instance identity document); set by the provider",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT": "the EC2 instance metadata service the ec2 plugin asks for the identity "
    "(default http://169.254.169.254; http://[fd00:ec2::254] on IPv6-only subnets)",
    "LEVERS9_SANDBOXES": "the most sandboxes this worker runs at once, served on its loopback "
    "(levers9.worker.sandbox_api); unset or 0: none (the default until the controlplane drives them)",
    "LEVERS9_PLUGINS_ALLOW": "comma-separated plugins the worker may load (default: every installed one)",
    "LEVERS9_PLUGINS_BLOCK": "comma-separated plugins the worker must not load",
    "LEVERS9_PLUGINS_STRICT": "1: a plugin that fails to load stops the worker instead of being skipped",
}

#: the variables a :class:`WorkerBootstrap` field carries; ``environment`` may not set them
BOOTSTRAP_FIELD_VARIABLES: dict[str, str] = {
    "LEVERS9_CONTROLPLANE_URL": "controlplane_url",
    "LEVERS9_CONTROLPLANE_CA": "controlplane_ca",
    "LEVERS9_CONTROLPLANE_CA_FILE": "controlplane_ca",
    "LEVERS9_TOKEN_FILE": "token",
    "LEVERS9_TOKEN": "token",
    "LEVERS9_MACHINE_ID": "machine_id",
    "LEVERS9_POOL": "pool",
}


def closest_variable(name: str) -> str | None:
    """The worker variable ``name`` is most likely a misspelling of, if any is close."""
    found = difflib.get_close_matches(name, list(WORKER_VARIABLES), n=1, cutoff=0.8)
    return found[0] if found else None
