"""The ``local`` provider: levers9 workers as processes on the controlplane's own machine.

This is the provider of ``levers9 up`` and of development setups: a "machine" is
a ``levers9 worker`` process, GPUs are the ones discovery finds on this host,
and nothing is rented or tagged anywhere. It exists so that the whole path from
a call to a running container (scheduler, provisioning hook, registration with
a token, runtime plugin) can be exercised on one laptop with exactly the code
production runs; only the provider differs.

Its settings are therefore about sharing one host: which command starts a
worker, which GPUs workers may take, where their records and logs live and how
long a worker gets to stop. How many workers and how big each is are the pool's
own ``max_workers``, ``cpu`` and ``memory``.

What the hooks do:

* ``levers9_provision`` starts ``worker_command`` (default
  ``python -m levers9 worker``) detached: in its own session, stdin from
  ``/dev/null``, output appended to ``<state_dir>/<pool>/<machine_id>.log``,
  and re-parented to init through a short-lived launcher, so it outlives a
  controlplane that is killed and never becomes that controlplane's zombie.
  There is no machine to boot, so no user data: the worker gets what
  :func:`levers9.bootstrap.worker_environment` renders of
  ``request.bootstrap`` (the same variables a booted machine's worker reads),
  in its environment, never its argv (which anyone can read in ``ps``); its
  join token is written to ``<state_dir>/<pool>/<machine_id>.token`` (mode
  0600) and the worker, given its path as ``LEVERS9_TOKEN_FILE``, reads and
  deletes it. What only this host knows is added: ``LEVERS9_GPU_COUNT`` and
  ``CUDA_VISIBLE_DEVICES`` (the GPU indices it was given, empty for a CPU
  worker), ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so those indices are
  nvidia-smi's), ``LEVERS9_WORKER_STATE_DIR`` (``<machine_id>.worker`` beside
  the record), ``LEVERS9_STOP_GRACE_S`` and, unless the bootstrap says
  otherwise, the request's CPU and memory and ``LEVERS9_DISCONNECT_EXIT_S=120``
  (a worker left without its controlplane exits after that long). The rest of
  the controlplane's environment is inherited, except its ``LEVERS9_*``
  variables other than the host-wide worker ones of
  :data:`levers9.worker_variables.WORKER_VARIABLES` (plugin policy, nvidia-smi, log
  level). Each GPU goes to at most one live worker; asking for more than are
  free raises ``InsufficientCapacity``. The provider id is the machine id; no
  ``provider_data`` is needed to find it again.
* ``levers9_list_machines`` reads ``<state_dir>/<pool>/<machine_id>.json``
  records and reports those whose process is still the one recorded (pid,
  start time and boot id all match): ``running`` while the worker lives,
  ``stopping`` while only processes it started remain, ``failed`` (with the
  last line of its log as the reason) once nothing of it runs: a worker that
  exited or crashed, before registering or after. A new controlplane
  therefore finds the workers the previous one started.
* ``levers9_terminate`` sends SIGTERM to the worker's session, SIGKILL to
  what is left after ``stop_grace_s``, waits until nothing of it runs, then
  deletes the record. The log is kept for a week after its last write.
  Unknown or already stopped workers are success, and a recorded pid that now
  belongs to another process is never signalled.
* ``levers9_gpu_offers`` offers, for a GPU pool, this host's GPUs of the pool's
  type (``visible_gpus`` restricts them) when it has at least ``gpu_count``;
  a CPU pool, or a type the host lacks, gets no offer. This host's GPUs are
  what the GPU discovery plugins report, asked through the plugin manager
  (the context ``levers9_startup`` gives it), never by calling a discovery
  plugin directly.
* ``levers9_check`` says whether the state directory is writable, the worker
  command runs, and (for a GPU pool) discovery finds enough GPUs of the type.

:mod:`levers9_local.provider` has the record layout and the plugin object,
:class:`LocalProvider`, whose methods are the hooks; :mod:`levers9_local.processes`
how workers are started, recognised and stopped. The entry point names
:data:`plugin`, the one instance.
"""

from __future__ import annotations

from levers9_local.provider import LocalProvider
from levers9_local.settings import LocalSettings

__all__ = ["LocalProvider", "LocalSettings", "plugin"]

# Stateless apart from its GPU discovery cache: records on disk are the provider's whole memory.
plugin = LocalProvider()
