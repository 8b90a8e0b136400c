"""The ranges a stub's settings must lie in, shared by the SDK and the controlplane.

The SDK checks them when a function is decorated, so a mistake fails on the
user's machine at the line that made it; the controlplane checks them again
(``StubSettings``) when a stub is defined, because not every client is this
SDK. Both read these constants, so the two checks cannot drift apart.

Each bound is inclusive unless its name says otherwise. This module imports
nothing: the SDK imports it on the user's machine.
"""

from __future__ import annotations

#: CPU per container, in millicores (1 core = 1000)
CPU_MILLICORES_MIN = 1
CPU_MILLICORES_MAX = 1_024_000
#: memory per container, in MiB (16 TiB at most)
MEMORY_MIB_MIN = 1
MEMORY_MIB_MAX = 16 * 1024 * 1024
#: the stub's name
NAME_LENGTH_MIN = 1
NAME_LENGTH_MAX = 128
#: reruns of a call that raised
RETRIES_MIN = 0
RETRIES_MAX = 100
#: how long an idle container is kept, in seconds
KEEP_WARM_S_MIN = 0.0
KEEP_WARM_S_MAX = 86_400.0
#: endpoints and boxes: containers kept however idle, and the most at once
MIN_CONTAINERS_MIN = 0
MIN_CONTAINERS_MAX = 1000
MAX_CONTAINERS_MIN = 1
MAX_CONTAINERS_MAX = 1000
#: calls one serving container takes at once
TASKS_PER_CONTAINER_MIN = 1
TASKS_PER_CONTAINER_MAX = 10_000
#: requests that may wait for room at an endpoint
MAX_PENDING_MIN = 0
MAX_PENDING_MAX = 1_000_000
#: how long a request may wait for a container to start, in seconds; must be above 0
START_TIMEOUT_S_ABOVE = 0.0
START_TIMEOUT_S_MAX = 3600.0
#: TCP ports a box's server may listen on
PORT_MIN = 1
PORT_MAX = 65535
