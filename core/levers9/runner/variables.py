"""The variables the worker sets in a runner's environment (both the function and the sandbox mode read them).

Their own module, standard library only, so every part of the runner reads the
names from one place without importing :mod:`levers9.runner.main`.
"""

from __future__ import annotations

__all__ = [
    "ENV_GO",
    "ENV_HANDLER",
    "ENV_HOST",
    "ENV_PORT",
    "ENV_PYTHON",
    "ENV_READY",
    "ENV_SOCKET",
    "ENV_TOKEN",
]

ENV_PORT = "LEVERS9_RUNNER_PORT"
ENV_TOKEN = "LEVERS9_RUNNER_TOKEN"
ENV_HANDLER = "LEVERS9_HANDLER_FILE"
ENV_PYTHON = "LEVERS9_PYTHON_VERSION"
#: where to listen; the worker narrows it to loopback when the container shares the host's network
ENV_HOST = "LEVERS9_RUNNER_HOST"
#: listen on this unix socket instead of a TCP port: a container without network (one to be checkpointed)
ENV_SOCKET = "LEVERS9_RUNNER_SOCKET"
#: the file to create once start-up is done (the handler loaded), and the one to wait for before serving:
#: the worker checkpoints the container in between, while it has no connection open
ENV_READY = "LEVERS9_READY_FILE"
ENV_GO = "LEVERS9_GO_FILE"
