"""Built-in discovery plugin: the NVIDIA GPUs of this machine, as ``nvidia-smi`` sees them.

A worker must know which GPUs it really has before it offers them: a cloud's
instance-type description says what should be there, but a GPU can fall off
the bus or a driver can fail to load, and a job placed on a GPU that is not
there fails late and confusingly. ``nvidia-smi`` asks the driver itself and
ships with it, so it is present wherever NVIDIA GPUs can be used and needs no
extra dependency.

A machine without the tool simply has no NVIDIA GPUs to report, so that is an
empty answer, not an error. A tool that is present but fails (typically a
driver that is not loaded or does not match the kernel) is an error, raised
with the tool's own words so the operator sees the real cause.
``LEVERS9_NVIDIA_SMI`` points at a specific binary for hosts that keep it off
``PATH`` (some container images, NixOS); a value that points nowhere is a
configuration mistake and is reported rather than read as "no GPUs".
"""

from __future__ import annotations

import os
import shutil

from levers9 import probe
from levers9.discovery.nvidia_smi_query import COMMAND, parse_query_gpu
from levers9.hooks.markers import hookimpl
from levers9.hooks.types import GpuDevice

__all__ = ["ENV_VAR", "TIMEOUT_S", "find_nvidia_smi", "levers9_gpu_devices"]

ENV_VAR = "LEVERS9_NVIDIA_SMI"
#: nvidia-smi can take several seconds while the driver initialises GPUs (persistence mode off);
#: past this it is hung on a wedged GPU and the worker should not wait for it
TIMEOUT_S = 20.0
# nvidia-smi's answer on a machine whose driver is loaded but sees no GPU: nothing to report, not a failure.
_NO_DEVICES = "No devices were found"


def find_nvidia_smi() -> str | None:
    """The ``nvidia-smi`` to run, or None when this machine has none.

    :raises RuntimeError: ``LEVERS9_NVIDIA_SMI`` is set but names no executable.
    """
    override = os.environ.get(ENV_VAR, "").strip()
    if override:
        found = shutil.which(override)
        if found is None:
            raise RuntimeError(f"{ENV_VAR}={override!r} is not an executable file")
        return found
    return shutil.which(COMMAND[0])


@hookimpl
def levers9_gpu_devices() -> list[GpuDevice]:
    """The NVIDIA GPUs of this machine; empty when ``nvidia-smi`` is not installed.

    :raises RuntimeError: nvidia-smi failed, timed out or could not be started.
    :raises ValueError: its output could not be parsed.
    """
    binary = find_nvidia_smi()
    if binary is None:
        return []
    result = probe.run([binary, *COMMAND[1:]], timeout=TIMEOUT_S)
    if result.rc == probe.TIMED_OUT:
        raise RuntimeError(f"{binary} did not answer within {TIMEOUT_S:g} s")
    if result.rc in (probe.NOT_FOUND, probe.NOT_EXECUTABLE):
        raise RuntimeError(f"could not run {binary}: {result.stderr.strip()}")
    if result.rc != 0:
        # nvidia-smi prints most of its failures on stdout, so report both streams.
        message = "\n".join(part for part in (result.stderr.strip(), result.stdout.strip()) if part)
        if _NO_DEVICES in message:
            return []
        raise RuntimeError(f"{binary} exited with status {result.rc}: {message or '(no output)'}")
    return parse_query_gpu(result.stdout)
