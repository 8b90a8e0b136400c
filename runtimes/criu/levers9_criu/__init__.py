"""Checkpointing of runc containers through CRIU.

runc does not checkpoint by itself: it hands the container's processes to
CRIU, which needs root and a kernel whose features (and vDSO layout) it
understands. Whether that holds is a property of the host, not of runc, so it
lives in a plugin of its own that answers the checkpoint hooks for the ``runc``
runtime only, and other runtimes (gVisor checkpoints itself) stay unaffected.

The answer is CRIU's own: ``criu check`` is run and, when it fails, its error
lines become the reason, so an operator reads what CRIU objected to rather
than a paraphrase. ``criu check`` inspects the kernel and is slow enough that
it is run once per process; :func:`clear_cache` forgets the answer (tests, or
after the host changed). Checkpoint and restore go through runc (``runc
checkpoint --leave-running``, ``runc restore``), which drives CRIU; on a host
where ``criu check`` fails they raise :class:`CheckpointUnavailable` with
CRIU's reason, and the container is left running untouched.

The plugin is one object, :data:`plugin`, a :class:`CriuCheckpointer` whose
``levers9_*`` methods are the hooks. It drives runc through the engine
:mod:`levers9.engine.runc` builds from the pool's runc settings, the same
engine the ``runc`` plugin runs the container with; it does not import the
``runc`` plugin.
"""

from __future__ import annotations

import os
import threading

from levers9 import probe
from levers9.engine import runc as runc_engine
from levers9.hooks.errors import CheckpointUnavailable, RestoreFailed
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import (
    CheckpointImage,
    CheckpointSupport,
    ContainerState,
    PreparedContainer,
    RuntimeContext,
)

__all__ = [
    "CHECK_TIMEOUT",
    "MECHANISM",
    "SERVED_RUNTIMES",
    "CriuCheckpointer",
    "check_host",
    "clear_cache",
    "plugin",
]

#: the runtimes whose containers CRIU checkpoints here
SERVED_RUNTIMES = frozenset({"runc"})
MECHANISM = "criu"
#: seconds ``criu check`` may take before the host is reported unable to checkpoint
CHECK_TIMEOUT = 30.0

_lock = threading.Lock()
_cache: dict[str, CheckpointSupport] = {}


def clear_cache() -> None:
    """Forget the cached ``criu check`` answers, so the next question runs it again."""
    with _lock:
        _cache.clear()


def _failure_reason(result: probe.ProbeResult) -> str:
    if result.rc == probe.TIMED_OUT:
        return f"'criu check' did not finish within {CHECK_TIMEOUT:g} s"
    lines = result.output_lines()
    # CRIU prefixes what it objects to with "Error"; keep only those when there are any
    errors = [line for line in lines if line.startswith("Error")] or lines
    if not errors:
        return f"'criu check' failed with exit status {result.rc} and printed nothing"
    return f"'criu check' failed with exit status {result.rc}:\n" + "\n".join(errors)


def _run_check(path: str) -> CheckpointSupport:
    result = probe.run([path, "check"], timeout=CHECK_TIMEOUT)
    if not result.ok:
        return CheckpointSupport(available=False, reason=_failure_reason(result), mechanism=MECHANISM)
    version = probe.run([path, "--version"], timeout=CHECK_TIMEOUT)
    named = next((line for line in version.output_lines() if line.startswith("Version:")), None)
    note = f"'criu check' passed (CRIU {named.split(':', 1)[1].strip()})" if named else "'criu check' passed"
    return CheckpointSupport(available=True, reason=note, mechanism=MECHANISM)


def check_host() -> CheckpointSupport:
    """Whether CRIU can checkpoint on this host, in CRIU's own words when it cannot; cached per process."""
    if os.geteuid() != 0:
        return CheckpointSupport(
            available=False,
            reason=f"criu needs root to checkpoint and restore, and levers9 runs as uid {os.geteuid()}",
            mechanism=MECHANISM,
        )
    path = probe.which("criu")
    if path is None:
        return CheckpointSupport(
            available=False,
            reason="criu not found on PATH (apt-get install -y criu)",
            mechanism=MECHANISM,
        )
    with _lock:
        cached = _cache.get(path)
        if cached is None:
            cached = _cache[path] = _run_check(path)
        return cached


class CriuCheckpointer:
    """The ``criu`` plugin: the checkpoint hooks for the runtimes in :data:`SERVED_RUNTIMES` (runc)."""

    #: the edition of the hook spec these hooks follow
    LEVERS9_SPEC_VERSION = 2

    @hookimpl
    def levers9_checkpoint_support(self, runtime: RuntimeContext) -> CheckpointSupport | None:
        if runtime.name not in SERVED_RUNTIMES:
            return None
        return check_host()

    @hookimpl
    def levers9_checkpoint(self, runtime: RuntimeContext, container_id: str, image_dir: str) -> CheckpointImage | None:
        if runtime.name not in SERVED_RUNTIMES:
            return None
        support = check_host()
        if not support.available:
            raise CheckpointUnavailable(support.reason or "criu cannot checkpoint on this host")
        return runc_engine.engine(runtime).checkpoint(container_id, image_dir)

    @hookimpl
    def levers9_restore(
        self, runtime: RuntimeContext, container: PreparedContainer, image: CheckpointImage
    ) -> ContainerState | None:
        if runtime.name not in SERVED_RUNTIMES:
            return None
        support = check_host()
        if not support.available:
            raise RestoreFailed(f"cannot restore {image.checkpoint_id}: {support.reason}")
        return runc_engine.engine(runtime).restore(container, image)


#: the plugin the entry point names
plugin = CriuCheckpointer()
