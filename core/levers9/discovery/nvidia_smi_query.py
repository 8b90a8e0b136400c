"""Read the GPUs of a machine from ``nvidia-smi``'s CSV query output.

``nvidia-smi`` is on every machine with an NVIDIA driver, needs no Python
binding to the driver, and its ``--query-gpu`` CSV format is documented and
stable across driver releases, unlike its human-readable table. Parsing is kept
apart from running the tool so it can be tested on recorded outputs.
"""

from __future__ import annotations

import csv

from levers9.gpu.normalize import from_nvidia_smi
from levers9.hooks.types import GpuDevice

__all__ = ["COMMAND", "QUERY", "parse_query_gpu"]

QUERY = "index,uuid,name,memory.total"
COMMAND = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]

_FIELDS = len(QUERY.split(","))
# What nvidia-smi prints for a value the GPU or driver does not report.
_NOT_REPORTED = {"", "[N/A]", "N/A", "[NOT SUPPORTED]", "NOT SUPPORTED", "[UNKNOWN ERROR]"}


def _memory_mib(raw: str) -> int | None:
    value = raw.strip()
    if value.upper() in _NOT_REPORTED:
        return 0
    # Tolerate output produced without "nounits" ("81559 MiB").
    if value.upper().endswith("MIB"):
        value = value[:-3].strip()
    try:
        mib = int(value)
    except ValueError:
        return None
    return mib if mib >= 0 else None


def parse_query_gpu(text: str) -> list[GpuDevice]:
    """Parse the output of :data:`COMMAND` into one :class:`GpuDevice` per GPU.

    Memory the driver does not report (``[N/A]``, ``[Not Supported]``) is
    recorded as 0 rather than failing the whole machine: the GPU is still there
    and still usable, only its size is unknown.

    :raises ValueError: a line is not four fields of the expected kinds; the
        message gives the line number and the line, because this output is what
        an operator will compare it with.
    """
    devices: list[GpuDevice] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [field.strip() for field in next(csv.reader([line], skipinitialspace=True))]
        if len(fields) != _FIELDS:
            raise ValueError(
                f"nvidia-smi output line {number}: expected {_FIELDS} fields ({QUERY}), got {len(fields)}: {line!r}"
            )
        raw_index, uuid, name, raw_memory = fields
        try:
            index = int(raw_index)
        except ValueError:
            raise ValueError(f"nvidia-smi output line {number}: index is not a number: {line!r}") from None
        if index < 0:
            raise ValueError(f"nvidia-smi output line {number}: negative index: {line!r}")
        if not uuid or not name:
            raise ValueError(f"nvidia-smi output line {number}: empty uuid or name: {line!r}")
        memory = _memory_mib(raw_memory)
        if memory is None:
            raise ValueError(f"nvidia-smi output line {number}: memory.total is not a number: {line!r}")
        devices.append(
            GpuDevice(
                index=index,
                uuid=uuid,
                model=name,
                gpu=from_nvidia_smi(name, memory or None),
                memory_mib=memory,
            )
        )
    return devices
